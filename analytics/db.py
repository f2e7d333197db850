"""Where the analytics library reads and writes: ``Database``.

A ``Database`` is one DuckDB file seen one of two ways:

- ``Database(path)`` (the CLI on a file no collector holds): ``read()`` opens the file
  read-only for the call, ``write()`` opens it for writing (migrations and views applied);
- ``Database.served(con, path)`` (inside the collector serving the file): ``read()`` is a
  cursor of the collector's connection in a ``READ ONLY`` transaction that is always rolled
  back, so nothing a read path runs can write, whatever the SQL; ``write()`` (fits, imports,
  stored findings) takes a cursor under the service's write lock, one at a time.

Every function of cmdare.analytics.api takes one; none opens a file of its own.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from cmdare.wire.units import duration_seconds

DEFAULT_DB = "cmdare.duckdb"


class AnalyticsError(Exception):
    """A problem a user can fix (missing database, bad argument); one line."""


def default_db() -> str:
    return os.environ.get("CMDARE_DB") or DEFAULT_DB


def open_ro(path: str | Path, config: dict[str, object] | None = None) -> duckdb.DuckDBPyConnection:
    """The file read-only (``config``: DuckDB settings for the connection), with one-line
    errors for a missing, locked or foreign file."""
    from cmdare.collector.db import DatabaseError, connect

    p = Path(path)
    if not p.exists():
        raise AnalyticsError(f"{p}: no such database (load one with cmdare-collector, or pass --db)")
    try:
        return connect(p, read_only=True, config=config)
    except DatabaseError as e:
        if "lock" in str(e).lower():
            raise AnalyticsError(
                f"{p}: locked by a running collector without its API (--http off), or one shutting down "
                "(its API goes first, the database a moment later): start it with the API, query a copy, "
                "or stop it (DuckDB allows one writer process)"
            ) from None
        raise AnalyticsError(f"{p}: cannot open as a DuckDB database: {e.detail or e}") from None


def open_rw(path: str | Path) -> duckdb.DuckDBPyConnection:
    """The file for writing, migrated, with the views (re)created."""
    from cmdare.collector.db import DatabaseError, connect

    try:
        return connect(path)
    except DatabaseError as e:
        raise AnalyticsError(str(e)) from None


T = TypeVar("T")


class Database:
    """One database file, opened per call (``Database(path)``) or served by a collector
    (``Database.served``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._live: duckdb.DuckDBPyConnection | None = None
        self._catalog = ""  # the served connection's database name (a cursor starts elsewhere)
        self._scopes: Any = None  # a served database's label-filtered views (scoping.Made)
        self._lock = threading.Lock()  # cursors are made one at a time
        self._write_lock = threading.Lock()
        # up to when the database holds everything sent (a serving collector's ingest
        # horizon; None: as of now, a file no collector is filling)
        self.horizon: Callable[[], dt.datetime | None] = lambda: None
        self._held: duckdb.DuckDBPyConnection | None = None  # a file kept open (``held``)

    @classmethod
    def served(cls, con: duckdb.DuckDBPyConnection, path: str | Path) -> Database:
        """The live database of a collector: ``con`` is its own connection (made on the
        thread calling this); requests take cursors of it."""
        d = cls(path)
        d._catalog = _q(con.execute("SELECT current_database()").fetchall()[0][0])
        d._live = con.cursor()
        from .scoping import Made

        d._scopes = Made()  # label-filtered tokens' views of it (analytics/scoping.py)
        return d

    @property
    def is_served(self) -> bool:
        return self._live is not None

    OFFLINE_AFTER = 120.0  # seconds a file's newest event may lie behind now before it is judged as of then
    judges_offline = True  # a plain file read here (a lake has its own horizon)

    def file_end(self) -> dt.datetime | None:
        """Where a file no collector is filling ends: its newest event time (``nodes.last_seen``)
        when that is more than OFFLINE_AFTER seconds ago; None for a served database, a lake,
        a file still current, or one with no node. Liveness in such a file is judged as of
        its end: an agent is never ``lost`` for a gap the file cannot see."""
        if self._live is not None or not self.judges_offline or not Path(self.path).exists():
            return None
        try:
            with self.read() as con:
                (t,) = con.execute("SELECT max(last_seen) FROM nodes").fetchone() or (None,)
        except (duckdb.Error, AnalyticsError):
            return None
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        return t if t is not None and (now - t).total_seconds() > self.OFFLINE_AFTER else None

    def exists(self) -> bool:
        return self._live is not None or Path(self.path).exists()

    def writable(self) -> bool:
        """Whether ``write()`` may be used: a served database, or a file this user may
        write (a file without write permission bits is a read-only copy, even to root)."""
        if self._live is not None:
            return True
        p = Path(self.path)
        return (p.exists() and os.access(p, os.W_OK) and bool(p.stat().st_mode & 0o222)
                and os.access(p.parent, os.W_OK))

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        assert self._live is not None
        with self._lock:
            c = self._live.cursor()
        c.execute(f"USE {self._catalog}")
        return c

    @contextlib.contextmanager
    def read(self, config: dict[str, object] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection that cannot write (``config``: settings for a file opened here; a
        served database has them instance-wide)."""
        if self._live is None:
            _unscoped("read a database file")
            if self._held is not None and not config:
                with self._lock:
                    cur = self._held.cursor()
                try:
                    yield cur
                finally:
                    cur.close()
                return
            con = open_ro(self.path, config)
            try:
                yield con
            finally:
                con.close()
            return
        from . import scoping

        cur = self._cursor()
        scope = scoping.current()  # a label-filtered token's request: its views only
        attached = None
        try:
            if scope is not None:
                attached = scoping.attach(cur, scope, self._scopes)
            cur.execute("BEGIN TRANSACTION READ ONLY")
            yield cur
        finally:
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
            if attached is not None:
                scoping.detach(cur, attached, self._scopes)
            cur.close()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A file's many reads on one read-only connection (a report's hundreds of calls:
        opening the file was half of each): within, ``read()`` gives cursors of it. A write
        within closes it first (reads then open the file each time again)."""
        if self._live is not None or self._held is not None:
            yield
            return
        self._held = open_ro(self.path)
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        with self._lock:
            con, self._held = self._held, None
        if con is not None:
            con.close()

    @contextlib.contextmanager
    def write(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection that writes: the file opened for writing, or a cursor of the served
        connection under the write lock."""
        _unscoped("write")
        self._release()  # a held read-only connection would refuse the writer's open
        if self._live is None:
            con = open_rw(self.path)
            try:
                yield con
            finally:
                con.close()
            return
        with self._write_lock:
            cur = self._cursor()
            try:
                yield cur
            finally:
                cur.close()

    def close(self) -> None:
        if self._live is not None:
            with contextlib.suppress(duckdb.Error):
                self._live.close()


def has_view(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the database has the rollup view ``name`` (collector/rollup.py; a database
    from before its migration reads the raw rows)."""
    return bool(con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ? AND NOT internal",
                            [name]).fetchall()[0][0])


def has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    """Whether ``table`` (or view) has ``column`` (a rollup column a migration added)."""
    return bool(con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = ? "
                            "AND column_name = ?", [table, column]).fetchall()[0][0])


def _unscoped(what: str) -> None:
    """Refuse what a label-filtered token's request may not do (fail closed)."""
    from . import scoping

    scope = scoping.current()
    if scope is not None:
        raise AnalyticsError(f"token {scope.token} sees only {scope}: it cannot {what}")


def _q(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


SINCE_UNITS = ("s", "m", "h", "d", "w")


EARLIEST, LATEST = dt.datetime(1970, 1, 1), dt.datetime(2200, 1, 1)  # what a time argument may name (UTC)
TIME_RANGE = f"a time from {EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d} (UTC)"


def in_time_range(t: dt.datetime) -> bool:
    """Whether ``t`` (naive UTC, or with a zone) is from 1970 to 2200: what telemetry can
    hold; outside it an argument is refused in one line, never an overflow deeper down."""
    u = t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo is not None else t
    return EARLIEST <= u <= LATEST


def _ago(flag: str, text: str, seconds: float, now: dt.datetime | None) -> dt.datetime:
    """``seconds`` before ``now``; a duration reaching before 1970 (``--since 100000d``:
    everything) is 1970-01-01."""
    now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    if not in_time_range(now):
        raise AnalyticsError(f"{flag}: this machine's clock ({now:%Y-%m-%d}) is not {TIME_RANGE}")
    try:
        return max(EARLIEST, now - dt.timedelta(seconds=seconds))
    except OverflowError:
        return EARLIEST


def since_cutoff(since: str | None, now: dt.datetime | None = None) -> dt.datetime | None:
    """``10m`` / ``2h`` / ``7d`` -> naive UTC datetime; None -> no cutoff."""
    if since is None:
        return None
    seconds = duration_seconds(since, SINCE_UNITS, bare=False)
    if seconds is None:
        raise AnalyticsError(f"--since: expected a duration like 30s, 10m, 2h or 7d, got {since[:40]!r}")
    return _ago("--since", since, seconds, now)


def time_arg(flag: str, text: str | None, now: dt.datetime | None = None) -> dt.datetime | None:
    """A point in time given as a duration ago (``10m``, ``2h``, ``7d``) or as an ISO 8601
    time (``2026-05-19T14:00``, UTC unless it says otherwise) -> naive UTC; None -> none."""
    if text is None:
        return None
    seconds = duration_seconds(text, SINCE_UNITS, bare=False)
    if seconds is not None:
        return _ago(flag, text, seconds, now)
    try:
        t = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise AnalyticsError(f"{flag}: expected a duration ago (10m, 2h, 7d) or an ISO 8601 time, "
                             f"got {text[:40]!r}") from None
    if not in_time_range(t):
        raise AnalyticsError(f"{flag}: {text[:40]!r} is not {TIME_RANGE}")
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return t


def every_seconds(text: str | None) -> float | None:
    """``--every 1m`` -> 60.0 (at least 1 s); None -> no bucketing."""
    if text is None:
        return None
    seconds = duration_seconds(text, SINCE_UNITS, bare=False)
    if seconds is None or not 1 <= seconds < 1e9:
        raise AnalyticsError(f"--every: expected a duration of at least 1s like 30s, 1m, 1h, got {text[:40]!r}")
    return float(seconds)


def read_text_file(path: str | Path, limit: int, what: str, where: str = "",
                   error: type[Exception] = AnalyticsError) -> str:
    """A regular text file of at most ``limit`` bytes (read no further: a FIFO, a device or
    a socket is refused without waiting on it); ``error`` (one line, starting with
    ``where``, default the path) never quotes the file's content."""
    import stat

    where = where or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO's open does not wait for a writer
    except OSError as e:
        raise error(f"{where}: cannot read: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a device or socket"
            raise error(f"{where}: {kind}, not a regular file")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{where}: cannot read: {e.strerror}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB" if limit >= 1 << 10 else f"{limit} bytes"
        raise error(f"{where}: larger than {size}: not {what}")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise error(f"{where}: not a text file") from None


def retry_conflicts(fn: Callable[[], T], tries: int, pause: float = 0.05) -> T:
    """``fn()``, again after a DuckDB write-write conflict (another thread's transaction on
    the same rows), up to ``tries`` times; the last conflict is raised."""
    for i in range(tries):
        try:
            return fn()
        except duckdb.TransactionException:
            if i == tries - 1:
                raise
            time.sleep(pause)
    raise AssertionError("tries must be at least 1")
