"""tensor_idle on what the real GPU source reads through GPM (the fake NVML's scenarios)."""

from __future__ import annotations

from tests.fakes.nvml import FakeNvml

from .conftest import agent_gpus, found


def test_a_job_training_in_fp32_on_hopper_is_told_to_use_mixed_precision(tmp_path) -> None:
    con = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100", scenario="no_tensor"))
    f = found(con, "tensor_idle")
    assert list(f) == ["j"]
    x = f["j"][0]
    assert x.evidence["gpus"] == 2 and x.evidence["tensor_active"] == 0.0
    assert 0.9 <= x.evidence["gr_engine_active"] <= 0.99 and x.evidence["fp32_active"] == 0.7
    assert "mixed precision" in x.summary and x.node == "n0" and x.subject == "n0:0,n0:1"
    # a threshold above what the GPUs showed: nothing
    assert found(con, "tensor_idle", min_fp32=0.8) == {}


def test_tensor_cores_in_use_or_no_profiling_metrics_make_no_finding(tmp_path) -> None:
    busy = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100"), job="bf16")  # tensor pipes 60-69 %
    assert found(busy, "tensor_idle") == {}
    ampere = agent_gpus(tmp_path, FakeNvml(gpus=2, model="a100", scenario="no_tensor"), job="a100")  # no GPM
    assert ampere.execute("SELECT count(tensor_active_ratio) FROM gpu_samples").fetchone() == (0,)
    assert found(ampere, "tensor_idle") == {}
