"""The Grafana dashboards (dashboards/grafana/*.json): the files are what the builder makes,
and every panel's PromQL, with its variables filled as Grafana would, returns series from a
real Prometheus scraping a real agent (fake NVML GPUs, a real training loop on its socket)
and a real collector (Kafka ingest, findings stored by ``analyze bottlenecks``)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cmdare.dashboards import grafana_dashboards as gd
from tests.conftest import BIN, ROOT, KafkaBroker, Prometheus, agent_env, free_port, go_tool, wait_for

LOOP = ROOT / "tests" / "integration" / "train_loop.py"


def test_the_files_are_what_the_builder_makes() -> None:
    for name, build in gd.DASHBOARDS.items():
        f = ROOT / "dashboards" / "grafana" / f"{name}.json"
        assert f.read_text() == gd.text(build()), f"{f}: stale, run python -m cmdare.dashboards.grafana_dashboards --write"
        d = json.loads(f.read_text())
        names = [v["name"] for v in d["templating"]["list"]]
        assert names[0] == "datasource" and d["uid"] == name and d["schemaVersion"] >= 39
        ids = [p["id"] for p in d["panels"] if p["type"] == "row"] + [p["id"] for p in gd.panels(d)]
        assert len(ids) == len(set(ids))  # Grafana needs unique panel ids
        kinds = {p["type"] for p in gd.panels(d)}
        assert "graph" not in kinds and "singlestat" not in kinds  # current panel types only
        for p in gd.panels(d):
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            used = set(re.findall(r"\$(\w+)", " ".join(t["expr"] for t in p["targets"])))
            assert used <= set(names) | {"__rate_interval"}, (name, p["title"], used)


def fill(expr: str, values: dict[str, str]) -> str:
    out = expr.replace("$__rate_interval", "30s")
    for k, v in values.items():
        out = out.replace(f"${k}", v)
    return out


@pytest.mark.kafka
@pytest.mark.slow
def test_every_panel_returns_series_from_a_real_agent_and_collector(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    binary = go_tool("prometheus")
    topic = "grafana-panels"
    agent_port, col_port = free_port(), free_port()
    sock = tmp_path / "train.sock"
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f"""
node = "dash-node"
job = "dash-job"
interval = "0.5s"
[spool]
dir = "{tmp_path / 'spool'}"
fsync = false
[sink]
url = "{kafka_broker.url(topic)}"
[prometheus]
listen = "127.0.0.1:{agent_port}"
[sources.gpu]
backend = "python:tests.fakes.nvml"
[sources.train]
enabled = true
socket = "{sock}"
""")
    # H100s with NVLink: the profiling (GPM) and NVLink panels have series; a second agent on
    # the same node with a MIG-mode H100 gives the MIG panels theirs
    agent = subprocess.Popen([str(BIN / "cmdare-agent"), "--config", str(cfg)],
                             env=agent_env(CMDARE_FAKE_NVML="gpus=2,model=h100,nvlinks=2",
                                           CMDARE_AGENT_SOURCES__TRAIN__ENABLED="true"),
                             stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "w"))
    mig_port = free_port()
    mig_cfg = tmp_path / "mig.toml"
    mig_cfg.write_text(f"""
node = "dash-node"
job = "dash-job"
interval = "0.5s"
[spool]
dir = "{tmp_path / 'mig-spool'}"
fsync = false
[prometheus]
listen = "127.0.0.1:{mig_port}"
[sources.gpu]
backend = "python:tests.fakes.nvml"
""")
    mig = subprocess.Popen([str(BIN / "cmdare-agent"), "--config", str(mig_cfg)],
                           env=agent_env(CMDARE_FAKE_NVML="gpus=1,model=h100,mig=2"),
                           stdout=subprocess.DEVNULL, stderr=open(tmp_path / "mig-agent.log", "w"))
    db = tmp_path / "c.duckdb"
    col = subprocess.Popen(
        [str(BIN / "cmdare-collector"), "kafka", kafka_broker.url(topic), "--db", str(db), "--max-wait", "0.5s",
         "--http", f"127.0.0.1:{col_port}"], stdout=subprocess.DEVNULL, stderr=open(tmp_path / "collector.log", "w"))
    prom = None
    try:
        wait_for(sock.exists, 30, what="the agent's train socket")
        loop = subprocess.run([sys.executable, str(LOOP), "--mode", "input", "--steps", "400", "--job", "dash-job"],
                              env=agent_env(CMDARE_TRAIN_SOCKET=str(sock)), capture_output=True, text=True, timeout=300)
        assert loop.returncode == 0, loop.stderr[-2000:]
        prom = Prometheus(binary, tmp_path, {"cmdare-agent": [f"127.0.0.1:{agent_port}", f"127.0.0.1:{mig_port}"],
                                             "cmdare-collector": [f"127.0.0.1:{col_port}"]})
        # the collector has the job's steps: its findings, stored through the running collector
        wait_for(lambda: subprocess.run([str(BIN / "analyze"), "jobs", "--db", str(db)], capture_output=True,
                                        text=True).stdout.count("dash-job") > 0, 60, what="the job's steps stored")
        found = subprocess.run([str(BIN / "analyze"), "bottlenecks", "--job", "dash-job", "--db", str(db)],
                               capture_output=True, text=True, timeout=120)
        assert "input_bound" in found.stdout, found.stdout + found.stderr
        values = {"node": "dash-node", "job": "dash-job", "gpu": ".*"}
        wait_for(lambda: prom.query('cmdare_finding_active{job="dash-job"}') and
                 prom.query('cmdare_job_goodput_ratio{job="dash-job"}') and
                 prom.query('cmdare_train_steps_per_second{job="dash-job"}'), 90, what="the conclusions scraped")
        # the variables' own queries give the values used
        for name, build in gd.DASHBOARDS.items():
            d = build()
            for v in d["templating"]["list"][1:]:
                m = re.fullmatch(r"label_values\((.*), (\w+)\)", v["query"]["query"])
                assert m, v["query"]
                got = {r["metric"].get(m.group(2)) for r in prom.query(fill(m.group(1), values))}
                assert values[v["name"]] in got or values[v["name"]] == ".*", (name, v["name"], got)
            missing = []
            for p in gd.panels(d):
                for t in p["targets"]:
                    expr = fill(t["expr"], values)
                    if not wait_for_series(prom, expr):
                        missing.append(f"{name} / {p['title']}: {expr}")
            assert missing == [], missing
    finally:
        if prom is not None:
            prom.stop()
        for p in (agent, mig, col):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def wait_for_series(prom: Prometheus, expr: str, seconds: float = 20) -> bool:
    """A panel's query returns a series (rates need two scrapes: a short wait)."""
    try:
        wait_for(lambda: prom.query(expr), seconds, interval=1, what=expr)
        return True
    except (TimeoutError, AssertionError):
        return False
