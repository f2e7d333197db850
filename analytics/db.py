"""Read-only access to the collector's database for analyses."""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb

from cmdare.wire.units import duration_seconds

DEFAULT_DB = "cmdare.duckdb"


class AnalyticsError(Exception):
    """A problem a user can fix (missing database, bad argument); one line."""


def default_db() -> str:
    return os.environ.get("CMDARE_DB") or DEFAULT_DB


# Inside a collector's API (collector/service.py) the database is the collector's own open
# connection: every open below takes a cursor of it instead of opening the file (which the
# collector holds). (factory, the database path it serves)
_LIVE: contextvars.ContextVar[tuple[Callable[[], duckdb.DuckDBPyConnection], str] | None] = contextvars.ContextVar(
    "cmdare_live_db", default=None
)


@contextlib.contextmanager
def live(factory: Callable[[], duckdb.DuckDBPyConnection], path: str) -> Iterator[None]:
    """Within it, opening ``path`` (read-only or for writing) gives ``factory()``: a cursor
    of the connection of the collector serving it."""
    tok = _LIVE.set((factory, os.path.abspath(path)))
    try:
        yield
    finally:
        _LIVE.reset(tok)


def live_cursor(path: str | Path) -> duckdb.DuckDBPyConnection | None:
    """A cursor of the live connection when ``path`` is the database being served here."""
    cur = _LIVE.get()
    if cur is not None and os.path.abspath(str(path)) == cur[1]:
        return cur[0]()
    return None


def open_ro(path: str | Path, config: dict[str, object] | None = None) -> duckdb.DuckDBPyConnection:
    served = live_cursor(path)
    if served is not None:
        return served
    p = Path(path)
    if not p.exists():
        raise AnalyticsError(f"{p}: no such database (load one with cmdare-collector, or pass --db)")
    try:
        return duckdb.connect(str(p), read_only=True, config=config or {})
    except duckdb.Error as e:
        first = str(e).splitlines()[0]
        if "lock" in first.lower():
            raise AnalyticsError(
                f"{p}: locked by a running collector without its API (--http off): start it with the API, "
                "query a copy, or stop it (DuckDB allows one writer process)"
            ) from None
        raise AnalyticsError(f"{p}: cannot open as a DuckDB database: {first}") from None


SINCE_UNITS = ("s", "m", "h", "d", "w")


def since_cutoff(since: str | None, now: dt.datetime | None = None) -> dt.datetime | None:
    """``10m`` / ``2h`` / ``7d`` -> naive UTC datetime; None -> no cutoff."""
    if since is None:
        return None
    seconds = duration_seconds(since, SINCE_UNITS, bare=False)
    if seconds is None:
        raise AnalyticsError(f"--since: expected a duration like 30s, 10m, 2h or 7d, got {since!r}")
    now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    return now - dt.timedelta(seconds=seconds)
