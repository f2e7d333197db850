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


def test_two_slurm_jobs_sharing_a_node_with_no_track(tmp_path: Path) -> None:
    """Issue 55's Slurm node: job 501's processes (cgroup v2, user alice) work GPUs 0 and 1;
    a prolog's GPU map gives GPUs 2 and 3 to job 502 (uid 0), which idles. No rank declared
    anything, no step was sent: the processes, gpu_idle, goodput by Slurm job and by user,
    and the jobs listing name both."""
    import json

    from click.testing import CliRunner

    from cmdare.agent.sources.gpu import GpuSource, slurm
    from cmdare.analytics.cli import cli
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer
    from tests.analytics.test_kubernetes_jobs import EVERY, TICKS, IdleAbove

    proc = tmp_path / "proc"
    for pid in (4000, 4001):
        _proc(proc, pid, V2.replace("4243", "501"), b"SLURM_JOB_NAME=resnet\0SLURM_JOB_USER=alice\0")
    gmap = tmp_path / "dcgm-job-map"
    gmap.mkdir()
    for i in (2, 3):
        (gmap / str(i)).write_text("502 0\n")
    src = GpuSource(GpuSource.parse_config("sources.gpu", {"slurm_gpu_map": str(gmap), "kubernetes": False}),
                    nvml=IdleAbove(2, gpus=4, model="a100"))
    src.slurm = slurm.Resolver(proc)
    src.collect(lambda *a, **k: None)  # the GPU map is read in a thread of its own from the first tick
    assert src.slurm_map is not None and src.slurm_map.read_done.wait(5)
    agent = EventFactory("slurm-n0", "worker", "", rows=True)
    lines: list[bytes] = []
    for i in range(TICKS):
        src.collect(lambda t, d, ts=T0 + i * EVERY, job=None: lines.append(agent.line(t, d, ts, job)))
    src.close()
    db = tmp_path / "slurm.duckdb"
    con = connect(db)
    assert Writer(con, rollup_every=None).write([("agent", b"".join(lines))]).dead == 0
    f = found(con, "gpu_idle")
    con.close()
    assert sorted(f) == ["slurm-502"] and f["slurm-502"][0].subject == "2,3"

    def analyze(*args: str) -> list[dict]:
        r = CliRunner().invoke(cli, ["--db", str(db), *args, "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    procs = {r["pid"]: (r["job"], r["named_by"]) for r in analyze("gpu", "--processes")}
    assert procs == {4000: ("slurm-501", "slurm"), 4001: ("slurm-501", "slurm"),
                     4002: ("slurm-502", "slurm"), 4003: ("slurm-502", "slurm")}  # 4002/3: by the GPU map
    by_user = {r["user"]: r for r in analyze("goodput", "--fleet", "--by", "user")}
    assert sorted(by_user) == ["alice", "root"]
    assert by_user["alice"]["goodput_pct"] == 100.0 and by_user["root"]["idle_accelerators_gpu_hours"] > 0.99
    assert sorted(r["slurm_job"] for r in analyze("goodput", "--fleet", "--by", "slurm_job")) == ["501", "502"]
    states = {r["job"]: r["state"] for r in analyze("jobs")}
    assert states == {"slurm-501": "slurm job (no steps)", "slurm-502": "slurm job (no steps)"}
    rows = analyze("goodput", "--job", "slurm-502")
    assert next(r for r in rows if r["category"] == "idle_accelerators")["pct"] == 100.0
