"""Alert rules evaluated inside the collector (``--rules FILE...``): a thread beside the
ingest loop, on its own cursor of the collector's connection, reading what was committed;
state restored from the ``alerts`` table at start and saved after every group's round.

Receivers: the log (each change of state, one line); the others are in
docs/alerts.md.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from pathlib import Path
from typing import Any

import duckdb

from cmdare.analytics import alerts

log = logging.getLogger("cmdare.alerts")


def rule_paths(given: tuple[str, ...]) -> list[Path]:
    return alerts.resolve_paths(given)


class LogReceiver:
    """One log line per change of an alert's state."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], str] = {}

    def round(self, engine: alerts.Engine) -> None:
        now = {(a.rule, a.fingerprint): a for a in engine.snapshot()}
        for key, a in now.items():
            if self.last.get(key) != a.state:
                labels = ",".join(f"{k}={v}" for k, v in sorted(a.labels.items()) if k != "alertname")
                extra = f" ({a.inhibited_by})" if a.inhibited_by else ""
                log.warning("alert %s %s{%s} value=%g%s: %s", a.rule, a.state, labels, a.value, extra,
                            a.annotations.get("summary", ""))
        self.last = {k: a.state for k, a in now.items()}


class Alerting:
    def __init__(self, con: duckdb.DuckDBPyConnection, groups: list[alerts.Group], inhibit_window: float) -> None:
        from .db import cursor

        self.con = con
        # made here, on the thread that owns con: DuckDB refuses a connection used by two
        # threads at once (cursor() runs a statement on it)
        self._cur = cursor(con)
        self.cursor = lambda: self._cur
        self.engine = alerts.Engine(groups, inhibit_window)
        self.receivers: list[Any] = [LogReceiver()]
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.urgent: set[str] = set()  # groups to evaluate now (their urgent tables got rows)
        self._urgent_of = {g.name: alerts.urgent_tables(g) for g in groups}
        self.thread: threading.Thread | None = None

    def on_batch(self, result: Any) -> None:
        """Called by ingest after each committed batch (its thread: cheap)."""
        tables = {t for t, n in getattr(result, "rows", {}).items() if n}
        if not tables & set(alerts.URGENT_TABLES):
            return
        hit = {g for g, ts in self._urgent_of.items() if ts & tables}
        if hit:
            self.urgent.update(hit)
            self.wake.set()

    def add(self, receiver: Any) -> None:
        self.receivers.append(receiver)
        if hasattr(receiver, "resolved_sent"):
            self.engine.receivers.append(receiver)

    def start(self) -> int:
        restored = self.engine.restore(self.cursor())
        for r in self.receivers:  # what was already known and sent is not new
            if isinstance(r, LogReceiver):
                r.last = {(a.rule, a.fingerprint): a.state for a in self.engine.snapshot()}
            elif hasattr(r, "restore"):
                r.restore(self.engine)
        self.thread = threading.Thread(
            target=alerts.run_forever, args=(self.engine, self.cursor, self.stop_event, self._round),
            kwargs={"wake": self.wake, "urgent": self.urgent}, name="cmdare-alerts", daemon=True,
        )
        self.thread.start()
        return restored

    def _round(self, group: alerts.Group, at: Any) -> None:
        for r in self.receivers:
            try:
                r.round(self.engine)
            except Exception as e:  # a receiver never stops evaluation
                log.error("alert receiver %s: %s: %s", type(r).__name__, type(e).__name__, e)

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()
        if self.thread:
            self.thread.join(timeout=30)
        for r in self.receivers:
            if hasattr(r, "stop"):
                r.stop()


# -- receivers that deliver -----------------------------------------------------------------------
def receiver_label(spec: str) -> tuple[str, str, str]:
    """``NAME=URL`` or ``URL`` -> (the name shown in metrics and logs: NAME, else the URL's
    host and port only; the URL without user:password; that user:password as a Basic
    credential, base64, or ""). Paths and query strings often hold tokens (Slack-style
    hooks): they are never part of the name."""
    import base64
    import urllib.parse

    name, eq, url = spec.partition("=")
    if not eq or "://" in name:
        name, url = "", spec
    u = urllib.parse.urlsplit(url)
    basic = ""
    if u.username is not None or u.password is not None:
        cred = f"{urllib.parse.unquote(u.username or '')}:{urllib.parse.unquote(u.password or '')}"
        basic = base64.b64encode(cred.encode()).decode()
        host = u.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (f":{u.port}" if u.port else "")
        url = urllib.parse.urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))
    if not name:
        name = (u.hostname or "?") + (f":{u.port}" if u.port else "")
    return name.strip()[:64], url, basic



def _iso(t: Any) -> str:
    return t.isoformat(timespec="milliseconds") + "Z"


class HttpReceiver:
    """Alertmanager's v2 API (``POST /api/v2/alerts``) or a generic webhook (Alertmanager's
    webhook payload): firing alerts sent at once and again every ``resend`` while they fire
    (``endsAt`` a little ahead, as Prometheus does), resolutions sent with their ``endsAt``.
    Sending runs on its own thread with retries and capped exponential backoff: a receiver
    that hangs, fails or refuses never blocks evaluation or ingest, and a resolution is kept
    until it has been delivered."""

    def __init__(self, kind: str, url: str, resend: float = 60.0, timeout: float = 5.0, backoff_max: float = 30.0,
                 generator: str = "http://localhost/cmdare", token: str | None = None) -> None:
        self.label, url, self.basic = receiver_label(url)
        self.kind, self.url = kind, url.rstrip("/")
        self.endpoint = self.url + "/api/v2/alerts" if kind == "alertmanager" else self.url  # kafka: unused
        self.resend, self.timeout, self.backoff_max = resend, timeout, backoff_max
        self.generator, self.token = generator, token
        self.sent: dict[tuple[str, str], Any] = {}  # alert -> when this receiver last delivered it
        self.resolved_sent: set[tuple[str, str]] = set()
        self.sent_total = self.failed_total = 0
        self.last_error: str | None = None
        self._batch: list[tuple[tuple[str, str], dict[str, Any], bool]] | None = None
        self._cv = threading.Condition()
        self._stop = False
        self.engine: alerts.Engine | None = None
        self.thread = threading.Thread(target=self._run, name=f"cmdare-alerts-{kind}", daemon=True)
        self.thread.start()

    @property
    def name(self) -> str:
        """What metrics and logs call it: never its URL's credentials, path or query."""
        return f"{self.kind}:{self.label}"

    def restore(self, engine: alerts.Engine) -> None:
        self.engine = engine
        for a in engine.snapshot():
            if a.last_sent is not None:
                self.sent[(a.rule, a.fingerprint)] = a.last_sent
            if a.sent_resolved:
                self.resolved_sent.add((a.rule, a.fingerprint))

    def _item(self, a: alerts.Alert, now: Any) -> dict[str, Any]:
        from urllib.parse import quote

        ends = a.resolved_at if a.state == "resolved" else now + dt.timedelta(seconds=4 * self.resend)
        d = {
            "labels": a.labels, "annotations": a.annotations,
            "startsAt": _iso(a.fired_at or a.active_at), "endsAt": _iso(ends),
            "generatorURL": f"{self.generator}/alerts?rule={quote(a.rule)}",
        }
        if self.kind in ("webhook", "kafka"):
            d.update(status="resolved" if a.state == "resolved" else "firing", fingerprint=a.fingerprint)
        return d

    def round(self, engine: alerts.Engine) -> None:
        """Queue what is due: new and re-due firing alerts, undelivered resolutions."""
        self.engine = engine
        now = alerts.utcnow()
        due = []
        for a in engine.snapshot():
            key = (a.rule, a.fingerprint)
            if a.state == "firing":
                self.resolved_sent.discard(key)
                last = self.sent.get(key)
                if last is None or (now - last).total_seconds() >= self.resend:
                    due.append((key, self._item(a, now), False))
            elif a.state == "resolved" and key not in self.resolved_sent and key in self.sent:
                due.append((key, self._item(a, now), True))
        if due:
            with self._cv:
                merged = {k: (k, d, r) for k, d, r in (self._batch or [])}
                merged.update({k: (k, d, r) for k, d, r in due})
                self._batch = list(merged.values())
                self._cv.notify()

    def _payload(self, items: list[dict[str, Any]]) -> bytes:
        if self.kind == "alertmanager":
            return json.dumps(items).encode()
        firing = any(i["status"] == "firing" for i in items)
        common = dict(set.intersection(*(set(i["labels"].items()) for i in items))) if items else {}
        return json.dumps({
            "version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": "firing" if firing else "resolved",
            "receiver": "cmdare", "groupLabels": {}, "commonLabels": common, "commonAnnotations": {},
            "externalURL": self.generator, "alerts": items,
        }).encode()

    def _deliver(self, items: list[dict[str, Any]]) -> None:
        self._post(self._payload(items))

    def _post(self, body: bytes) -> None:
        import urllib.request

        req = urllib.request.Request(self.endpoint, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        elif self.basic:
            req.add_header("Authorization", f"Basic {self.basic}")
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            if r.status >= 300:
                raise OSError(f"HTTP {r.status}")

    def _run(self) -> None:
        delay = 0.5
        while True:
            with self._cv:
                while self._batch is None and not self._stop:
                    self._cv.wait()
                if self._stop and self._batch is None:
                    return
                batch, self._batch = self._batch, None
            assert batch is not None
            try:
                self._deliver([d for _, d, _ in batch])
            except Exception as e:  # refused, timed out, 4xx/5xx: keep it, back off, retry
                self.failed_total += 1
                msg = f"{type(e).__name__}: {e}"
                if msg != self.last_error:
                    log.warning("alert receiver %s: %s (retrying with backoff)", self.name, msg)
                self.last_error = msg
                with self._cv:  # newer versions of the same alerts win; the rest go again
                    merged = {k: (k, d, r) for k, d, r in batch}
                    merged.update({k: (k, d, r) for k, d, r in (self._batch or [])})
                    self._batch = list(merged.values())
                    if self._stop:
                        return
                    self._cv.wait(delay)
                delay = min(delay * 2, self.backoff_max)
                continue
            delay = 0.5
            if self.last_error:
                log.info("alert receiver %s: delivering again", self.name)
            self.last_error = None
            self.sent_total += 1
            now = alerts.utcnow()
            for key, _, resolved in batch:
                self.sent[key] = now
                if resolved:
                    self.resolved_sent.add(key)
            if self.engine is not None:
                self.engine.delivered([(k, r) for k, _, r in batch], now, self)

    def stop(self, grace: float = 3.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self.thread.join(timeout=grace)


class KafkaReceiver(HttpReceiver):
    """Alerts as JSON messages on a Kafka topic (``--alert-kafka kafka://host:port/topic``):
    one message per alert and change (the webhook format's alert object, with ``status``),
    keyed by fingerprint so that one alert's messages stay in order; acks=all."""

    def __init__(self, url: Any, resend: float = 60.0, generator: str = "http://localhost/cmdare") -> None:
        self.kurl = url
        self.producer: Any = None
        super().__init__("kafka", url.text, resend, generator=generator)

    @property
    def name(self) -> str:
        return self.kurl.text

    def _deliver(self, items: list[dict[str, Any]]) -> None:
        from kafka import KafkaProducer

        if self.producer is None:
            self.producer = KafkaProducer(bootstrap_servers=self.kurl.bootstrap, acks="all", client_id="cmdare-alerts",
                                          request_timeout_ms=int(self.timeout * 1000),
                                          max_block_ms=int(self.timeout * 1000), **self.kurl.client_options())
        try:
            futures = [self.producer.send(self.kurl.topic, key=i["fingerprint"].encode(), value=json.dumps(i).encode())
                       for i in items]
            for f in futures:
                f.get(timeout=self.timeout)
        except Exception:
            self.producer.close(timeout=1)
            self.producer = None
            raise

    def stop(self, grace: float = 3.0) -> None:
        super().stop(grace)
        if self.producer is not None:
            self.producer.close(timeout=1)


def load(con: duckdb.DuckDBPyConnection, given: tuple[str, ...], inhibit_window: float,
         alertmanagers: tuple[str, ...] = (), webhooks: tuple[str, ...] = (), resend: float = 60.0,
         generator: str | None = None, kafka_topics: tuple[Any, ...] = ()) -> Alerting:
    """Load and validate the rule files against the collector's database (RuleError: one
    line) and build the evaluation; ``start()`` runs it."""
    from .db import cursor

    groups = alerts.load_files(rule_paths(given))
    c = cursor(con)
    try:
        alerts.validate(c, groups)
    finally:
        c.close()
    al = Alerting(con, groups, inhibit_window)
    if generator is None:  # where the alert came from, as Alertmanager shows it
        import socket

        generator = f"http://{socket.gethostname()}/cmdare"
    for u in alertmanagers:
        al.add(HttpReceiver("alertmanager", u, resend, generator=generator))
    for u in webhooks:
        al.add(HttpReceiver("webhook", u, resend, generator=generator))
    for k in kafka_topics:
        al.add(KafkaReceiver(k, resend, generator=generator))
    return al
