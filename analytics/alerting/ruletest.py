"""Unit tests of rules (``analyze alerts test``), as ``promtool test rules`` does: input
rows at offsets from a fixed start, the rules evaluated every ``evaluation_interval``, the
firing alerts compared at each ``eval_time``."""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from cmdare.collector.ingest import storage

from .evaluate import _first, validate
from .rulefmt import RuleError, duration, load_files, parse_yaml, read_text, short
from .state import Alert, Engine

TEST_BASE = dt.datetime(2026, 1, 1)
_TEST_KEYS = {"rule_files", "evaluation_interval", "tests"}
_CASE_KEYS = {"name", "rows", "alert_rule_test", "inhibit_window"}


MAX_STEPS = 100_000


@dataclass
class TestResult:
    name: str
    failures: list[str]


def _offset(where: str, v: Any) -> dt.datetime:
    return TEST_BASE + dt.timedelta(seconds=duration(where, "time", v))


def run_tests(path: str | Path, schema: Callable[[], duckdb.DuckDBPyConnection]) -> list[TestResult]:
    """Run the test file's cases: each on a fresh database (``schema()``) holding its input
    rows (times as offsets from the start), the rules evaluated every ``evaluation_interval``
    up to the last ``eval_time``, the firing alerts compared at each ``eval_time``."""
    p = Path(path)
    tree = parse_yaml(str(p), read_text(p))
    if not isinstance(tree, dict) or set(tree) - _TEST_KEYS or "tests" not in tree:
        raise RuleError(f"{p}: expected rule_files, evaluation_interval (optional) and tests")
    given = tree.get("rule_files") or []
    if not isinstance(given, list) or not all(isinstance(f, str) for f in given):
        raise RuleError(f"{p}: rule_files: a list of file names, not {short(given)}")
    files = [f if f == "default" else str((p.parent / f).resolve()) for f in given]
    if not files:
        raise RuleError(f"{p}: rule_files: name at least one rule file")
    step_s = duration(str(p), "evaluation_interval", tree.get("evaluation_interval", "15s"))
    if step_s <= 0:
        raise RuleError(f"{p}: evaluation_interval must be positive")
    groups = load_files(files)
    results = []
    if not isinstance(tree["tests"] or [], list):
        raise RuleError(f"{p}: tests: a list of test cases, not {short(tree['tests'])}")
    for i, case in enumerate(tree["tests"] or []):
        name = short(str(case.get("name", f"test {i + 1}")), 80)[1:-1] if isinstance(case, dict) else f"test {i + 1}"
        where = f"{p}: {name}"
        if not isinstance(case, dict) or set(case) - _CASE_KEYS:
            raise RuleError(f"{where}: expected name, rows, alert_rule_test")
        con = schema()
        try:
            validate(con, groups)
            _load_rows(con, where, case.get("rows") or {})
            checks = case.get("alert_rule_test") or []
            if not isinstance(checks, list) or not checks:
                raise RuleError(f"{where}: alert_rule_test: give a list of eval_time / alertname / exp_alerts")
            if not all(isinstance(c, dict) for c in checks):
                raise RuleError(f"{where}: alert_rule_test: each check is a mapping of eval_time, alertname, exp_alerts")
            times = sorted({_offset(where, c.get("eval_time")) for c in checks})
            if (times[-1] - TEST_BASE).total_seconds() / step_s > MAX_STEPS:
                raise RuleError(f"{where}: more than {MAX_STEPS:,} evaluations to the last eval_time: "
                                "raise evaluation_interval")
            engine = Engine(groups, duration(where, "inhibit_window", case.get("inhibit_window", "30m")))
            by_time: dict[dt.datetime, list[Alert]] = {}
            t, end = TEST_BASE, times[-1]
            while True:
                for g in engine.groups:
                    engine.eval_group(con, g, t)
                by_time[t] = [copy.copy(a) for a in engine.snapshot()]  # as they were then
                if t >= end:
                    break
                nxt = t + dt.timedelta(seconds=step_s)
                t = min([x for x in times if x > t and x < nxt] or [nxt])  # land on every eval_time
            failures = [f"rule {r}: {h.last_error}" for r, h in engine.health.items() if h.health == "error"]
            for c in checks:
                failures += _check(where, c, by_time[_offset(where, c.get("eval_time"))])
        finally:
            con.close()
        results.append(TestResult(name, failures))
    return results


def _load_rows(con: duckdb.DuckDBPyConnection, where: str, rows: Any) -> None:
    if not isinstance(rows, dict):
        raise RuleError(f"{where}: rows: expected table -> list of rows")
    n = 0
    for table, items in rows.items():
        if not isinstance(table, str) or not isinstance(items or [], list):
            raise RuleError(f"{where}: rows: {short(table)}: expected a table name and a list of rows")
        try:
            cols = {r[0]: r[1] for r in con.execute('DESCRIBE "' + table.replace('"', '""') + '"').fetchall()}
        except duckdb.Error:
            raise RuleError(f"{where}: rows: no table {short(table)}") from None
        for row in items or []:
            if not isinstance(row, dict):
                raise RuleError(f"{where}: rows.{table}: each row is a mapping of column -> value")
            vals = dict(row)
            for k in list(vals):
                if k not in cols:
                    raise RuleError(f"{where}: rows.{table}: no column {short(k)} (columns: {', '.join(cols)})")
                if cols[k].startswith("TIMESTAMP"):
                    vals[k] = _offset(f"{where}: rows.{table}.{k}", vals[k])
                elif cols[k] == "JSON" and not isinstance(vals[k], str):
                    vals[k] = json.dumps(vals[k])
            if "id" in cols and "id" not in vals:
                n += 1
                vals["id"] = f"test-{n}"
            names = list(vals)
            try:
                # GPU samples are stored packed under their view (collector/ingest/storage.py)
                con.execute(storage.insert_sql(con, table, names), [vals[c] for c in names])
            except duckdb.Error as e:
                raise RuleError(f"{where}: rows.{table}: {_first(e)}") from None


def _check(where: str, c: dict[str, Any], alerts_: list[Alert]) -> list[str]:
    name = c.get("alertname")
    when = c.get("eval_time")
    got = [({k: v for k, v in a.labels.items() if k != "alertname"}, a.annotations)
           for a in alerts_ if a.labels.get("alertname") == name and a.state == "firing"]
    exp = c.get("exp_alerts") or []
    if not isinstance(exp, list) or not all(isinstance(e, dict) for e in exp):
        raise RuleError(f"{where}: exp_alerts: a list of exp_labels / exp_annotations mappings, not {short(exp)}")
    want = [({str(k): str(v) for k, v in (e.get("exp_labels") or {}).items()}, e.get("exp_annotations")) for e in exp]
    out = []
    left = list(got)
    for labels, ann in want:
        match = next((g for g in left if g[0] == labels and (ann is None or g[1] == {str(k): str(v) for k, v in ann.items()})),
                     None)
        if match is None:
            out.append(f"at {when}: {name}: expected firing {labels}{f' with {ann}' if ann else ''}; "
                       f"got {[g[0] for g in got] or 'none'}")
        else:
            left.remove(match)
    for g in left:
        out.append(f"at {when}: {name}: unexpected firing {g[0]}")
    return out
