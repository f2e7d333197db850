"""The GPU source on a real NVIDIA GPU and driver (the ``gpu`` marker: run where the
``device`` machine lends one, ``pytest -m gpu``; skipped where NVML finds no GPU, CI
included). What no stub can show: that every field the agent reports agrees with what
``nvidia-smi`` says of the same GPUs, read through the real libnvidia-ml.so.1."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

PROBE = """
import json
from cmdare.agent.sources.gpu import GpuSource
from tests.agent.test_gpu import tick
src = GpuSource(GpuSource.parse_config("sources.gpu", {}))
events, statuses = tick(src)
events, statuses = tick(src)  # the second tick has rates (utilisation over an interval)
print(json.dumps({"gpus": [d for t, d in events if t == "gpu"], "status": [list(s[:2]) for s in statuses]}))
"""

SMI_FIELDS = "index,uuid,name,memory.total,memory.used,temperature.gpu,power.limit"


def smi() -> list[dict[str, str]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        pytest.skip("nvidia-smi is not on PATH: no NVIDIA driver here")
    r = subprocess.run([exe, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or not r.stdout.strip():
        pytest.skip(f"nvidia-smi finds no GPU: {(r.stderr or r.stdout).strip()[:200]}")
    keys = SMI_FIELDS.split(",")
    return [dict(zip(keys, (x.strip() for x in line.split(",")), strict=True)) for line in r.stdout.splitlines()]


def test_the_agent_reads_what_nvidia_smi_shows() -> None:
    want = smi()
    from tests.conftest import ROOT

    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["status"][-1] == ["gpu", "ok"], got["status"]
    gpus = sorted(got["gpus"], key=lambda g: g["index"])
    assert [g["uuid"] for g in gpus] == [w["uuid"] for w in want]
    for g, w in zip(gpus, want, strict=True):
        assert g["name"] == w["name"]
        assert g["mem_total_bytes"] == pytest.approx(float(w["memory.total"]) * 2**20, rel=0.01)
        assert 0 <= g["mem_used_bytes"] <= g["mem_total_bytes"]
        assert g["temp_celsius"] == pytest.approx(float(w["temperature.gpu"]), abs=5)
        assert 0 <= g["util_gpu_ratio"] <= 1
        if w["power.limit"] not in ("[N/A]", "[Not Supported]") and "power_limit_watts" in g:
            assert g["power_limit_watts"] == pytest.approx(float(w["power.limit"]), rel=0.01)
