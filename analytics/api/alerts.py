"""Alerts: the alerting state, rule files checked against a database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from ..db import AnalyticsError, Database
from ..queries import needs_schema


@dataclass
class Alerts:
    """The alerts table (rule, state, since, value, labels JSON, summary, description) and
    each rule's health (rule, health, last_error, last_eval, eval_seconds, instances)."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    health: list[tuple[Any, ...]]


def alerts(db: Database, rule: str | None = None) -> Alerts:
    from .. import alerting as al

    try:
        with db.read() as con:
            needs_schema(con, 10, "analyze alerts")
            cols, rows, health = al.listing(con)
    except duckdb.Error as e:
        raise AnalyticsError(str(e).splitlines()[0]) from None
    if rule:
        rows = [r for r in rows if r[0] == rule or r[0].split("/", 1)[-1] == rule]
        health = [h for h in health if h[0] == rule or h[0].split("/", 1)[-1] == rule]
    return Alerts(list(cols), [tuple(r) for r in rows], [tuple(h) for h in health])


@dataclass
class RulesChecked:
    files: int
    groups: int
    rules: int


def check_rules(db: Database | None, files: list[tuple[str, str]]) -> RulesChecked:
    """Validate rule files given as (name, text): structure, durations, templates, and each
    rule's SQL bound against ``db``'s tables (None: an empty database of the current
    schema). Nothing is read but the texts and the database."""
    from .. import alerting as al

    groups = al.load_texts(files)
    if db is not None and db.exists():
        with db.read(SCHEMA_CONFIG) as con:
            al.validate(con, groups)
    else:
        con = empty_db()
        try:
            al.validate(con, groups)
        finally:
            con.close()
    return RulesChecked(len(files), len(groups), sum(len(g.rules) for g in groups))


# no file, network, extension or Python-object access while rule SQL is bound
SCHEMA_CONFIG: dict[str, object] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,
}


def empty_db() -> duckdb.DuckDBPyConnection:
    """An in-memory database with the collector's current schema and views, which reads
    nothing else (rule checks and rule unit tests run on it)."""
    from cmdare.collector.db import migrate
    from cmdare.collector.views import apply

    con = duckdb.connect(":memory:")
    migrate(con)
    apply(con)
    for k, v in SCHEMA_CONFIG.items():
        con.execute(f"SET {k} = {str(v).lower()}")
    return con
