"""memory_bound on the GPM DRAM activity the real GPU source reads (fake NVML)."""

from __future__ import annotations

from tests.fakes.nvml import FakeNvml

from .conftest import agent_gpus, found


def test_dram_bandwidth_above_the_threshold_on_most_busy_gpus_is_a_finding(tmp_path) -> None:
    con = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100"))  # DRAM 30-49 % of its maximum
    assert found(con, "memory_bound") == {}  # under the 60 % default
    f = found(con, "memory_bound", min_dram=0.3)
    x = f["j"][0]
    assert x.severity == "info" and x.evidence["gpus"] == x.evidence["busy_gpus"] == 2
    assert 0.3 <= x.evidence["dram_active"] <= 0.5 and 0.8 <= x.evidence["sm_active"] <= 0.9
    # the threshold exactly between: GPUs at or over it count
    mean = con.execute("SELECT avg(dram_active_ratio) FROM gpu_samples WHERE \"index\" = 0").fetchone()[0]
    assert found(con, "memory_bound", min_dram=round(mean + 0.05, 2)) == {}
