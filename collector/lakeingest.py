"""Ingest in lake mode (collector/lake.py): the same checks, typing and de-duplication as a
database file, into an in-memory staging database, committed to the lake in rounds.

- ``Stager``: the staging databases and the round in progress (which source positions
  its rows came from); a due round is committed on its own thread while the next is
  staged: one exactly-once append per table with rows, then the round's row in
  ``lake_commits``, then its staging tables are emptied;
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
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb

from cmdare.wire.kafka import KafkaURL
from cmdare.wire.spool import Position

from .consumer import DEFAULT_MAX_SKEW, KafkaIngest, Progress, SpoolIngest
from .db import migrate
from .ingest import storage
from .ingest.batch import Batch, WriteResult
from .lake import APPENDED, Lake
from .writer import Writer

log = logging.getLogger("cmdare.collector")
DEFAULT_COMMIT_EVERY = 10.0  # seconds between rounds: fewer, larger files; data visible this late
ROUND_ROWS = 2_000_000  # ... or once this many rows are staged (the staging database's memory)


def writer_id() -> str:
    """This collector, as commits and lake_commits name it."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Buffer:
    """One staging database and its writer."""

    def __init__(self, max_skew: float | None) -> None:
        self.con = duckdb.connect(":memory:")
        migrate(self.con)
        self.writer = Writer(self.con, max_skew, rollup_every=None)


class Stager:
    """Two staging databases: while a round is committed to the lake (its own thread), the
    next one is staged in the other; a third round waits for the first's commit (memory
    stays bounded at two rounds).  Called from one thread at a time."""

    def __init__(self, lake: Lake, max_skew: float | None = DEFAULT_MAX_SKEW,
                 commit_every: float = DEFAULT_COMMIT_EVERY) -> None:
        self.lake = lake
        self.id = writer_id()
        self._bufs = (_Buffer(max_skew), _Buffer(max_skew))
        self.active = self._bufs[0]
        self.commit_every = commit_every
        # source -> ([start position], [end position]) of the round's rows
        self.ranges: dict[str, tuple[list[int], list[int]]] = {}
        self.ends: dict[str, list[int]] = {}  # spool sources: where the last write ended
        self.started = time.monotonic()
        self.staged_rows = 0
        self.rounds = 0
        self.stored = 0  # rows committed to the lake
        self.flush_seconds = 0.0  # the last round's commit (all tables and lake_commits)
        # called with a round's ranges once it is in the lake (on the committing thread)
        self.on_flush: Any = None
        self._committing: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last = 0

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self.active.con

    def _range(self, source: str, start: list[int], end: list[int]) -> None:
        if source in self.ranges:
            s0, _ = self.ranges[source]
            self.ranges[source] = (min(s0, start), end)
        else:
            self.ranges[source] = (start, end)

    def write_batch(self, batch: Batch, position: tuple[str, int, int] | None = None) -> WriteResult:
        """Stage a batch (Kafka: its partitions' offsets ride on it); hand the round over
        for committing when due."""
        self._raise()
        res = self.active.writer.write_batch(batch) if batch else WriteResult()
        self.staged_rows += res.inserted + res.dead
        for key, first in batch.first.items():
            self._range(key, [first], [batch.next[key]])
        if position is not None:
            source, seg, off = position
            self._range(source, self.ends.get(source, [0, 0]), [seg, off])
            self.ends[source] = [seg, off]
        if self.due():
            self._hand_off()
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
        """Commit what is staged and wait for it; the rows the last round stored."""
        if self.ranges:
            self._hand_off()
        self._wait()
        self.started = time.monotonic()
        return self._last

    def _hand_off(self) -> None:
        self._wait()  # the previous round is in the lake (or its error is raised here)
        full, ranges = self.active, self.ranges
        self.active = self._bufs[1] if full is self._bufs[0] else self._bufs[0]
        self.ranges, self.staged_rows, self.started = {}, 0, time.monotonic()
        self._committing = threading.Thread(target=self._commit, args=(full, ranges), name="cmdare-lake-commit",
                                            daemon=True)
        self._committing.start()

    def _commit(self, buf: _Buffer, ranges: dict[str, tuple[list[int], list[int]]]) -> None:
        t0 = time.monotonic()
        try:
            stored = 0
            for table in APPENDED:
                ((n,),) = buf.con.execute(f"SELECT count(*) FROM {table}").fetchall()
                if n:
                    stored += self.lake.append(table, buf.con.sql(f"SELECT * FROM {table}").to_arrow_table(),
                                               ranges, self.id)
            self.lake.mark(ranges, self.id, stored)
            buf.con.execute("BEGIN")
            for table in (*APPENDED, "rollup_dirty", "ingest_positions"):
                buf.con.execute(f"DELETE FROM {storage.stored(table)}")
            buf.con.execute("COMMIT")
            self.rounds += 1
            self.stored += stored
            self._last = stored
            self.flush_seconds = time.monotonic() - t0
            if self.on_flush is not None:
                self.on_flush(ranges)
        except BaseException as e:  # raised on the staging thread; nothing of the round is acknowledged
            self._error = e

    def _wait(self) -> None:
        if self._committing is not None:
            self._committing.join()
            self._committing = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def close(self) -> None:
        if self._committing is not None:
            self._committing.join()
        for b in self._bufs:
            b.con.close()


class LakeKafkaIngest(KafkaIngest):
    """A consumer group member writing the lake."""

    def __init__(self, lake: Lake, url: KafkaURL, group: str = "cmdare-collector",
                 commit_every: float = DEFAULT_COMMIT_EVERY, **kw: Any) -> None:
        self.stager = Stager(lake, kw.get("max_skew", DEFAULT_MAX_SKEW), commit_every)
        super().__init__(self.stager.con, url, group, **kw)
        self.writer = self.stager  # type: ignore[assignment]  # write_batch and rollup, as the writer's
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
        """(The agent may delete only what a committed round holds: see ``_flushed``.)"""

    def _flushed(self, ranges: dict[str, tuple[list[int], list[int]]]) -> None:
        end = ranges.get(self.source)
        if end is not None and len(end[1]) == 2:
            super()._collected(Position(*end[1]))

    def load_available(self) -> int:
        stored = super().load_available()
        if not self.following or self.stager.due():
            self.stager.flush()
        return stored
