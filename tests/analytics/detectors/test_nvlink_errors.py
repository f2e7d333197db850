"""nvlink_errors on the NVLink counters the real GPU source reads (fake NVML)."""

from __future__ import annotations

from tests.fakes.nvml import FakeNvml

from .conftest import agent_gpus, found


def test_growing_nvlink_errors_name_the_gpu_and_the_job_across_it(tmp_path) -> None:
    con = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100", scenario="nvlink_errors", nvlinks=2))
    # replay errors grow by 3 a sample on link 0 of each GPU: 60 samples, 3 .. 180
    f = found(con, "nvlink_errors")
    assert [(x.subject.split(":")[0], x.evidence["nvlink_errors"], x.severity) for x in f["j"]] == [
        ("0", 177, "warning"), ("1", 177, "warning")]
    assert "job j" in f["j"][0].summary
    assert [x.severity for x in found(con, "nvlink_errors", critical_errors=177)["j"]] == ["critical"] * 2
    assert found(con, "nvlink_errors", min_errors=178) == {}
    healthy = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100", nvlinks=2), job="ok")
    assert healthy.execute("SELECT max(nvlink_errors_total) FROM gpu_samples").fetchone() == (0,)
    assert found(healthy, "nvlink_errors") == {}
