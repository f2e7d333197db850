"""dcgm-exporter's names on the agent's /metrics (``[prometheus] names = "dcgm"``): every
metric of dcgm-exporter's default counter list is served with its name, type and help, or
listed as left out; the values are in dcgm-exporter's units, compared with what the fake
NVML answered; counters carry no ``_total``; the endpoint answers in the text format even to
an OpenMetrics scraper; a bad setting is one line. (A real Prometheus reading NVIDIA's
dashboard from the agent: tests/integration/test_prometheus.py.)"""

from __future__ import annotations

import csv
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cmdare.agent import dcgm
from cmdare.agent.config import ConfigError
from cmdare.agent.exporters import MetricStore
from cmdare.agent.runtime import Agent
from tests.agent.test_exports import agent_config
from tests.conftest import dcgm_exporter_file, wait_for
from tests.fakes.nvml import FakeNvml

CSV = dcgm_exporter_file("default-counters.csv")


def default_counters() -> dict[str, tuple[str, str]]:
    """name -> (type, help) of every metric dcgm-exporter exports by default."""
    out = {}
    for row in csv.reader(line for line in CSV.read_text().splitlines() if line.strip() and not line.startswith("#")):
        name, kind, help_ = (x.strip() for x in (row[0], row[1], ",".join(row[2:])))
        out[name] = (kind, help_)
    return out


def test_every_default_counter_is_served_as_dcgm_exporter_names_it_or_left_out_by_name() -> None:
    want = default_counters()
    served = {c.name: (c.kind, c.help) for c in (*dcgm.COUNTERS, dcgm.XID)}
    assert set(served) | set(dcgm.LEFT_OUT) == set(want) and not set(served) & set(dcgm.LEFT_OUT)
    for name, (kind, help_) in served.items():
        assert (kind, help_) == want[name], name  # type and help (its unit) as dcgm-exporter has them


def _store_and_samples(**fake: Any) -> tuple[dict[str, Any], list[dict[str, Any]], FakeNvml]:
    from cmdare.agent.sources.gpu import GpuSource

    nvml = FakeNvml(**fake)
    st = MetricStore("gpu-a", "worker", "j0", names="dcgm")
    seen: list[dict[str, Any]] = []
    src = GpuSource(GpuSource.parse_config("sources.gpu", {}), nvml=nvml)

    def emit(t: str, d: dict[str, Any]) -> None:
        st.observe(t, d)
        if t == "gpu":
            seen.append(dict(d))
    for _ in range(3):
        src.collect(emit)
    return {f.name: (f, dict(s)) for f, s in st.snapshot()}, seen, nvml


def test_values_are_in_dcgm_exporters_units_as_nvml_answered_them() -> None:
    fams, seen, nvml = _store_and_samples(gpus=2, model="h100")
    last = {d["index"]: d for d in seen}
    names = dict(zip(dcgm.LABELS, range(len(dcgm.LABELS)), strict=True))
    off = 3  # node, role, job
    for name, (f, series) in fams.items():
        if not name.startswith("DCGM_"):
            continue
        assert f.labelnames[off:] == dcgm.LABELS and f.dcgm
        for key in series:
            assert key[off + names["Hostname"]] == "gpu-a" and key[off + names["device"]] == f"nvidia{key[off]}"
            assert key[off + names["modelName"]] == last[int(key[off])]["name"]
            assert key[off + names["UUID"]] == last[int(key[off])]["uuid"]
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    def one(name: str) -> float:
        return next(v for k, v in fams[name][1].items() if k[off] == "0")
    assert one("DCGM_FI_DEV_SM_CLOCK") == nvml.nvmlDeviceGetClockInfo(h, 1)  # MHz, as NVML answers it
    assert one("DCGM_FI_DEV_MEM_CLOCK") == nvml.nvmlDeviceGetClockInfo(h, 2)
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    assert one("DCGM_FI_DEV_FB_USED") == pytest.approx(mem.used / 1048576)  # MiB
    assert one("DCGM_FI_DEV_FB_FREE") == pytest.approx((mem.total - mem.used) / 1048576)
    d = last[0]
    assert one("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == pytest.approx(d["energy_joules_total"] * 1000)  # mJ
    assert fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0].kind == "counter"
    assert one("DCGM_FI_DEV_GPU_UTIL") == pytest.approx(d["util_gpu_ratio"] * 100)  # %
    assert 0 <= one("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") <= 1  # the profiling fields stay ratios
    assert one("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") == d["tensor_active_ratio"]
    assert one("DCGM_FI_DEV_POWER_USAGE") == d["power_watts"] and one("DCGM_FI_DEV_GPU_TEMP") == d["temp_celsius"]


def test_a_mig_instance_is_its_parents_gpu_with_its_profile() -> None:
    fams, seen, _ = _store_and_samples(gpus=1, model="h100", mig=2)
    fb = fams["DCGM_FI_DEV_FB_USED"][1]
    prof, gi = 3 + dcgm.LABELS.index("GPU_I_PROFILE"), 3 + dcgm.LABELS.index("GPU_I_ID")
    migs = [k for k in fb if k[prof]]
    assert len(migs) == 2 and all(m[3] == "0" and m[5] == "nvidia0" and m[prof].startswith("1g.") for m in migs)
    assert sorted(m[gi] for m in migs) == sorted({str(d["gpu_instance_id"]) for d in seen if d.get("parent_index") == 0})


def test_the_pod_and_the_slurm_job_holding_a_gpu_are_its_labels() -> None:
    """dcgm-exporter's pod, namespace, container (its kubelet mapping) and hpc_job (its HPC
    job mapping) labels, from the GPU sample's scheduler fields; empty where none."""
    st = MetricStore("gpu-a", "worker", "", names="dcgm")
    st.observe("gpu", {"index": 0, "uuid": "GPU-0", "name": "A100", "util_gpu_ratio": 0.5, "namespace": "nlp",
                       "pod": "bert-0", "container": "main"}, "nlp/bert-0")
    st.observe("gpu", {"index": 1, "uuid": "GPU-1", "name": "A100", "util_gpu_ratio": 0.5, "slurm_job": "4242"},
               "slurm-4242")
    st.observe("gpu", {"index": 2, "uuid": "GPU-2", "name": "A100", "util_gpu_ratio": 0.5})
    util = {f.name: dict(s) for f, s in st.snapshot()}["DCGM_FI_DEV_GPU_UTIL"]
    at = {k: 3 + dcgm.LABELS.index(k) for k in ("pod", "namespace", "container", "hpc_job")}
    got = {key[3]: {k: key[i] for k, i in at.items()} | {"job": key[2]} for key in util}
    assert got == {"0": {"pod": "bert-0", "namespace": "nlp", "container": "main", "hpc_job": "", "job": "nlp/bert-0"},
                   "1": {"pod": "", "namespace": "", "container": "", "hpc_job": "4242", "job": "slurm-4242"},
                   "2": {"pod": "", "namespace": "", "container": "", "hpc_job": "", "job": ""}}


def test_an_xid_is_the_gauge_of_the_last_one_and_the_cmdare_names_stay() -> None:
    st = MetricStore("gpu-a", "worker", "j0", names="dcgm")
    st.observe("gpu", {"index": 0, "uuid": "GPU-1", "name": "NVIDIA A100", "util_gpu_ratio": 0.5})
    for xid in (13, 79):
        st.observe("gpu_event", {"index": 0, "uuid": "GPU-1", "kind": "xid", "xid": xid})
    st.observe("gpu_event", {"index": 7, "uuid": "GPU-7", "kind": "xid", "xid": 31})  # a GPU never sampled: no labels to give
    fams = {f.name: dict(s) for f, s in st.snapshot()}
    assert list(fams["DCGM_FI_DEV_XID_ERRORS"].values()) == [79.0]
    assert list(fams["cmdare_gpu_util_gpu_ratio"].values()) == [0.5]  # the agent's own names as before
    assert sum(fams["cmdare_gpu_events_total"].values()) == 3
    plain = MetricStore("gpu-a", "worker", "j0")  # the default: no DCGM names
    plain.observe("gpu", {"index": 0, "uuid": "GPU-1", "name": "NVIDIA A100", "util_gpu_ratio": 0.5})
    assert not [f for f, _ in plain.snapshot() if f.name.startswith("DCGM_")]


@pytest.mark.parametrize("value", [True, 1, None])
def test_a_hostile_sample_costs_that_value_only(value: Any) -> None:
    st = MetricStore("gpu-a", "worker", "j0", names="dcgm")
    st.observe("gpu", {"index": 0, "uuid": "GPU-1", "name": "x", "mem_used_bytes": value, "mem_total_bytes": 10,
                       "row_remap_failed": value, "temp_celsius": 50.0})
    st.observe("gpu", {"index": "0; drop", "temp_celsius": 1.0})  # no index: not a GPU
    fams = {f.name: dict(s) for f, s in st.snapshot()}
    assert list(fams["DCGM_FI_DEV_GPU_TEMP"].values()) == [50.0]
    assert ("DCGM_FI_DEV_FB_USED" in fams) == (type(value) is int) and ("DCGM_FI_DEV_ROW_REMAP_FAILURE" in fams) == (value is True)


def test_the_endpoint_serves_bare_counters_in_the_text_format_to_any_scraper(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    cfg = agent_config(tmp_path, **{"prometheus.listen": "127.0.0.1:0", "prometheus.names": "dcgm",
                                    "sources.gpu.backend": "python:tests.fakes.nvml"})
    agent = Agent(cfg)
    import threading

    t = threading.Thread(target=agent.run, daemon=True)
    t.start()
    try:
        wait_for(lambda: agent.prometheus is not None and agent.prometheus.server is not None, 10, what="the endpoint")
        url = f"http://127.0.0.1:{agent.prometheus.port}/metrics"  # type: ignore[union-attr]

        def get(accept: str) -> tuple[str, str]:
            req = urllib.request.Request(url, headers={"Accept": accept})
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.headers["Content-Type"], r.read().decode()
        text = wait_for(lambda: (lambda b: b if "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in b else None)(get("*/*")[1]),
                        20, what="DCGM series")
        assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
        assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        assert fams["DCGM_FI_DEV_GPU_TEMP"].type == "gauge" and fams["cmdare_gpu_temp_celsius"].type == "gauge"
        ctype, body = get("application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5")
        assert ctype.startswith("text/plain") and "# EOF" not in body
    finally:
        agent.stop()
        t.join(10)


@pytest.mark.parametrize(("value", "msg"), [("nvidia", "prometheus.names: expected"), (3, "prometheus.names")])
def test_a_bad_names_setting_is_one_line(tmp_path: Path, value: Any, msg: str) -> None:
    with pytest.raises(ConfigError, match=msg) as e:
        agent_config(tmp_path, **{"prometheus.listen": "127.0.0.1:0", "prometheus.names": value})
    assert "\n" not in str(e.value)
