"""analyze gpu on what the real GPU source reads beyond nvidia-smi (fake NVML): profiling
activity, MIG instances with their parent, per-process use attributed to jobs by PID."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cmdare.analytics.cli import cli
from tests.analytics.detectors.conftest import agent_gpus
from tests.fakes.nvml import FakeNvml


def run(*args: str) -> list[dict]:
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_gpm_activity_and_energy_per_gpu(tmp_path) -> None:
    con = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100", nvlinks=2, scenario="nvlink_errors"))
    con.close()
    rows = run("gpu", "--db", str(tmp_path / "agent-j.duckdb"))
    assert [r["gpu"] for r in rows] == [0, 1]
    r = rows[0]
    assert 90 <= r["gr_active_pct"] <= 99 and 80 <= r["sm_active_pct"] <= 90 and 60 <= r["tensor_pct"] <= 70
    assert r["energy_kwh"] == round(59 * 300 / 3.6e6, 4)  # 300 J a sample, 60 samples
    assert r["nvlink_errors"] == 177 and r["parent"] is None


def test_a_mig_parent_shows_its_instances_activity_weighted_by_their_share(tmp_path) -> None:
    import pynvml

    nvml = FakeNvml(gpus=1, model="h100", mig=2)

    def whole_gpu_unsupported(h, s):  # GPM per GPU instance only (as some drivers answer in MIG mode)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    nvml.nvmlGpmSampleGet = whole_gpu_unsupported
    con = agent_gpus(tmp_path, nvml)
    con.close()
    rows = {r["gpu"]: r for r in run("gpu", "--db", str(tmp_path / "agent-j.duckdb"))}
    assert sorted(rows) == [0, 1000, 1001]
    a, b = rows[1000], rows[1001]
    assert a["parent"] == b["parent"] == 0 and a["mig_profile"] == "1g.10gb" and a["mig_share_pct"] == 13.6
    p = rows[0]
    assert p["util_pct"] is None  # GPU_UTIL reads nothing in MIG mode
    assert p["gr_active_pct"] == round((a["gr_active_pct"] + b["gr_active_pct"]) * 13.6 / 100, 1)


def test_per_process_use_names_the_job_and_the_processes_in_none(tmp_path) -> None:
    con = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100"))
    con.close()
    db = str(tmp_path / "agent-j.duckdb")
    procs = run("gpu", "--processes", "--db", db)
    assert [(r["gpu"], r["pid"], r["job"], r["rank"]) for r in procs] == [(0, 4000, "j", 0), (1, 4001, "", None)]
    assert procs[0]["present_pct"] == 100.0 and 70 <= procs[0]["sm_pct"] <= 80 and 30 <= procs[0]["mem_pct"] <= 35
    assert run("gpu", "--job", "j", "--db", db) == procs[:1]
    assert run("gpu", "--job", "nope", "--db", db) == []
    res = CliRunner().invoke(cli, ["gpu", "--job", "j", "--every", "5m", "--db", db])
    assert res.exit_code == 2 and "--every and --label do not apply" in res.output


def test_analyze_tpu_reads_what_the_tpu_source_sends(tmp_path) -> None:
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import EventFactory

    f = EventFactory("tpu-vm-1", "worker", "")
    lines = []
    for k in range(10):
        for dev in (0, 1):
            lines.append(f.line("tpu", {"device": dev, "hbm_used_bytes": (4 + k) << 30, "hbm_total_bytes": 16 << 30,
                                        "duty_cycle_ratio": 0.5 + 0.01 * k + 0.2 * dev}, 1.75e9 + 10 * k, job="bert"))
    con = connect(tmp_path / "t.duckdb")
    assert Writer(con).write([("t", b"".join(lines))]).dead == 0
    con.close()
    rows = run("tpu", "--db", str(tmp_path / "t.duckdb"))
    assert [(r["node"], r["device"], r["samples"], r["duty_pct"], r["duty_max_pct"], r["hbm_used_gib"], r["jobs"])
            for r in rows] == [("tpu-vm-1", 0, 10, 54.5, 59.0, 13.0, "bert"), ("tpu-vm-1", 1, 10, 74.5, 79.0, 13.0, "bert")]
    assert rows[0]["hbm_bw_pct"] is None  # libtpu listed no bandwidth metric
    assert run("tpu", "--node", "other", "--db", str(tmp_path / "t.duckdb")) == []


def test_the_job_page_says_what_the_jobs_own_processes_used_of_each_gpu(tmp_path) -> None:
    from cmdare.analytics import api as pageapi
    from cmdare.analytics.db import Database

    agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100")).close()
    s = pageapi.job_series(Database(tmp_path / "agent-j.duckdb"), "j")
    rows = {g["gpu"]: g for g in s["gpus"]["rows"]}
    assert rows[0]["job_processes"] == 1 and 70 <= rows[0]["job_sm_pct"] <= 80 and rows[0]["other_processes"] == 0
    assert rows[1]["job_processes"] == 0 and rows[1]["job_sm_pct"] is None and rows[1]["other_processes"] == 1
    assert 90 <= rows[0]["util_pct"] <= 99  # the graphics engine's activity (GPM), not GPU_UTIL


def test_goodput_says_how_much_of_its_gpus_the_job_really_used(tmp_path) -> None:
    agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100")).close()
    res = CliRunner().invoke(cli, ["goodput", "--job", "j", "--db", str(tmp_path / "agent-j.duckdb")])
    assert res.exit_code == 0, res.output
    note = [line for line in res.output.splitlines() if "SMs" in line]
    assert len(note) == 1 and "of the SMs of its 1 GPU(s) on average (per process: analyze gpu --job j)" in note[0]
    assert 70 <= int(note[0].split("used ")[1].split(" %")[0]) <= 80


def test_the_job_page_lists_a_tpu_vms_cores_with_duty_cycle_and_hbm(tmp_path) -> None:
    from cmdare.analytics import api as pageapi
    from cmdare.analytics.db import Database
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import EventFactory

    f = EventFactory("tpu-vm-1", "worker", "")
    lines = []
    for k in range(10):
        ts = 1.75e9 + 10 * k
        lines.append(f.line("train_steps", {"run": "r", "steps": 10, "steps_per_second": 1.0,
                                            "interval_seconds": 10.0}, ts, job="bert"))
        for dev in (0, 1):
            lines.append(f.line("tpu", {"device": dev, "hbm_used_bytes": 8 << 30, "duty_cycle_ratio": 0.6 + 0.2 * dev}, ts))
    con = connect(tmp_path / "t.duckdb")
    assert Writer(con).write([("t", b"".join(lines))]).dead == 0
    con.close()
    s = pageapi.job_series(Database(tmp_path / "t.duckdb"), "bert")
    assert [(g["gpu"], g["name"], g["util_pct"], g["mem_used_gib"], g["active"]) for g in s["gpus"]["rows"]] == [
        (0, "TPU core", 60.0, 8.0, True), (1, "TPU core", 80.0, 8.0, True)]


def test_hostile_process_lists_cost_their_own_rows_only(tmp_path) -> None:
    """A broken or hostile agent's process lists (pids that are not numbers, SM shares out
    of range or huge, objects of the wrong shape) neither fail the per-process views nor
    change what the good agent's rows say."""
    from cmdare.analytics import api as pageapi
    from cmdare.analytics.db import Database
    from cmdare.analytics.detectors import detect
    from cmdare.analytics.units import Scope
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer

    agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100")).close()
    db = str(tmp_path / "agent-j.duckdb")
    before = run("gpu", "--processes", "--db", db)
    page = pageapi.job_series(Database(db), "j")["gpus"]["rows"]
    bad = [
        '{"v":1,"id":"h1","ts":1750000005.0,"node":"n0","role":"worker","job":"","labels":{},"type":"gpu",'
        '"data":{"index":0,"processes":[{"pid":"abc","sm_ratio":"x"},{"pid":4000,"sm_ratio":1e300,"mem_ratio":-5},'
        '{"pid":[1,2]},{"pid":4000,"used_bytes":-1}]}}',
        '{"v":1,"id":"h2","ts":1750000006.0,"node":"n0","role":"worker","job":"","labels":{},"type":"gpu",'
        '"data":{"index":1,"processes":[{"pid":4001,"sm_ratio":7.5}]}}',
    ]
    con = connect(db)
    n0 = con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]
    Writer(con).write([("hostile", ("\n".join(bad) + "\n").encode())])
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] in (n0, n0 + 1, n0 + 2)  # stored or refused
    assert [f.kind for f in detect("gpu_shared", con, Scope())] == []
    con.close()
    after = run("gpu", "--processes", "--db", db)
    assert [(r["gpu"], r["pid"], r["job"]) for r in after] == [(r["gpu"], r["pid"], r["job"]) for r in before]
    for a, b in zip(after, before, strict=True):  # the shares stay those NVML gave (out-of-range ones left out)
        assert a["sm_pct"] == b["sm_pct"] and a["mem_pct"] == b["mem_pct"] and a["mem_used_gib"] == b["mem_used_gib"]
    assert [(g["gpu"], g["job_sm_pct"]) for g in pageapi.job_series(Database(db), "j")["gpus"]["rows"]] == [
        (g["gpu"], g["job_sm_pct"]) for g in page]


def test_a_process_is_its_nodes_pid_not_any_pid(tmp_path) -> None:
    """Node n1 runs a process with the PID that job j's rank declared on n0: it is in no
    job (PIDs repeat across machines; a process is its node and its PID)."""
    from cmdare.agent.sources.gpu import GpuSource
    from cmdare.wire.events import EventFactory
    from tests.analytics.detectors.conftest import T0

    src = GpuSource(GpuSource.parse_config("sources.gpu", {}), nvml=FakeNvml(gpus=1, model="h100"))
    other = EventFactory("n1", "worker", "", rows=True)
    extra: list[bytes] = []
    for k in range(6):
        src.collect(lambda t, d, ts=T0 + 10 * k: extra.append(other.line(t, d, ts)))
    src.close()
    con = agent_gpus(tmp_path, FakeNvml(gpus=1, model="h100"), extra=extra)
    con.close()
    procs = run("gpu", "--processes", "--db", str(tmp_path / "agent-j.duckdb"))
    assert [(r["node"], r["gpu"], r["pid"], r["job"]) for r in procs] == [("n0", 0, 4000, "j"), ("n1", 0, 4000, "")]
    assert [r["node"] for r in run("gpu", "--job", "j", "--db", str(tmp_path / "agent-j.duckdb"))] == ["n0"]


def test_the_goodput_notes_count_the_jobs_gpus_and_each_foreign_process_once(monkeypatch) -> None:
    """gpu_use_notes over per-process rows (node, gpu, parent, pid, job, rank, run, present,
    sm, mem, GiB): the job's GPUs are (node, index) pairs; a foreign process is its node, GPU
    and PID on one of them, whatever job (or none) it belongs to."""
    from cmdare.analytics import processes

    def row(node, gpu, pid, job, sm, gib=1.0):
        return (node, gpu, None, pid, job, 0 if job == "j" else None, None, 100.0, sm, 5.0, gib)

    rows = [row("n0", 0, 100, "j", 80.0), row("n1", 0, 100, "j", 60.0),  # the job: index 0 on two nodes
            row("n0", 0, 200, "", 5.0), row("n1", 0, 200, "", 5.0),  # one PID, two nodes: two processes
            row("n0", 0, 201, "", None), row("n1", 0, 300, "k", 1.0, 2.0),  # another job's on the job's GPU
            row("n0", 1, 400, "k", 90.0), row("n2", 0, 500, "", 9.0)]  # on GPUs the job does not hold
    monkeypatch.setattr(processes, "gpu_processes", lambda *a, **k: (["c"] * 11, rows))
    assert processes.gpu_use_notes(None, "j", None, None) == [
        "the job's processes used 70 % of the SMs of its 2 GPU(s) on average (per process: analyze gpu --job j)",
        "4 process(es) of no rank of this job held the same GPUs"]
    assert processes.gpu_use_notes(None, "k", None, None) == [
        "the job's processes used 46 % of the SMs of its 2 GPU(s) on average (per process: analyze gpu --job k)",
        "2 process(es) of no rank of this job held the same GPUs"]
    assert processes.gpu_use_notes(None, "none", None, None) == []
    monkeypatch.setattr(processes, "gpu_processes", lambda *a, **k: (["c"] * 11, [row("n0", 0, 1, "j", None)]))
    assert processes.gpu_use_notes(None, "j", None, None) == [
        "the job's processes ran on 1 GPU(s) (no per-process utilisation sampled)"]

    def old(*a, **k):
        raise RuntimeError("a database from before per-process fields")

    monkeypatch.setattr(processes, "gpu_processes", old)
    assert processes.gpu_use_notes(None, "j", None, None) == []


def test_process_rows_keep_real_pids_and_name_a_held_job_only_where_a_scheduler_holds_the_gpu(tmp_path) -> None:
    """``process_rows`` row by row: pid 0 is no process (a positive pid is), 0 bytes used is
    a value (not unknown), and the job the scheduler gave the GPU to (``held_job``) is the
    sample's job only on a GPU a pod or a Slurm job holds, and never an empty name. (Each
    was a surviving SQL mutant: scripts/mutation-sql processes.)"""
    from cmdare.analytics.processes import process_rows
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer

    con = connect(tmp_path / "p.duckdb")
    procs = [{"pid": 0, "used_bytes": 5}, {"pid": 1, "used_bytes": 0}]
    lines = []
    for i, (job, pod, slurm) in enumerate((("trainer", None, None), ("trainer", "pod-a", None), ("", "pod-b", None),
                                            ("sjob", None, "42"), ("", None, None))):
        data = {"index": i, "uuid": f"GPU-{i}", "processes": procs} | ({"pod": pod} if pod else {}) | (
            {"slurm_job": slurm} if slurm else {})
        lines.append(json.dumps({"v": 1, "id": f"s{i}", "ts": 1750000000.0, "node": "n", "role": "worker", "job": job,
                                 "labels": {}, "type": "gpu", "data": data}))
    Writer(con).write([("t", ("\n".join(lines) + "\n").encode())])
    rows = con.execute(f'SELECT "index", pid, used, held_job FROM ({process_rows("true")}) ORDER BY "index", pid'
                       ).fetchall()
    assert rows == [(0, 1, 0, None), (1, 1, 0, "trainer"), (2, 1, 0, None), (3, 1, 0, "sjob"), (4, 1, 0, None)]
    con.close()
