"""Jobs as Slurm sees them (issue 55): a GPU process no rank declared is named by the Slurm
job the agent found it in (``slurm-<id>``, with its step and user); a declared one keeps its
declared job even inside a Slurm job (one process, one job); ``gpu_shared`` finds two Slurm
jobs on one GPU with no ``track`` in their code; what a hostile agent writes into a process
entry costs that value only."""

from __future__ import annotations

from pathlib import Path

from cmdare.analytics.processes import gpu_processes
from cmdare.wire.events import EventFactory
from tests.agent.test_slurm import V1, V2, _proc
from tests.analytics.detectors.conftest import T0, agent_gpus, found
from tests.fakes.nvml import FakeNvml


def test_a_process_is_its_declared_job_else_its_slurm_job(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _proc(proc, 4000, V1, b"SLURM_JOB_NAME=resnet50\0SLURM_JOB_USER=bob\0")  # declared by job j's rank 0 too
    _proc(proc, 4001, V2, b"SLURM_JOB_NAME=bert\0SLURM_JOB_USER=alice\0")  # GPU 1's: no rank declared it
    other = EventFactory("n0", "worker", "")
    evil = [other.line("gpu", {"index": 2, "uuid": "GPU-z", "processes": [
        {"pid": 4005, "used_bytes": 1, "slurm_job": "1; DROP TABLE steps", "slurm_user": "x" * 10_000}]}, T0 + 5)]
    con = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100"), proc=proc, extra=evil)
    cols, rows = gpu_processes(con)
    got = {r[cols.index("pid")]: dict(zip(cols, r, strict=True)) for r in rows}
    assert (got[4000]["job"], got[4000]["named_by"], got[4000]["rank"]) == ("j", "track", 0)
    assert got[4000]["slurm_job"] == "4242"  # still shown: the declaration wins the name
    assert (got[4001]["job"], got[4001]["named_by"]) == ("slurm-4243", "slurm")
    assert (got[4001]["slurm_step"], got[4001]["slurm_user"]) == ("batch", "alice")
    assert (got[4005]["job"], got[4005]["named_by"], got[4005]["slurm_job"]) == ("", "", None)
    assert len(got[4005]["slurm_user"]) == 64
    assert [r[cols.index("pid")] for r in gpu_processes(con, job="slurm-4243")[1]] == [4001]
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] > 0  # nothing stored was touched


def test_two_slurm_jobs_on_one_gpu_are_found_without_track(tmp_path: Path) -> None:
    other = EventFactory("n0", "worker", "")
    extra = [other.line("gpu", {"index": 1, "uuid": "GPU-y", "processes": [
        {"pid": 7001, "used_bytes": 1, "sm_ratio": 0.5, "slurm_job": "501", "slurm_step": "0"},
        {"pid": 7002, "used_bytes": 1, "sm_ratio": 0.25, "slurm_job": "502", "slurm_step": "0"}]}, T0 + 1 + 10 * i)
        for i in range(4)]
    con = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100"), extra=extra)
    f = found(con, "gpu_shared")
    assert sorted(f) == ["slurm-501", "slurm-502"]
    x = f["slurm-502"][0]
    assert x.subject == "1" and x.evidence["samples"] == 4 and x.evidence["job2_sm"] == 0.25
