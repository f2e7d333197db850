"""Ingest loops: a Kafka consumer group, or a spool directory read directly.

Kafka: messages are gathered into batches (``batch_bytes`` or ``max_wait``), each batch is
one DuckDB transaction, and the group's offsets are committed only after that transaction
has committed.  A crash between the two replays the batch; the writer's de-duplication
stores each event once.

Spool: the position reached is stored in DuckDB (``ingest_positions``) in the same
transaction as the rows, so a restart resumes exactly; ``cursor.collected`` is written
into the spool dir afterwards so the agent can delete what was loaded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from cmdare.wire.kafka import KafkaURL
from cmdare.wire.spool import Position, read_lines, write_cursor

from .retry import StorageRetry, storage_problem  # noqa: F401  (storage_problem: its home before)
from .writer import Batch, Retention, Writer, WriteResult

log = logging.getLogger("cmdare.collector")
_MAX_POLL = 256  # records per poll at most
# events stamped further than this from the collector's clock are listed in clock_skew
DEFAULT_MAX_SKEW = 86400.0


@dataclass
class Totals:
    events: int = 0
    duplicates: int = 0
    dead: int = 0
    not_utf8: int = 0  # of dead: damaged lines (bytes that are not UTF-8)
    empty: int = 0  # messages with an empty value
    skewed: int = 0  # of events: stamped beyond --max-clock-skew (listed in clock_skew)
    batches: int = 0
    messages: int = 0
    started: float = 0.0
    last_stored: float = 0.0  # time.monotonic() when the last batch was committed to DuckDB
    batch_seconds: float = 0.0  # write transactions' total wall time
    last_batch_seconds: float = 0.0
    # Kafka: per (topic, partition), records behind the partition's end at the last fetch
    # (high watermark - next offset), and the newest fetched record's age (its timestamp)
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    lag_seconds: float | None = None
    # when ingest last held everything its source had (epoch seconds): the collector's
    # horizon for liveness verdicts; None until it first caught up after starting
    caught_up_at: float | None = None
    on_batch: Callable[[WriteResult], None] | None = field(default=None, repr=False, compare=False)

    def add(self, r: WriteResult, messages: int) -> None:
        self.events += r.inserted
        self.duplicates += r.duplicates
        self.dead += r.dead
        self.not_utf8 += r.not_utf8
        self.empty += r.empty
        self.skewed += r.skewed
        self.batches += 1
        self.messages += messages
        self.last_stored = time.monotonic()
        self.batch_seconds += r.seconds
        self.last_batch_seconds = r.seconds
        if self.on_batch is not None:
            try:
                self.on_batch(r)  # e.g. alert rules reading revocations evaluate now
            except Exception as e:
                log.error("after-batch hook: %s: %s", type(e).__name__, e)

    def _of_them(self) -> str:
        n = self.not_utf8
        return f" ({n} damaged line{'' if n == 1 else 's'})" if n else ""

    def _skew(self) -> str:
        return f" ({self.skewed} with clock skew)" if self.skewed else ""

    def line(self) -> str:
        dt = max(1e-9, time.monotonic() - self.started)
        return (
            f"{self.events} events stored ({self.events / dt:,.0f}/s){self._skew()}, {self.duplicates} duplicates "
            f"skipped, {self.dead} dead-lettered{self._of_them()}, "
            f"{self.messages} messages in {self.batches} batches{f' ({self.empty} empty)' if self.empty else ''}"
        )


Progress = Callable[[Totals], None]

class KafkaIngest:
    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        url: KafkaURL,
        group: str = "cmdare-collector",
        # measured: rows of an INSERT that fill row groups (db.ROW_GROUP_SIZE, on each of
        # DuckDB's threads) go straight to the file, the rest through the WAL and a later
        # checkpoint; 64 MiB (~230k GPU samples) loads a backlog 1.4-2x faster than 16 MiB
        batch_bytes: int = 64 << 20,
        max_wait: float = 1.0,
        progress: Progress | None = None,
        progress_every: float = 10.0,
        consumer_options: dict[str, Any] | None = None,
        max_skew: float | None = DEFAULT_MAX_SKEW,
        retention: Retention | None = None,
    ) -> None:
        self.writer = Writer(con, max_skew, retention=retention)
        self.url, self.group = url, group
        self.batch_bytes, self.max_wait = batch_bytes, max_wait
        self.progress, self.progress_every = progress, progress_every
        self.totals = Totals(started=time.monotonic())
        self.stop_event = threading.Event()
        self.options = consumer_options or {}
        self.commit_timeout = 10.0
        self.stall_after = 10.0  # no records this long: check whether the consumer is wedged
        self.assign_after = 30.0  # out of the group this long: rejoin with a fresh consumer
        self.rejoins = 0
        self.consumer: Any = None
        self._mean_size = float(256 << 10)  # bytes per record (the agent packs 256 KiB), then learnt
        # per batch in flight, in order: the time its last fetch found every partition at
        # its end (None: it did not); the horizon moves there once the batch is committed
        self._horizons: deque[float | None] = deque()
        self.horizon_every = 2.0  # idle: ask the broker whether we are at the end this often

    def open(self) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        try:
            options = dict(
                bootstrap_servers=self.url.bootstrap,
                group_id=self.group,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_partition_fetch_bytes=16 << 20,
                fetch_max_bytes=64 << 20,
                max_poll_records=_MAX_POLL,
                session_timeout_ms=10000,
                heartbeat_interval_ms=3000,
                client_id="cmdare-collector",
                bootstrap_timeout_ms=15000,
                **self.url.client_options(),  # SASL / TLS
            )
            self.consumer = self._subscribe(KafkaConsumer, {**options, **self.options})
        except KafkaError as e:
            from cmdare.wire.kafka import explain

            raise ConnectionError(f"{self.url.text}: {explain(e)}") from None

    def _subscribe(self, consumer_class: Any, options: dict[str, Any]) -> Any:
        """The consumer, subscribed to the topic (lake mode also listens to rebalances)."""
        return consumer_class(self.url.topic, **options)

    def _idle(self) -> None:
        """Called when a poll brought nothing and nothing is being written: the rollups and
        retention when due, on the writer's thread (lake mode: commit what is staged)."""
        if self.writer.due():
            self._pipe.submit(Batch(), {})  # an empty write: nothing stored, then housekeep()

    def _take(self, batch: Batch, offsets: dict[Any, int]) -> tuple[Batch, dict[Any, int]]:
        """The batch being filled, after a poll (lake mode drops it after a rebalance)."""
        return batch, offsets

    def run(self, idle_exit: float | None = None) -> Totals:
        """Consume until stop() (or, with ``idle_exit``, until no message came for that long
        while partitions were assigned: time spent waiting for the group does not count).

        Pipelined: this thread polls Kafka and reads each message into the next batch
        (lines split, column blocks decoded: Python) while a writer thread commits the
        previous batch to DuckDB (SQL, which releases the GIL); offsets are committed here,
        in order, once the transaction holding their rows has committed."""
        if self.consumer is None:
            self.open()
        assert self.consumer is not None
        self._pipe = _WriterThread(self.writer, self.stop_event)
        try:
            self._run(idle_exit)
            self._settle()
        finally:
            self._pipe.close()
        self.writer.rollup()  # what this run stored, rolled up before the process ends
        return self.totals

    def _run(self, idle_exit: float | None) -> None:
        last_data = last_report = last_check = last_horizon = time.monotonic()
        unassigned_since: float | None = None
        while not self.stop_event.is_set():
            batch = Batch()  # messages are read into it here, while the writer runs SQL
            offsets: dict[Any, int] = {}
            at_end: float | None = None
            t0 = time.monotonic()
            while (
                batch.bytes < self.batch_bytes
                and time.monotonic() - t0 < self.max_wait
                and not self.stop_event.is_set()
            ):
                self._commit_done()
                # at most as many records as the batch has room for, at the mean record
                # size so far: a poll may otherwise return 256 x 256 KiB and overshoot
                # --batch-bytes (the memory bound) 4-fold
                room = max(1, int((self.batch_bytes - batch.bytes) / self._mean_size))
                poll_wall = time.time()
                try:
                    polled = self.consumer.poll(timeout_ms=100, max_records=min(room, _MAX_POLL))
                except Exception as e:
                    log.warning("poll failed (%s: %s); reconnecting", type(e).__name__, e)
                    batch, offsets = Batch(), {}  # nothing written yet: it will be fetched again
                    self.reconnect()
                    break
                batch, offsets = self._take(batch, offsets)
                got = batch.bytes
                n = 0
                for tp, records in polled.items():
                    for rec in records:
                        batch.add(f"kafka:{tp.topic}/{tp.partition}@{rec.offset}", rec.value)
                        offsets[tp] = rec.offset
                    if records:  # the range the batch holds of this partition (lake mode's positions)
                        key = f"{tp.topic}/{tp.partition}"
                        batch.first.setdefault(key, records[0].offset)
                        batch.next[key] = records[-1].offset + 1
                        self._lag(tp, records[-1])
                    n += len(records)
                if n:
                    self._mean_size = 0.5 * self._mean_size + 0.5 * max(1.0, (batch.bytes - got) / n)
                    at_end = poll_wall if self._at_end() else None
                if not polled and batch:
                    break  # caught up: write what we have
            now = time.monotonic()
            if self.consumer is None:  # stopped while reconnecting
                break
            if batch:
                self._horizons.append(at_end)
                self._pipe.submit(batch, offsets)  # blocks while one batch waits and one is written
                last_data = now
            else:
                self._commit_done()
                if self._pipe.idle():
                    self._idle()
                if now - last_horizon >= self.horizon_every and self._pipe.idle():
                    last_horizon = now
                    self._check_at_end()
                # kafka-python can stay out of its group for good after a broker restart
                # (seen in CI: no assignment for minutes); rejoin with a fresh consumer.  A
                # stable member without partitions (more collectors than partitions) is fine.
                if self.consumer.assignment() or self._in_group():
                    unassigned_since = None
                elif unassigned_since is None:
                    unassigned_since = now
                elif now - unassigned_since >= self.assign_after:
                    log.warning(
                        "no partitions assigned for %.0fs; rejoining the group", now - unassigned_since
                    )
                    unassigned_since = None
                    self.rejoins += 1
                    self.reconnect()
                    if self.consumer is None:
                        break
                    continue
                if now - max(last_data, last_check) >= self.stall_after:
                    last_check = now
                    if self.stalled():
                        self.reconnect()
                        if self.consumer is None:
                            break
                        continue
                if idle_exit is not None and not self.consumer.assignment():
                    last_data = now  # not idle: still waiting for the group to assign partitions
                elif idle_exit is not None and now - last_data >= idle_exit and self._pipe.idle():
                    break
            if self.progress and now - last_report >= self.progress_every:
                self.progress(self.totals)
                last_report = now

    def _at_end(self) -> bool:
        """Whether the last fetch of every assigned partition reached its end."""
        try:
            assigned = self.consumer.assignment()
        except Exception:
            return False
        return bool(assigned) and all(self.totals.lag.get((tp.topic, tp.partition)) == 0 for tp in assigned)

    def _check_at_end(self) -> None:
        """Idle and everything written: ask the broker for the partitions' ends; at them,
        the horizon is now. A broker that cannot be asked (an outage) moves nothing."""
        t = time.time()
        try:
            assigned = list(self.consumer.assignment())
            if not assigned:
                return
            ends = self.consumer.end_offsets(assigned, timeout_ms=2000)
            if all(self.consumer.position(tp, timeout_ms=2000) >= ends.get(tp, 0) for tp in assigned):
                self.totals.caught_up_at = t
                for tp in assigned:
                    self.totals.lag[(tp.topic, tp.partition)] = 0
        except Exception:
            return

    def _done(self) -> list[tuple[Any, dict[Any, int], int]]:
        """The batches committed since the last call; the horizon moves with them."""
        out = self._pipe.done()
        for _ in out:
            h = self._horizons.popleft() if self._horizons else None
            if h is not None:
                self.totals.caught_up_at = max(self.totals.caught_up_at or 0.0, h)
        return out

    def _lag(self, tp: Any, rec: Any) -> None:
        """Consumer lag from what the last fetch said (no request of its own)."""
        try:
            hw = self.consumer.highwater(tp)
        except Exception:
            hw = None
        if hw is not None:
            self.totals.lag[(tp.topic, tp.partition)] = max(0, hw - rec.offset - 1)
        if rec.timestamp and rec.timestamp > 0:
            self.totals.lag_seconds = max(0.0, time.time() - rec.timestamp / 1000)

    def _in_group(self) -> bool:
        """Whether the consumer is a stable member of its group (kafka-python's coordinator
        state; True when that cannot be read, so that nothing is restarted on a guess)."""
        coord = getattr(self.consumer, "_coordinator", None)
        try:
            return bool(coord.stable()) if coord is not None else True
        except Exception:
            return True

    def _commit_done(self) -> None:
        """Commit the offsets of every batch whose DuckDB transaction has committed."""
        from kafka.structs import OffsetAndMetadata

        offsets: dict[Any, int] = {}
        for result, batch_offsets, messages in self._done():
            self.totals.add(result, messages)
            offsets.update(batch_offsets)
        if not offsets or self.consumer is None:
            return
        try:
            self.consumer.commit(
                {tp: OffsetAndMetadata(o + 1, "", -1) for tp, o in offsets.items()},
                timeout_ms=int(self.commit_timeout * 1000),
            )
        except Exception as e:
            # Broker away or group rebalanced.  The rows are safe in DuckDB; whoever consumes
            # these offsets next replays them and the writer stores each event once.  Start a
            # fresh consumer: kafka-python's group state after a failed commit is not to be
            # trusted.
            log.warning(
                "offset commit failed (%s: %s); reconnecting; the batch will be replayed and de-duplicated",
                type(e).__name__,
                e,
            )
            self.reconnect()

    def _settle(self) -> None:
        """Wait for the batches in flight and commit their offsets."""
        if getattr(self, "_pipe", None) is not None:
            self._pipe.wait()
            self._commit_done()

    def stalled(self) -> bool:
        """True when the broker has data past our position that we are not receiving, or
        cannot be asked: kafka-python's consumer can stay wedged after a broker restart,
        so the collector checks instead of trusting it."""
        try:
            assigned = list(self.consumer.assignment())
            if not assigned:
                return False
            ends = self.consumer.end_offsets(assigned, timeout_ms=5000)
            behind = [tp for tp in assigned if self.consumer.position(tp, timeout_ms=5000) < ends.get(tp, 0)]
        except Exception as e:
            log.warning("cannot read end offsets (%s: %s); reconnecting", type(e).__name__, e)
            return True
        if behind:
            log.warning(
                "no records for %.0fs although %d partition(s) have more; reconnecting",
                self.stall_after,
                len(behind),
            )
        return bool(behind)

    def reconnect(self) -> None:
        """Close the consumer and open a new one (retrying while the broker is away)."""
        pipe = getattr(self, "_pipe", None)
        if pipe is not None:  # let the batches in flight land; their offsets are best effort
            pipe.wait()
            for result, _, messages in self._done():
                self.totals.add(result, messages)
        self.close()
        delay = 1.0
        while not self.stop_event.is_set():
            try:
                self.open()
                return
            except ConnectionError as e:
                log.warning("%s; retrying in %.0fs", e, delay)
                self.stop_event.wait(delay)
                delay = min(delay * 2, 30.0)

    def stop(self) -> None:
        self.stop_event.set()

    def close(self) -> None:
        if self.consumer is not None:
            try:
                self.consumer.close(autocommit=False)
            except Exception:
                pass
            self.consumer = None


class _WriterThread:
    """Runs Writer.write for submitted batches in order on one thread (the DuckDB
    connection's).  At most one batch waits while one is written, bounding memory."""

    def __init__(self, writer: Writer, stop: threading.Event | None = None) -> None:
        import queue

        self.writer = writer
        self.retry = StorageRetry(stop or threading.Event())
        self.todo: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.finished: queue.Queue[Any] = queue.Queue()
        self.error: BaseException | None = None
        self.in_flight = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="cmdare-duckdb-writer", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.todo.get()
            if item is None:
                return
            batch, offsets = item
            t0 = time.perf_counter()
            try:
                result = self.retry(lambda: self.writer.write_batch(batch))  # noqa: B023 (called at once)
                result.seconds = time.perf_counter() - t0
            except BaseException as e:  # surfaced on the consumer thread
                self.error = e
                self.finished.put(None)
                return
            self.finished.put((result, offsets, len(batch)))

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def submit(self, batch: Batch, offsets: dict[Any, int]) -> None:
        self._raise()
        with self.lock:
            self.in_flight += 1
        while True:
            try:
                self.todo.put((batch, offsets), timeout=0.5)
                return
            except Exception:  # queue.Full: the writer is busy; check it is alive
                self._raise()

    def done(self) -> list[tuple[WriteResult, dict[Any, int], int]]:
        out = []
        while not self.finished.empty():
            item = self.finished.get_nowait()
            if item is None:
                self._raise()
            with self.lock:
                self.in_flight -= 1
            out.append(item)
        self._raise()
        return out

    def idle(self) -> bool:
        return self.in_flight == 0

    def wait(self) -> None:
        """Block until every submitted batch is written (or the writer failed)."""
        while self.in_flight > self.finished.qsize() and self.thread.is_alive():
            time.sleep(0.01)
        self._raise()

    def close(self) -> None:
        if self.thread.is_alive():
            self.todo.put(None)
            self.thread.join(timeout=60)


class SpoolIngest:
    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        directory: Path | str,
        batch_bytes: int = 64 << 20,
        progress: Progress | None = None,
        progress_every: float = 10.0,
        max_skew: float | None = DEFAULT_MAX_SKEW,
        retention: Retention | None = None,
    ) -> None:
        self.con, self.writer = con, Writer(con, max_skew, retention=retention)
        self.following = False
        self.dir = Path(directory).resolve()
        self.source = f"spool:{self.dir}"
        self.batch_bytes = batch_bytes
        self.progress, self.progress_every = progress, progress_every
        self.totals = Totals(started=time.monotonic())
        self.stop_event = threading.Event()
        self.retry = StorageRetry(self.stop_event)

    def position(self) -> Position:
        row = self.con.execute(
            'SELECT segment, "offset" FROM ingest_positions WHERE source = ?', [self.source]
        ).fetchone()
        return Position(row[0], row[1]) if row else Position(0, 0)

    def load_available(self) -> int:
        """Load everything spooled so far; return events stored."""
        if not self.dir.is_dir():
            raise FileNotFoundError(f"{self.dir}: no such spool directory")
        stored, last_report = 0, time.monotonic()
        pos = self.position()
        while not self.stop_event.is_set():
            read_at = time.time()
            chunks, nxt, skipped = read_lines(self.dir, pos, self.batch_bytes)
            if skipped:
                log.warning("%s: skipped %d torn line(s) left by a crash", self.dir, skipped)
            if not chunks:
                if nxt != pos:
                    self.writer.write([], position=(self.source, nxt.segment, nxt.offset))
                self.totals.caught_up_at = read_at  # everything spooled by then is stored
                if stored and not self.following:
                    self.writer.rollup()  # a one-shot load: the rollups too (following: every rollup_every)
                break
            msgs = []
            for data, end in chunks:
                start = end.offset - len(data)
                msgs.append((f"spool:{self.dir}/{end.segment:016d}@{start}", data))
            t0 = time.perf_counter()
            r = self.retry(lambda: self.writer.write(msgs, position=(self.source, nxt.segment, nxt.offset)))  # noqa: B023
            r.seconds = time.perf_counter() - t0
            self.totals.add(r, len(msgs))
            stored += r.inserted
            pos = nxt
            self._collected(pos)
            if self.progress and time.monotonic() - last_report >= self.progress_every:
                self.progress(self.totals)
                last_report = time.monotonic()
        return stored

    def _collected(self, pos: Position) -> None:
        """Tell the agent what it may delete: all up to ``pos`` is stored."""
        try:
            write_cursor(self.dir, "collected", pos, fsync=False)
        except OSError:
            pass  # read-only spool: the agent's size/age bounds still apply

    def follow(self, interval: float = 1.0) -> None:
        self.following = True
        while not self.stop_event.is_set():
            self.load_available()
            self.writer.housekeep()  # on schedule even while the spool stays empty
            self.stop_event.wait(interval)
        self.writer.rollup()

    def stop(self) -> None:
        self.stop_event.set()
