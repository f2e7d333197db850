"""Opening the DuckDB database file and applying schema migrations in order.

Migrations are ``schema/NNN_name.sql`` files that create and change tables; each is
applied once, in its own transaction, and recorded in ``schema_migrations`` (version, name,
applied_at).  Views and table macros are not migrations: after migrating, every writable
open re-creates them from their files (cmdare.analytics.views).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb

from . import views
from .ingest import storage

MIGRATION = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


class DatabaseError(Exception):
    """The database file cannot be used; the message says why in one line (``detail``:
    DuckDB's own first line, where it gave one)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def migrations() -> list[tuple[int, str, str]]:
    out = []
    for f in (Path(__file__).parent / "schema").iterdir():
        m = MIGRATION.match(f.name)
        if m:
            out.append((int(m.group(1)), m.group(2), f.read_text()))
    return sorted(out)


# Rows per row group in tables this process writes (DuckDB's default: 122,880).  Rows of
# a transaction that do not fill a row group go through the WAL and are compressed again
# at the next checkpoint; with the collector's batches (~230k GPU samples at 64 MiB,
# appended by two threads) most rows did, at the default.  Measured: a plain insert of
# 1.2M GPU samples in 230k-row transactions, checkpoints included, 2.2-3.3 -> 1.0-1.4 us a
# row; file size (27-30 MiB) and the time of two analyze-like queries within noise.
# DuckDB does not keep the size in the file: every writable connection attaches with it.
ROW_GROUP_SIZE = 30720


def connect(path: str | Path, read_only: bool = False,
            config: dict[str, Any] | None = None, as_is: bool = False) -> duckdb.DuckDBPyConnection:
    """The one place a database file is opened: read-only (``config``: DuckDB settings for
    that connection), or for writing with the migrations applied. Views are the analytics
    re-created on every open for writing (collector/views.py). ``as_is``: opened for
    writing as it is (a lake server's replica: its own shape, checked by its owner)."""
    path = str(path)
    if read_only and not Path(path).exists():
        raise DatabaseError(f"{path}: no such database (load data with cmdare-collector first)")
    try:
        if read_only:
            con = duckdb.connect(path, read_only=True, config=config or {})
        else:
            con = duckdb.connect()
            try:
                con.execute(f"ATTACH {_q(path)} AS cmdare (ROW_GROUP_SIZE {ROW_GROUP_SIZE})")
            except BaseException:
                con.close()
                raise
            con.execute("USE cmdare")
    except duckdb.IOException as e:
        msg = str(e).splitlines()[0]
        if "lock" in msg.lower():
            raise DatabaseError(
                f"{path}: database is locked by another process (a running collector?)", msg
            ) from None
        raise DatabaseError(f"{path}: cannot open: {msg}", msg) from None
    except duckdb.Error as e:
        msg = str(e).splitlines()[0]
        if "already attached" in msg:
            raise DatabaseError(f"{path}: database is already open for writing in this process", msg) from None
        raise DatabaseError(f"{path}: not a DuckDB database or unreadable: {msg}", msg) from None
    if not read_only and not as_is:
        migrate(con)
        views.apply(con)
    return con


def cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A cursor (another thread's connection) on ``con``'s database.  A writable connection
    attaches the file under the name ``cmdare`` (for its row group size); a plain
    ``con.cursor()`` starts in DuckDB's in-memory catalog and does not see the tables."""
    cur = con.cursor()
    cur.execute(f"USE {_q(con.execute('SELECT current_database()').fetchall()[0][0])}")
    return cur


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def migrate(con: duckdb.DuckDBPyConnection) -> list[int]:
    con.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
        version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL)""")
    done = {r[0] for r in con.execute("SELECT version FROM schema_migrations").fetchall()}
    applied = []
    for version, name, sql in migrations():
        if version in done:
            continue
        con.execute("BEGIN")
        try:
            con.execute(sql)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, now()::TIMESTAMP)", [version, name])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        applied.append(version)
    storage.create_views(con)  # GPU samples read by name over their packed table (migration 018)
    known = {v for v, _, _ in migrations()}
    newer = sorted(done - known)
    if newer:
        raise DatabaseError(
            f"database has schema version {newer[-1]}, newer than this collector knows: upgrade cmdare"
        )
    return applied
