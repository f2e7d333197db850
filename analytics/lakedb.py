"""``LakeDatabase``: the analytics library over an Apache Iceberg lake (collector/lake.py),
through DuckDB, so every command, detector, fit, rule and page runs unchanged on it.

Each ``read()`` / ``write()`` is an in-memory DuckDB connection holding the schema of a
database file, where

- each table the collectors append is a view over the Parquet files of the table's current
  Iceberg snapshot, as its metadata plans them (DuckDB then skips the row groups a query's
  filters exclude by their statistics);
- ``nodes`` aggregates the collectors' per-round node rows (first seen the least, role,
  job and labels of the newest);
- the tables analyze writes (findings, fits, alerts, imported overhead records) are loaded
  whole (they are small), and ``write()`` replaces in the lake those a command changed;
- the 1- and 5-minute rollup views (``gpu_5m``, ``steps_5m``, ...) aggregate the rows.

``read()`` cannot change the lake: nothing it does leaves the process's memory.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

import duckdb

from cmdare.collector import lakerollup, rollup
from cmdare.collector.ingest import storage
from cmdare.collector.lake import APPENDED, DERIVED, MARKER, NAMESPACE, Lake, LakeError, lake_io

from .db import AnalyticsError, Database, _q

NODES_SQL = """SELECT node, arg_max(role, last_seen) AS role,
    arg_max(job, last_seen) FILTER (WHERE job IS NOT NULL) AS job, arg_max(labels, last_seen) AS labels,
    min(first_seen) AS first_seen, max(last_seen) AS last_seen
FROM ({src}) GROUP BY node"""


# tables a lake's ruler also reads straight from Kafka (analytics/server/lakeruler.py FastPath):
# the lake's rows in lake_<t>, the rows read ahead of a commit in fast_<t>, and <t> the view
# of both (a row in both, by its event id, once)
FAST = ("revocations", "lifecycle_events")

# sources whose newest commit is this much older than the newest of any are left out of the
# horizon: a partition no agent writes to any more would otherwise hold it back forever
HORIZON_QUIET = 600.0


def lake_horizon(con: duckdb.DuckDBPyConnection, commits: str = MARKER) -> dt.datetime | None:
    """Up to when the lake holds everything sent (liveness is judged as of it, as a
    collector judges it as of its ingest horizon): the oldest of each source's (Kafka
    partition's, spool's) newest commit, among the sources committed within
    ``HORIZON_QUIET`` seconds of the newest commit. None: nothing committed yet."""
    row = con.execute(f"""WITH newest AS (SELECT source, max(committed_at) AS t FROM {commits} GROUP BY source)
        SELECT min(t) FILTER (WHERE t >= (SELECT max(t) FROM newest) - to_seconds({HORIZON_QUIET}))
        FROM newest""").fetchone()
    return row[0] if row else None


class LakeDatabase(Database):
    """An Iceberg lake seen as a database (``path``: the lake's URI)."""

    judges_offline = False  # liveness as of the lake's own horizon

    def __init__(self, uri: str, catalog: str | None = None) -> None:
        super().__init__(uri)
        try:
            self.lake = Lake(uri, catalog, create=False)
        except LakeError as e:
            raise AnalyticsError(str(e)) from None
        self._horizon: dt.datetime | None = None
        self.horizon = self._lake_horizon
        self._ruled = False  # the alert state read from a ruler's tables in the catalog

    def _lake_horizon(self) -> dt.datetime | None:
        """The lake's horizon as of the planned connection (planned here when no read has)."""
        if self._live is None:
            with self.read():
                pass
        return self._horizon

    def exists(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    @contextlib.contextmanager
    def read(self, config: dict[str, object] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """The lake as of this object's first read (planned once: a report's many reads
        share it), served as a collector's connection is (a read-only transaction, always
        rolled back); with ``config`` (user SQL's guards), a connection of its own."""
        from .db import _unscoped

        _unscoped("read a lake (label filters apply to a collector's database)")
        if config:
            con = self._open(config)
            try:
                yield con
            finally:
                con.close()
            return
        with self._lock:
            if self._live is None:
                self._live = self._open(None)
                self._catalog = _q(self._live.execute("SELECT current_database()").fetchall()[0][0])
        with super().read() as cur:
            yield cur

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Nothing to hold: every read shares the lake's one planned connection already."""
        yield

    @contextlib.contextmanager
    def write(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._write_lock:
            con = self._open(None)
            try:
                # (the ruler's alert state is the catalog's: never written back as a lake table)
                with written(self.lake, con, ("alerts", "alert_rules") if self._ruled else ()) as changed:
                    yield con
                if changed:
                    self.forget()
            except LakeError as e:
                raise AnalyticsError(str(e)) from None
            finally:
                con.close()

    def forget(self) -> None:
        """Plan the lake again at the next read (after this object wrote to it)."""
        with self._lock:
            if self._live is not None:
                self._live.close()
            self._live = None

    def close(self) -> None:
        self.forget()

    def _open(self, config: dict[str, object] | None, fast: bool = False) -> duckdb.DuckDBPyConnection:
        """A connection planned at the lake's current snapshots; ``fast``: each ``FAST``
        table read as the view of its lake rows (``lake_<t>``) and the rows a ruler read
        ahead of the lake (``fast_<t>``, empty here), as a lake server's replica holds them."""
        from cmdare.collector import views
        from cmdare.collector.db import migrate

        cfg: dict[str, Any] = dict(config or {})
        # the guards of user SQL (safesql.CONFIG) are set once the views exist: the lake's
        # files stay readable through them (allowed_directories), nothing else is
        closed = cfg.pop("enable_external_access", True) is False
        lock = bool(cfg.pop("lock_configuration", False))
        con = duckdb.connect(":memory:", config=cfg)
        try:
            # each query re-reads the footers of every file its views name, without this: a
            # detector run names the rollups' files some 30 times (bench/findings.py --lake)
            con.execute("SET parquet_metadata_cache = true")
            migrate(con)
            if fast:
                for t in FAST:
                    con.execute(f"ALTER TABLE {t} RENAME TO lake_{t}")
                    con.execute(f"CREATE TABLE fast_{t} AS SELECT * FROM lake_{t} LIMIT 0")
                    con.execute(f"CREATE VIEW {t} AS SELECT * FROM lake_{t} UNION ALL BY NAME "
                                f"SELECT * FROM fast_{t} WHERE id NOT IN (SELECT id FROM lake_{t})")
            present = self.lake.names()
            ruled = _ruler_state(self.lake)  # the servers' ruler keeps the alert state in the catalog
            self._ruled = ruled is not None
            for t in (*APPENDED, *DERIVED):
                if ruled is not None and t in ruled:
                    if ruled[t]:
                        con.executemany(f"INSERT INTO {t} VALUES ({', '.join('?' * len(ruled[t][0]))})", ruled[t])
                    continue
                self._plan(con, t, present, fast)
            # the rollups maintenance built (collector/lakerollup.py): a day of a source is
            # read from them while the source's files for that day are the ones they were
            # built from; other days are pending, aggregated from the raw files
            for r in rollup.ROLLUPS:
                self._plan(con, r.table, present, fast)
            con.execute("DROP TABLE rollup_dirty")
            self._plan_dirty(con, present)
            views.apply(con)
            if config is None:  # (liveness as of the lake's horizon: never lost for want of a commit)
                commits = self.lake.files(MARKER) if MARKER in present else []
                self._horizon = lake_horizon(con, _read(commits)) if commits else None
            if closed:
                loc = self.lake.location
                # the tables' files only (NAMESPACE/...): not the catalog file beside them
                base = str(loc.local) if loc.local is not None else loc.warehouse.rstrip("/")
                where = f"{base}/{NAMESPACE}/"
                con.execute("SET allowed_directories = $d", {"d": [where]})
                con.execute("SET enable_external_access = false")
            if lock:
                con.execute("SET lock_configuration = true")
        except OSError as e:
            con.close()
            raise AnalyticsError(f"{self.path}: {lake_io(e)}") from None
        except BaseException:
            con.close()
            raise
        return con

    def replan(self, con: duckdb.DuckDBPyConnection, moved: set[str], fast: bool = False) -> None:
        """Plan again on ``con`` (made by ``_open``) only the tables whose metadata location
        moved (``moved``: their names): a collector's commit moves a few tables, and planning
        the whole lake again costs every table's metadata (0.3-0.5 s on a small lake)."""
        try:
            present = self.lake.names()
            for t in (*APPENDED, *DERIVED, *(r.table for r in rollup.ROLLUPS)):
                if t in moved and not (self._ruled and t in ("alerts", "alert_rules")):
                    self._plan(con, t, present, fast, again=True)
            if moved & {*rollup.SOURCES, *(r.table for r in rollup.ROLLUPS)}:
                self._plan_dirty(con, present)
        except OSError as e:
            raise AnalyticsError(f"{self.path}: {lake_io(e)}") from None

    def _plan(self, con: duckdb.DuckDBPyConnection, t: str, present: set[str], fast: bool,
              again: bool = False) -> None:
        """Table ``t`` as its current snapshot's files: a view over them (the rows of a
        table analyze writes, loaded); none, the empty table (``again``: emptied)."""
        name = f"lake_{t}" if fast and t in FAST else t
        files = self.lake.files(t) if t in present else []
        kind = _kind(con, name)
        if t in DERIVED:
            if again:
                con.execute(f"DELETE FROM {t}")
            if files:
                con.execute(f"INSERT INTO {t} SELECT {_casts(con, t, files)} FROM {_read(files)}")
            return
        if not files:
            if again and kind == "VIEW" and not (t in storage.STORED and _kind(con, storage.stored(t))):
                cols = ", ".join(f'NULL::{ty} AS "{c}"' for c, ty in _columns(con, name))
                con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT {cols} WHERE false")
            return  # the empty table stays
        src = f"SELECT {_casts(con, name, files)} FROM {_read(files)}"
        if t in storage.STORED and _kind(con, storage.stored(t)):
            # a view over its packed table: the lake has every field by name
            con.execute(f"DROP VIEW {name}")
            con.execute(f"DROP TABLE {storage.stored(t)}")
        elif kind == "BASE TABLE":
            con.execute(f"DROP TABLE {name}")
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {NODES_SQL.format(src=src) if t == 'nodes' else src}")

    def _plan_dirty(self, con: duckdb.DuckDBPyConnection, present: set[str]) -> None:
        pending = []
        for src in rollup.SOURCES:
            days, todo = lakerollup.pending_days(self.lake, src, present, fresh=False)
            files = [f for d in sorted(todo) for f in days[d]]
            if files:
                pending.append(f"SELECT node, min(ts) AS lo, max(ts) AS hi, '{src}' AS src "
                               f"FROM {_read(files)} GROUP BY node")
        con.execute("CREATE OR REPLACE VIEW rollup_dirty AS " + (" UNION ALL ".join(pending) if pending else
                    "SELECT NULL::VARCHAR AS node, NULL::TIMESTAMP AS lo, NULL::TIMESTAMP AS hi, "
                    "NULL::VARCHAR AS src WHERE false"))


def _kind(con: duckdb.DuckDBPyConnection, name: str) -> str | None:
    """'BASE TABLE', 'VIEW', or None: what ``name`` is in the connection's main schema."""
    row = con.execute("SELECT table_type FROM information_schema.tables WHERE table_schema = 'main' "
                      "AND table_name = ? AND table_catalog = current_database()", [name]).fetchone()
    return row[0] if row else None


def _columns(con: duckdb.DuckDBPyConnection, name: str) -> list[tuple[str, str]]:
    return [(c, ty) for c, ty in con.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? AND table_schema = 'main' "
        "AND table_catalog = current_database() ORDER BY ordinal_position", [name]).fetchall()]


@contextlib.contextmanager
def written(lake: Lake, con: duckdb.DuckDBPyConnection, skip: Any = ()) -> Iterator[list[str]]:
    """Replace in ``lake`` each table analyze writes (``DERIVED``) that the block changed on
    ``con`` (``analyze --lake``'s connection, or a lake server's replica); the list yielded
    holds them afterwards."""
    tables = [t for t in DERIVED if t not in skip]  # (skip: tables kept elsewhere, a ruler's alert state)
    before = {t: _digest(con, t) for t in tables}
    changed: list[str] = []
    yield changed
    for t in tables:
        if _digest(con, t) != before[t]:
            lake.replace(t, con.sql(f"SELECT * FROM {t}").to_arrow_table())
            changed.append(t)


def _ruler_state(lake: Lake) -> dict[str, list[tuple[Any, ...]]] | None:
    """The alert state a lake's ruler keeps in the catalog (analytics/server/lakeruler.py), as the
    ``alerts`` and ``alert_rules`` rows; None when no ruler ever ran over this lake."""
    from sqlalchemy import inspect

    from .alertstore import AlertStore

    engine = lake.catalog.engine
    if not inspect(engine).has_table(AlertStore.ALERTS):
        return None
    alerts, rules = AlertStore(engine).load()
    return {"alerts": alerts, "alert_rules": rules}


def _digest(con: duckdb.DuckDBPyConnection, table: str) -> Any:
    return con.execute(f"SELECT count(*), md5(coalesce(string_agg(x::VARCHAR, '|' ORDER BY x::VARCHAR), '')) "
                       f"FROM {table} x").fetchall()[0]


def _list(files: list[str]) -> str:
    return "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"


def _read(files: list[str]) -> str:
    """The Parquet files of one table, columns matched by name: files written before a
    migration added a column (a lake made by an older cmdare) read it as null."""
    return f"read_parquet({_list(files)}, union_by_name = true)"


def _casts(con: duckdb.DuckDBPyConnection, table: str, files: list[str]) -> str:
    """The SELECT list that reads a table's Parquet columns as the migrations' types (null
    for a column none of the files has). A column already of its type is read as it is: a
    cast in the view would keep a filter on it (a time range) from pruning row groups."""
    have = {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM {_read(files)}").fetchall()}
    out = []
    for c, ty in _columns(con, table):
        if c not in have:
            out.append(f'NULL::{ty} AS "{c}"')
        elif have[c] == ty:
            out.append(f'"{c}"')
        else:
            out.append(f'CAST("{c}" AS {ty}) AS "{c}"')
    return ", ".join(out)
