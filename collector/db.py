"""Opening the DuckDB database file and applying schema migrations in order.

Migrations are ``schema/NNN_name.sql`` files; each is applied once, in its own
transaction, and recorded in ``schema_migrations`` (version, name, applied_at).
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

MIGRATION = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


class DatabaseError(Exception):
    """The database file cannot be used; the message says why in one line."""


def migrations() -> list[tuple[int, str, str]]:
    out = []
    for f in (Path(__file__).parent / "schema").iterdir():
        m = MIGRATION.match(f.name)
        if m:
            out.append((int(m.group(1)), m.group(2), f.read_text()))
    return sorted(out)


def connect(path: str | Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    path = str(path)
    if read_only and not Path(path).exists():
        raise DatabaseError(f"{path}: no such database (load data with cmdare-collector first)")
    try:
        con = duckdb.connect(path, read_only=read_only)
    except duckdb.IOException as e:
        msg = str(e).splitlines()[0]
        if "lock" in msg.lower():
            raise DatabaseError(
                f"{path}: database is locked by another process (a running collector?)"
            ) from None
        raise DatabaseError(f"{path}: cannot open: {msg}") from None
    except duckdb.Error as e:
        raise DatabaseError(
            f"{path}: not a DuckDB database or unreadable: {str(e).splitlines()[0]}"
        ) from None
    if not read_only:
        migrate(con)
    return con


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
    known = {v for v, _, _ in migrations()}
    newer = sorted(done - known)
    if newer:
        raise DatabaseError(
            f"database has schema version {newer[-1]}, newer than this collector knows: upgrade cmdare"
        )
    return applied
