"""The agent's standard exports: a Prometheus /metrics endpoint scraped over HTTP and
parsed with prometheus-client's own parser, and the OTLP sink decoded as real OTLP
protobuf by a receiver over HTTP and gRPC; names, units, labels, counters, staleness, a
dead endpoint, and configuration errors.  (A real Prometheus server scraping the agent:
tests/integration/test_prometheus.py.)"""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cmdare.agent.config import ConfigError, load
from cmdare.agent.exporters import MetricStore
from cmdare.agent.runtime import Agent
from cmdare.wire.events import decode_line
from cmdare.wire.spool import Position, read_lines
from tests.conftest import wait_for
from tests.fakes.nvml import FakeNvml
from tests.fakes.otlp import GrpcReceiver, HttpReceiver

QUIET = {
    "sources.train.enabled": False,
    "sources.tensorboard.enabled": False,
    "sources.tpu.enabled": False,
    "sources.cloud.enabled": False,
}


def agent_config(tmp_path: Path, **over: Any) -> Any:
    return load(
        None,
        env={"CMDARE_AGENT_CONFIG": str(tmp_path / "none.toml")},
        overrides={
            "node": "n1",
            "job": "j1",
            "role": "worker",
            "interval": 0.3,
            "spool.dir": str(tmp_path / "sp"),
            "spool.fsync": False,
            **QUIET,
            **over,
        },
    )


def scrape(port: int) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams: dict[str, Any], name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in fams.values() for s in f.samples if s.name == name]


def test_metric_store_names_units_labels_and_counters() -> None:
    t = [100.0]
    st = MetricStore("n1", "worker", "j0", {"team": "vision", "cost-center": "7"}, stale_after=60, clock=lambda: t[0])
    st.observe("gpu", {"index": 0, "uuid": "GPU-a", "util_gpu_ratio": 0.5, "sm_clock_hz": 1.4e9, "ecc_corrected_total": 3})
    st.observe("host", {"cpu_per_core_ratio": [0.1, 0.2], "net": [{"nic": "eth0", "rx_bytes_total": 10}]})
    st.observe("train_steps", {"run": "r", "rank": 1, "steps": 10, "examples": 320.0, "step_mean_seconds": 0.2}, job="train-j")
    st.observe("train_steps", {"run": "r", "rank": 1, "steps": 5, "examples": 160.0, "step_mean_seconds": 0.3}, job="train-j")
    st.observe("gpu_event", {"index": 0, "uuid": "GPU-a", "kind": "xid", "xid": 79, "count": 1})
    st.observe("revocation", {"kind": "preemption", "cloud": "gce"})
    st.observe("status", {"source": "gpu", "ok": False, "state": "error", "duration_seconds": 0.01})
    st.observe("gpu", {"index": "not-a-number", "util_gpu_ratio": "x"})  # malformed: ignored, no raise
    fams = {f.name: (f, dict(s)) for f, s in st.snapshot()}
    f, s = fams["cmdare_gpu_util_gpu_ratio"]
    assert f.kind == "gauge" and f.unit == "1"
    assert f.labelnames == ("node", "role", "job", "team", "cost_center", "gpu", "uuid")
    assert s == {("n1", "worker", "j0", "vision", "7", "0", "GPU-a"): 0.5}
    assert fams["cmdare_gpu_sm_clock_hertz"][0].unit == "Hz"  # _hz in the wire, base unit here
    assert fams["cmdare_gpu_ecc_corrected_total"][0].kind == "counter"
    assert fams["cmdare_gpu_ecc_corrected_total"][0].base == "cmdare_gpu_ecc_corrected"
    assert fams["cmdare_host_net_rx_bytes_total"][0].labelnames[-1] == "nic"
    assert sorted(fams["cmdare_host_cpu_per_core_ratio"][1].values()) == [0.1, 0.2]
    # per-interval counts summed into counters; gauges keep the last value; the event's job
    steps = fams["cmdare_train_steps_total"][1]
    assert list(steps.values()) == [15.0] and list(steps)[0][2] == "train-j"
    assert list(fams["cmdare_train_examples_total"][1].values()) == [480.0]
    assert list(fams["cmdare_train_step_mean_seconds"][1].values()) == [0.3]
    assert list(fams["cmdare_gpu_events_total"][1]) == [("n1", "worker", "j0", "vision", "7", "0", "GPU-a", "xid", "79")]
    assert list(fams["cmdare_revocation_notices_total"][1].values()) == [1.0]
    assert list(fams["cmdare_agent_source_up"][1].values()) == [0.0]
    # a series not updated for stale_after is dropped (a GPU gone, a run ended)
    t[0] += 61
    st.observe("gpu", {"index": 1, "uuid": "GPU-b", "util_gpu_ratio": 0.9})
    live = {f.name: dict(s) for f, s in st.snapshot()}
    assert [k[5] for k in live["cmdare_gpu_util_gpu_ratio"]] == ["1"]
    assert live["cmdare_train_steps_total"] == {}


def test_prometheus_endpoint_serves_the_samples_and_the_agents_health(tmp_path: Path) -> None:
    cfg = agent_config(tmp_path, **{"prometheus.listen": "127.0.0.1:0", "labels": {"team": "vision"}})
    agent = Agent(cfg, adapters={"nvml": FakeNvml(gpus=2)})
    t = threading.Thread(target=agent.run, kwargs={"duration": 30}, daemon=True)
    t.start()
    try:
        wait_for(lambda: agent.prometheus is not None and agent.prometheus.server is not None, 10, what="the endpoint")
        wait_for(lambda: agent.samples_total >= 2, 10, what="two ticks")
        fams = scrape(agent.prometheus.port)  # type: ignore[union-attr]
        util = samples(fams, "cmdare_gpu_util_gpu_ratio")
        assert sorted(lab["gpu"] for lab, _ in util) == ["0", "1"]
        for lab, v in util:
            assert lab["node"] == "n1" and lab["job"] == "j1" and lab["role"] == "worker" and lab["team"] == "vision"
            assert lab["uuid"].startswith("GPU-") and 0 <= v <= 1
        assert fams["cmdare_gpu_ecc_corrected"].type == "counter"  # exposed as ..._total
        assert samples(fams, "cmdare_gpu_ecc_corrected_total")
        assert samples(fams, "cmdare_gpu_mem_used_bytes")[0][1] > 0
        assert samples(fams, "cmdare_host_mem_total_bytes")[0][1] > 0
        assert {lab["source"] for lab, _ in samples(fams, "cmdare_agent_source_up")} >= {"host", "gpu", "heartbeat"}
        spooled = samples(fams, "cmdare_agent_spooled_total")[0][1]
        assert spooled > 0
        assert samples(fams, "process_resident_memory_bytes")[0][1] > 0  # the process's own
        wait_for(lambda: agent.samples_total >= 4, 10, what="more ticks")
        assert samples(scrape(agent.prometheus.port), "cmdare_agent_spooled_total")[0][1] > spooled  # type: ignore[union-attr]
    finally:
        agent.stop()
        t.join(10)
    with pytest.raises(OSError):  # stopped with the agent
        urllib.request.urlopen(f"http://127.0.0.1:{agent.prometheus.port}/metrics", timeout=2)  # type: ignore[union-attr]


@pytest.mark.parametrize("receiver", [HttpReceiver, GrpcReceiver], ids=["http", "grpc"])
def test_otlp_sink_sends_the_same_metrics_as_real_otlp_protobuf(tmp_path: Path, receiver: Any) -> None:
    r = receiver()
    try:
        proto = "grpc" if receiver is GrpcReceiver else "http/protobuf"
        cfg = agent_config(
            tmp_path,
            **{"otlp.endpoint": r.endpoint, "otlp.protocol": proto, "otlp.interval": 1.0, "otlp.headers": {"x-tenant": "t1"}},
        )
        agent = Agent(cfg, adapters={"nvml": FakeNvml(gpus=2)})
        agent.run(duration=2.5)  # at least two periodic exports, and a last one at the stop
        rec = r.received
        assert rec.requests >= 2
        util = rec.latest("cmdare_gpu_util_gpu_ratio")
        assert sorted(p["attributes"]["gpu"] for p in util) == ["0", "1"]
        p = util[0]
        assert p["kind"] == "gauge" and p["unit"] == "1" and p["description"].startswith("share of time")
        assert p["attributes"]["node"] == "n1" and p["attributes"]["job"] == "j1"
        assert p["resource"]["service.name"] == "cmdare-agent" and p["resource"]["host.name"] == "n1"
        spooled = rec.latest("cmdare_agent_spooled")  # a counter: a monotonic sum, named without _total
        assert spooled[0]["kind"] == "sum" and spooled[0]["monotonic"] is True and spooled[0]["value"] > 0
        assert rec.latest("cmdare_host_mem_total_bytes")[0]["unit"] == "By"
        assert rec.latest("cmdare_gpu_temp_celsius")[0]["unit"] == "Cel"
        assert all(h.get("x-tenant") == "t1" for h in rec.headers)
    finally:
        r.close()


def test_otlp_endpoint_down_is_a_status_event_and_sampling_goes_on(tmp_path: Path) -> None:
    r = HttpReceiver()
    r.received.fail_with = 503
    try:
        cfg = agent_config(tmp_path, **{"otlp.endpoint": r.endpoint, "otlp.interval": 1.0, "otlp.timeout": 1.0})
        agent = Agent(cfg, adapters={"nvml": FakeNvml(gpus=1)})
        agent.run(duration=3.0)
    finally:
        r.close()
    chunks, _, _ = read_lines(tmp_path / "sp", Position(0, 0), 1 << 30)
    events = [decode_line(x) for c, _ in chunks for x in c.splitlines()]
    otlp = [e["data"] for e in events if e["type"] == "status" and e["data"]["source"] == "sink.otlp"]
    assert otlp and otlp[0]["ok"] is False and "export failed" in otlp[0]["message"]
    assert sum(e["type"] == "gpu" for e in events) >= 5  # the samples still reach the spool


@pytest.mark.parametrize(
    ("over", "msg"),
    [
        ({"prometheus.listen": "9464"}, "prometheus.listen: expected ADDR:PORT"),
        ({"prometheus.listen": "0.0.0.0:99999"}, "prometheus.listen: expected ADDR:PORT"),
        ({"prometheus.tls_cert": "/x.pem"}, "prometheus.tls_cert: TLS needs both"),
        ({"prometheus.stale_after": "soon"}, "prometheus.stale_after"),
        ({"prometheus.port": 1}, "unknown key 'prometheus.port'"),
        ({"otlp.endpoint": "collector:4317"}, "otlp.endpoint: expected an http:// or https:// URL"),
        ({"otlp.endpoint": "http://c:4318/v1/metrics", "otlp.protocol": "thrift"}, "otlp.protocol: must be one of"),
        ({"otlp.endpoint": "http://c:4318/v1/metrics", "otlp.interval": "100ms"}, "otlp.interval: must be at least 1s"),
        ({"otlp.headers": {"a": 1}}, "otlp.headers.a: header values must be strings"),
    ],
)
def test_export_config_errors_name_the_key(tmp_path: Path, over: dict[str, Any], msg: str) -> None:
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(")):
        agent_config(tmp_path, **over)


def test_listen_port_taken_is_a_one_line_error(tmp_path: Path) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        cfg = agent_config(tmp_path, **{"prometheus.listen": f"127.0.0.1:{s.getsockname()[1]}"})
        with pytest.raises(OSError, match="prometheus.listen: cannot listen on 127.0.0.1:"):
            Agent(cfg).run(duration=1)
    finally:
        s.close()


def test_prometheus_endpoint_over_tls(tmp_path: Path) -> None:
    import ssl

    from tests.fakes.tls import make_pki

    pki = make_pki(tmp_path / "tls")
    cfg = agent_config(tmp_path, **{"prometheus.listen": "127.0.0.1:0", "prometheus.tls_cert": str(pki / "server.crt"),
                                    "prometheus.tls_key": str(pki / "server.key")})
    agent = Agent(cfg, adapters={"nvml": FakeNvml(gpus=1)})
    t = threading.Thread(target=agent.run, kwargs={"duration": 30}, daemon=True)
    t.start()
    try:
        wait_for(lambda: agent.samples_total >= 1 and agent.prometheus is not None and agent.prometheus.server,
                 10, what="a tick")
        url = f"https://127.0.0.1:{agent.prometheus.port}/metrics"  # type: ignore[union-attr]
        ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        body = urllib.request.urlopen(url, context=ctx, timeout=5).read().decode()
        assert "cmdare_gpu_util_gpu_ratio{" in body
        with pytest.raises(OSError):  # plain HTTP is not served
            urllib.request.urlopen(url.replace("https", "http"), timeout=5).read()
    finally:
        agent.stop()
        t.join(10)


def test_gpu_depth_fields_are_exported_per_gpu_and_per_nvlink() -> None:
    """What the GPU source reads beyond nvidia-smi (fake NVML, an H100 with two NVLinks and
    MIG instances): GPM activity, energy as a counter, NVLink per link, MIG identity."""
    from cmdare.agent.sources.gpu import GpuSource
    from tests.fakes.nvml import FakeNvml

    st = MetricStore("n1", "worker", "j0")
    src = GpuSource(GpuSource.parse_config("sources.gpu", {}), nvml=FakeNvml(gpus=1, model="h100", nvlinks=2, mig=2))
    for _ in range(3):
        src.collect(lambda t, d: st.observe(t, d))
    fams = {f.name: (f, dict(s)) for f, s in st.snapshot()}
    tensor = fams["cmdare_gpu_tensor_active_ratio"][1]
    assert {k[3] for k in tensor} == {"0", "1000", "1001"} and all(0 <= v <= 1 for v in tensor.values())
    assert fams["cmdare_gpu_energy_joules_total"][0].kind == "counter"
    rx = fams["cmdare_gpu_nvlink_rx_bytes_per_second"]
    assert rx[0].labelnames[-1] == "link" and sorted(k[-1] for k in rx[1]) == ["0", "1"]
    assert fams["cmdare_gpu_nvlink_replay_errors_total"][0].kind == "counter"
    assert set(fams["cmdare_gpu_nvlink_total_rx_bytes_per_second"][1].values()) == {2 * 1000 * 1048576.0}
    parent = fams["cmdare_gpu_parent_index"][1]
    assert sorted((k[3], v) for k, v in parent.items()) == [("1000", 0.0), ("1001", 0.0)]
