"""Delivery and scheduling as an operator relies on them (issue 32): every firing episode
sent, its resolution owed across a kill, a trickling receiver cut at its deadline, a slow
group never delaying another, a failing template costing one rule. Real DuckDB files and
real HTTP servers on loopback; rounds driven by hand at chosen times where timing matters."""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cmdare.analytics import alerting
from cmdare.analytics.alerting.notify.http import HttpReceiver
from cmdare.analytics.server.schedule import Alerting
from cmdare.collector.db import connect

T0 = dt.datetime(2026, 3, 1, 12, 0, 0)
# fires for 20 s, clears for 20 s, from T0 on
FLAPPING = f"""
groups:
  - name: flap
    interval: 5s
    rules:
      - alert: Flapping
        expr: >
          SELECT 'x' AS k, 1 AS value
          WHERE (epoch(eval_time()) - epoch(TIMESTAMP '{T0:%Y-%m-%d %H:%M:%S}'))::BIGINT // 20 % 2 = 0
"""


class Hook(BaseHTTPRequestHandler):
    posts: list[dict] = []
    on_post = None

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if type(self).on_post:
            type(self).on_post(body)
        type(self).posts.append(body)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def hook():
    h = type("H", (Hook,), {"posts": [], "on_post": None})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), h)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield h, f"http://127.0.0.1:{srv.server_port}/hook"
    srv.shutdown()


def _alerting(db: Path, text: str, url: str | None, clock) -> tuple[Alerting, HttpReceiver | None]:
    con = connect(str(db))
    f = db.parent / "rules.yml"
    f.write_text(text)
    groups = alerting.load_files([f])
    al = Alerting(con, groups, 1800, clock=clock)
    r = None
    if url:
        r = HttpReceiver("webhook", url, resend=60, timeout=2)
        al.add(r)
    al.start(run=False)
    return al, r


def _round(al: Alerting, r: HttpReceiver | None) -> None:
    g = al.engine.groups[0]
    al.round(g, al.runners[g.name].cur)
    deadline = time.monotonic() + 10
    while r is not None and not r.idle() and time.monotonic() < deadline:
        time.sleep(0.01)


def _events(posts: list[dict]) -> list[tuple[str, str]]:
    return [(a["status"], a["startsAt"]) for p in posts for a in p["alerts"]]


def test_every_firing_episode_is_sent_and_each_resolution_follows_its_own_firing(tmp_path, hook) -> None:
    h, url = hook
    now = [T0]
    al, r = _alerting(tmp_path / "a.duckdb", FLAPPING, url, lambda: now[0])
    try:
        for s in range(0, 96, 5):
            now[0] = T0 + dt.timedelta(seconds=s)
            _round(al, r)
    finally:
        al.stop()
        al.con.close()
    ev = _events(h.posts)
    # three episodes (0-19 s, 40-59 s, 80-95 s): each firing sent at once, each of the two
    # that ended resolved once, naming its own start
    assert [s for s, _ in ev] == ["firing", "resolved", "firing", "resolved", "firing"]
    starts = [t for _, t in ev]
    assert starts[0] == starts[1] and starts[2] == starts[3] and len(set(starts)) == 3


def test_a_resolution_is_owed_after_a_kill_right_after_the_firing_was_sent(tmp_path, hook) -> None:
    h, url = hook
    db = tmp_path / "a.duckdb"
    now = [T0]
    al, r = _alerting(db, FLAPPING, url, lambda: now[0])
    seen: list[bool] = []

    def check(body: dict) -> None:  # what is on disk when the receiver gets the firing
        c = al.con.cursor()
        seen.append(bool(c.execute("SELECT bool_and(notified) FROM cmdare.alerts").fetchone()[0]))
        c.close()

    h.on_post = check
    _round(al, r)
    assert [s for s, _ in _events(h.posts)] == ["firing"] and seen == [True]  # saved before it was sent
    # "SIGKILL": nothing more of this process runs (no delivery acknowledged, no stop)
    r.stop(grace=0)
    al.con.close()
    h.on_post = None
    now[0] = T0 + dt.timedelta(seconds=25)  # the condition cleared while it was down
    al2, r2 = _alerting(db, FLAPPING, url, lambda: now[0])
    try:
        _round(al2, r2)
    finally:
        al2.stop()
        al2.con.close()
    ev = _events(h.posts)
    assert [s for s, _ in ev] == ["firing", "resolved"] and ev[0][1] == ev[1][1]


def test_after_a_restart_a_firing_alert_delivered_within_resend_is_not_sent_again(tmp_path, hook) -> None:
    """Receivers learn the previous run's deliveries when it starts: a firing alert sent just
    before a restart is not sent again before its resend (60 s) is due."""
    h, url = hook
    db = tmp_path / "a.duckdb"
    now = [T0]
    al, r = _alerting(db, FLAPPING, url, lambda: now[0])
    try:
        _round(al, r)
        now[0] = T0 + dt.timedelta(seconds=5)
        _round(al, r)  # saves when the firing was delivered
    finally:
        al.stop()
        al.con.close()
    now[0] = T0 + dt.timedelta(seconds=10)  # still firing
    al2, r2 = _alerting(db, FLAPPING, url, lambda: now[0])
    try:
        _round(al2, r2)
        time.sleep(0.2)
    finally:
        al2.stop()
        al2.con.close()
    assert [s for s, _ in _events(h.posts)] == ["firing"]


def test_a_receivers_documented_defaults_and_its_error_cut_at_200_characters(hook) -> None:
    """docs/alerts.md: 5 s for each exchange, backoff capped at 30 s, resend every 60 s; the
    last error (logged, and in /metrics) is cut at 200 characters."""
    import socketserver

    from cmdare.analytics.alerting.notify.http import Item

    _, url = hook
    r = HttpReceiver("webhook", url)
    assert (r.timeout, r.backoff_max, r.resend) == (5.0, 30.0, 60.0)
    r.stop(grace=0)

    class Garbage(socketserver.BaseRequestHandler):  # answers with a 400-character status line
        def handle(self) -> None:
            self.request.recv(65536)
            self.request.sendall(b"X" * 400 + b"\r\n\r\n")

    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    bad = HttpReceiver("webhook", f"http://127.0.0.1:{srv.server_address[1]}/", timeout=2)
    try:
        bad.send([Item(("r", "f"), T0, False, {"labels": {"alertname": "A"}, "status": "firing"})])
        deadline = time.monotonic() + 10
        while bad.last_error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        name, _, text = (bad.last_error or "").partition(": ")
        assert name == "BadStatusLine" and text == "X" * 200
    finally:
        bad.stop(grace=0)
        srv.shutdown()


@pytest.mark.slow  # waits on purpose, or runs pytest itself, for seconds (fast tier: docs/testing.md)
def test_a_trickling_receiver_is_cut_at_its_deadline_counted_and_logged(tmp_path, caplog) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    stop = threading.Event()

    def trickle() -> None:  # reads the request, then answers one byte every 0.3 s
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.recv(65536)
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                if stop.is_set():
                    break
                try:
                    c.send(bytes([b]))
                except OSError:
                    break
                time.sleep(0.3)
            c.close()

    threading.Thread(target=trickle, daemon=True).start()
    r = HttpReceiver("webhook", f"http://127.0.0.1:{srv.getsockname()[1]}/slow", timeout=1.0, backoff_max=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="within 1 s"):
            r._post(b"{}")
        assert time.monotonic() - t0 < 2.5  # not 40 bytes x 0.3 s
        r.send([alerting_item()])
        deadline = time.monotonic() + 10
        while r.failed_total < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.failed_total >= 1 and "within 1 s" in (r.last_error or "")
    finally:
        stop.set()
        r.stop(grace=1)
        srv.close()


def alerting_item():
    from cmdare.analytics.alerting.notify.http import Item

    return Item(("g/r", "f"), T0, False, {"labels": {}, "annotations": {}, "status": "firing"})


SLOW_AND_FAST = """
groups:
  - name: slow
    interval: 1s
    rules:
      - alert: Slow
        expr: SELECT 'a' AS k, count(*) AS value FROM range(200000) a, range(200000) b
  - name: fast
    interval: 1s
    rules:
      - alert: Fast
        expr: SELECT 'b' AS k, 1 AS value
"""


@pytest.mark.slow  # waits on purpose, or runs pytest itself, for seconds (fast tier: docs/testing.md)
def test_a_slow_group_delays_no_other_and_stop_interrupts_it(tmp_path) -> None:
    con = connect(str(tmp_path / "a.duckdb"))
    f = tmp_path / "rules.yml"
    f.write_text(SLOW_AND_FAST)
    al = Alerting(con, alerting.load_files([f]), 1800)
    al.start()
    try:
        deadline = time.monotonic() + 20
        while al.runners["fast"].rounds < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        # the fast group went round four times while the slow one was still on its first
        assert al.runners["fast"].rounds >= 4 and al.runners["slow"].rounds == 0 and al.runners["slow"].busy
        assert [a.labels["alertname"] for a in al.engine.snapshot()] == ["Fast"]
    finally:
        t0 = time.monotonic()
        al.stop()
        took = time.monotonic() - t0
        con.close()
    assert took < 8  # the slow query was interrupted, not waited for
    assert not any(r.thread.is_alive() for r in al.runners.values())


TEMPLATES = """
groups:
  - name: g
    interval: 5s
    rules:
      - alert: Infinite
        expr: SELECT 'x' AS k, 'inf'::DOUBLE AS value
        annotations: {summary: 'value {{ printf "%d" $value }}'}
      - alert: Broken
        expr: SELECT 'y' AS k, 2 AS value
      - alert: Healthy
        expr: SELECT 'z' AS k, 3 AS value
"""


def test_a_failing_rule_costs_that_rule_only(tmp_path, monkeypatch) -> None:
    from cmdare.analytics.alerting import state

    real = state.render

    def render(text, labels, value, summary=""):
        if value == 2:
            raise RuntimeError("template blew up")
        return real(text, labels, value, summary)

    monkeypatch.setattr(state, "render", render)
    now = [T0]
    rules = TEMPLATES.replace("alert: Broken\n", "alert: Broken\n        labels: {v: '{{ $value }}'}\n")
    al, _ = _alerting(tmp_path / "a.duckdb", rules, None, lambda: now[0])
    try:
        _round(al, None)
        firing = {a.labels["alertname"]: a for a in al.engine.snapshot() if a.state == "firing"}
        health = {k.split("/")[1]: h for k, h in al.engine.health.items()}
    finally:
        al.stop()
        al.con.close()
    assert set(firing) == {"Infinite", "Healthy"}
    assert firing["Infinite"].annotations["summary"] == "value inf"  # %d of inf: printed, not raised
    assert health["Broken"].health == "error" and "template blew up" in health["Broken"].last_error
    assert health["Healthy"].health == "ok" and health["Infinite"].health == "ok"


@pytest.mark.parametrize("template", ['{{ printf "%%" $value }}', '{{ printf "%999999999d" $value }}',
                                      '{{ printf "%d %d" $value }}'])
def test_check_refuses_templates_that_could_fail_at_run_time(tmp_path, template) -> None:
    f = tmp_path / "r.yml"
    f.write_text(TEMPLATES.replace('value {{ printf "%d" $value }}', template))
    with pytest.raises(alerting.RuleError, match="unsupported template"):
        alerting.load_files([f])


def test_receiver_auth_comes_from_files_and_never_reaches_errors(tmp_path, hook) -> None:
    from cmdare.analytics.alerting.notify import read_secret

    h, url = hook
    seen: list[str] = []
    h.on_post = lambda body: None
    tok = tmp_path / "tok"
    tok.write_text("s3cr3t-token\n")
    name, secret = read_secret("--alert-token-file", f"oncall={tok}")
    assert (name, secret) == ("oncall", "s3cr3t-token")

    class Capture(Hook):
        posts: list[dict] = []

        def do_POST(self) -> None:  # noqa: N802
            seen.append(self.headers.get("Authorization", ""))
            super().do_POST()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for kw, want in (({"token": secret}, "Bearer s3cr3t-token"), ({"basic": "u:p w"}, "Basic dTpwIHc=")):
            r = HttpReceiver("webhook", f"oncall=http://127.0.0.1:{srv.server_port}/h", timeout=2, **kw)
            r.send([alerting_item()])
            deadline = time.monotonic() + 10
            while r.sent_total < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            r.stop()
            assert seen[-1] == want and r.name == "webhook:oncall"
    finally:
        srv.shutdown()
    big = tmp_path / "big"
    big.write_text("x" * 10000)
    for spec, match in ((f"oncall={tmp_path / 'none'}", "cannot read"), (f"oncall={big}", "larger than"),
                        ("no-equals", "expected NAME=FILE")):
        with pytest.raises(alerting.RuleError, match=match) as e:
            read_secret("--alert-token-file", spec)
        assert "xxxx" not in str(e.value)


def test_the_ingest_horizon_waits_out_gaps_and_their_grace(tmp_path) -> None:
    """ingest_horizon(): the newest heartbeat stored at start until ingest catches up, then
    that for the grace; frozen while ingest is behind; the gap's start for the grace after."""
    con = connect(str(tmp_path / "a.duckdb"))
    al = Alerting(con, [], 1800)
    al.grace = 45
    start = dt.datetime(2026, 3, 1, 12, 0, 0)
    al.start_horizon = start
    e = start.replace(tzinfo=dt.timezone.utc).timestamp()
    try:
        assert al._horizon(e + 60, None) == start  # restarted, not caught up yet
        assert al._horizon(e + 70, e + 69) == start  # caught up: agents get the grace to re-send
        assert al._horizon(e + 114, e + 113) == start
        assert al._horizon(e + 116, e + 115) == start + dt.timedelta(seconds=115)  # grace over
        assert al._horizon(e + 120, e + 119) == start + dt.timedelta(seconds=119)
        # Kafka unreachable from 119 s: the horizon stays there
        assert al._horizon(e + 150, e + 119) == start + dt.timedelta(seconds=119)
        assert al._horizon(e + 180, e + 119) == start + dt.timedelta(seconds=119)
        # reachable again and caught up at 185 s: still 119 s for the grace, then the present
        assert al._horizon(e + 186, e + 185) == start + dt.timedelta(seconds=119)
        assert al._horizon(e + 230, e + 229) == start + dt.timedelta(seconds=119)
        assert al._horizon(e + 232, e + 231) == start + dt.timedelta(seconds=231)
    finally:
        al.stop()
        con.close()


def test_ingest_lag_is_the_time_since_nothing_was_unread(tmp_path) -> None:
    """ingest_lag(): since the collector started while it has not caught up once, then since
    it last found nothing unread; never the age of the newest event."""
    con = connect(str(tmp_path / "a.duckdb"))
    al = Alerting(con, [], 1800)
    seen: list[float | None] = [None]
    al.caught_up = lambda: seen[0]
    try:
        al.created = time.time() - 50
        assert 49 < al.lag() < 60  # reading since it started
        seen[0] = time.time() - 1  # a spool read to its end a second ago, whatever its events' age
        assert 0.9 < al.lag() < 5
        seen[0] = time.time() - 120  # Kafka away for two minutes
        assert 119 < al.lag() < 130
        seen[0] = time.time() + 5  # a clock step: never negative
        assert al.lag() == 0
    finally:
        al.stop()
        con.close()


ONCE = f"""
groups:
  - name: once
    interval: 5s
    rules:
      - alert: Once
        expr: >
          SELECT 'x' AS k, 1 AS value WHERE eval_time() < TIMESTAMP '{T0 + dt.timedelta(seconds=20):%Y-%m-%d %H:%M:%S}'
"""


def test_a_firing_alert_is_sent_again_every_resend_and_not_in_between(tmp_path, hook) -> None:
    """Alertmanager forgets an alert whose endsAt passed: a firing alert goes again every
    ``resend`` (the same episode, a later endsAt), not on every round."""
    h, url = hook
    now = [T0]
    al, r = _alerting(tmp_path / "a.duckdb", FLAPPING, url, lambda: now[0])
    r.resend = 0.5
    try:
        _round(al, r)
        _round(al, r)  # at once: nothing new to say
        assert len(h.posts) == 1
        time.sleep(0.6)
        _round(al, r)
    finally:
        al.stop()
        al.con.close()
    ev = [a for p in h.posts for a in p["alerts"]]
    assert [a["status"] for a in ev] == ["firing", "firing"] and ev[0]["startsAt"] == ev[1]["startsAt"]
    assert ev[1]["endsAt"] > ev[0]["endsAt"]


def test_a_resolution_is_kept_past_retention_until_every_receiver_has_it(tmp_path, hook) -> None:
    """Two receivers; one refuses everything. Past the 15 minutes a resolved alert is kept,
    it stays in the database while that receiver is owed its resolution, so a restart still
    delivers it; once every receiver has it, it goes."""
    from cmdare.analytics.alerting.state import RESOLVED_RETENTION

    h, url = hook
    down = type("Down", (Hook,), {"posts": [], "on_post": None, "refuse": True})

    class Refusing(down):  # type: ignore[valid-type,misc]
        def do_POST(self) -> None:  # noqa: N802
            if type(self).refuse:
                self.send_response(503)
                self.end_headers()
                return
            super().do_POST()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    db = tmp_path / "a.duckdb"
    now = [T0]

    def two() -> tuple[Alerting, list[HttpReceiver]]:
        al, r1 = _alerting(db, ONCE, url, lambda: now[0])
        r2 = HttpReceiver("webhook", f"down=http://127.0.0.1:{srv.server_port}/h", resend=60, timeout=2,
                          backoff_max=0.2)
        al.add(r2)
        r2.restore(al.engine)
        return al, [r1, r2]

    def rows(al: Alerting) -> list[tuple]:
        c = al.con.cursor()
        try:
            return c.execute("SELECT state, sent_resolved FROM cmdare.alerts").fetchall()
        finally:
            c.close()

    try:
        al, (r1, r2) = two()
        _round(al, r1)  # firing: r1 has it, r2 refuses
        now[0] = T0 + dt.timedelta(seconds=25)
        _round(al, r1)  # resolved: r1 has the resolution
        deadline = time.monotonic() + 10
        while not any(it.resolved for it in r2._batch.values()) and time.monotonic() < deadline:
            time.sleep(0.02)
        now[0] = T0 + dt.timedelta(seconds=25 + RESOLVED_RETENTION + 60)
        _round(al, r1)
        assert rows(al) == [("resolved", False)]  # past retention, kept: r2 is owed it
        assert [a["status"] for p in h.posts for a in p["alerts"]] == ["firing", "resolved"]
        # "SIGKILL", then a restart with r2 answering again
        r1.stop(grace=0)
        r2.stop(grace=0)
        al.con.close()
        Refusing.refuse = False
        al, (r1, r2) = two()
        _round(al, r1)
        deadline = time.monotonic() + 10
        while not Refusing.posts and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [a["status"] for p in Refusing.posts for a in p["alerts"]] == ["resolved"]
        while not r2.idle() and time.monotonic() < deadline:
            time.sleep(0.02)
        _round(al, r1)
        assert rows(al) == []  # every receiver has it: gone
        # the other receiver may get the resolution again after the restart (delivery is at
        # least once: which receivers had it is saved only as "all of them"), never the firing
        assert [a["status"] for p in h.posts for a in p["alerts"]][:2] == ["firing", "resolved"]
        assert "firing" not in [a["status"] for p in h.posts[2:] for a in p["alerts"]]
    finally:
        al.stop()
        al.con.close()
        srv.shutdown()


URGENT = """
groups:
  - name: notices
    interval: 1h
    rules:
      - alert: Revoked
        expr: SELECT node, 1 AS value FROM revocations
  - name: other
    interval: 1h
    rules:
      - alert: Always
        expr: SELECT 'x' AS k, 1 AS value
"""


def test_a_group_reading_an_urgent_table_is_evaluated_as_soon_as_rows_of_it_are_stored(tmp_path) -> None:
    """A revocation notice gives about 30 s: its group is evaluated when ingest stores one,
    not at its interval (an hour here); groups that do not read it are left alone."""
    from types import SimpleNamespace

    from cmdare.collector.writer import Writer
    from cmdare.wire.events import EventFactory, encode_many

    con = connect(str(tmp_path / "a.duckdb"))
    f = tmp_path / "rules.yml"
    f.write_text(URGENT)
    al = Alerting(con, alerting.load_files([f]), 1800)
    al.start()
    try:
        deadline = time.monotonic() + 10
        while min(r.rounds for r in al.runners.values()) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert {n: r.rounds for n, r in al.runners.items()} == {"notices": 1, "other": 1}
        fac = EventFactory("spot-1", "worker", "j")
        res = Writer(con).write([("t", encode_many([fac.make("revocation", {"source": "gce"})]))])
        al.on_batch(res)
        al.on_batch(SimpleNamespace(rows={"heartbeats": 5}))  # not urgent: nobody poked
        deadline = time.monotonic() + 5  # a round counts itself after storing its alerts: wait for both
        while (not al.engine.snapshot()[1:] or al.runners["notices"].rounds < 2) and time.monotonic() < deadline:
            time.sleep(0.02)
        names = sorted(a.labels["alertname"] for a in al.engine.snapshot())
        assert names == ["Always", "Revoked"] and al.runners["notices"].rounds == 2
        time.sleep(0.5)
        assert al.runners["other"].rounds == 1
    finally:
        al.stop()
        con.close()


METRICS_RULES = """
groups:
  - name: m
    interval: 5s
    rules:
      - alert: Now
        expr: SELECT 'x' AS k, 1 AS value
      - alert: Later
        expr: SELECT 'y' AS k, 1 AS value
        for: 1h
      - alert: Fails
        expr: SELECT 'z' AS k, error('boom')::DOUBLE AS value
"""


def test_the_collectors_metrics_count_alerts_by_state_bad_rules_and_deliveries(tmp_path, hook) -> None:
    """What an operator alerts on about alerting itself: /metrics' alert states, unhealthy
    rules, and deliveries and failed attempts per receiver (named, never by URL)."""
    from prometheus_client.parser import text_string_to_metric_families

    from cmdare.analytics.server.http import Limits
    from cmdare.analytics.server.service import HttpConfig, Service

    h, url = hook
    srv = ThreadingHTTPServer(("127.0.0.1", 0), type("R", (BaseHTTPRequestHandler,), {
        "do_POST": lambda self: (self.send_response(500), self.end_headers()),
        "log_message": lambda self, *a: None}))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    now = [T0]
    al, r = _alerting(tmp_path / "a.duckdb", METRICS_RULES, f"ok={url}", lambda: now[0])
    bad = HttpReceiver("alertmanager", f"http://user:pw@127.0.0.1:{srv.server_port}", timeout=2, backoff_max=0.2)
    al.add(bad)
    svc = Service(al.con, tmp_path / "a.duckdb", HttpConfig("127.0.0.1", 0, limits=Limits()))
    svc.alerting = al
    try:
        _round(al, r)
        deadline = time.monotonic() + 10
        while bad.failed_total < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        text = svc.metrics_text().decode()
    finally:
        bad.stop(grace=0)
        al.stop()
        al.con.close()
        srv.shutdown()
    m = {(s.name, tuple(sorted(s.labels.items()))): s.value
         for f in text_string_to_metric_families(text) for s in f.samples}
    state = {k[1][0][1]: v for k, v in m.items() if k[0] == "cmdare_collector_alerts"}
    assert state == {"pending": 1, "firing": 1, "inhibited": 0, "resolved": 0}
    assert m[("cmdare_collector_alert_rules_unhealthy", ())] == 1
    sent = {k[1][0][1]: v for k, v in m.items() if k[0] == "cmdare_collector_alert_notifications_total"}
    failed = {k[1][0][1]: v for k, v in m.items() if k[0] == "cmdare_collector_alert_notification_failures_total"}
    assert sent["webhook:ok"] == 1 and failed["webhook:ok"] == 0
    assert failed[bad.name] >= 2 and sent[bad.name] == 0 and "pw" not in text and "user" not in text
