"""Alerts delivered from a real collector: to a real Alertmanager (built from the Go module
proxy by scripts/gobuild; skipped without Go) through its v2 API, read back from its API
while firing and gone once resolved; to a webhook that fails, then recovers (retried with
backoff, counted, the resolution delivered); a receiver that refuses connections never
stops evaluation."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import BIN, Alertmanager, KafkaBroker, agent_env, free_port, go_tool, wait_for

# agents and collectors run while alerts fire, resolve and are re-sent: scripts/test-fast leaves it to the full run
pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: times what it waits for

RULES = """
groups:
  - name: live
    interval: 1s
    rules:
      - alert: AgentRunning
        expr: SELECT node, 1 AS value FROM heartbeats WHERE ts > eval_time() - INTERVAL 3 SECOND GROUP BY node
        labels: {severity: info}
        annotations: {summary: "{{ $labels.node }} is sending heartbeats"}
"""


def run(tmp_path: Path, *receiver_args: str, agent_seconds: float = 4.0) -> tuple[subprocess.Popen, Path]:
    """An agent running ``agent_seconds`` into a spool; a collector following it with the
    rule above and the receivers given."""
    spool, db, rules = tmp_path / "spool", tmp_path / "a.duckdb", tmp_path / "rules.yml"
    rules.write_text(RULES)
    subprocess.Popen(
        [str(BIN / "cmdare-agent"), "--config", "/dev/null", "--spool-dir", str(spool), "--interval", "0.3s",
         "--node", "n-1", "--duration", str(agent_seconds), "--set", "sources.gpu.enabled=false"],
        env=agent_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_for(spool.exists, 30, what="the spool")
    col = subprocess.Popen(
        [str(BIN / "cmdare-collector"), "spool", str(spool), "--follow", "--interval", "0.2s", "--db", str(db),
         "--rules", str(rules), "--alert-resend", "2s", *receiver_args],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "collector.log", "w"),
    )
    return col, db


def stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)


def test_alertmanager_receives_firing_then_resolved(tmp_path: Path) -> None:
    am = Alertmanager(go_tool("alertmanager"), tmp_path)
    col = None
    try:
        col, db = run(tmp_path, "--alertmanager", am.url, agent_seconds=5.0)
        [a] = wait_for(lambda: [x for x in am.alerts() if x["labels"].get("alertname") == "AgentRunning"], 60,
                       what="the alert in Alertmanager")
        assert a["labels"] == {"alertname": "AgentRunning", "node": "n-1", "severity": "info"}
        assert a["annotations"] == {"summary": "n-1 is sending heartbeats"}
        # the alert's link opens the collector's alerts page at its rule (no longer a 404)
        from cmdare.analytics.cli.client import service_file

        api = json.loads(service_file(db).read_text())["url"]
        assert a["status"]["state"] == "active" and a["generatorURL"] == f"{api}/ui/alerts?rule=live%2FAgentRunning"
        import urllib.request

        with urllib.request.urlopen(a["generatorURL"], timeout=10) as page:
            assert page.status == 200 and 'data-page="alerts"' in page.read().decode()
        # the agent stops: the rule clears, the resolution reaches Alertmanager (its own
        # counter of resolved alerts received), and it no longer lists the alert
        wait_for(lambda: received(am, "resolved") >= 1, 60, what="the resolution in Alertmanager")
        assert not [x for x in am.alerts() if x["labels"].get("alertname") == "AgentRunning"]
        assert received(am, "firing") >= 1
    finally:
        if col is not None:
            stop(col)
        am.stop()


def received(am: Alertmanager, status: str) -> float:
    """alertmanager_alerts_received_total{status=...}, from Alertmanager's own /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(am.url + "/metrics", timeout=10).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "alertmanager_alerts_received_total" and s.labels.get("status") == status)


class Hook(BaseHTTPRequestHandler):
    fail_first = 0
    posts: list[dict] = []
    attempts = 0

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).attempts += 1
        if type(self).attempts <= type(self).fail_first:
            self.send_response(500)
            self.end_headers()
            return
        type(self).posts.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


def test_webhook_retried_until_it_takes_them_and_a_dead_receiver_blocks_nothing(tmp_path: Path) -> None:
    hook = type("H", (Hook,), {"fail_first": 3, "posts": [], "attempts": 0})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    dead = f"http://127.0.0.1:{free_port()}/nobody"  # refuses connections
    import socket

    hang = socket.socket()  # accepts connections, never answers
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)
    hanging = f"http://127.0.0.1:{hang.getsockname()[1]}/hangs"
    col = None
    try:
        col, db = run(tmp_path, "--alert-webhook", f"http://127.0.0.1:{srv.server_port}/hook",
                      "--alert-webhook", dead, "--alert-webhook", hanging, agent_seconds=5.0)
        wait_for(lambda: any(a["status"] == "resolved" for p in hook.posts for a in p["alerts"]), 90,
                 what="the resolution at the webhook")
        firing = [p for p in hook.posts if p["status"] == "firing"]
        assert hook.attempts > 3 and firing  # three 500s, retried
        a = firing[0]["alerts"][0]
        assert firing[0]["version"] == "4" and firing[0]["commonLabels"]["alertname"] == "AgentRunning"
        assert a["labels"]["node"] == "n-1" and a["status"] == "firing" and a["fingerprint"]
        res = [a for p in hook.posts for a in p["alerts"] if a["status"] == "resolved"][0]
        assert res["startsAt"] == a["startsAt"] and res["endsAt"] > res["startsAt"]
        # counted in the collector's metrics: the failures (retried) and the deliveries
        from prometheus_client.parser import text_string_to_metric_families

        url = json.loads(db.with_name(db.name + ".service.json").read_text())["url"]
        import urllib.request

        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        m = {(s.name, s.labels.get("receiver")): s.value for f in text_string_to_metric_families(text) for s in f.samples}
        hook_name = f"webhook:127.0.0.1:{srv.server_port}"  # host and port only: a path may hold a token

        def named(u: str) -> str:
            return "webhook:" + u.split("//", 1)[1].split("/", 1)[0]

        assert "/hook" not in text and "/nobody" not in text
        assert m[("cmdare_collector_alert_notification_failures_total", hook_name)] >= 3
        assert m[("cmdare_collector_alert_notifications_total", hook_name)] >= 2
        assert m[("cmdare_collector_alert_notification_failures_total", named(dead))] >= 1
        assert m[("cmdare_collector_alert_notification_failures_total", named(hanging))] >= 1  # timed out
        # the dead receiver never held up evaluation: the rule kept being evaluated throughout
        r = subprocess.run([str(BIN / "analyze"), "alerts", "--db", str(db), "--json"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert [x["health"] for x in json.loads(r.stdout)["rules"]] == ["ok"]
    finally:
        if col is not None:
            stop(col)
        srv.shutdown()
        hang.close()
    log = (tmp_path / "collector.log").read_text()
    dead_name = "webhook:" + dead.split("//", 1)[1].split("/", 1)[0]
    assert f"alert receiver {dead_name}: ConnectionRefusedError" in log and "retrying with backoff" in log and "/nobody" not in log


def test_kafka_topic_receives_firing_and_resolved(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    from kafka import KafkaConsumer

    topic = "cmdare-alerts-test"
    col, _ = run(tmp_path, "--alert-kafka", kafka_broker.url(topic), agent_seconds=4.0)
    try:
        c = KafkaConsumer(topic, bootstrap_servers=kafka_broker.bootstrap, auto_offset_reset="earliest",
                          consumer_timeout_ms=1000, group_id="t")
        got: list[dict] = []

        def resolved() -> bool:
            got.extend(json.loads(m.value) for m in c)
            return any(x["status"] == "resolved" for x in got)

        wait_for(resolved, 90, what="the resolution on the topic")
        c.close()
    finally:
        stop(col)
    firing = [x for x in got if x["status"] == "firing"]
    res = [x for x in got if x["status"] == "resolved"]
    assert firing and firing[0]["labels"] == {"alertname": "AgentRunning", "node": "n-1", "severity": "info"}
    assert res[0]["fingerprint"] == firing[0]["fingerprint"] and res[0]["startsAt"] == firing[0]["startsAt"]


def test_a_resolution_reaches_alertmanager_after_a_sigkill_right_after_the_firing(tmp_path: Path) -> None:
    """Issue 32: the collector is SIGKILLed as soon as Alertmanager lists the firing alert,
    and restarted after the condition cleared: the resolution is delivered (the hand-over
    was saved before the firing was sent)."""
    import datetime as dt

    am = Alertmanager(go_tool("alertmanager"), tmp_path)
    until = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) + dt.timedelta(seconds=12)
    rules = tmp_path / "until.yml"
    rules.write_text(f"""
groups:
  - name: g
    interval: 1s
    rules:
      - alert: UntilT
        expr: SELECT 'x' AS k, 1 AS value WHERE eval_time() < TIMESTAMP '{until:%Y-%m-%d %H:%M:%S}'
""")
    spool = tmp_path / "spool"
    spool.mkdir()
    log = tmp_path / "collector.log"

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [str(BIN / "cmdare-collector"), "spool", str(spool), "--follow", "--db", str(tmp_path / "a.duckdb"),
             "--http", "off", "--rules", str(rules), "--alertmanager", am.url, "--alert-resend", "1h"],
            stdout=subprocess.DEVNULL, stderr=open(log, "a"),
        )

    col = start()
    try:
        wait_for(lambda: [x for x in am.alerts() if x["labels"].get("alertname") == "UntilT"], 30,
                 interval=0.05, what="the firing alert in Alertmanager")
        col.send_signal(signal.SIGKILL)
        col.wait(timeout=10)
        while dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) < until + dt.timedelta(seconds=1):
            time.sleep(0.2)
        col = start()
        wait_for(lambda: received(am, "resolved") >= 1, 30, what="the resolution in Alertmanager")
        assert not [x for x in am.alerts() if x["labels"].get("alertname") == "UntilT"]
    finally:
        col.kill()
        am.stop()
