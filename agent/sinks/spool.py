"""The spool's writer: the agent's write-ahead log (the Fluent Bit filesystem-buffer model).

The on-disk format (segments, cursors) and the reader that consumers use are in
cmdare.wire.spool.  ``Spool`` appends whole ticks to the newest segment, moves the
governing cursor when a consumer (the Kafka shipper, or a collector reading the directory)
reports what is safe downstream, and deletes segments wholly behind it.  It enforces the
bounds: past ``max_bytes``, or for a segment older than ``max_age``, the oldest segments
are deleted even though not consumed, and their unconsumed events are counted in
``dropped_total``.  A torn last line from a crash is cut off when the spool is opened.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from cmdare.wire.spool import START, Position, list_segments, read_cursor, seg_name, write_cursor


class Spool:
    """Writer side, owned by the agent (one process per spool dir)."""

    def __init__(
        self,
        directory: Path | str,
        max_bytes: int = 1 << 30,
        max_age: float = 7 * 86400,
        segment_bytes: int = 8 << 20,
        fsync: bool = True,
        consumer: str = "shipped",
        fsync_interval: float = 0.0,
    ) -> None:
        self.dir = Path(directory)
        self.max_bytes, self.max_age = max_bytes, max_age
        self.segment_bytes, self.fsync, self.consumer = segment_bytes, fsync, consumer
        self.fsync_interval = fsync_interval  # group commit: at most one fsync per interval
        self._synced_at = float("-inf")
        self.lock = threading.Lock()
        self.dropped_total = 0
        self.spooled_total = 0
        self._f = None
        self._active = 0
        self._active_size = 0
        self._sizes: dict[int, int] = {}
        self.pending = 0  # events spooled and not yet consumed
        self._seen_cursor: Position | None = None
        self._bounds_checked = 0.0

    def open(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        lock = self.dir / ".lock"
        self._lockf = open(lock, "a+")
        try:
            import fcntl

            fcntl.flock(self._lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"spool {self.dir} is in use by another cmdare-agent") from None
        segs = list_segments(self.dir)
        for s in segs:
            self._sizes[s] = (self.dir / seg_name(s)).stat().st_size
        if segs:
            self._repair(segs[-1])
        self._rotate((segs[-1] if segs else 0) + 1)
        self._recount()

    def _recount(self) -> None:
        cur = self.cursor()
        self._seen_cursor = cur
        self.pending = sum(self._unconsumed_lines(s, cur) for s in sorted(self._sizes) if s >= cur.segment)

    def _repair(self, s: int) -> None:
        """Cut a torn last line left by a crash."""
        p = self.dir / seg_name(s)
        with open(p, "rb+") as f:
            size = f.seek(0, 2)
            if size == 0:
                return
            f.seek(max(0, size - (1 << 20)))
            tail = f.read()
            if tail.endswith(b"\n"):
                return
            cut = tail.rfind(b"\n")
            keep = size - len(tail) + cut + 1 if cut >= 0 else (0 if size <= (1 << 20) else size)
            f.truncate(keep)
            self._sizes[s] = keep

    def _rotate(self, n: int) -> None:
        if self._f is not None:
            if self.fsync:
                os.fsync(self._f.fileno())  # a closed segment is whole on disk
            self._f.close()
        self._active = n
        self._f = open(self.dir / seg_name(n), "ab")
        self._active_size = self._f.tell()
        self._sizes[n] = self._active_size

    def append(self, data: bytes, count: int) -> None:
        """Append whole NDJSON lines (``count`` events).  Raises OSError if the disk refuses."""
        with self.lock:
            assert self._f is not None, "spool not open"
            if self._active_size and self._active_size + len(data) > self.segment_bytes:
                self._rotate(self._active + 1)
            self._f.write(data)
            self._f.flush()
            if self.fsync:
                now = time.monotonic()
                if now - self._synced_at >= self.fsync_interval:
                    os.fsync(self._f.fileno())
                    self._synced_at = now
            self._active_size += len(data)
            self._sizes[self._active] = self._active_size
            self.spooled_total += count
            self.pending += count
            self._enforce_bounds()

    def commit(self, pos: Position, count: int) -> None:
        """The consumer (Kafka shipper) got ``count`` more events safely out, up to ``pos``."""
        write_cursor(self.dir, self.consumer, pos, self.fsync)
        with self.lock:
            self._seen_cursor = pos
            self.pending = max(0, self.pending - count)
            self._bounds_checked = 0.0  # consumed segments can go now
            self._enforce_bounds()

    def size_bytes(self) -> int:
        return sum(self._sizes.values())

    def cursor(self) -> Position:
        return read_cursor(self.dir, self.consumer) or START

    def _unconsumed_lines(self, s: int, cur: Position) -> int:
        if cur.segment > s:
            return 0
        try:
            with open(self.dir / seg_name(s), "rb") as f:
                if cur.segment == s:
                    f.seek(cur.offset)
                return f.read().count(b"\n")
        except FileNotFoundError:
            return 0

    def _delete(self, s: int) -> None:
        try:
            os.unlink(self.dir / seg_name(s))
        except FileNotFoundError:
            pass
        self._sizes.pop(s, None)

    def _enforce_bounds(self) -> None:
        now = time.monotonic()
        if (
            self._seen_cursor is not None
            and now - self._bounds_checked < 1.0
            and self.size_bytes() <= self.max_bytes
        ):
            return  # cheap path for every tick; the cursor file and ages are looked at once a second
        self._bounds_checked = now
        cur = self.cursor()
        if cur != self._seen_cursor:  # moved by another process (a collector, embedded mode)
            self._seen_cursor = cur
            self.pending = sum(
                self._unconsumed_lines(s, cur) for s in sorted(self._sizes) if s >= cur.segment
            )
        now = time.time()
        for s in sorted(self._sizes):
            if s == self._active:
                break
            consumed = cur.segment > s
            too_big = self.size_bytes() > self.max_bytes
            too_old = False
            if not consumed and not too_big:
                try:
                    too_old = now - (self.dir / seg_name(s)).stat().st_mtime > self.max_age
                except FileNotFoundError:
                    too_old = True
            if consumed:
                self._delete(s)
            elif too_big or too_old:
                lost = self._unconsumed_lines(s, cur)
                self.dropped_total += lost
                self.pending = max(0, self.pending - lost)
                self._delete(s)
            else:
                break

    def gc(self) -> None:
        """Delete consumed segments and apply the bounds now."""
        with self.lock:
            self._bounds_checked = 0.0
            self._enforce_bounds()

    def close(self) -> None:
        with self.lock:
            if self._f is not None:
                self._f.flush()
                if self.fsync:
                    os.fsync(self._f.fileno())
                self._f.close()
                self._f = None
            if getattr(self, "_lockf", None):
                self._lockf.close()
