"""The views and table macros analyses read, as SQL files in ``collector/schema/views/`` (one
object per file, named after it).  Migrations (``schema/NNN_*.sql``) hold tables only; these are
re-created with ``CREATE OR REPLACE`` whenever a database is migrated or opened for
writing, so the logic in force is always the file, never a replay of migrations.

- ``instance_lives(lost_after := 3, asof_ts := NULL)``: every life of a VM and how it ended
  (revoked / stopped / lost)
- ``instances``: ``instance_lives()`` with the default liveness rule
- ``step_hardware``: each step aggregate next to its node's GPU and CPU use over its interval
"""

from __future__ import annotations

from importlib import resources

import duckdb

# in dependency order: a view after the macros and views it reads
VIEWS = ("instance_lives", "instances", "step_hardware")


def sql(name: str) -> str:
    """The SQL of one view or macro."""
    return resources.files("cmdare.collector").joinpath("schema", "views", f"{name}.sql").read_text()


def apply(con: duckdb.DuckDBPyConnection) -> None:
    """Create or replace every view and macro, in one transaction."""
    con.execute("BEGIN")
    try:
        for name in VIEWS:
            con.execute(sql(name))
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
