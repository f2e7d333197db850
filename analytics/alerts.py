"""Alerting rules: YAML files in Prometheus's shape, evaluated against the database, with
Prometheus's ``for`` / ``keep_firing_for`` semantics and state kept in DuckDB.

A rule file::

    groups:
      - name: nodes
        interval: 15s
        rules:
          - alert: NodeLost
            expr: |
              SELECT node, job, 1 AS value FROM instance_lives(asof_ts := eval_time())
              WHERE end_reason = 'lost' AND last_seen >= eval_time() - INTERVAL 1 HOUR
            for: 0s
            keep_firing_for: 5m
            labels: {severity: critical}
            annotations:
              summary: "node {{ $labels.node }} lost without a revocation notice"
          - alert: InputBound
            finding: input_bound          # fires per finding of this detector
            filters: {min_severity: warning, min_confidence: 0.5}
            window: 15m                   # the telemetry the detector reads

- ``expr``: one SELECT over the documented tables and views; each row is one alert
  instance, its columns its labels (``value``, when present, its value; else 1).
  ``eval_time()`` is the evaluation's time (UTC), so rules are testable.
- ``finding: KIND``: the detector runs over the last ``window`` at each evaluation; each
  finding is an instance labelled ``kind``, ``job``, ``node``, ``rank``, ``subject``,
  ``severity``, valued by its confidence; ``{{ $summary }}`` is its summary.
- ``for``, ``keep_firing_for``, ``labels``, ``annotations`` as Prometheus defines them; the
  annotations take ``{{ $labels.NAME }}``, ``{{ $value }}`` and ``{{ printf "%.2f" $value }}``.
- ``inhibit_on_revocation: true`` (cmdare's): an instance whose ``node`` (or whose ``job``'s
  nodes) ended a life revoked within the inhibition window is ``inhibited``: shown, not sent.

Loading validates everything and says, in one line, which file, group and rule is wrong.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from cmdare.wire.units import ConfigError, parse_duration

from .db import AnalyticsError

RESOLVED_RETENTION = 900.0  # a resolved alert is kept (and its resolution re-sent) this long
DEFAULT_INTERVAL = 15.0
DEFAULT_WINDOW = 900.0
SEVERITIES = ("info", "warning", "critical")
FINDING_LABELS = ("kind", "job", "node", "rank", "subject", "severity")
FINDING_FILTERS = ("job", "node", "min_severity", "min_confidence")
_RULE_KEYS = {"alert", "expr", "finding", "filters", "window", "for", "keep_firing_for", "labels", "annotations",
              "inhibit_on_revocation"}
_GROUP_KEYS = {"name", "interval", "rules"}
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}")
_T_LABEL = re.compile(r"^\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*$")
_T_VALUE = re.compile(r"^\s*\$value\s*$")
_T_PRINTF = re.compile(r'^\s*printf\s+"(%[-+ 0#]*\d*(?:\.\d+)?[dfeEgGs%])"\s+\$value\s*$')
_T_SUMMARY = re.compile(r"^\s*\$summary\s*$")


class RuleError(AnalyticsError):
    """A rule file that cannot be used: one line naming the file, group, rule and problem."""


@dataclass
class Rule:
    name: str
    group: str
    file: str
    expr: str | None = None
    finding: str | None = None
    filters: dict[str, Any] = field(default_factory=dict)
    window: float = DEFAULT_WINDOW
    for_: float = 0.0
    keep_firing_for: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    inhibit_on_revocation: bool = False

    @property
    def id(self) -> str:
        return f"{self.group}/{self.name}"

    def where(self) -> str:
        return f"{self.file}: group {self.group!r}: rule {self.name!r}"


@dataclass
class Group:
    name: str
    file: str
    interval: float
    rules: list[Rule]


# -- loading ----------------------------------------------------------------------------------
def resolve_paths(given: Iterable[str | Path]) -> list[Path]:
    """``default`` names the shipped pack (analytics/rules/cmdare.yml)."""
    from importlib import resources

    return [Path(str(resources.files("cmdare.analytics") / "rules" / "cmdare.yml")) if str(g) == "default"
            else Path(g) for g in given]


def read_files(paths: Iterable[str | Path]) -> list[tuple[str, str]]:
    """(name, text) of each rule file (``default``: the shipped pack)."""
    out = []
    for path in resolve_paths(paths):
        try:
            out.append((str(path), path.read_text()))
        except OSError as e:
            raise RuleError(f"{path}: cannot read: {e.strerror}") from None
        except UnicodeDecodeError:
            raise RuleError(f"{path}: not a text file") from None
    return out


def load_files(paths: Iterable[str | Path]) -> list[Group]:
    """Parse and check the files' structure (not yet against a database: ``validate``)."""
    return load_texts(read_files(paths))


def load_texts(files: Iterable[tuple[str, str]]) -> list[Group]:
    """``load_files`` on (name, text) pairs: what the HTTP API is sent."""
    import yaml

    groups: list[Group] = []
    seen: dict[str, str] = {}
    for path, text in files:
        try:
            tree = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" (line {mark.line + 1})" if mark is not None else ""
            raise RuleError(f"{path}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
        if tree is None:
            continue
        if not isinstance(tree, dict) or set(tree) - {"groups"}:
            raise RuleError(f"{path}: expected a mapping with one key, groups")
        gl = tree.get("groups") or []
        if not isinstance(gl, list):
            raise RuleError(f"{path}: groups must be a list")
        for i, g in enumerate(gl):
            groups.append(_group(str(path), i, g, seen))
    return groups


def _group(file: str, i: int, g: Any, seen: dict[str, str]) -> Group:
    if not isinstance(g, dict):
        raise RuleError(f"{file}: group {i + 1}: expected a mapping with name, interval, rules")
    name = g.get("name")
    if not isinstance(name, str) or not name.strip():
        raise RuleError(f"{file}: group {i + 1}: needs a name")
    where = f"{file}: group {name!r}"
    extra = sorted(set(g) - _GROUP_KEYS)
    if extra:
        raise RuleError(f"{where}: unknown key {extra[0]!r} (known: {', '.join(sorted(_GROUP_KEYS))})")
    if name in seen:
        raise RuleError(f"{where}: a group of this name is already in {seen[name]}")
    seen[name] = file
    interval = _duration(where, "interval", g.get("interval", DEFAULT_INTERVAL))
    if interval < 1:
        raise RuleError(f"{where}: interval must be at least 1s")
    rules_raw = g.get("rules") or []
    if not isinstance(rules_raw, list):
        raise RuleError(f"{where}: rules must be a list")
    rules: list[Rule] = []
    names: set[str] = set()
    for j, r in enumerate(rules_raw):
        rule = _rule(file, name, j, r)
        if rule.name in names:
            raise RuleError(f"{rule.where()}: two rules of this name in the group")
        names.add(rule.name)
        rules.append(rule)
    return Group(name, file, interval, rules)


def _duration(where: str, key: str, v: Any) -> float:
    try:
        return parse_duration(key, v)
    except ConfigError as e:
        raise RuleError(f"{where}: {e}") from None


def _strings(where: str, key: str, v: Any, names: bool) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise RuleError(f"{where}: {key} must be a mapping")
    out = {}
    for k, x in v.items():
        if names and not (isinstance(k, str) and _LABEL.match(k)):
            raise RuleError(f"{where}: {key}: {k!r} is not a valid label name")
        if not isinstance(x, (str, int, float)) or isinstance(x, bool):
            raise RuleError(f"{where}: {key}.{k} must be a string")
        out[str(k)] = str(x)
    return out


def _rule(file: str, group: str, j: int, r: Any) -> Rule:
    if not isinstance(r, dict):
        raise RuleError(f"{file}: group {group!r}: rule {j + 1}: expected a mapping")
    name = r.get("alert")
    if not isinstance(name, str) or not _LABEL.match(name):
        raise RuleError(f"{file}: group {group!r}: rule {j + 1}: alert must be a name (letters, digits, _)")
    rule = Rule(name, group, file)
    where = rule.where()
    extra = sorted(set(r) - _RULE_KEYS)
    if extra:
        raise RuleError(f"{where}: unknown key {extra[0]!r} (known: {', '.join(sorted(_RULE_KEYS))})")
    if ("expr" in r) == ("finding" in r):
        raise RuleError(f"{where}: give exactly one of expr (SQL) or finding (a detector's name)")
    if "expr" in r:
        if not isinstance(r["expr"], str) or not r["expr"].strip():
            raise RuleError(f"{where}: expr must be a SELECT statement")
        rule.expr = r["expr"].strip().rstrip(";")
        if "filters" in r or "window" in r:
            raise RuleError(f"{where}: filters and window apply to finding rules only")
    else:
        from .detectors import DETECTORS

        kind = r["finding"]
        if kind not in DETECTORS:
            raise RuleError(f"{where}: finding {kind!r} is not a detector (known: {', '.join(sorted(DETECTORS))})")
        rule.finding = kind
        f = r.get("filters") or {}
        if not isinstance(f, dict):
            raise RuleError(f"{where}: filters must be a mapping")
        bad = sorted(set(f) - set(FINDING_FILTERS))
        if bad:
            raise RuleError(f"{where}: filters: unknown key {bad[0]!r} (known: {', '.join(FINDING_FILTERS)})")
        if "min_severity" in f and f["min_severity"] not in SEVERITIES:
            raise RuleError(f"{where}: filters.min_severity must be one of {', '.join(SEVERITIES)}")
        if "min_confidence" in f:
            c = f["min_confidence"]
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c <= 1:
                raise RuleError(f"{where}: filters.min_confidence must be a number from 0 to 1")
        rule.filters = dict(f)
        rule.window = _duration(where, "window", r.get("window", DEFAULT_WINDOW))
        if rule.window <= 0:
            raise RuleError(f"{where}: window must be positive")
    rule.for_ = _duration(where, "for", r.get("for", 0))
    rule.keep_firing_for = _duration(where, "keep_firing_for", r.get("keep_firing_for", 0))
    rule.labels = _strings(where, "labels", r.get("labels"), names=True)
    rule.annotations = _strings(where, "annotations", r.get("annotations"), names=True)
    inh = r.get("inhibit_on_revocation", False)
    if not isinstance(inh, bool):
        raise RuleError(f"{where}: inhibit_on_revocation must be true or false")
    rule.inhibit_on_revocation = inh
    for k, text in {**rule.labels, **rule.annotations}.items():
        for m in _TEMPLATE.finditer(text):
            body = m.group(1)
            if not (_T_LABEL.match(body) or _T_VALUE.match(body) or _T_PRINTF.match(body)
                    or (_T_SUMMARY.match(body) and rule.finding)):
                raise RuleError(f"{where}: {k}: unsupported template {{{{{body}}}}} "
                                "(use {{ $labels.NAME }}, {{ $value }} or {{ printf \"%.2f\" $value }})")
    return rule


# -- evaluation ---------------------------------------------------------------------------------
def prepare(con: duckdb.DuckDBPyConnection, at: dt.datetime) -> None:
    """``eval_time()`` on this connection: the evaluation's time."""
    con.execute(f"SET VARIABLE cmdare_eval_time = TIMESTAMP '{at.isoformat(sep=' ')}'")
    con.execute("CREATE OR REPLACE TEMP MACRO eval_time() AS getvariable('cmdare_eval_time')")


def columns_of(con: duckdb.DuckDBPyConnection, rule: Rule) -> list[str]:
    """The columns the rule's instances will have (its labels, and value); RuleError when
    its SQL is not one SELECT or does not bind (an unknown table or column)."""
    if rule.finding:
        return [*FINDING_LABELS, "value"]
    from .safesql import SqlRefused, check

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


def validate(con: duckdb.DuckDBPyConnection, groups: list[Group]) -> None:
    """Every rule's SQL parses and binds against this database, and its templates name
    columns it has."""
    prepare(con, utcnow())
    for g in groups:
        for r in g.rules:
            cols = columns_of(con, r)
            have = set(cols) | set(r.labels) | {"alertname"}
            for k, text in {**r.labels, **r.annotations}.items():
                for m in _TEMPLATE.finditer(text):
                    lm = _T_LABEL.match(m.group(1))
                    if lm and lm.group(1) not in have:
                        raise RuleError(f"{r.where()}: {k}: $labels.{lm.group(1)} is not a column of the "
                                        f"expression (columns: {', '.join(c for c in cols if c != 'value')})")


def _first(e: BaseException) -> str:
    lines = [x for x in str(e).splitlines() if x.strip()] or [type(e).__name__]
    return lines[0]


@dataclass
class Instance:
    labels: dict[str, str]
    value: float
    summary: str = ""


def evaluate(con: duckdb.DuckDBPyConnection, rule: Rule, at: dt.datetime, timeout: float = 30.0) -> list[Instance]:
    """The rule's instances at ``at`` (raises duckdb.Error / RuleError when it cannot run)."""
    if rule.finding:
        return _findings(con, rule, at)
    from .safesql import interrupt_after

    prepare(con, at)
    with interrupt_after(con, timeout) as fired:
        try:
            cur = con.execute(rule.expr)  # type: ignore[arg-type]
            cols = [d[0] for d in cur.description or []]
            rows = cur.fetchmany(10_001)
        except duckdb.Error as e:
            if fired.is_set():
                raise RuleError(f"expr stopped after {timeout:g} s") from None
            raise RuleError(f"expr failed: {_first(e)}") from None
    if len(rows) > 10_000:
        raise RuleError("expr returned more than 10,000 rows (alert instances): narrow it")
    out = []
    vi = cols.index("value") if "value" in cols else None
    for row in rows:
        v = 1.0 if vi is None else row[vi]
        if v is None:
            continue  # no value: no instance (as a PromQL comparison that filtered it)
        v = float(v)
        if math.isnan(v):
            continue
        labels = {c: "" if x is None else str(x) for i, (c, x) in enumerate(zip(cols, row, strict=True)) if i != vi}
        out.append(Instance(labels, v))
    return out


_SEV = {s: i for i, s in enumerate(SEVERITIES)}


def _findings(con: duckdb.DuckDBPyConnection, rule: Rule, at: dt.datetime) -> list[Instance]:
    from .detectors import DETECTORS
    from .units import Scope, check_requirements, run_unit

    f = rule.filters
    scope = Scope(job=f.get("job"), since=at - dt.timedelta(seconds=rule.window), until=at)
    assert rule.finding is not None
    try:
        check_requirements(DETECTORS, rule.finding, con)
    except AnalyticsError:
        return []  # nothing to detect from yet (e.g. no rows in checkpoints): no instances
    found = run_unit(DETECTORS, rule.finding, con, scope, {})
    out = []
    for x in found:
        if "node" in f and x.node != f["node"]:
            continue
        if "min_severity" in f and _SEV.get(x.severity, 0) < _SEV[f["min_severity"]]:
            continue
        if x.confidence < float(f.get("min_confidence", 0)):
            continue
        labels = {"kind": x.kind, "job": x.job or "", "node": getattr(x, "node", None) or "",
                  "rank": "" if getattr(x, "rank", None) is None else str(x.rank),
                  "subject": getattr(x, "subject", None) or "", "severity": x.severity}
        out.append(Instance(labels, float(x.confidence), x.summary))
    return out


def render(text: str, labels: dict[str, str], value: float, summary: str = "") -> str:
    def sub(m: re.Match[str]) -> str:
        body = m.group(1)
        if lm := _T_LABEL.match(body):
            return labels.get(lm.group(1), "")
        if _T_VALUE.match(body):
            return f"{value:g}"
        if pm := _T_PRINTF.match(body):
            return pm.group(1) % value
        if _T_SUMMARY.match(body):
            return summary
        return m.group(0)

    return _TEMPLATE.sub(sub, text)


def fingerprint(rule: Rule, labels: dict[str, str]) -> str:
    text = json.dumps([rule.id, sorted(labels.items())], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- state ----------------------------------------------------------------------------------------
@dataclass
class Alert:
    rule: str
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str  # pending | firing | inhibited | resolved
    value: float
    active_at: dt.datetime
    fired_at: dt.datetime | None = None
    last_seen: dt.datetime | None = None
    resolved_at: dt.datetime | None = None
    last_sent: dt.datetime | None = None
    sent_resolved: bool = False
    inhibited_by: str | None = None

    @property
    def firing(self) -> bool:
        return self.state in ("firing", "inhibited")


@dataclass
class RuleHealth:
    health: str = "unknown"
    last_error: str | None = None
    last_eval: dt.datetime | None = None
    eval_seconds: float | None = None
    instances: int = 0


class Engine:
    """Evaluates groups and keeps every alert's state (Prometheus's state machine):

    - a new instance is ``pending`` from ``active_at``; it is ``firing`` once it has held for
      ``for`` (at once with ``for: 0``), from ``fired_at``;
    - an instance no longer returned: pending ones go; firing ones stay firing while
      ``keep_firing_for`` has not passed since ``last_seen``, then are ``resolved``
      (``resolved_at``) and kept ``RESOLVED_RETENTION`` for the receivers;
    - a resolved instance that comes back starts again as pending;
    - a rule that fails leaves its alerts as they were and is marked unhealthy.
    """

    def __init__(self, groups: list[Group], inhibit_window: float = 1800.0) -> None:
        self.groups = groups
        self.rules = {r.id: r for g in groups for r in g.rules}
        self.alerts: dict[tuple[str, str], Alert] = {}
        self.health: dict[str, RuleHealth] = {r: RuleHealth() for r in self.rules}
        self.inhibit_window = inhibit_window
        self.lock = threading.Lock()
        self.receivers: list[Any] = []  # those that deliver (resolutions are kept until they have)

    def delivered(self, items: list[tuple[tuple[str, str], bool]], at: dt.datetime, receiver: Any) -> None:
        """A receiver delivered these alerts (``True``: their resolution) at ``at``."""
        with self.lock:
            for key, resolved in items:
                a = self.alerts.get(key)
                if a is None:
                    continue
                a.last_sent = at
                if resolved and all(key in getattr(r, "resolved_sent", set()) for r in self.receivers):
                    a.sent_resolved = True

    # persistence
    def restore(self, con: duckdb.DuckDBPyConnection) -> int:
        """Load the alerts a previous run left (of rules still loaded)."""
        rows = con.execute(
            "SELECT rule, fingerprint, labels, annotations, state, value, active_at, fired_at, last_seen, "
            "resolved_at, last_sent, sent_resolved, inhibited_by FROM alerts"
        ).fetchall()
        n = 0
        with self.lock:
            for r in rows:
                if r[0] not in self.rules:
                    continue
                a = Alert(r[0], r[1], json.loads(r[2]), json.loads(r[3] or "{}"), r[4], r[5] or 0.0, r[6], r[7], r[8],
                          r[9], r[10], bool(r[11]), r[12])
                self.alerts[(a.rule, a.fingerprint)] = a
                n += 1
        return n

    def save(self, con: duckdb.DuckDBPyConnection, group: Group, at: dt.datetime) -> None:
        ids = [r.id for r in group.rules]
        with self.lock:
            rows = [
                (a.rule, a.fingerprint, json.dumps(a.labels), json.dumps(a.annotations), a.state, a.value,
                 a.active_at, a.fired_at, a.last_seen, a.resolved_at, a.last_sent, a.sent_resolved, a.inhibited_by, at)
                for a in self.alerts.values() if a.rule in ids
            ]
            health = [(rid, group.name, group.file, h.health, h.last_error, h.last_eval, h.eval_seconds, h.instances)
                      for rid, h in self.health.items() if rid in ids]
        con.execute("BEGIN")
        try:
            con.execute(f"DELETE FROM alerts WHERE rule IN ({','.join('?' * len(ids))})", ids)
            if rows:
                con.executemany("INSERT INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            con.execute(f"DELETE FROM alert_rules WHERE rule IN ({','.join('?' * len(ids))})", ids)
            con.executemany("INSERT INTO alert_rules VALUES (?, ?, ?, ?, ?, ?, ?, ?)", health)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    # evaluation
    def eval_group(self, con: duckdb.DuckDBPyConnection, group: Group, at: dt.datetime) -> None:
        revoked = self._revoked(con, at) if any(r.inhibit_on_revocation for r in group.rules) else None
        for rule in group.rules:
            t0 = time.perf_counter()
            h = self.health[rule.id]
            try:
                found = evaluate(con, rule, at)
            except (RuleError, duckdb.Error) as e:
                h.health, h.last_error = "error", str(e) if isinstance(e, RuleError) else _first(e)
                h.last_eval, h.eval_seconds = at, time.perf_counter() - t0
                continue  # its alerts stay as they were
            h.health, h.last_error, h.last_eval = "ok", None, at
            h.eval_seconds, h.instances = time.perf_counter() - t0, len(found)
            self._apply(rule, found, at, revoked)

    def _apply(self, rule: Rule, found: list[Instance], at: dt.datetime,
               revoked: dict[str, tuple[str, dt.datetime]] | None) -> None:
        seen: set[str] = set()
        with self.lock:
            for inst in found:
                labels = {**inst.labels, **rule.labels, "alertname": rule.name}
                labels = {k: render(v, inst.labels, inst.value, inst.summary) if k in rule.labels else v
                          for k, v in labels.items()}
                fp = fingerprint(rule, labels)
                if fp in seen:
                    continue  # one instance per rule and label set
                seen.add(fp)
                ann = {k: render(v, labels, inst.value, inst.summary) for k, v in rule.annotations.items()}
                if rule.finding and "summary" not in ann:
                    ann["summary"] = inst.summary
                a = self.alerts.get((rule.id, fp))
                if a is None or a.state == "resolved":
                    a = Alert(rule.id, fp, labels, ann, "pending", inst.value, at)
                    self.alerts[(rule.id, fp)] = a
                a.value, a.annotations, a.last_seen = inst.value, ann, at
                if a.state == "pending" and (at - a.active_at).total_seconds() >= rule.for_:
                    a.state, a.fired_at = "firing", at
                if a.firing:
                    self._inhibit(rule, a, revoked)
            for key, a in list(self.alerts.items()):
                if key[0] != rule.id or key[1] in seen:
                    continue
                if a.state == "pending":
                    del self.alerts[key]
                elif a.firing:
                    if rule.keep_firing_for and a.last_seen and (at - a.last_seen).total_seconds() < rule.keep_firing_for:
                        continue
                    a.state, a.resolved_at, a.inhibited_by = "resolved", at, None
                elif a.state == "resolved" and a.resolved_at:
                    age = (at - a.resolved_at).total_seconds()
                    # kept until every receiver has the resolution (a day at most)
                    undelivered = bool(self.receivers) and not a.sent_resolved and a.last_sent is not None
                    if age > RESOLVED_RETENTION and (not undelivered or age > 86400):
                        del self.alerts[key]

    def _revoked(self, con: duckdb.DuckDBPyConnection, at: dt.datetime) -> dict[str, tuple[str, dt.datetime]]:
        """Nodes (and their jobs) whose life ended revoked within the inhibition window:
        name -> (node, notice time)."""
        try:
            rows = con.execute(
                """
                SELECT l.node, n.job, coalesce(l.revoked_notice_at, l.ended_at, l.last_seen)
                FROM instance_lives(asof_ts := ?) l LEFT JOIN nodes n USING (node)
                WHERE l.end_reason = 'revoked' OR l.revoked_notice_at IS NOT NULL
                """,
                [at],
            ).fetchall()
        except duckdb.Error:
            return {}
        out: dict[str, tuple[str, dt.datetime]] = {}
        for node, job, t in rows:
            if t is None or (at - t).total_seconds() > self.inhibit_window:
                continue
            out[f"node:{node}"] = (node, t)
            if job:
                out.setdefault(f"job:{job}", (node, t))
        return out

    def _inhibit(self, rule: Rule, a: Alert, revoked: dict[str, tuple[str, dt.datetime]] | None) -> None:
        if not rule.inhibit_on_revocation or not revoked:
            if a.state == "inhibited":
                a.state, a.inhibited_by = "firing", None
            return
        hit = revoked.get(f"node:{a.labels.get('node', '')}") or revoked.get(f"job:{a.labels.get('job', '')}")
        if hit:
            a.state = "inhibited"
            a.inhibited_by = f"revocation of {hit[0]} at {hit[1].isoformat(sep=' ', timespec='seconds')}"
        elif a.state == "inhibited":
            a.state, a.inhibited_by = "firing", None

    def snapshot(self) -> list[Alert]:
        with self.lock:
            return sorted(self.alerts.values(), key=lambda a: (a.rule, sorted(a.labels.items())))


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


# tables of rare, urgent events: a group reading one is evaluated as soon as rows of it are
# stored, not at its next interval (a revocation notice must not wait 15 s)
URGENT_TABLES = ("revocations", "lifecycle_events", "gpu_events")


def urgent_tables(group: Group) -> set[str]:
    """The urgent tables the group's SQL rules read (instance_lives reads them all)."""
    out: set[str] = set()
    for r in group.rules:
        text = (r.expr or "").lower()
        for t in URGENT_TABLES:
            if re.search(rf"\b{t}\b", text) or "instance_lives" in text:
                out.add(t)
    return out


def run_forever(engine: Engine, cursor: Callable[[], duckdb.DuckDBPyConnection], stop: threading.Event,
                on_round: Callable[[Group, dt.datetime], None] | None = None,
                clock: Callable[[], dt.datetime] = utcnow, wake: threading.Event | None = None,
                urgent: set[str] | None = None, min_gap: float = 0.2) -> None:
    """Each group at its own interval until ``stop`` (the collector's evaluation thread);
    groups named in ``urgent`` (filled by the ingest side, with ``wake`` set) at once, at most
    every ``min_gap`` seconds."""
    import logging

    log = logging.getLogger("cmdare.alerts")
    due = {g.name: 0.0 for g in engine.groups}
    last = {g.name: 0.0 for g in engine.groups}
    con = cursor()
    while not stop.is_set():
        now_m = time.monotonic()
        hot: set[str] = set()
        if urgent:
            hot = {n for n in list(urgent) if now_m - last[n] >= min_gap}
            urgent.difference_update(hot)
        for g in engine.groups:
            if now_m < due[g.name] and g.name not in hot:
                continue
            due[g.name], last[g.name] = now_m + g.interval, now_m
            at = clock()
            try:
                engine.eval_group(con, g, at)
                engine.save(con, g, at)
                if on_round:
                    on_round(g, at)
            except Exception as e:  # never stop evaluating: next round
                log.error("alert group %s: %s: %s", g.name, type(e).__name__, e)
        wait = min(due.values()) - time.monotonic() if due else 1.0
        if urgent:
            wait = min(wait, min_gap)
        ev = wake or stop
        ev.wait(max(0.01, min(wait, 1.0)))
        if wake is not None:
            wake.clear()


# -- unit tests of rules (analyze alerts test), as promtool test rules does -------------------
TEST_BASE = dt.datetime(2026, 1, 1)
_TEST_KEYS = {"rule_files", "evaluation_interval", "tests"}
_CASE_KEYS = {"name", "rows", "alert_rule_test", "inhibit_window"}


@dataclass
class TestResult:
    name: str
    failures: list[str]


def _offset(where: str, v: Any) -> dt.datetime:
    return TEST_BASE + dt.timedelta(seconds=_duration(where, "time", v))


def run_tests(path: str | Path, schema: Callable[[], duckdb.DuckDBPyConnection]) -> list[TestResult]:
    """Run the test file's cases: each on a fresh database (``schema()``) holding its input
    rows (times as offsets from the start), the rules evaluated every ``evaluation_interval``
    up to the last ``eval_time``, the firing alerts compared at each ``eval_time``."""
    import yaml

    p = Path(path)
    try:
        tree = yaml.safe_load(p.read_text())
    except OSError as e:
        raise RuleError(f"{p}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise RuleError(f"{p}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(tree, dict) or set(tree) - _TEST_KEYS or "tests" not in tree:
        raise RuleError(f"{p}: expected rule_files, evaluation_interval (optional) and tests")
    files = [f if f == "default" else str((p.parent / f).resolve()) for f in tree.get("rule_files") or []]
    if not files:
        raise RuleError(f"{p}: rule_files: name at least one rule file")
    step_s = _duration(str(p), "evaluation_interval", tree.get("evaluation_interval", "15s"))
    if step_s <= 0:
        raise RuleError(f"{p}: evaluation_interval must be positive")
    groups = load_files(files)
    results = []
    for i, case in enumerate(tree["tests"] or []):
        name = str(case.get("name", f"test {i + 1}")) if isinstance(case, dict) else f"test {i + 1}"
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
            times = sorted({_offset(where, c.get("eval_time")) for c in checks})
            engine = Engine(groups, _duration(where, "inhibit_window", case.get("inhibit_window", "30m")))
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
        try:
            cols = {r[0]: r[1] for r in con.execute(f'DESCRIBE "{table}"').fetchall()}
        except duckdb.Error:
            raise RuleError(f"{where}: rows: no table {table!r}") from None
        for row in items or []:
            if not isinstance(row, dict):
                raise RuleError(f"{where}: rows.{table}: each row is a mapping of column -> value")
            vals = dict(row)
            for k in list(vals):
                if k not in cols:
                    raise RuleError(f"{where}: rows.{table}: no column {k!r} (columns: {', '.join(cols)})")
                if cols[k].startswith("TIMESTAMP"):
                    vals[k] = _offset(f"{where}: rows.{table}.{k}", vals[k])
                elif cols[k] == "JSON" and not isinstance(vals[k], str):
                    vals[k] = json.dumps(vals[k])
            if "id" in cols and "id" not in vals:
                n += 1
                vals["id"] = f"test-{n}"
            names = list(vals)
            try:
                con.execute(f'INSERT INTO "{table}" ({", ".join(chr(34) + c + chr(34) for c in names)}) '
                            f"VALUES ({', '.join('?' * len(names))})", [vals[c] for c in names])
            except duckdb.Error as e:
                raise RuleError(f"{where}: rows.{table}: {_first(e)}") from None


def _check(where: str, c: dict[str, Any], alerts_: list[Alert]) -> list[str]:
    name = c.get("alertname")
    when = c.get("eval_time")
    got = [({k: v for k, v in a.labels.items() if k != "alertname"}, a.annotations)
           for a in alerts_ if a.labels.get("alertname") == name and a.state == "firing"]
    exp = c.get("exp_alerts") or []
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
