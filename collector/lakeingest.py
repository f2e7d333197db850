"""Ingest in lake mode (collector/lake.py): the same checks, typing and de-duplication as a
database file, into an in-memory staging database, committed to the lake in rounds.

- ``Stager``: the staging database and the round in progress (which source positions
  its rows came from); ``flush()`` commits a round: one exactly-once append per table
  with rows, then the round's row in ``lake_commits``, then empties the staging tables;
- ``LakeKafkaIngest``: a Kafka consumer group member; when the group gives it partitions
  it starts each where the lake says everything is stored; when it loses them, it first
  commits what it staged (a member that cannot, being dead or cut off, is made harmless
  by the lake's positions: whoever reads those records next stores each once);
- ``LakeSpoolIngest``: a spool directory, its position kept in the lake; the agent's
  ``collected`` cursor moves only once a round is in the lake (it may delete what is).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb

from cmdare.wire.kafka import KafkaURL
from cmdare.wire.spool import Position

from .consumer import DEFAULT_MAX_SKEW, KafkaIngest, Progress, SpoolIngest
from .db import migrate
from .ingest.batch import Batch, WriteResult
from .lake import APPENDED, Lake
from .writer import Writer

log = logging.getLogger("cmdare.collector")
DEFAULT_COMMIT_EVERY = 10.0  # seconds between rounds: fewer, larger files; data visible this late
ROUND_ROWS = 2_000_000  # ... or once this many rows are staged (the staging database's memory)


def writer_id() -> str:
    """This collector, as commits and lake_commits name it."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Stager:
    """The staging database and the round in progress.  Used from one thread at a time."""

    def __init__(self, lake: Lake, max_skew: float | None = DEFAULT_MAX_SKEW,
                 commit_every: float = DEFAULT_COMMIT_EVERY) -> None:
        self.lake = lake
        self.id = writer_id()
        self.con = duckdb.connect(":memory:")
        migrate(self.con)
        self.writer = Writer(self.con, max_skew, rollup_every=None)
        self.commit_every = commit_every
        # source -> ([start position], [end position]) of the round's rows
        self.ranges: dict[str, tuple[list[int], list[int]]] = {}
        self.ends: dict[str, list[int]] = {}  # spool sources: where the last write ended
        self.started = time.monotonic()
        self.staged_rows = 0
        self.rounds = 0
        self.stored = 0  # rows committed to the lake
        self.on_flush: Any = None  # called after a round is in the lake

    def _range(self, source: str, start: list[int], end: list[int]) -> None:
        if source in self.ranges:
            s0, _ = self.ranges[source]
            self.ranges[source] = (min(s0, start), end)
        else:
            self.ranges[source] = (start, end)

    def write_batch(self, batch: Batch, position: tuple[str, int, int] | None = None) -> WriteResult:
        """Stage a batch (Kafka: its partitions' offsets ride on it); commit the round when due."""
        res = self.writer.write_batch(batch) if batch else WriteResult()
        self.staged_rows += res.inserted + res.dead
        for key, first in batch.first.items():
            self._range(key, [first], [batch.next[key]])
        if position is not None:
            source, seg, off = position
            self._range(source, self.ends.get(source, [0, 0]), [seg, off])
            self.ends[source] = [seg, off]
        if self.due():
            self.flush()
        return res

    def write(self, messages: list[tuple[str, bytes | None]],
              position: tuple[str, int, int] | None = None) -> WriteResult:
        batch = Batch()
        for origin, raw in messages:
            batch.add(origin, raw)
        return self.write_batch(batch, position)

    def due(self) -> bool:
        return bool(self.ranges) and (time.monotonic() - self.started >= self.commit_every
                                      or self.staged_rows >= ROUND_ROWS)

    def rollup(self) -> int:
        """(As the single-file writer's end of a load): commit what is staged."""
        return self.flush()

    def flush(self) -> int:
        """Commit the round to the lake; the rows stored (0: nothing was staged)."""
        self.started = time.monotonic()
        if not self.ranges:
            return 0
        stored = 0
        for table in APPENDED:
            ((n,),) = self.con.execute(f"SELECT count(*) FROM {table}").fetchall()
            if n:
                stored += self.lake.append(table, self.con.sql(f"SELECT * FROM {table}").to_arrow_table(),
                                           self.ranges, self.id)
        self.lake.mark(self.ranges, self.id, stored)
        self.con.execute("BEGIN")
        for table in (*APPENDED, "rollup_dirty", "ingest_positions"):
            self.con.execute(f"DELETE FROM {table}")
        self.con.execute("COMMIT")
        self.ranges, self.staged_rows = {}, 0
        self.rounds += 1
        self.stored += stored
        if self.on_flush is not None:
            self.on_flush()
        return stored

    def close(self) -> None:
        self.con.close()


class LakeKafkaIngest(KafkaIngest):
    """A consumer group member writing the lake."""

    def __init__(self, lake: Lake, url: KafkaURL, group: str = "cmdare-collector",
                 commit_every: float = DEFAULT_COMMIT_EVERY, **kw: Any) -> None:
        self.stager = Stager(lake, kw.get("max_skew", DEFAULT_MAX_SKEW), commit_every)
        super().__init__(self.stager.con, url, group, **kw)
        self.writer = self.stager  # type: ignore[assignment]  (write_batch and rollup, as the writer's)
        self.lake = lake
        self._discard = False
        self.rebalances = 0

    def _subscribe(self, consumer_class: Any, options: dict[str, Any]) -> Any:
        from kafka import ConsumerRebalanceListener

        ingest = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Any) -> None:
                ingest._revoked(revoked)

            def on_partitions_assigned(self, assigned: Any) -> None:
                ingest._assigned(assigned)

        consumer = consumer_class(**options)
        consumer.subscribe([self.url.topic], listener=Listener())
        return consumer

    def _revoked(self, revoked: Any) -> None:
        """Before the group moves partitions: what is staged goes to the lake now, and the
        batch being filled is dropped (its records are read again from the lake's
        positions by whoever gets them)."""
        self.rebalances += 1
        pipe = getattr(self, "_pipe", None)
        try:
            if pipe is not None:
                pipe.wait()
                for result, _, messages in self._done():
                    self.totals.add(result, messages)
            self.stager.flush()
        except Exception as e:  # the next owner starts from the lake's positions all the same
            log.error("committing the staged round before a rebalance failed: %s", e)
        self._discard = True

    def _assigned(self, assigned: Any) -> None:
        """Start each partition given to us where the lake has everything before it."""
        try:
            positions = self.lake.positions()
        except Exception as e:
            log.error("reading the lake's positions failed (%s); starting from the partitions' beginning", e)
            positions = {}
        for tp in assigned:
            pos = positions.get(f"{tp.topic}/{tp.partition}")
            if pos:
                self.consumer.seek(tp, pos[0])
            else:
                self.consumer.seek_to_beginning(tp)
        if assigned:
            log.info("assigned %s; starting at the lake's positions",
                     ", ".join(f"{tp.topic}/{tp.partition}" for tp in sorted(assigned)))

    def _take(self, batch: Batch, offsets: dict[Any, int]) -> tuple[Batch, dict[Any, int]]:
        if self._discard:
            self._discard = False
            return Batch(), {}
        return batch, offsets

    def _idle(self) -> None:
        if self.stager.due():
            self._pipe.submit(Batch(), {})  # the writer thread commits the round

    def close(self) -> None:
        super().close()


class LakeSpoolIngest(SpoolIngest):
    """A spool directory into the lake (its position kept there)."""

    def __init__(self, lake: Lake, directory: Path | str, progress: Progress | None = None,
                 max_skew: float | None = DEFAULT_MAX_SKEW, commit_every: float = DEFAULT_COMMIT_EVERY,
                 **kw: Any) -> None:
        self.stager = Stager(lake, max_skew, commit_every)
        super().__init__(self.stager.con, directory, progress=progress, max_skew=max_skew, **kw)
        self.writer = self.stager  # type: ignore[assignment]
        self.lake = lake
        self._pending: Position | None = None
        self.stager.on_flush = self._flushed

    def position(self) -> Position:
        if self.source in self.stager.ends:
            seg, off = self.stager.ends[self.source]
            return Position(seg, off)
        pos = self.lake.positions().get(self.source)
        p = Position(pos[0], pos[1]) if pos and len(pos) == 2 else Position(0, 0)
        self.stager.ends[self.source] = [p.segment, p.offset]
        return p

    def _collected(self, pos: Position) -> None:
        self._pending = pos  # the agent may delete it once the round is in the lake

    def _flushed(self) -> None:
        if self._pending is not None:
            super()._collected(self._pending)
            self._pending = None

    def load_available(self) -> int:
        stored = super().load_available()
        if not self.following or self.stager.due():
            self.stager.flush()
        return stored
