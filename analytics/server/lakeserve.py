"""The server tier over a lake (``cmdare-collector serve --lake``): the API, the pages and
``/metrics`` of a database file, answered from an Apache Iceberg lake by any number of
replicas, each stateless apart from the lake, its catalog and a cache it can rebuild (kept
across restarts in ``--cache-dir``: a restart reads only what the lake changed since).

A replica keeps what it has read (``LakeReplica``): a DuckDB database (a file in a private
cache directory) with the schema of a database file, where

- each table the collectors append holds the rows of the Parquet files its current
  snapshot plans; a new snapshot that only added files (what collectors' commits do) is
  read incrementally: the added files' rows are inserted, nothing else is read again; one
  that removed files (compaction, retention, a replaced table) reloads that table;
- ``nodes`` aggregates the collectors' per-round node rows (``lakedb.NODES_SQL``), and
  ``lake_commits`` (a row per commit and source: the horizon's input) is read the same way;
- the tables ``analyze`` writes (findings, fits, alerts ...) and the rollup tables
  ``maintain`` builds are reloaded whole when their snapshot changes (they are small);
- ``rollup_dirty`` is made again from the days whose rollups do not hold the source's
  current files (collector/lakerollup.py), so the rollup views read exactly as on a file.

``refresh()`` asks the catalog for every table's metadata location in one query and reads
only the tables whose location moved, then applies the change in one transaction: a
request sees the lake as of one refresh or the next, never half of one. The Parquet files
are read with pyarrow: the served connection has DuckDB's external access off (as a
collector's), so no query it answers can open a file.

``LakeServed`` is that database as the HTTP service sees a collector's (cursors in
read-only transactions, label-filtered scopes); its ``write()`` (fits, stored findings)
writes the lake's table as ``analyze --lake`` does. Liveness is judged as of the lake's
own horizon (``lake_horizon``): never ``lost`` for an agent whose events are merely not
yet committed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb

from cmdare.collector import lakerollup, rollup
from cmdare.collector.ingest import storage
from cmdare.collector.lake import APPENDED, DERIVED, MARKER, Lake, LakeError, _path, time_column

from ..db import AnalyticsError, Database, _q, _unscoped
from ..lakedb import FAST, NODES_SQL, lake_horizon  # noqa: F401  (FAST: the read-ahead tables)

log = logging.getLogger("cmdare.analytics.server.lakeserve")
NODE_ROWS = "lake_node_rounds"  # the collectors' per-round node rows (``nodes`` aggregates them)
WHOLE = (*DERIVED, *rollup.TABLES)  # reloaded whole when their snapshot changes
# appended and read incrementally: the event tables, nodes' rounds, and the commit marker (a
# file per commit: read whole each time, a week's markers would be read every refresh)
INCREMENTAL = (*APPENDED, MARKER)
FAST_MAX_ROWS = 100_000  # rows read ahead that a lake commit has not caught up with, at most
BATCH_ROWS = 128 * 1024  # rows of a Parquet file read at a time into the replica
STATE = "cmdare_replica"  # the schema of what a replica has read (kept with its rows, for a restart)
STATE_FORMAT = 1  # bump when the replica's shape changes (_restructure, FAST, these tables): read again


class LakeReplica:
    """What one server has read of a lake, kept current by ``refresh()``."""

    def __init__(self, lake: Lake, cache_dir: Path | None = None) -> None:
        from cmdare.collector import views
        from cmdare.collector.db import connect

        self.lake = lake
        self._own_dir = cache_dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="cmdare-serve-")) if cache_dir is None else cache_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "replica.duckdb"
        self.locations: dict[str, str] = {}  # table -> metadata location as last applied
        self.files: dict[str, dict[str, str | None]] = {}  # table -> data file path -> its day ("" none)
        self.rolled: dict[str, dict[str, str]] = {}  # rollup table -> day -> fingerprint
        self.refreshed_at: float | None = None  # monotonic time of the last refresh that ran whole
        self.loaded_files = 0  # data files read since start (the incremental reads' count)
        self.horizon: dt.datetime | None = None
        self.elsewhere: set[str] = set()  # tables kept elsewhere (the alert state: the ruler's, in the catalog)
        self.after_refresh: list[Callable[[set[str]], None]] = []  # called with the tables each refresh changed
        self._lock = threading.Lock()  # one refresh at a time
        self.write_lock = threading.Lock()  # a refresh's apply and the service's writes, one at a time
        # a --cache-dir's replica from the last run, of this lake and this schema: kept, and
        # only what the lake changed since is read (a restart costs a refresh, not the lake)
        self.kept = not self._own_dir and self._reopen()
        if not self.kept:
            for p in (self.path, self.path.with_name(self.path.name + ".wal")):
                p.unlink(missing_ok=True)  # a cache: what a previous run left is read again from the lake
            self.con = connect(self.path)  # (migrated, with the views)
            self.catalog = _q(self.con.execute("SELECT current_database()").fetchall()[0][0])  # (cursors start elsewhere)
            self._restructure()
            views.apply(self.con)
            self.con.execute(f"CREATE SCHEMA {STATE}")
            self.con.execute(f"CREATE TABLE {STATE}.lake (name VARCHAR, format INTEGER)")
            self.con.execute(f"CREATE TABLE {STATE}.tables (tbl VARCHAR, location VARCHAR)")
            self.con.execute(f"CREATE TABLE {STATE}.files (tbl VARCHAR, path VARCHAR, day VARCHAR)")
            self.con.execute(f"CREATE TABLE {STATE}.rolled (tbl VARCHAR, day VARCHAR, fp VARCHAR)")
            self.con.execute(f"INSERT INTO {STATE}.lake VALUES (?, ?)", [self.lake.name, STATE_FORMAT])

    def _reopen(self) -> bool:
        """The replica a previous run left in the cache directory, when it is of this lake,
        this schema and this state format (what it had read: its tables' locations, files
        and rollup fingerprints, saved with each refresh's rows); else False (read again)."""
        from cmdare.collector.db import connect, migrations

        if not self.path.exists():
            return False
        try:
            con = connect(self.path, read_only=True)
            try:
                version = con.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]
                lake = con.execute(f"SELECT name, format FROM {STATE}.lake").fetchall()
            finally:
                con.close()
        except Exception as e:  # noqa: BLE001  (a broken or foreign cache: read again, said once)
            log.warning("%s: not reused (%s): reading the lake again", self.path,
                        str(e).splitlines()[0][:160] if str(e) else type(e).__name__)
            return False
        if version != max(m[0] for m in migrations()) or lake != [(self.lake.name, STATE_FORMAT)]:
            return False
        self.con = connect(self.path, as_is=True)  # (its own shape: migrated and restructured when made)
        try:
            self.catalog = _q(self.con.execute("SELECT current_database()").fetchall()[0][0])
            con = self.con
            self.locations = dict(con.execute(f"SELECT tbl, location FROM {STATE}.tables").fetchall())
            for t, path, day in con.execute(f"SELECT tbl, path, day FROM {STATE}.files").fetchall():
                self.files.setdefault(t, {})[path] = day
            for t, day, fp in con.execute(f"SELECT tbl, day, fp FROM {STATE}.rolled").fetchall():
                self.rolled.setdefault(t, {})[day] = fp
            for t in FAST:  # rows read ahead by a ruler of the last run: the fast path reads them again
                con.execute(f"DELETE FROM fast_{t}")
            self.horizon = lake_horizon(con)
        except BaseException:
            self.con.close()
            raise
        return True

    def _restructure(self) -> None:
        """Tables of the lake's shape: every field by name (no packed column), the nodes'
        per-round rows under ``nodes``' aggregate, the commit marker."""
        con = self.con
        for t in APPENDED:
            if t == "nodes":
                con.execute(f"CREATE TABLE {NODE_ROWS} AS SELECT * FROM nodes LIMIT 0")
                con.execute("DROP TABLE nodes")
                con.execute(f"CREATE VIEW nodes AS {NODES_SQL.format(src=f'SELECT * FROM {NODE_ROWS}')}")
            elif t in storage.STORED:
                con.execute(f"CREATE TABLE _lake_{t} AS SELECT * FROM {t} LIMIT 0")
                con.execute(f"DROP VIEW {t}")
                con.execute(f"DROP TABLE {storage.stored(t)}")
                con.execute(f"ALTER TABLE _lake_{t} RENAME TO {t}")
        for t in FAST:
            con.execute(f"ALTER TABLE {t} RENAME TO lake_{t}")
            con.execute(f"CREATE TABLE fast_{t} AS SELECT * FROM lake_{t} LIMIT 0")
            con.execute(f"CREATE VIEW {t} AS SELECT * FROM lake_{t} UNION ALL BY NAME "
                        f"SELECT * FROM fast_{t} WHERE id NOT IN (SELECT id FROM lake_{t})")
        con.execute("DROP TABLE rollup_dirty")
        con.execute("CREATE TABLE rollup_dirty (node VARCHAR, lo TIMESTAMP, hi TIMESTAMP, src VARCHAR)")
        con.execute(f"CREATE TABLE {MARKER} (committed_at TIMESTAMP, writer VARCHAR, source VARCHAR, "
                    '"start" BIGINT[], "end" BIGINT[], rows BIGINT)')

    # -- refresh ---------------------------------------------------------------------------
    def refresh(self) -> int:
        """Read what changed in the lake since the last refresh; the tables changed."""
        with self._lock:
            try:
                locs = self.lake.locations()
            except Exception as e:  # noqa: BLE001  (a catalog away: keep serving what was read)
                raise AnalyticsError(f"lake catalog: {str(e).splitlines()[0][:200]}") from None
            changed = sorted(t for t, loc in locs.items() if loc != self.locations.get(t) and self._known(t))
            if changed:
                with self.write_lock:
                    self._apply(changed, locs)
            self.refreshed_at = time.monotonic()
        for hook in self.after_refresh:
            hook(set(changed))
        return len(changed)

    def _known(self, t: str) -> bool:
        return (t in INCREMENTAL or t in WHOLE) and t not in self.elsewhere

    @contextlib.contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor of the replica in its own catalog (a new cursor starts elsewhere)."""
        cur = self.con.cursor()
        try:
            cur.execute(f"USE {self.catalog}")
            yield cur
        finally:
            cur.close()

    def read_ahead(self) -> dict[str, Any]:
        """The rows of each ``FAST`` table read ahead of the lake's commits (Arrow tables;
        only those with rows): what a rule's worker adds to its lake (analytics/server/sqlpool.py)."""
        out = {}
        with self.cursor() as cur:
            for t in FAST:
                rows = cur.sql(f"SELECT * FROM fast_{t}").to_arrow_table()
                if rows.num_rows:
                    out[t] = rows
        return out

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """``cursor()`` in one transaction: committed when the block ends, rolled back when
        it raises."""
        with self.cursor() as cur:
            cur.execute("BEGIN TRANSACTION")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    cur.execute("ROLLBACK")
                raise

    def positions(self) -> dict[str, int]:
        """How far the lake has stored each Kafka partition ("topic/partition" -> the
        offset after its last stored record), from the commits read."""
        with self.cursor() as cur:
            return {s: int(e) for s, e in cur.execute(
                f'SELECT source, max("end"[1]) FROM {MARKER} WHERE len("end") = 1 GROUP BY source').fetchall()
                if e is not None}

    def add_fast(self, table: str, rows: Any) -> int:
        """Rows of a ``FAST`` table read from Kafka ahead of the lake (an Arrow table of its
        columns): those not yet in the lake nor read before are added; how many."""
        assert table in FAST
        with self.write_lock, self.transaction() as cur:
            cur.register("_fast", rows)
            before = cur.execute(f"SELECT count(*) FROM fast_{table}").fetchall()[0][0]
            cur.execute(f"INSERT INTO fast_{table} BY NAME SELECT * FROM _fast WHERE id NOT IN "
                        f"(SELECT id FROM lake_{table} UNION ALL SELECT id FROM fast_{table}) "
                        "QUALIFY row_number() OVER (PARTITION BY id) = 1")
            after = cur.execute(f"SELECT count(*) FROM fast_{table}").fetchall()[0][0]
            if after > FAST_MAX_ROWS:  # the lake far behind: the oldest read ahead go (the lake has them later)
                cur.execute(f"DELETE FROM fast_{table} WHERE ts < (SELECT ts FROM fast_{table} ORDER BY ts DESC "
                            f"LIMIT 1 OFFSET {FAST_MAX_ROWS - 1})")
            return max(0, after - before)

    def _apply(self, changed: list[str], locs: dict[str, str]) -> None:
        plans: dict[str, tuple[Any, dict[str, str | None]]] = {}
        for t in changed:
            tbl = self.lake.table(t)
            plans[t] = (tbl, _plan(tbl))
        with self.transaction() as cur:
            for t in changed:
                tbl, files = plans[t]
                self._load(cur, t, files)
                if t in rollup.TABLES:
                    self.rolled[t] = lakerollup.rolled(tbl)
            if any(t in rollup.SOURCES or t in rollup.TABLES for t in changed):
                self._dirty(cur, {**self.files, **{t: plans[t][1] for t in changed}})
            if MARKER in changed:
                self.horizon = lake_horizon(cur)
            for t in FAST:  # read ahead, now in the lake
                if t in changed:
                    cur.execute(f"DELETE FROM fast_{t} WHERE id IN (SELECT id FROM lake_{t})")
            self._save(cur, changed, locs, plans)
        for t in changed:
            self.locations[t] = locs[t]
            self.files[t] = plans[t][1]

    def _save(self, cur: duckdb.DuckDBPyConnection, changed: list[str], locs: dict[str, str],
              plans: dict[str, tuple[Any, dict[str, str | None]]]) -> None:
        """What this refresh read, in the same transaction as its rows (a restart over the
        cache directory reads only what the lake changed since)."""
        cur.execute(f"DELETE FROM {STATE}.tables WHERE tbl IN (SELECT unnest($t::VARCHAR[]))", {"t": changed})
        cur.execute(f"DELETE FROM {STATE}.files WHERE tbl IN (SELECT unnest($t::VARCHAR[]))", {"t": changed})
        cur.executemany(f"INSERT INTO {STATE}.tables VALUES (?, ?)", [(t, locs[t]) for t in changed])
        rows = [(t, path, day) for t in changed for path, day in plans[t][1].items()]
        if rows:  # (one statement: executemany is a statement a row)
            cur.execute(f"INSERT INTO {STATE}.files SELECT unnest($t::VARCHAR[]), unnest($p::VARCHAR[]), "
                        "unnest($d::VARCHAR[])", {"t": [r[0] for r in rows], "p": [r[1] for r in rows],
                                                   "d": [r[2] for r in rows]})
        rolled = [t for t in changed if t in rollup.TABLES]
        if rolled:
            cur.execute(f"DELETE FROM {STATE}.rolled WHERE tbl IN (SELECT unnest($t::VARCHAR[]))", {"t": rolled})
            fps = [(t, d, fp) for t in rolled for d, fp in self.rolled.get(t, {}).items()]
            if fps:
                cur.executemany(f"INSERT INTO {STATE}.rolled VALUES (?, ?, ?)", fps)

    def _load(self, cur: duckdb.DuckDBPyConnection, t: str, files: dict[str, str | None]) -> None:
        target = NODE_ROWS if t == "nodes" else f"lake_{t}" if t in FAST else t
        old = self.files.get(t, {})
        if t in WHOLE or any(f not in files for f in old):
            cur.execute(f"DELETE FROM {target}")
            new = list(files)
        else:
            new = [f for f in files if f not in old]
        _insert(cur, target, new)
        self.loaded_files += len(new)

    def _dirty(self, cur: duckdb.DuckDBPyConnection, files: dict[str, dict[str, str | None]]) -> None:
        """``rollup_dirty``: per source and node, the span of the days some rollup does not
        hold as the source's files now are (read from the raw rows, as a file reads rows its
        rollups have not caught up with)."""
        cur.execute("DELETE FROM rollup_dirty")
        for src in rollup.SOURCES:
            days: dict[str, list[str]] = {}
            for f, d in files.get(src, {}).items():
                if d:
                    days.setdefault(d, []).append(f)
            todo: set[str] = set()
            for r in (r for r in rollup.ROLLUPS if r.source == src):
                state = self.rolled.get(r.table, {})
                todo |= {d for d, fs in days.items() if state.get(d) != lakerollup.fingerprint(fs, r.version)}
            if todo:
                col = _q(time_column(src) or "ts")
                cur.execute(f"""INSERT INTO rollup_dirty SELECT node, min({col}), max({col}), '{src}' FROM {src}
                    WHERE CAST({col} AS DATE) IN (SELECT unnest($days::DATE[])) GROUP BY node""",
                            {"days": sorted(todo)})

    def close(self) -> None:
        with contextlib.suppress(duckdb.Error):
            self.con.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def _plan(tbl: Any) -> dict[str, str | None]:
    """A table's current data files (path -> its day partition, "YYYY-MM-DD"; None for an
    unpartitioned table, or a file whose partition value is null). Not lake.day_partitions:
    it leaves such files out, and every file's rows must be served."""
    out: dict[str, str | None] = {}
    if tbl.current_snapshot() is None:
        return out
    parted = bool(tbl.spec().fields)
    for task in tbl.scan().plan_files():
        day = task.file.partition[0] if parted else None
        out[_path(task.file.file_path)] = (
            (dt.date(1970, 1, 1) + dt.timedelta(days=int(day))).isoformat() if day is not None else None)
    return out


def _insert(cur: duckdb.DuckDBPyConnection, table: str, paths: list[str]) -> None:
    """Parquet files' rows into ``table``, columns matched by name (a column a file lacks,
    written before a migration added it, is null), typed as the table is. Each file is
    streamed in record batches of ``BATCH_ROWS``: a server's memory holds one batch, not
    the table (all of a day's GPU samples concatenated first took 13.5 GB for 20.7 M rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not paths:
        return
    cols = cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? "
                       "AND table_catalog = current_database() ORDER BY ordinal_position", [table]).fetchall()
    for path in paths:
        try:
            f = pq.ParquetFile(path)
            have = set(f.schema_arrow.names)
            reader = pa.RecordBatchReader.from_batches(f.schema_arrow, f.iter_batches(batch_size=BATCH_ROWS))
            sel = ", ".join((f"CAST(_f.{_q(c)} AS {ty})" if c in have else f"NULL::{ty}") for c, ty in cols)
            cur.register("_f", reader)
            try:
                cur.execute(f"INSERT INTO {table} SELECT {sel} FROM _f")
            finally:
                cur.unregister("_f")
        except (OSError, ValueError, pa.ArrowException) as e:  # (a truncated or foreign file: ArrowInvalid)
            why = str(e).splitlines()[0].replace(path, "it")[:160] if str(e) else type(e).__name__
            raise AnalyticsError(f"...{path[-100:]}: cannot read: {why}") from None


class LakeServed(Database):
    """A replica of the lake served as a collector serves its file: reads are cursors of
    the replica's connection in read-only transactions (label-filtered scopes apply),
    writes (fits, stored findings, imported records) replace the lake's tables."""

    judges_offline = False  # liveness as of the lake's horizon

    def __init__(self, replica: LakeReplica, name: str) -> None:
        super().__init__(name)
        self.replica = replica
        con = replica.con
        self._catalog = _q(con.execute("SELECT current_database()").fetchall()[0][0])
        self._live = con.cursor()
        from ..scoping import Made

        self._scopes = Made()
        self._write_lock = replica.write_lock  # type: ignore[assignment]
        self.sql_pool: Any = None  # user SQL's worker processes (analytics/server/sqlpool.py), when given
        self.rule_pool: Any = None  # the alert rules' worker processes, when the server has rules
        self.horizon = lambda: replica.horizon

    @property
    def lake(self) -> Lake:
        return self.replica.lake

    @contextlib.contextmanager
    def write(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor of the replica under the write lock; the tables analyze writes that it
        changed are then replaced in the lake (the next refresh reads them back)."""
        from ..lakedb import written

        _unscoped("write")
        with self._write_lock:
            cur = self._cursor()
            try:
                with written(self.lake, cur, self.replica.elsewhere):
                    yield cur
            except LakeError as e:
                raise AnalyticsError(str(e)) from None
            finally:
                cur.close()

    def close(self) -> None:
        for pool in (self.sql_pool, self.rule_pool):
            if pool is not None:
                pool.close()
        with contextlib.suppress(duckdb.Error):
            if self._live is not None:
                self._live.close()


class Refresher:
    """``replica.refresh()`` every ``every`` seconds on a thread of its own; a failed
    refresh is said once per new reason and tried again (what was read keeps serving)."""

    def __init__(self, replica: LakeReplica, every: float, say: Callable[[str], None] | None = None) -> None:
        self.replica, self.every = replica, every
        self.say = say or (lambda line: log.warning("%s", line))
        self._stop = threading.Event()
        self._last_error = ""
        self.thread = threading.Thread(target=self._run, name="cmdare-lake-refresh", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.replica.refresh()
                if self._last_error:
                    self.say("cmdare-collector: lake readable again")
                self._last_error = ""
            except Exception as e:  # noqa: BLE001  (serve what was read; say why once)
                msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                if msg != self._last_error:
                    self.say(f"cmdare-collector: lake refresh failed (serving what was read): {msg}")
                self._last_error = msg

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=30)
