"""Issue 32: a whole fleet is not paged as lost for a gap the collector caused. Twenty agents
ship every second through a real broker to a collector running the shipped rules with a
webhook receiver. The broker goes down for 60 s; later the collector itself is down for
60 s. Zero NodeLost is delivered, the collector's own CollectorBehind alert is (one alert,
not one per node), every node is alive again after, and every event spooled is stored."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import BIN, KafkaBroker, wait_for
from tests.integration.test_pipeline import check_database, start_agents

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

N = 20


class Hook(BaseHTTPRequestHandler):
    alerts: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).alerts.extend(body["alerts"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


def collector(url: str, db: Path, hook: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "cmdare-collector"), "kafka", url, "--db", str(db), "--max-wait", "0.5s",
         "--http", "127.0.0.1:0", "--rules", "default", "--alert-webhook", f"hook={hook}", "--alert-resend", "1h"],
        stdout=subprocess.DEVNULL, stderr=open(log, "a"),
    )


def nodes(db: Path) -> dict[str, str]:
    svc = json.loads(db.with_name(db.name + ".service.json").read_text())
    with urllib.request.urlopen(svc["url"] + "/api/v1/nodes", timeout=30) as r:
        out = json.loads(r.read())
    cols = out["columns"]
    return {row[cols.index("node")]: row[cols.index("state")] for row in out["rows"]}


@pytest.mark.timeout(480)  # ~330 s of planned outages and graces, on a loaded 2-core runner
def test_broker_and_collector_down_60s_page_no_node(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    h = type("H", (Hook,), {"alerts": []})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), h)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{srv.server_port}/hook"
    url = kafka_broker.url(f"it-liveness-{uuid.uuid4().hex[:6]}")
    db, log = tmp_path / "fleet.duckdb", tmp_path / "collector.log"
    # the agents outlive the collector's restart by a minute or more, however long the
    # broker took to come back (at 260 s they had stopped before it on a loaded machine, and
    # a node that stopped sending cannot be alive again)
    agents = start_agents(tmp_path, url, n=N, duration=320, interval="1s")
    col = collector(url, db, hook, log)
    service = db.with_name(db.name + ".service.json")

    def all_alive() -> bool:
        try:
            states = nodes(db)
        except OSError:
            return False
        return len(states) == N and set(states.values()) == {"alive"}

    try:
        wait_for(service.exists, 60, what="the collector's API")
        wait_for(all_alive, 60, what="all nodes alive")
        time.sleep(50)  # past the start-up grace: the horizon is the present
        kafka_broker.stop()  # 1. the broker away for 60 s
        time.sleep(45)
        # the API and the pages judge liveness as the alerts do: silent only because the
        # collector cannot read is "unknown (collector behind)", never "lost"
        during = nodes(db)
        time.sleep(15)
        kafka_broker.start()
        wait_for(all_alive, 90, what="all nodes alive after the broker outage")
        time.sleep(50)  # the grace after the gap
        col.send_signal(signal.SIGTERM)  # 2. the collector away for 60 s
        assert col.wait(timeout=60) == 0, log.read_text()[-2000:]
        time.sleep(60)
        col = collector(url, db, hook, log)
        wait_for(service.exists, 60, what="the restarted collector's API")
        wait_for(all_alive, 90, what="all nodes alive after the collector's restart")
        for a in agents:
            assert a.proc.wait(timeout=120) == 0, a.log.read_text()[-2000:]
        time.sleep(5)  # the last events ingested
    finally:
        col.send_signal(signal.SIGTERM)
        col.wait(timeout=60)
        for a in agents:
            a.proc.kill()
        srv.shutdown()
    text = log.read_text()
    assert set(during.values()) == {"unknown (collector behind)"}, during
    fired = [a for a in h.alerts if a["status"] == "firing"]
    names = {a["labels"]["alertname"] for a in fired}
    assert not [a for a in fired if a["labels"]["alertname"] == "NodeLost"], text[-3000:]
    assert "CollectorBehind" in names, (names, text[-3000:])
    assert {a["fingerprint"] for a in fired if a["labels"]["alertname"] == "CollectorBehind"}.__len__() == 1
    assert names <= {"CollectorBehind", "GpuIdleWhileJobRuns", "JobStalled"}, names
    check_database(db, agents)  # nothing lost, nothing twice
