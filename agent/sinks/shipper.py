"""The shipper: forwards the spool to Kafka, in order, and moves ``cursor.shipped``
only over what Kafka acknowledged.  When the broker is away it backs off (exponential,
capped) while the spool grows within its bounds; when the broker returns it resumes
from the cursor.  A message holds whole events (NDJSON) up to ``sink.message_bytes``; with
``columns`` (``sink.message_format = "columns"``) its row-form samples travel as binary
column blocks (``cmdare.agent.columns``), the other events as lines.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from cmdare.wire.columns import encode as encode_columns
from cmdare.wire.spool import Position, read_lines

from .kafka import KafkaSink, SinkError
from .spool import Spool

log = logging.getLogger("cmdare.agent.shipper")


def pack(
    chunks: list[tuple[bytes, Position]], message_bytes: int, columns: bool = False
) -> list[tuple[bytes, int, Position]]:
    """Cut line chunks into messages of at most ``message_bytes`` of lines (a longer single
    event travels alone); with ``columns``, each message's row lines become column blocks.
    Returns [(message, events in it, spool position after it)]."""
    out: list[tuple[bytes, int, Position]] = []
    for data, end_pos in chunks:
        start = 0
        n = len(data)
        base = end_pos.offset - n
        while start < n:
            stop = min(start + message_bytes, n)
            if stop < n:
                cut = data.rfind(b"\n", start, stop) + 1
                stop = cut if cut > start else data.index(b"\n", start) + 1
            msg = data[start:stop]
            count = msg.count(b"\n")
            out.append(
                (encode_columns(msg) if columns else msg, count, Position(end_pos.segment, base + stop))
            )
            start = stop
    return out


class Shipper(threading.Thread):
    def __init__(
        self,
        spool: Spool,
        sink: KafkaSink,
        batch_bytes: int,
        backoff: float = 1.0,
        backoff_max: float = 30.0,
        on_status: Callable[[bool, str], None] | None = None,
        columns: bool = False,
    ) -> None:
        super().__init__(name="cmdare-shipper", daemon=True)
        self.spool, self.sink = spool, sink
        self.batch_bytes, self.backoff, self.backoff_max = batch_bytes, backoff, backoff_max
        self.on_status = on_status or (lambda ok, msg: None)
        self.columns = columns
        self.shipped_total = 0
        self.skipped_total = 0
        self.damaged_total = 0  # chunks read from the spool with bytes the agent did not write
        self._damaged: set[int] = set()  # segments already said to hold them
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.deadline: float | None = None
        self._ok: bool | None = None
        self._priority: deque[bytes] = deque()  # urgent lines: sent ahead of the spool's backlog

    def priority(self, lines: bytes) -> None:
        """Send these (already spooled) lines ahead of any backlog: a revocation notice must
        not wait behind an hour of samples.  They travel again, in order, when the cursor
        reaches them; the collector stores each event id once."""
        self._priority.append(lines)
        self.wake.set()

    def _ship_priority(self) -> None:
        while self._priority:
            data = self._priority[0]
            msgs = pack([(data, Position(0, len(data)))], self.sink.message_bytes, self.columns)
            acked = self.sink.write([m for m, _, _ in msgs])
            if acked < len(msgs):
                if acked:  # keep what was not acknowledged
                    self._priority[0] = data[msgs[acked - 1][2].offset :]
                raise SinkError(f"{self.sink.url.text}: urgent events not acknowledged")
            self._priority.popleft()

    def _state(self, ok: bool, msg: str) -> None:
        if ok != self._ok:
            (log.info if ok else log.warning)("kafka sink %s: %s", "ok" if ok else "failing", msg)
            self.on_status(ok, msg)
        self._ok = ok

    def _check(self, chunks: list[tuple[bytes, Position]]) -> None:
        """Say (once per segment) when the spool holds bytes this agent did not write: a bad
        sector, a stray write.  They are shipped as they are: the collector dead-letters
        the lines they touch, keeps their bytes, and stores every other line."""
        for data, end in chunks:
            if data.isascii():  # what the agent writes (JSON with ensure_ascii, rows of numbers)
                continue
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as e:
                self.damaged_total += 1
                if end.segment not in self._damaged:
                    self._damaged.add(end.segment)
                    log.warning(
                        "spool segment %d holds bytes this agent did not write (not UTF-8 at offset %d): "
                        "shipped as they are; the collector dead-letters only the lines they touch",
                        end.segment,
                        end.offset - len(data) + e.start,
                    )

    def ship_once(self) -> int:
        """Ship up to ``batch_bytes`` from the cursor; return events shipped (0: nothing
        to do).  Raises SinkError when the broker took nothing."""
        cur = self.spool.cursor()
        chunks, nxt, skipped = read_lines(self.spool.dir, cur, self.batch_bytes)
        self.skipped_total += skipped
        if not chunks:
            if nxt != cur:  # skipped over deleted / torn segments
                self.spool.commit(nxt, 0)
            return 0
        self._check(chunks)
        msgs = pack(chunks, self.sink.message_bytes, self.columns)
        acked = self.sink.write([m for m, _, _ in msgs])
        if acked == 0:
            raise SinkError(f"{self.sink.url.text}: no acknowledgement from the broker")
        n = sum(c for _, c, _ in msgs[:acked])
        self.spool.commit(msgs[acked - 1][2], n)
        self.shipped_total += n
        if acked < len(msgs):
            raise SinkError(
                f"{self.sink.url.text}: {len(msgs) - acked} of {len(msgs)} messages not acknowledged"
            )
        return n

    def run(self) -> None:
        delay = self.backoff
        while True:
            if self.stopping.is_set() and (self.deadline is None or time.monotonic() >= self.deadline):
                break
            try:
                self._ship_priority()
                n = self.ship_once()
                self._state(True, f"shipping to {self.sink.url.text}")
                delay = self.backoff
                if n == 0:
                    if self.stopping.is_set():
                        break
                    self.wake.wait(0.5)
                    self.wake.clear()
            except SinkError as e:
                self._state(False, str(e))
                self.sink.close(timeout=0.5)
                if self.stopping.is_set():
                    break
                self.wake.wait(delay)
                delay = min(delay * 2, self.backoff_max)
            except Exception as e:  # never let the thread die silently
                self._state(False, f"{type(e).__name__}: {e}")
                if self.stopping.is_set():
                    break
                self.wake.wait(delay)
                delay = min(delay * 2, self.backoff_max)
        self.sink.close(timeout=max(0.1, (self.deadline or time.monotonic()) - time.monotonic()))

    def stop(self, grace: float) -> None:
        """Finish shipping what is spooled for at most ``grace`` seconds, then stop."""
        self.deadline = time.monotonic() + grace
        self.stopping.set()
        self.wake.set()
        self.join(grace + 1.0)
