"""Alert tests: an in-memory database with the collector's schema, rows inserted as the
collector stores them, and the engine evaluated at chosen times."""

from __future__ import annotations

import datetime as dt
import itertools
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from cmdare.analytics import alerting as alerts
from cmdare.collector import views
from cmdare.collector.db import migrate
from cmdare.collector.ingest import storage

T0 = dt.datetime(2026, 11, 24, 12, 0, 0)
_ids = itertools.count()


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect(":memory:")
    migrate(c)
    views.apply(c)
    yield c
    c.close()


def insert(con: duckdb.DuckDBPyConnection, table: str, **cols: Any) -> None:
    """One row; ``id`` made up where the table has one."""
    have = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
    if "id" in have and "id" not in cols:
        cols["id"] = f"e{next(_ids)}"
    names = list(cols)
    con.execute(storage.insert_sql(con, table, names), [cols[n] for n in names])


def engine(con: duckdb.DuckDBPyConnection, tmp_path: Path, text: str, inhibit_window: float = 1800.0) -> alerts.Engine:
    f = tmp_path / f"rules{next(_ids)}.yml"
    f.write_text(textwrap.dedent(text))
    groups = alerts.load_files([f])
    alerts.validate(con, groups)
    return alerts.Engine(groups, inhibit_window)


def step(e: alerts.Engine, con: duckdb.DuckDBPyConnection, when: dt.datetime) -> dict[str, alerts.Alert]:
    """Evaluate every group at ``when``; the alerts by their alertname (and labels when several)."""
    for g in e.groups:
        e.eval_group(con, g, when)
    out = {}
    for a in e.snapshot():
        key = a.labels["alertname"]
        if key in out:
            key = f"{key}{sorted((k, v) for k, v in a.labels.items() if k != 'alertname')}"
        out[key] = a
    return out


def default_engine(con: duckdb.DuckDBPyConnection, inhibit_window: float = 1800.0) -> alerts.Engine:
    from cmdare.analytics.alerting import resolve_paths as rule_paths

    groups = alerts.load_files(rule_paths(("default",)))
    alerts.validate(con, groups)
    return alerts.Engine(groups, inhibit_window)
