"""Reads through a label-filtered token: a request signed in with a token that has
``labels = { team = "vision" }`` sees the nodes whose labels all match, the jobs seen on
those nodes, and nothing else, in every API call, page and user SQL query.

How: each read of such a request (``Database.read`` of a served database) attaches a fresh
in-memory catalog holding one view per table and view of the served database, of the same
name, filtered, and makes it the cursor's default (``USE``); the library's queries and the
user's SQL name tables unqualified and so read the views. What each view keeps:

- a table with a ``node`` column: the rows of visible nodes (and, where it has a ``job``
  column too, rows with no node of an owned job: a job-wide finding);
- with a ``job`` column only (goodput hours, finding coverage): the rows of owned jobs;
- ``alerts``: those whose labels name a visible node, or no node and an owned job;

A job is visible when a visible node ran it, and owned when every node that ran it is
visible. Job names are declared by training processes, so a job seen on nodes of two
teams (a trainer that named its job after another team's) is shown to each for its own
nodes only: its job-wide rows, computed over every node, belong to neither (an admin
token sees them).
- reference tables that hold no team's telemetry (``OPEN``): all of it;
- anything else (fleet-wide fits built from every team's jobs, delivery bookkeeping,
  dead letters): nothing.

The table macros (``instance_lives``, ``runs``) are made again in the attached catalog, so
they read the views.

The visible nodes and jobs are fixed when the views are made (two small tables in the
attached catalog); the views of one label set are shared by its reads for ``FRESH``
seconds, then made again, the old catalog dropped by its last reader. User SQL under a scope may not name a catalog or a schema other than
``main``, ``information_schema`` and ``pg_catalog``, nor call a table function outside
``TABLE_FUNCTIONS`` or name one's catalog or schema (``query_table``, ``duckdb_views()``,
``"db".main.instance_lives()`` ...), nor name DuckDB's catalogue views that count every
catalog's rows (``pg_class``, ``duckdb_tables``, ``duckdb_*``): each is a way around the
views (analytics/safesql.py refuses them).
"""

from __future__ import annotations

import contextlib
import contextvars
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import duckdb

from cmdare.collector.views import VIEWS
from cmdare.collector.views import sql as view_sql

OPEN = frozenset({"schema_migrations", "rollup_horizon", "alert_rules", "checkpoint_records", "startup_records",
                  "spot_lives"})
# table functions that read no table, and cmdare's table macros (made again in the scope's catalog)
TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest", "json_each", "json_tree", "instance_lives", "runs"})
SCHEMAS = frozenset({"", "main", "information_schema", "pg_catalog"})
# DuckDB's own catalogue views that show every catalog's row counts, sizes, paths or log
# (``pg_class.reltuples``, ``duckdb_tables.estimated_size``): the table functions they wrap
# are refused already; named as tables they are refused too
STATS_VIEWS = frozenset({"pg_class", "pg_stats", "pg_statistic"})
STATS_PREFIXES = ("duckdb_", "pragma_")
PREFIX = "cmdare_scope_"


@dataclass(frozen=True)
class Scope:
    token: str  # the token's name, for messages
    labels: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.labels)


_CURRENT: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("cmdare_scope", default=None)


def current() -> Scope | None:
    """The scope of the request being served (None: unfiltered)."""
    return _CURRENT.get()


@contextlib.contextmanager
def active(scope: Scope | None) -> Iterator[None]:
    """Reads made inside see ``scope`` only (None: everything)."""
    t = _CURRENT.set(scope)
    try:
        yield
    finally:
        _CURRENT.reset(t)


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def _build(cur: duckdb.DuckDBPyConnection, served: str, scope: Scope) -> str:
    """Attach a catalog of ``scope``'s views of catalog ``served``: its name."""
    src, name = _ident(served), PREFIX + secrets.token_hex(8)
    cur.execute(f"ATTACH ':memory:' AS {name}")
    try:
        match = " AND ".join(f"json_extract_string(labels, {_lit('$.' + _ident(k))}) = {_lit(v)}"
                             for k, v in scope.labels) or "false"
        cur.execute(f"CREATE TABLE {name}.main.cmdare_visible_nodes AS "
                    f"SELECT node FROM {src}.main.nodes WHERE {match}")
        nodes = f"(SELECT node FROM {name}.main.cmdare_visible_nodes)"
        cur.execute(f"CREATE TABLE {name}.main.cmdare_visible_jobs AS SELECT DISTINCT job FROM ("
                    f"SELECT job FROM {src}.main.jobs WHERE node IN {nodes} UNION ALL "
                    f"SELECT job FROM {src}.main.nodes WHERE node IN {nodes}) WHERE job IS NOT NULL")
        # a job-wide row (a finding with no node, goodput hours, an alert naming the job and no
        # node) is the team's only where every node that ran the job is visible: a trainer on a
        # vision node that names its job after nlp's does not make nlp's job-wide rows vision's
        cur.execute(f"CREATE TABLE {name}.main.cmdare_owned_jobs AS SELECT job FROM {name}.main.cmdare_visible_jobs v "
                    f"WHERE NOT EXISTS (SELECT 1 FROM (SELECT job, node FROM {src}.main.jobs UNION ALL "
                    f"SELECT job, node FROM {src}.main.nodes) a WHERE a.job = v.job AND a.node NOT IN {nodes})")
        jobs = f"(SELECT job FROM {name}.main.cmdare_owned_jobs)"
        rels = cur.execute("SELECT table_name, list(column_name) FROM information_schema.columns "
                           "WHERE table_catalog = ? AND table_schema = 'main' GROUP BY table_name",
                           [served]).fetchall()
        for table, cols in rels:
            if "node" in cols:
                keep = f"node IN {nodes}" + (f" OR (node IS NULL AND job IN {jobs})" if "job" in cols else "")
            elif "job" in cols:
                keep = f"job IN {jobs}"
            elif table == "alerts":
                keep = (f"json_extract_string(labels, '$.node') IN {nodes} "
                        f"OR (json_extract_string(labels, '$.node') IS NULL "
                        f"AND json_extract_string(labels, '$.job') IN {jobs})")
            elif table in OPEN:
                keep = "true"
            else:
                keep = "false"
            cur.execute(f"CREATE VIEW {name}.main.{_ident(table)} AS "
                        f"SELECT * FROM {src}.main.{_ident(table)} WHERE {keep}")
        cur.execute(f"USE {name}")  # the table macros are made in the current catalog
        macros = {m for (m,) in cur.execute(
            "SELECT function_name FROM duckdb_functions() WHERE database_name = ? AND NOT internal "
            "AND function_type IN ('macro', 'table_macro')", [served]).fetchall()}
        for m in VIEWS:  # the table macros again, here: their tables are the views above
            if m in macros:
                cur.execute(view_sql(m))
        cur.execute(f"USE {src}")
    except BaseException:
        _drop(cur, name, src)
        raise
    return name


def _use(cur: duckdb.DuckDBPyConnection, catalog: str) -> None:
    with contextlib.suppress(duckdb.Error):
        cur.execute(f"USE {catalog}")


def _drop(cur: duckdb.DuckDBPyConnection, name: str, src: str) -> None:
    _use(cur, src)
    with contextlib.suppress(duckdb.Error):
        cur.execute(f"DETACH {name}")


@dataclass
class _Views:
    """One scope's attached catalog, shared by the reads of its label set for ``FRESH``
    seconds (the visible nodes and jobs are fixed when it is made); dropped once replaced
    and no read uses it."""

    name: str
    src: str
    made: float
    users: int
    retired: bool = False


FRESH = 5.0  # seconds a scope's views are reused (a node new to the labels is seen within it)


class Made:
    """The scopes' views made on one database (a served Database keeps one)."""

    def __init__(self) -> None:
        self.views: dict[tuple[tuple[str, str], ...], _Views] = {}
        self.lock = threading.Lock()


def attach(cur: duckdb.DuckDBPyConnection, scope: Scope, made: Made) -> _Views:
    """Make ``scope``'s views of the cursor's current catalog its default (made, or the
    ones ``made`` less than FRESH seconds ago); ``detach`` when the read is done."""
    (served,) = cur.execute("SELECT current_database()").fetchone() or ("",)
    key = scope.labels
    now = time.monotonic()
    _made, _lock = made.views, made.lock
    with _lock:
        v = _made.get(key)
        if v is not None and now - v.made < FRESH:
            v.users += 1
        else:
            v = None
    if v is None:
        v = _Views(_build(cur, served, scope), _ident(served), now, users=1)
        with _lock:
            old, _made[key] = _made.get(key), v
            gone = old is not None and not old.retired and old.users == 0
            if old is not None:
                old.retired = True
        if gone:
            _drop(cur, old.name, old.src)  # type: ignore[union-attr]
    try:
        cur.execute(f"USE {v.name}")
    except BaseException:  # the read's count given back
        detach(cur, v, made)
        raise
    return v


def detach(cur: duckdb.DuckDBPyConnection, v: _Views, made: Made) -> None:
    """The read is done: back to the served catalog; a replaced scope's last reader drops it."""
    _use(cur, v.src)
    with made.lock:
        v.users -= 1
        gone = v.retired and v.users == 0
    if gone:
        _drop(cur, v.name, v.src)



def refused(tree: object) -> str | None:
    """What in a user query's parse tree (json_serialize_sql) would read around a scope's
    views, in words, or None."""
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            t = x.get("type")
            if t == "BASE_TABLE":
                if x.get("catalog_name") or (x.get("schema_name") or "") not in SCHEMAS:
                    path = ".".join(p for p in (x.get("catalog_name"), x.get("schema_name"), x.get("table_name")) if p)
                    return f"the table {str(path)[:80]!r} (name tables without a database or schema)"
                name = str(x.get("table_name") or "").lower()
                if name in STATS_VIEWS or name.startswith(STATS_PREFIXES):
                    return f"the catalogue view {name[:60]!r} (it counts every team's rows)"
            elif t == "TABLE_FUNCTION":
                f = x.get("function") or {}
                fn = str(f.get("function_name", "")).lower() if isinstance(f, dict) else ""
                if fn not in TABLE_FUNCTIONS or (isinstance(f, dict) and (f.get("catalog") or f.get("schema"))):
                    return f"the table function {fn[:60]!r}"
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return None
