"""Alert state: Prometheus's state machine per rule instance, kept in DuckDB (the
``alerts`` and ``alert_rules`` tables) so that a restart resumes it."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import duckdb

from .evaluate import _SEV, Instance, _first, evaluate, fingerprint, render
from .rulefmt import Group, Rule, RuleError

RESOLVED_RETENTION = 900.0  # a resolved alert is kept (and its resolution re-sent) this long


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
    # this firing episode was handed to the receivers (saved before it is sent): its
    # resolution is owed to them, across restarts
    notified: bool = False

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
        self.rule_timeout = 30.0  # seconds one rule's query may run
        # with the collector's detector schedule on: finding rules read the findings it stored
        # within this many seconds (unresolved) instead of running their detector again
        self.findings_fresh: float | None = None
        # where a rule's SQL runs, when not on the round's connection: (rule, at, timeout,
        # horizon, lag) -> its instances (a lake's ruler: a worker process, analytics/server/sqlpool.py)
        self.evaluator: Any = None

    def delivered(self, items: list[tuple[tuple[str, str], Any, bool]], at: dt.datetime) -> None:
        """A receiver delivered these alerts (key, episode, ``True``: their resolution) at
        ``at``; a resolution counts once every receiver has it."""
        with self.lock:
            for key, episode, resolved in items:
                a = self.alerts.get(key)
                if a is None or a.fired_at != episode:
                    continue  # a later episode of the same instance: not this one's delivery
                a.last_sent = at
                if resolved and all((key, episode) in r.resolved_sent for r in self.receivers):
                    a.sent_resolved = True

    def mark_notified(self, keys: list[tuple[str, str]]) -> None:
        """These firing alerts are about to be handed to the receivers (saved first)."""
        with self.lock:
            for key in keys:
                a = self.alerts.get(key)
                if a is not None:
                    a.notified = True

    # persistence
    def restore(self, con: duckdb.DuckDBPyConnection) -> int:
        """Load the alerts a previous run left (of rules still loaded)."""
        rows = con.execute(
            "SELECT rule, fingerprint, labels, annotations, state, value, active_at, fired_at, last_seen, "
            "resolved_at, last_sent, sent_resolved, inhibited_by, notified FROM alerts ORDER BY rule, fingerprint"
        ).fetchall()
        n = 0
        with self.lock:
            for r in rows:
                if r[0] not in self.rules:
                    continue
                a = Alert(r[0], r[1], json.loads(r[2]), json.loads(r[3] or "{}"), r[4], r[5] or 0.0, r[6], r[7], r[8],
                          r[9], r[10], bool(r[11]), r[12], bool(r[13]) or r[10] is not None)
                self.alerts[(a.rule, a.fingerprint)] = a
                n += 1
        return n

    def rows(self, group: Group, at: dt.datetime) -> tuple[list[str], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The group's state as saved: its rule ids, its alerts' rows (``alerts``' columns)
        and its rules' health rows (``alert_rules``')."""
        ids = [r.id for r in group.rules]
        with self.lock:
            rows = [
                (a.rule, a.fingerprint, json.dumps(a.labels), json.dumps(a.annotations), a.state, a.value,
                 a.active_at, a.fired_at, a.last_seen, a.resolved_at, a.last_sent, a.sent_resolved, a.inhibited_by, at,
                 a.notified)
                for a in self.alerts.values() if a.rule in ids
            ]
            health = [(rid, group.name, group.file, h.health, h.last_error, h.last_eval, h.eval_seconds, h.instances)
                      for rid, h in self.health.items() if rid in ids]
        return ids, rows, health

    def save(self, con: duckdb.DuckDBPyConnection, group: Group, at: dt.datetime,
             state: tuple[list[str], list[tuple[Any, ...]], list[tuple[Any, ...]]] | None = None) -> None:
        """Write the group's state (``state``: as ``rows`` gave it) into ``con``'s tables."""
        write_rows(con, *(state or self.rows(group, at)))

    # evaluation
    def eval_group(self, con: duckdb.DuckDBPyConnection, group: Group, at: dt.datetime,
                   horizon: dt.datetime | None = None, lag: float = 0.0) -> None:
        """Every rule of the group at ``at``; ``horizon``: the collector's ingest horizon
        (``ingest_horizon()``), None when it is not behind; ``lag``: seconds it has had
        unread input (``ingest_lag()``)."""
        revoked = self._revoked(con, at) if any(r.inhibit_on_revocation for r in group.rules) else None
        for rule in group.rules:
            t0 = time.perf_counter()
            h = self.health[rule.id]
            try:
                if self.evaluator is not None and not rule.finding:
                    found = self.evaluator(rule, at, self.rule_timeout, horizon, lag)
                else:
                    found = evaluate(con, rule, at, self.rule_timeout, horizon, lag, self.findings_fresh)
                self._apply(rule, found, at, revoked)
            except Exception as e:  # this rule only: the rest of the group runs
                h.health = "error"
                h.last_error = str(e)[:300] if isinstance(e, RuleError) else f"{type(e).__name__}: {_first(e)}"
                h.last_eval, h.eval_seconds = at, time.perf_counter() - t0
                continue  # its alerts stay as they were
            h.health, h.last_error, h.last_eval = "ok", None, at
            h.eval_seconds, h.instances = time.perf_counter() - t0, len(found)

    def _apply(self, rule: Rule, found: list[Instance], at: dt.datetime,
               revoked: dict[str, tuple[str, dt.datetime]] | None) -> None:
        # rendered before anything changes: a failure here leaves the rule's alerts as they were
        items: dict[str, tuple[Instance, dict[str, str], dict[str, str]]] = {}
        for inst in found:
            labels = {**inst.labels, **rule.labels, "alertname": rule.name}
            labels = {k: render(v, inst.labels, inst.value, inst.summary) if k in rule.labels else v
                      for k, v in labels.items()}
            # a finding's alert is the finding (kind, job, node, rank, subject): its severity
            # moving between rounds neither ends it nor starts another (it keeps the highest)
            fp = fingerprint(rule, {k: v for k, v in labels.items() if not (rule.finding and k == "severity")})
            if fp in items:
                continue  # one instance per rule and label set
            ann = {k: render(v, labels, inst.value, inst.summary) for k, v in rule.annotations.items()}
            if rule.finding and "summary" not in ann:
                ann["summary"] = inst.summary
            items[fp] = (inst, labels, ann)
        seen = set(items)
        with self.lock:
            for fp, (inst, labels, ann) in items.items():
                a = self.alerts.get((rule.id, fp))
                if inst.hold:  # an open finding not standing this round: its alert as it is
                    if a is None or a.state == "resolved":
                        seen.discard(fp)
                        continue
                    a.last_seen = at
                    continue
                if a is None or a.state == "resolved":
                    a = Alert(rule.id, fp, labels, ann, "pending", inst.value, at)
                    self.alerts[(rule.id, fp)] = a
                elif rule.finding and _SEV.get(a.labels.get("severity", ""), 0) > _SEV.get(labels.get("severity", ""), 0):
                    labels = {**labels, "severity": a.labels["severity"]}
                a.labels = labels
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
                    undelivered = bool(self.receivers) and not a.sent_resolved and a.notified
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


def write_rows(con: duckdb.DuckDBPyConnection, ids: list[str] | None, rows: list[tuple[Any, ...]],
               health: list[tuple[Any, ...]]) -> None:
    """Replace these rules' rows of ``alerts`` and ``alert_rules`` (``ids`` None: every
    rule's: a copy of another process's state) in one transaction."""
    con.execute("BEGIN")
    try:
        if ids is None:
            con.execute("DELETE FROM alerts")
            con.execute("DELETE FROM alert_rules")
        elif ids:
            con.execute(f"DELETE FROM alerts WHERE rule IN ({','.join('?' * len(ids))})", ids)
            con.execute(f"DELETE FROM alert_rules WHERE rule IN ({','.join('?' * len(ids))})", ids)
        if rows:
            con.executemany("INSERT INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        if health:
            con.executemany("INSERT INTO alert_rules VALUES (?, ?, ?, ?, ?, ?, ?, ?)", health)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
