"""A real Prometheus server (built from the Go module proxy by scripts/gobuild) scrapes a
real agent's /metrics and a real collector's /metrics while the agent ships to Kafka and
the collector ingests; the test reads the scraped series back through Prometheus's HTTP
API, as a user's dashboards and rules would.  Skipped, saying why, without Go."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import (
    BIN,
    KafkaBroker,
    Prometheus,
    agent_env,
    dcgm_exporter_file,
    free_port,
    go_tool,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_prometheus_scrapes_the_agent_and_the_collector(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    binary = go_tool("prometheus")
    topic = "prom-scrape"
    agent_port, col_port = free_port(), free_port()
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f"""
node = "gpu-a"
job = "resnet-1"
interval = "0.5s"
[labels]
team = "vision"
[spool]
dir = "{tmp_path / 'spool'}"
fsync = false
[sink]
url = "{kafka_broker.url(topic)}"
[prometheus]
listen = "127.0.0.1:{agent_port}"
[sources.gpu]
backend = "python:tests.fakes.nvml"
"""
    )
    agent = subprocess.Popen(
        [str(BIN / "cmdare-agent"), "--config", str(cfg)],
        env=agent_env(CMDARE_FAKE_NVML="gpus=2"), stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "w"),
    )
    col = subprocess.Popen(
        [str(BIN / "cmdare-collector"), "kafka", kafka_broker.url(topic), "--db", str(tmp_path / "c.duckdb"),
         "--max-wait", "0.5s", "--http", f"127.0.0.1:{col_port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "collector.log", "w"),
    )
    prom = None
    try:
        prom = Prometheus(binary, tmp_path, {"cmdare-agent": [f"127.0.0.1:{agent_port}"],
                                             "cmdare-collector": [f"127.0.0.1:{col_port}"]})

        # `up` carries the scrape job's name; the agent's own series keep their job label (the
        # training job) because the scrape config honours target labels (docs/service.md)
        wait_for(lambda: prom.query(f'up{{instance="127.0.0.1:{col_port}",job="cmdare-collector"}} == 1'), 60, what="collector scraped")
        wait_for(lambda: prom.query(f'up{{instance="127.0.0.1:{agent_port}",job="cmdare-agent"}} == 1'), 60, what="agent scraped")

        util = wait_for(lambda: prom.query('cmdare_gpu_util_gpu_ratio{node="gpu-a"}'), 60, what="GPU series")
        assert sorted(r["metric"]["gpu"] for r in util) == ["0", "1"]
        for r in util:
            m = r["metric"]
            assert m["job"] == "resnet-1" and m["role"] == "worker" and m["team"] == "vision"
            assert m["uuid"].startswith("GPU-") and 0 <= r["value"] <= 1
        # counters are counters to Prometheus: rate() over the agent's own spool counter
        wait_for(lambda: prom.query('rate(cmdare_agent_spooled_total{node="gpu-a"}[5s]) > 0'), 60,
                 what="the agent's spooled counter rising")
        assert prom.query('cmdare_gpu_mem_used_bytes{node="gpu-a"}')[0]["value"] > 0
        assert prom.query('cmdare_agent_source_up{node="gpu-a",source="gpu"}')[0]["value"] == 1.0
        # the collector's own: ingest, lag, batch time, dead letters
        wait_for(lambda: prom.query("cmdare_collector_events_stored_total > 0"), 60, what="events stored")
        lag = wait_for(lambda: prom.query("cmdare_collector_kafka_lag_messages"), 60, what="consumer lag")
        assert {r["metric"]["topic"] for r in lag} == {topic} and all(r["value"] >= 0 for r in lag)
        assert prom.query("cmdare_collector_batch_seconds_count")[0]["value"] >= 1
        assert prom.query("cmdare_collector_dead_letters_total")[0]["value"] == 0
        assert prom.query("cmdare_collector_ready")[0]["value"] == 1
    finally:
        if prom is not None:
            prom.stop()
        for p in (agent, col):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


DASHBOARD = dcgm_exporter_file("dcgm-exporter-dashboard.json")


def _grafana_regex(values: list[str]) -> str:
    """A multi-value variable with every value selected, as Grafana's Prometheus data source
    writes it into a query: each value regex-escaped, joined as ``(a|b)``."""
    import re

    esc = [re.sub(r"([\\$^*{}\[\]'+?.()|])", r"\\\\\1", v) for v in values]
    return esc[0] if len(esc) == 1 else "(" + "|".join(esc) + ")"


def test_nvidias_dcgm_dashboard_answers_from_the_agent(tmp_path: Path) -> None:
    """NVIDIA's Grafana dashboard for dcgm-exporter, as it is: its variables filled as Grafana
    fills them (label_values through the series API, every value selected) and every panel's
    query returns series from a real Prometheus scraping the agent (fake NVML, two GPUs) with
    ``[prometheus] names = "dcgm"``; the counters are counters to Prometheus."""
    import json
    import urllib.parse
    import urllib.request

    binary = go_tool("prometheus")
    port = free_port()
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f"""
node = "gpu-a"
job = "resnet-1"
interval = "0.5s"
[spool]
dir = "{tmp_path / 'spool'}"
fsync = false
[prometheus]
listen = "127.0.0.1:{port}"
names = "dcgm"
[sources.gpu]
backend = "python:tests.fakes.nvml"
""")
    agent = subprocess.Popen([str(BIN / "cmdare-agent"), "--config", str(cfg)],
                             env=agent_env(CMDARE_FAKE_NVML="gpus=2,model=h100"), stdout=subprocess.DEVNULL,
                             stderr=open(tmp_path / "agent.log", "w"))
    prom = None
    try:
        prom = Prometheus(binary, tmp_path, {"gpu-nodes": [f"127.0.0.1:{port}"]})
        wait_for(lambda: len(prom.query("DCGM_FI_DEV_GPU_TEMP")) == 2, 60, what="DCGM series scraped")

        def api(path: str, **params: str) -> object:
            with urllib.request.urlopen(f"{prom.url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
                body = json.loads(r.read())
            assert body["status"] == "success", body
            return body["data"]

        board = json.loads(DASHBOARD.read_text())
        values = {}
        for v in board["templating"]["list"]:
            if v["type"] != "query":
                continue
            metric, label = v["query"].removeprefix("label_values(").removesuffix(")").split(", ")
            got = sorted({s[label] for s in api("series", **{"match[]": metric}) if label in s})  # type: ignore[union-attr]
            assert got, v["name"]
            values[v["name"]] = _grafana_regex(got)
        assert values == {"instance": f"127\\\\.0\\\\.0\\\\.1:{port}", "gpu": "(0|1)"}
        queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
        assert len(queries) == 8
        from tests.integration.test_grafana_dashboards import fill, wait_for_series

        missing = [q for q in queries if not wait_for_series(prom, fill(q, values))]
        assert missing == []  # every panel draws
        assert {r["metric"]["modelName"] for r in prom.query("DCGM_FI_DEV_GPU_TEMP")} == {"NVIDIA H100 80GB HBM3"}
        meta = api("metadata", metric="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        assert meta["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0]["type"] == "counter"  # type: ignore[index]
        wait_for(lambda: prom.query("rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5s]) > 0"), 60, what="energy rising")
    finally:
        if prom is not None:
            prom.stop()
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
