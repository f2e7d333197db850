"""The spool's writer: the agent's write-ahead log (the Fluent Bit filesystem-buffer model).

The on-disk format (segments, cursors) and the reader that consumers use are in
cmdare.wire.spool.  ``Spool`` appends whole ticks to the newest segment, moves the
governing cursor when a consumer (the Kafka shipper, or a collector reading the directory)
reports what is safe downstream, and deletes segments wholly behind it.  It enforces the
bounds: past ``max_bytes``, or for a segment older than ``max_age``, the oldest segments
are deleted even though not consumed, and their unconsumed events are counted in
``dropped_total``, except urgent ones (below) dropped for size, which are written again
at the end of the spool.  A torn last line from a crash is cut off when the spool is opened.

A disk that refuses to grow (full, over quota) is treated as the size bound: the oldest
segments are dropped (and their unconsumed events counted) until the write fits, the
active one last; the newest events are kept.  Urgent events (revocation notices, the
agent's lifecycle) in a dropped segment are carried into the next write: a full disk
never drops them while anything else can go.  Any other
write error (a read-only remount, the directory removed) drops that write, counted.  A
write either lands whole or is dropped and counted, never both: a partial write is cut
back.  Disk trouble is logged once when it starts and once when it ends; ``problem`` says
what it is meanwhile (for the agent's status events).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from cmdare.wire.spool import START, Position, list_segments, read_cursor, seg_name, write_cursor

log = logging.getLogger("cmdare.agent.spool")
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
# events a full disk never drops: what lives and revocation verdicts stand on
_URGENT = (b'"type":"revocation"', b'"type":"lifecycle"')


class SpoolFull(OSError):
    """Nothing could be written: no room, and nothing older left to drop."""


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
        self._f: Any = None
        self._active = self._active_size = self.pending = 0  # pending: events spooled and not yet consumed
        self._sizes: dict[int, int] = {}
        self._seen_cursor: Position | None = None
        self._bounds_checked = 0.0
        self.problem: str | None = None  # the disk trouble now, in one line; None when writes land
        # these two are set by _trouble() before ``problem``, the only way they are read
        self._no_room, self._dropped_at_problem = False, 0  # the trouble is a full disk (not a read-only one)
        self._carry: list[bytes] = []  # urgent lines of a dropped segment, for the next write

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
            f.seek(max(0, size - (1 << 20)))
            tail = f.read()
            if tail.endswith(b"\n"):
                return
            cut = tail.rfind(b"\n")
            keep = size - len(tail) + cut + 1 if cut >= 0 else (0 if size <= (1 << 20) else size)
            f.truncate(keep)
            self._sizes[s] = keep

    def _rotate(self, n: int) -> None:
        """Seal the active segment and start segment ``n``; on an error nothing changes."""
        if self._f is not None and self.fsync:
            os.fsync(self._f.fileno())  # a sealed segment is whole on disk
        f = open(self.dir / seg_name(n), "ab", buffering=0)  # raw: a write lands or fails now
        if self._f is not None:
            self._f.close()
        self._f, self._active = f, n
        self._active_size = f.tell()
        self._sizes[n] = self._active_size

    def append(self, data: bytes, count: int) -> bool:
        """Append whole NDJSON lines (``count`` events): True when they landed; False when they
        were dropped and counted (see the module docstring for a disk that refuses)."""
        with self.lock:
            if self._f is None:
                raise RuntimeError("spool not open")
            made_room = False
            while True:
                payload = b"".join(self._carry) + data if self._carry else data
                try:
                    self._write(payload)
                except OSError as e:
                    if e.errno in _NO_ROOM and self._try_make_room():
                        made_room = True
                        continue  # an older segment was dropped: try again
                    self._trouble(e)  # first: this write's events are the episode's first drops
                    self.dropped_total += count + len(self._carry)  # carried lines are lost too
                    self.pending = max(0, self.pending - len(self._carry))
                    self._carry = []
                    return False
                break
            self._carry = []
            self.spooled_total += count
            self.pending += count
            if self.problem is not None and not made_room and self._has_room():
                self._recovered()
            self._enforce_bounds()
            return True

    def _has_room(self) -> bool:
        """Whether the disk has room again: two segments' worth free (asked only while in
        trouble; the room one dropped segment makes does not end it)."""
        if not self._no_room:
            return True
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize >= 2 * self.segment_bytes

    def _write(self, data: bytes) -> None:
        """All of ``data`` at the end of the active segment, or none of it (OSError)."""
        assert self._f is not None
        if self._active_size and self._active_size + len(data) > self.segment_bytes:
            self._rotate(self._active + 1)
        f, start = self._f, self._active_size
        try:
            done = 0
            while done < len(data):
                n = f.write(memoryview(data)[done:])
                if not n:
                    raise OSError(errno.EIO, "the disk took no bytes")
                done += n
            if self.fsync:
                now = time.monotonic()
                if now - self._synced_at >= self.fsync_interval:
                    os.fsync(f.fileno())
                    self._synced_at = now
        except OSError:
            try:
                os.ftruncate(f.fileno(), start)  # no partial line stays behind
            except OSError:
                pass
            raise
        self._active_size += len(data)
        self._sizes[self._active] = self._active_size

    def _try_make_room(self) -> bool:
        try:
            return self._make_room()
        except OSError as e:  # sealing the active segment failed too
            log.debug("spool: cannot make room: %s", e)
            return False

    def _make_room(self) -> bool:
        """Drop the oldest segment, the active one last (sealed first): its unconsumed events
        are counted as dropped, except urgent ones (revocation notices, lifecycle), which are
        carried into the next write.  False: nothing older left to drop."""
        sealed = [s for s in sorted(self._sizes) if s != self._active]
        if not sealed:
            if not self._active_size:
                return False
            self._rotate(self._active + 1)  # the older events in it make way for newer ones
            sealed = [self._active - 1]
        if self.problem is None:
            self._trouble(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        return self._drop_segment(sealed[0], self.cursor(), carry=True)

    def _drop_segment(self, s: int, cur: Position, carry: bool) -> bool:
        """Delete segment ``s`` before it was consumed: its unconsumed events are counted as
        dropped, except (``carry``) urgent ones, kept in ``_carry`` for the next write.  False
        when the disk will not let it go (nothing changes)."""
        lines = self._unconsumed(s, cur).splitlines(keepends=True)
        if not self._delete(s):
            return False
        keep = [x for x in lines if any(m in x for m in _URGENT)] if carry else []
        self._carry += keep
        self.dropped_total += len(lines) - len(keep)
        self.pending = max(0, self.pending - (len(lines) - len(keep)))
        return True

    def _write_carry(self) -> None:
        """Write the urgent lines of segments dropped for size at the end of the spool now
        (on failure they wait for the next append, which tries them first)."""
        try:
            self._write(b"".join(self._carry))
        except OSError as e:
            log.debug("spool: urgent lines wait for the next write: %s", e)
            return
        self._carry = []

    def _trouble(self, e: OSError) -> None:
        why = f"{e.strerror or e} ({self.dir})"
        self._no_room = e.errno in _NO_ROOM
        if self.problem is None:
            self._dropped_at_problem = self.dropped_total
            if e.errno in _NO_ROOM:
                log.warning("spool: %s: dropping the oldest events to make room, counted in dropped_total", why)
            else:
                log.error("spool: %s: events are dropped and counted until it can write again", why)
        self.problem = why

    def _recovered(self) -> None:
        log.warning(
            "spool: writing again after %s; %d events dropped meanwhile",
            self.problem,
            self.dropped_total - self._dropped_at_problem,
        )
        self.problem = None

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

    def _unconsumed(self, s: int, cur: Position) -> bytes:
        """The bytes of segment ``s`` after ``cur`` (whole lines)."""
        if cur.segment > s:
            return b""
        try:
            with open(self.dir / seg_name(s), "rb") as f:
                if cur.segment == s:
                    f.seek(cur.offset)
                return f.read()
        except FileNotFoundError:
            return b""

    def _unconsumed_lines(self, s: int, cur: Position) -> int:
        return self._unconsumed(s, cur).count(b"\n")

    def _delete(self, s: int) -> bool:
        """Remove segment ``s``; False when the disk refuses (it stays, and is counted)."""
        try:
            os.unlink(self.dir / seg_name(s))
        except FileNotFoundError:
            pass
        except OSError as e:  # a read-only remount: it stays until it can go
            log.debug("spool: cannot delete segment %d: %s", s, e)
            return False
        self._sizes.pop(s, None)
        return True

    def _enforce_bounds(self) -> None:
        now = time.monotonic()
        # the cheap path's mutants change only how often the cursor file and the ages are read
        # (cost): commit() and gc() reset the clock, and a write past the size bound never takes it
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
                if not self._delete(s):
                    break
            elif too_big or too_old:
                # past the size bound urgent events are written again at the end; past the
                # age bound they are as stale as the rest
                if not self._drop_segment(s, cur, carry=too_big):
                    break
            else:
                break
        if self._carry and self.problem is None:
            self._write_carry()

    def gc(self) -> None:
        """Delete consumed segments and apply the bounds now."""
        with self.lock:
            self._bounds_checked = 0.0
            self._enforce_bounds()

    def close(self) -> None:
        """Flush and release; whatever the disk does, this returns (and says what it could
        not flush)."""
        with self.lock:
            if self._f is not None and self._carry:
                self._write_carry()
                if self._carry:
                    n = len(self._carry)
                    log.warning(
                        "spool: %d urgent events (notices, lifecycle) could not be written: dropped", n
                    )
                    self.dropped_total += n
                    self.pending = max(0, self.pending - n)
                    self._carry = []
            if self._f is not None:
                try:
                    if self.fsync:
                        os.fsync(self._f.fileno())
                except OSError as e:
                    log.warning("spool: the last writes may not be on disk: %s", e)
                try:
                    self._f.close()
                except OSError as e:
                    log.warning("spool: closing the active segment: %s", e)
                self._f = None
            if getattr(self, "_lockf", None):
                try:
                    self._lockf.close()
                except OSError:
                    pass
