"""The agent's OTLP push into a real OpenTelemetry Collector (built from the Go module proxy
by ``scripts/gobuild otelcol``: the core's OTLP receiver, contrib's file exporter), over
OTLP/HTTP and OTLP/gRPC: every metric family the agent holds arrives, with its resource
attributes, kind and declared unit, read back from the collector's file exporter. Skipped,
saying why, without Go. (What only a decoder of our own can check, the headers the agent
sends and an endpoint that fails: tests/agent/test_exports.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cmdare.agent.runtime import Agent
from tests.agent.test_exports import agent_config
from tests.conftest import free_port, go_tool, wait_for
from tests.fakes.nvml import FakeNvml

pytestmark = pytest.mark.slow


def _points(path: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, str]]]:
    """name -> {kind, unit, monotonic, attributes of one point}, and every resource's attributes,
    from the file exporter's OTLP JSON lines."""
    fams: dict[str, dict[str, Any]] = {}
    resources = []
    for line in path.read_text().splitlines():
        for rm in json.loads(line).get("resourceMetrics", []):
            resources.append({a["key"]: a["value"].get("stringValue") for a in rm["resource"]["attributes"]})
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    kind = "gauge" if "gauge" in m else "sum"
                    pts = m[kind]["dataPoints"]
                    fams[m["name"]] = {"kind": kind, "unit": m.get("unit", ""), "points": len(pts),
                                       "monotonic": m[kind].get("isMonotonic", False),
                                       "attributes": {a["key"]: a["value"].get("stringValue") for a in pts[0]["attributes"]}}
    return fams, resources


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_the_agents_otlp_reaches_a_real_opentelemetry_collector(tmp_path: Path, protocol: str) -> None:
    binary = go_tool("otelcol")
    grpc_port, http_port = free_port(), free_port()
    out = tmp_path / "metrics.json"
    cfg = tmp_path / "otelcol.yaml"
    cfg.write_text(json.dumps({  # JSON is YAML
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                                             "http": {"endpoint": f"127.0.0.1:{http_port}"}}}},
        "exporters": {"file": {"path": str(out)}},
        "service": {"telemetry": {"metrics": {"level": "none"}},  # no :8888 of its own
                    "pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["file"]}}}}))
    col = subprocess.Popen([str(binary), "--config", str(cfg)], stdout=subprocess.DEVNULL,
                           stderr=open(tmp_path / "otelcol.log", "w"))
    try:
        wait_for(lambda: "Everything is ready" in (tmp_path / "otelcol.log").read_text(), 30, what="the collector")
        endpoint = f"http://127.0.0.1:{http_port}/v1/metrics" if protocol == "http/protobuf" else f"http://127.0.0.1:{grpc_port}"
        agent = Agent(agent_config(tmp_path, **{"otlp.endpoint": endpoint, "otlp.protocol": protocol, "otlp.interval": 1.0,
                                                "labels": {"team": "vision"}}),
                      adapters={"nvml": FakeNvml(gpus=2, model="h100", nvlinks=2)})
        agent.run(duration=2.5)  # periodic exports, and a last one at the stop
        assert agent.metrics is not None
        want = {f.base: f for f in agent.metrics.families.values() if not f.dcgm}
        got, resources = wait_for(lambda: (lambda r: r if set(want) <= set(r[0]) else None)(_points(out))
                                  if out.exists() else None, 30, what="every family in the collector's file")
    finally:
        col.terminate()
        col.wait(timeout=30)
    assert {"cmdare_gpu_util_gpu_ratio", "cmdare_gpu_tensor_active_ratio", "cmdare_host_cpu_util_ratio",
            "cmdare_agent_spooled"} <= set(want)
    for name, f in want.items():  # every family the agent held, as declared
        g = got[name]
        assert g["unit"] == f.unit, name
        assert (g["kind"], g["monotonic"]) == (("sum", True) if f.kind == "counter" else ("gauge", False)), name
        assert {"node": "n1", "role": "worker", "job": "j1", "team": "vision"}.items() <= g["attributes"].items(), name
    assert got["cmdare_gpu_util_gpu_ratio"]["points"] == 2 and got["cmdare_gpu_temp_celsius"]["unit"] == "Cel"
    assert got["cmdare_gpu_sm_clock_hertz"]["unit"] == "Hz" and got["cmdare_host_mem_total_bytes"]["unit"] == "By"
    assert all(r["service.name"] == "cmdare-agent" and r["host.name"] == "n1" for r in resources)
