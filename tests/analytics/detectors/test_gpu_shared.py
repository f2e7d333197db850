"""gpu_shared: processes of two jobs on one GPU (pids from the jobs' declarations)."""

from __future__ import annotations

from cmdare.wire.events import EventFactory
from tests.fakes.nvml import FakeNvml

from .conftest import T0, agent_gpus, found


def test_a_gpu_used_by_two_jobs_processes_is_reported_for_each(tmp_path) -> None:
    other = EventFactory("n0", "worker", "")
    extra = [other.line("train_job", {"run": "r", "rank": 0, "pid": 4001, "world_size": 1}, T0, job="k")]
    # job k's process (pid 4001) runs on GPU 0 too for 5 samples: the fake lists pid 4000 there,
    # these samples list both
    for i in range(5):
        extra.append(other.line("gpu", {"index": 0, "uuid": "GPU-x", "processes": [
            {"pid": 4000, "used_bytes": 1, "sm_ratio": 0.5}, {"pid": 4001, "used_bytes": 1, "sm_ratio": 0.25}]},
            T0 + 1 + 10 * i))
    con = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100"), extra=extra)
    f = found(con, "gpu_shared")
    assert sorted(f) == ["j", "k"]
    x = f["k"][0]
    assert x.subject == "0" and x.node == "n0" and x.evidence["samples"] == 5 and x.evidence["jobs"] == 2
    assert x.evidence["job1"] == "j" and x.evidence["job2"] == "k" and x.evidence["job2_sm"] == 0.25
    assert found(con, "gpu_shared", min_samples=6) == {}
    alone = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100"), job="alone")
    assert found(alone, "gpu_shared") == {}
