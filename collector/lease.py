"""The ruler's lease over a lake: which one of a lake's servers evaluates the alert rules
and runs the scheduled detectors (analytics/server/lakeruler.py). No consensus of our own: the
lease is a lock the catalog's own machinery gives and takes back when its holder dies.

- a PostgreSQL catalog (many hosts): a session-level advisory lock
  (``pg_try_advisory_lock``) held on a connection of its own. PostgreSQL releases it when
  that session ends: at once when the holder's process dies (its socket closes), and
  within ``KEEPALIVE`` seconds when its host vanishes (TCP keepalives asked of the server
  for this session, and ``client_connection_check_interval`` where the server has it);
- a SQLite catalog (one host): ``flock`` on a lock file beside the catalog, which the
  kernel releases when the holder's process dies, however it dies.

``held()`` says whether the lease is still this process's (PostgreSQL: its session
answers); a holder that loses it must stop ruling at once (the server exits, and its
supervisor starts it again as a standby).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import urllib.parse
from pathlib import Path
from typing import Any

from .lake import Lake, LakeError, redact

KEEPALIVE = (5, 2, 3)  # idle seconds, interval, probes: a vanished holder's session ends in ~11 s
STATEMENT_TIMEOUT_MS = 5000  # the session's checks never hang on a stuck server


def lease_key(lake: Lake, name: str) -> int:
    """The advisory lock's key: a signed 64-bit number from the lake's warehouse and the
    lease's name (one lease per lake, whatever else shares the database)."""
    h = hashlib.sha256(f"cmdare:{lake.location.warehouse}:{name}".encode()).digest()
    return int.from_bytes(h[:8], "big", signed=True)


class Lease:
    """One lease (``name``) over one lake's catalog; ``try_acquire`` never blocks."""

    def __init__(self, lake: Lake, name: str = "ruler") -> None:
        self.lake, self.name = lake, name
        self.engine = lake.catalog.engine
        self.kind = "postgresql" if self.engine.dialect.name == "postgresql" else "flock"
        self.holder = f"{socket.gethostname()[:64]}:{os.getpid()}"
        self._conn: Any = None
        self.backend_pid: int | None = None  # PostgreSQL: the lease's session (the fence reads its locks)
        self._fd: int | None = None
        self.path: Path | None = None if self.kind == "postgresql" else _lock_path(lake, name)

    def describe(self) -> str:
        if self.kind == "postgresql":
            return f"a PostgreSQL advisory lock in the catalog {redact(str(self.engine.url))[:80]}"
        return f"a lock on {self.path}"

    @property
    def holding(self) -> bool:
        return self._conn is not None or self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it: True when this process holds it now."""
        if self.holding:
            return True
        return self._pg_acquire() if self.kind == "postgresql" else self._flock_acquire()

    def held(self) -> bool:
        """Whether this process still holds the lease (PostgreSQL: its session answers)."""
        if self._fd is not None:
            return True
        if self._conn is None:
            return False
        from sqlalchemy import text

        try:
            ok = self._conn.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                                         "AND pid = pg_backend_pid() AND objid = :lo AND classid = :hi"),
                                    _halves(lease_key(self.lake, self.name))).scalar()
        except Exception:  # noqa: BLE001  (the session is gone: so is the lock)
            self._drop()
            return False
        if not ok:
            self._drop()
        return bool(ok)

    def release(self) -> None:
        if self._conn is not None:
            from sqlalchemy import text

            with contextlib.suppress(Exception):
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lease_key(self.lake, self.name)})
        self._drop()

    # -- PostgreSQL ------------------------------------------------------------------------
    def _pg_acquire(self) -> bool:
        from sqlalchemy import text

        try:
            conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except Exception as e:  # noqa: BLE001
            raise LakeError(f"ruler lease: cannot reach the catalog: {redact(str(e)).splitlines()[0][:160]}") from None
        try:
            idle, interval, count = KEEPALIVE
            for stmt in (f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}", f"SET tcp_keepalives_idle = {idle}",
                         f"SET tcp_keepalives_interval = {interval}", f"SET tcp_keepalives_count = {count}",
                         "SET client_connection_check_interval = '2s'"):
                with contextlib.suppress(Exception):  # (older servers lack the last)
                    conn.execute(text(stmt))
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                                    {"k": lease_key(self.lake, self.name)}).scalar())
        except Exception as e:  # noqa: BLE001
            with contextlib.suppress(Exception):
                conn.close()
            raise LakeError(f"ruler lease: {redact(str(e)).splitlines()[0][:160]}") from None
        if not got:
            conn.close()
            return False
        self._conn = conn
        self.backend_pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar())
        return True

    # -- flock -----------------------------------------------------------------------------
    def _flock_acquire(self) -> bool:
        assert self.path is not None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise LakeError(f"ruler lease: {self.path}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        with contextlib.suppress(OSError):  # who holds it, for a person looking
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{self.holder}\n".encode(), 0)
        self._fd = fd
        return True

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
            self.backend_pid = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # (closing the last descriptor releases the flock)
            self._fd = None


def _halves(key: int) -> dict[str, int]:
    """pg_locks shows a bigint advisory key as classid (high 32 bits) and objid (low)."""
    u = key & 0xFFFFFFFFFFFFFFFF
    return {"hi": u >> 32, "lo": u & 0xFFFFFFFF}


def _lock_path(lake: Lake, name: str) -> Path:
    """The lock file, beside the SQLite catalog's file."""
    db = lake.catalog.engine.url.database or ""
    if db.startswith("file:"):  # (collector/lake.py's sqlite_url: escaped once more than SQLAlchemy unescapes)
        db = urllib.parse.unquote(db[5:].split("?", 1)[0])
    if not db or db == ":memory:":
        raise LakeError("ruler lease: a SQLite catalog in memory cannot be shared (give --catalog a file)")
    return Path(db).with_name(Path(db).name + f".{name}.lock")
