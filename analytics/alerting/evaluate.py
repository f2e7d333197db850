"""Evaluating one rule: its instances at a time, bound and run on a connection that cannot
write (the collector's read cursor, or a rolled-back read-only transaction)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import duckdb

from ..db import AnalyticsError, has_column
from .rulefmt import (
    FINDING_LABELS,
    MAX_TEXT,
    SEVERITIES,
    T_LABEL,
    T_PRINTF,
    T_SUMMARY,
    T_VALUE,
    TEMPLATE,
    Group,
    Rule,
    RuleError,
)

_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
MAX_INSTANCES = 10_000  # rows (alert instances) one rule may return
MAX_RESULT_BYTES = 2 << 20  # characters of labels in all its rows (a state file, a receiver's batch)
CHECK_TIMEOUT = 10.0  # seconds a rule's SQL may run when rules are checked or loaded
FETCH = 512  # rows fetched at a time: a result past a bound stops at the first chunk over it


def prepare(con: duckdb.DuckDBPyConnection, at: dt.datetime, horizon: dt.datetime | None = None,
            lag: float = 0.0) -> None:
    """``eval_time()`` on this connection: the evaluation's time; ``ingest_horizon()``: the
    time up to which the collector is known to hold everything sent (``horizon``; the
    evaluation's time when it is not behind, or outside a collector); ``ingest_lag()``:
    seconds the collector has had input it has not read (``lag``: since it last found
    nothing unread; 0 when caught up, or outside a collector)."""
    h = at if horizon is None or horizon > at else horizon
    lag = float(lag) if math.isfinite(lag) and lag > 0 else 0.0
    con.execute(f"SET VARIABLE cmdare_lag = {lag!r}::DOUBLE")
    con.execute("CREATE OR REPLACE TEMP MACRO ingest_lag() AS getvariable('cmdare_lag')")
    con.execute(f"SET VARIABLE cmdare_eval_time = TIMESTAMP '{at.isoformat(sep=' ')}'")
    con.execute(f"SET VARIABLE cmdare_horizon = TIMESTAMP '{h.isoformat(sep=' ')}'")
    con.execute("CREATE OR REPLACE TEMP MACRO eval_time() AS getvariable('cmdare_eval_time')")
    con.execute("CREATE OR REPLACE TEMP MACRO ingest_horizon() AS getvariable('cmdare_horizon')")


def columns_of(con: duckdb.DuckDBPyConnection, rule: Rule) -> list[str]:
    """The columns the rule's instances will have (its labels, and value); RuleError when
    its SQL is not one SELECT or does not bind (an unknown table or column)."""
    if rule.finding:
        return [*FINDING_LABELS, "value"]
    from ..safesql import SqlRefused, check

    assert rule.expr is not None
    try:
        check(con, rule.expr)
    except SqlRefused as e:
        raise RuleError(f"{rule.where()}: expr: {e}") from None
    try:
        desc = con.execute(f"DESCRIBE {rule.expr}").fetchall()
    except duckdb.Error as e:
        raise RuleError(f"{rule.where()}: expr: {_first(e)}") from None
    cols = [d[0] for d in desc]
    for c in cols:
        if c != "value" and not _LABEL.match(c):
            raise RuleError(f"{rule.where()}: expr: column {c!r} is not a valid label name (alias it: AS name)")
    if "value" in cols:
        t = dict((d[0], d[1]) for d in desc)["value"]
        if not any(x in t for x in ("INT", "DOUBLE", "FLOAT", "DECIMAL", "REAL", "BOOLEAN")):
            raise RuleError(f"{rule.where()}: expr: the value column must be a number, not {t}")
    return cols


def validate(con: duckdb.DuckDBPyConnection, groups: list[Group], evaluator: Any = None) -> None:
    """Every rule's SQL parses and binds against this database, and its templates name
    columns it has; ``evaluator`` (as ``Engine.evaluator``): where its first result is
    computed, when not on ``con`` (binding only reads the schema; running is the query)."""
    at = utcnow()
    prepare(con, at)
    for g in groups:
        for r in g.rules:
            cols = columns_of(con, r)
            if not r.finding:  # its result now, within the bounds (a rule past them would never alert)
                try:
                    if evaluator is not None:
                        evaluator(r, at, CHECK_TIMEOUT, None, 0.0)
                    else:
                        evaluate(con, r, at, timeout=CHECK_TIMEOUT)
                except RuleError as e:
                    if "stopped after" not in str(e):  # slow here is no error: the live evaluation has its own limit
                        raise RuleError(f"{r.where()}: {e}") from None
            have = set(cols) | set(r.labels) | {"alertname"}
            for k, text in {**r.labels, **r.annotations}.items():
                for m in TEMPLATE.finditer(text):
                    lm = T_LABEL.match(m.group(1))
                    if lm and lm.group(1) not in have:
                        raise RuleError(f"{r.where()}: {k}: $labels.{lm.group(1)} is not a column of the "
                                        f"expression (columns: {', '.join(c for c in cols if c != 'value')})")


def _first(e: BaseException) -> str:
    lines = [x for x in str(e).splitlines() if x.strip()] or [type(e).__name__]
    return lines[0][:300]


@dataclass
class Instance:
    labels: dict[str, str]
    value: float
    summary: str = ""
    # a finding still open that does not stand this round (its job between two records, the
    # schedule's round late): it keeps its alert as it is, never starts one (no flapping)
    hold: bool = False


def evaluate(con: duckdb.DuckDBPyConnection, rule: Rule, at: dt.datetime, timeout: float = 30.0,
             horizon: dt.datetime | None = None, lag: float = 0.0, fresh: float | None = None) -> list[Instance]:
    """The rule's instances at ``at`` (raises duckdb.Error / RuleError when it cannot run);
    ``fresh``: finding rules read the stored findings the collector's detector schedule
    found within that many seconds, instead of running their detector."""
    if rule.finding:
        return _findings(con, rule, at, fresh)
    from ..safesql import interrupt_after

    prepare(con, at, horizon, lag)
    out: list[Instance] = []
    size = 0
    with interrupt_after(con, timeout) as fired:
        try:
            cur = con.execute(rule.expr)  # type: ignore[arg-type]
            cols = [d[0] for d in cur.description or []]
            vi = cols.index("value") if "value" in cols else None
            n = 0
            while chunk := cur.fetchmany(FETCH):
                n += len(chunk)
                if n > MAX_INSTANCES:
                    raise RuleError(f"expr returned more than {MAX_INSTANCES:,} rows (alert instances): narrow it")
                for row in chunk:
                    inst = _instance(cols, vi, row, n)
                    if inst is not None:
                        size += sum(len(k) + len(x) for k, x in inst.labels.items())
                        out.append(inst)
                if size > MAX_RESULT_BYTES:
                    raise RuleError(f"expr's labels hold more than {MAX_RESULT_BYTES >> 20} MiB in "
                                    f"{len(out):,} rows: narrow it (fewer rows or shorter labels)")
        except duckdb.Error as e:
            if fired.is_set():
                raise RuleError(f"expr stopped after {timeout:g} s") from None
            raise RuleError(f"expr failed: {_first(e)}") from None
    return out


def _instance(cols: list[str], vi: int | None, row: tuple[Any, ...], n: int) -> Instance | None:
    """One row as an instance (None: no value, as a PromQL comparison that filtered it out);
    a label over MAX_TEXT characters is refused, not cut (rows differing past the cut would
    merge into one alert)."""
    v = 1.0 if vi is None else row[vi]
    if v is None:
        return None
    v = float(v)
    if math.isnan(v):
        return None
    labels = {}
    for i, (c, x) in enumerate(zip(cols, row, strict=True)):
        if i == vi:
            continue
        text = "" if x is None else str(x)
        if len(text) > MAX_TEXT:
            raise RuleError(f"expr: label {c} is longer than {MAX_TEXT:,} characters (row {n:,} or before): "
                            "refused, not cut")
        labels[c] = text
    return Instance(labels, v)


_SEV = {s: i for i, s in enumerate(SEVERITIES)}


def _stored(con: duckdb.DuckDBPyConnection, rule: Rule, at: dt.datetime, fresh: float) -> list[tuple[Any, bool]]:
    """The findings of the rule's kind the detector schedule has not resolved, each with
    whether it stands now: found within ``fresh`` seconds of ``at``, on the rule's window
    (one open but not standing holds its alert: ``Instance.hold``)."""
    from ..units import Finding

    rows = con.execute(
        """SELECT kind, job, summary, severity, confidence, node, subject, rank,
                  detected_at >= $fresh AND window_end >= $since FROM findings
           WHERE kind = $k AND resolved_at IS NULL AND ($job IS NULL OR job = $job)""",
        {"k": rule.finding, "fresh": at - dt.timedelta(seconds=fresh),
         "since": at - dt.timedelta(seconds=rule.window), "job": rule.filters.get("job")}).fetchall()
    return [(Finding(k, j, s, sev, conf, node=n, subject=sub, rank=r), bool(ok))
            for k, j, s, sev, conf, n, sub, r, ok in rows]


def _findings(con: duckdb.DuckDBPyConnection, rule: Rule, at: dt.datetime, fresh: float | None = None) -> list[Instance]:
    from ..detectors import DETECTORS
    from ..units import Scope, check_requirements, run_unit

    f = rule.filters
    scope = Scope(job=f.get("job"), since=at - dt.timedelta(seconds=rule.window), until=at)
    assert rule.finding is not None
    if fresh is not None:
        found = _stored(con, rule, at, fresh)
    else:
        try:
            check_requirements(DETECTORS, rule.finding, con)
        except AnalyticsError:
            return []  # nothing to detect from yet (e.g. no rows in checkpoints): no instances
        found = [(x, True) for x in run_unit(DETECTORS, rule.finding, con, scope, {})]
    live_jobs, live_nodes = _live(con, at, rule.window)
    out = []
    for x, stands in found:
        # a finding whose job stopped stepping, or whose node went quiet, has lost its
        # cause: its alert resolves instead of firing on the window's old telemetry, unless
        # the schedule still holds the finding open (then it resolves with the finding)
        if x.job and x.job not in live_jobs or getattr(x, "node", None) and x.node not in live_nodes:
            if fresh is None:
                continue
            stands = False
        if "node" in f and x.node != f["node"]:
            continue
        if "min_severity" in f and _SEV.get(x.severity, 0) < _SEV[f["min_severity"]]:
            continue
        if x.confidence < float(f.get("min_confidence", 0)):
            continue
        labels = {"kind": x.kind, "job": x.job or "", "node": getattr(x, "node", None) or "",
                  "rank": "" if getattr(x, "rank", None) is None else str(x.rank),
                  "subject": getattr(x, "subject", None) or "", "severity": x.severity}
        out.append(Instance(labels, float(x.confidence), x.summary, hold=not stands))
    return out


def _live(con: duckdb.DuckDBPyConnection, at: dt.datetime, window: float) -> tuple[set[str], set[str]]:
    """Jobs still stepping (or feeding input, or a pod's or Slurm job's GPUs reporting) at
    ``at``, heard within three of their own intervals (at least a minute), of which some run
    has not ended (``runs()``: a finished, failed or crashed job is not alerted on for what it
    did while it ran), and nodes heard from within two minutes."""
    since = at - dt.timedelta(seconds=window)
    # a job a Kubernetes pod or Slurm job holds GPUs for, with no steps: live while its GPUs report
    held = ("""
            UNION ALL
            SELECT job, last_ts, NULL FROM gpu_5m WHERE last_ts > ? AND first_ts <= ? AND job IS NOT NULL AND job <> ''
              AND (namespace IS NOT NULL OR slurm_job IS NOT NULL)""" if has_column(con, "gpu_5m", "slurm_job") else "")
    jobs = con.execute(
        f"""
        SELECT job FROM (
            SELECT job, ts, interval_seconds FROM steps WHERE ts > ? AND ts <= ? AND job IS NOT NULL
            UNION ALL
            SELECT job, ts, interval_seconds FROM data_batches WHERE ts > ? AND ts <= ? AND job IS NOT NULL{held})
        GROUP BY job
        HAVING epoch(?::TIMESTAMP) - epoch(max(ts)) <= greatest(60, 3 * coalesce(median(interval_seconds), 10))
        EXCEPT
        SELECT job FROM runs(asof_ts := ?::TIMESTAMP, since := ?::TIMESTAMP) GROUP BY job
        HAVING NOT bool_or(state = 'running')
        """,
        [since, at, since, at, *([since, at] if held else []), at, at, since],
    ).fetchall()
    nodes = con.execute(  # any event of the node counts (not every source sends heartbeats)
        "SELECT node FROM nodes WHERE last_seen >= ?::TIMESTAMP - INTERVAL 2 MINUTE", [at]
    ).fetchall()
    return {j for (j,) in jobs}, {n for (n,) in nodes}


def render(text: str, labels: dict[str, str], value: float, summary: str = "") -> str:
    """A label or annotation template filled in: never raises (a conversion the value
    cannot take, ``%d`` of an infinite value, prints the value as ``{{ $value }}`` does),
    and the result is cut at MAX_TEXT characters."""
    def sub(m: re.Match[str]) -> str:
        body = m.group(1)
        if lm := T_LABEL.match(body):
            return labels.get(lm.group(1), "")
        if T_VALUE.match(body):
            return f"{value:g}"
        if pm := T_PRINTF.match(body):
            try:
                return pm.group(1) % value
            except (TypeError, ValueError, OverflowError):
                return f"{value:g}"
        if T_SUMMARY.match(body):
            return summary
        return m.group(0)

    return TEMPLATE.sub(sub, text)[:MAX_TEXT]


def fingerprint(rule: Rule, labels: dict[str, str]) -> str:
    text = json.dumps([rule.id, sorted(labels.items())], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- state ----------------------------------------------------------------------------------------

def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def listing(con: duckdb.DuckDBPyConnection) -> tuple[list[str], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """``analyze alerts``: the stored alerts and the rules' health."""
    cols = ["rule", "state", "since", "value", "labels", "summary", "inhibited_by"]
    rows = con.execute(
        """
        SELECT rule, state, strftime(coalesce(fired_at, active_at), '%Y-%m-%d %H:%M:%S') AS since, value,
               labels, json_extract_string(annotations, '$.summary'), inhibited_by
        FROM alerts
        ORDER BY CASE state WHEN 'firing' THEN 0 WHEN 'pending' THEN 1 WHEN 'inhibited' THEN 2 ELSE 3 END, rule
        """
    ).fetchall()
    health = con.execute(
        "SELECT rule, health, last_error, strftime(last_eval, '%Y-%m-%d %H:%M:%S'), eval_seconds, instances "
        "FROM alert_rules ORDER BY rule"
    ).fetchall()
    return cols, rows, health
