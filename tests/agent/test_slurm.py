"""Slurm jobs of GPU processes (agent/sources/gpu/slurm.py): the job, step and user read from
``/proc/PID/cgroup`` texts as slurmd lays them out (cgroup v1 and v2) and from the job's
environment, cached per process start, bounded against what a process can write into its own
environment; the GPU source's process entries carry them; analyze names a process's job by
its declaration first, its Slurm job second (never two jobs for one process), and
``gpu_shared`` finds two Slurm jobs on one GPU with no ``track`` in their code."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmdare.agent.sources.gpu import slurm

# /proc/PID/cgroup as slurmd's cgroup plugins leave them (task plugin task/cgroup)
V1 = """12:pids:/slurm/uid_1000/job_4242/step_0/task_0
11:memory:/slurm/uid_1000/job_4242/step_0/task_0
10:devices:/slurm/uid_1000/job_4242/step_0
4:cpuset:/slurm/uid_1000/job_4242/step_0
1:name=systemd:/system.slice/slurmd.service
"""
V1_MULTI = "7:freezer:/slurm_gpu07/uid_1001/job_77/step_extern\n3:memory:/slurm_gpu07/uid_1001/job_77/step_extern\n"
V2 = "0::/system.slice/slurmstepd.scope/job_4243/step_batch/user/task_0\n"
V2_INTERACTIVE = "0::/system.slice/slurmstepd.scope/job_9/step_interactive/user/task_special\n"
NOT_SLURM = ["0::/user.slice/user-1000.slice/session-3.scope\n",
             "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/cri-containerd-9f.scope\n",
             "0::/slurm_is_a_word/job_x/step_0\n",
             "0::/system.slice/slurmstepd.scope/job_123456789012345678901234/step_0\n",  # 24 digits: no id
             "garbage without colons\n", ""]


@pytest.mark.parametrize(("text", "want"), [
    (V1, {"slurm_job": "4242", "slurm_step": "0", "uid": 1000}),
    (V1_MULTI, {"slurm_job": "77", "slurm_step": "extern", "uid": 1001}),
    (V2, {"slurm_job": "4243", "slurm_step": "batch"}),
    (V2_INTERACTIVE, {"slurm_job": "9", "slurm_step": "interactive"}),
    *((t, {}) for t in NOT_SLURM),
])
def test_the_cgroup_names_the_job_step_and_user(text: str, want: dict) -> None:
    assert slurm.from_cgroup(text) == want


def _proc(root: Path, pid: int, cgroup: str, environ: bytes | None = None, start: int = 123456, uid: int = 1000) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    rest = ["S", "1", "1", "1", "0", "-1", "4194560"] + ["0"] * 12 + [str(start)] + ["0"] * 30
    (d / "stat").write_text(f"{pid} (python3 train.py) " + " ".join(rest) + "\n")  # spaces in the name
    (d / "cgroup").write_text(cgroup)
    (d / "status").write_text(f"Name:\tpython3\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    if environ is not None:
        (d / "environ").write_bytes(environ)


def test_the_resolver_reads_once_per_process_start(tmp_path: Path) -> None:
    _proc(tmp_path, 4000, V2, b"PATH=/bin\0SLURM_JOB_ID=4243\0SLURM_JOB_NAME=resnet50\0SLURM_JOB_USER=alice\0")
    clock = [0.0]
    r = slurm.Resolver(tmp_path, clock=lambda: clock[0])
    assert r.resolve(4000) == {"slurm_job": "4243", "slurm_step": "batch", "slurm_job_name": "resnet50",
                               "slurm_user": "alice", "uid": 1000}
    (tmp_path / "4000" / "cgroup").write_text(V1)  # the same process: not read again
    assert r.resolve(4000)["slurm_job"] == "4243"
    clock[0] = 31.0  # the start time is checked again: the same process, not read again
    assert r.resolve(4000)["slurm_job"] == "4243"
    _proc(tmp_path, 4000, V1, b"SLURM_JOB_NAME=bert\0", start=999999)  # the PID reused by a new process
    assert r.resolve(4000)["slurm_job"] == "4243"  # until the next check, at most 30 s
    clock[0] = 62.0
    assert r.resolve(4000)["slurm_job"] == "4242" and r.resolve(4000)["slurm_job_name"] == "bert"
    assert r.resolve(4001) == {}  # no such process
    _proc(tmp_path, 4001, V2)
    assert r.resolve(4001) == {}  # remembered as none until the next check...
    clock[0] = 93.0
    assert r.resolve(4001)["slurm_job"] == "4243"  # ...then read
    _proc(tmp_path, 4002, NOT_SLURM[0], b"HOME=/root\0")
    assert r.resolve(4002) == {}


def test_environ_alone_names_the_job_where_the_cgroup_does_not(tmp_path: Path) -> None:
    _proc(tmp_path, 5000, NOT_SLURM[0], b"SLURM_JOB_ID=88\0SLURM_STEP_ID=3\0")
    assert slurm.Resolver(tmp_path).resolve(5000)["slurm_job"] == "88"
    assert slurm.Resolver(tmp_path).resolve(5000)["slurm_step"] == "3"


def test_a_process_cannot_smuggle_anything_through_its_environment(tmp_path: Path) -> None:
    evil = (b"SLURM_JOB_ID=1; DROP TABLE steps\0SLURM_JOB_NAME=" + b"\x1b[31m\"}\n" * 500 + b"\0"
            b"SLURM_JOB_USER=\xff\xfe\0" + b"X=" + b"y" * 200_000)
    _proc(tmp_path, 6000, V2, evil)
    info = slurm.Resolver(tmp_path).resolve(6000)
    assert info["slurm_job"] == "4243"  # the cgroup's, not the environment's
    assert len(info["slurm_job_name"]) == slurm.MAX_NAME and "\n" not in info["slurm_job_name"]
    assert "\x1b" not in info["slurm_job_name"] and info["slurm_user"] == "??"
    _proc(tmp_path, 6001, NOT_SLURM[0], b"SLURM_JOB_ID=1; DROP TABLE steps\0")
    assert slurm.Resolver(tmp_path).resolve(6001) == {}  # not an id: no job


def test_the_gpu_sources_process_entries_carry_the_slurm_job(tmp_path: Path) -> None:
    from cmdare.agent.sources.gpu import GpuSource
    from tests.fakes.nvml import FakeNvml

    _proc(tmp_path, 4000, V1, b"SLURM_JOB_NAME=resnet50\0SLURM_JOB_USER=alice\0")  # GPU 0's process
    src = GpuSource(GpuSource.parse_config("sources.gpu", {}), nvml=FakeNvml(gpus=2))
    src.slurm = slurm.Resolver(tmp_path)
    got: list[dict] = []
    jobs: dict[int, str | None] = {}
    src.collect(lambda t, d, job=None: (got.append(d), jobs.__setitem__(d["index"], job)) if t == "gpu" else None)
    by = {d["index"]: d["processes"] for d in got}
    # the GPU whose every process is in Slurm job 4242 is that job's; the other is no job's
    assert jobs == {0: "slurm-4242", 1: None}
    assert (got[0]["slurm_job"], got[0]["slurm_user"]) == ("4242", "alice") and "slurm_job" not in got[1]
    assert by[0] == [{"pid": 4000, "used_bytes": by[0][0]["used_bytes"], "slurm_job": "4242", "slurm_step": "0",
                      "slurm_job_name": "resnet50", "slurm_user": "alice"}]
    assert by[1] == [{"pid": 4001, "used_bytes": by[1][0]["used_bytes"]}]  # in no Slurm job
    e = src.sample(src.gpus[0])  # the row form the agent ships: the same entries (SM shares now sampled too)
    from cmdare.wire.events import encode_row_data

    assert e.row == encode_row_data("gpu", dict(e))  # byte for byte the generic encoder's
    assert {k: v for k, v in e["processes"][0].items() if k.startswith("slurm_")} == \
        {k: v for k, v in by[0][0].items() if k.startswith("slurm_")}
    off = GpuSource(GpuSource.parse_config("sources.gpu", {"slurm": False}), nvml=FakeNvml(gpus=1))
    assert off.slurm is None


def test_a_prologs_gpu_map_names_each_gpus_job_even_idle(tmp_path: Path) -> None:
    """dcgm-exporter's --hpc-job-mapping-dir layout: one file per GPU (index or UUID) holding
    the job id (and the uid after it, as jobstats writes it)."""
    from cmdare.agent.sources.gpu import GpuSource
    from tests.fakes.nvml import FakeNvml

    m = tmp_path / "map"
    m.mkdir()
    nv = FakeNvml(gpus=3)
    (m / "0").write_text("4242\n")
    (m / nv.devs[1].uuid).write_text("4243 0\n")  # by UUID, with the uid (root here)
    (m / "2").write_text("77\n78\n")  # two jobs share GPU 2: neither is named
    src = GpuSource(GpuSource.parse_config("sources.gpu", {"slurm_gpu_map": str(m)}), nvml=nv)
    src.slurm = slurm.Resolver(tmp_path / "noproc")  # its processes are in no Slurm job
    src.collect(lambda *a, **k: None)  # the first tick asks for the GPUs' files: read in a thread
    assert src.slurm_map is not None and src.slurm_map.read_done.wait(5)
    got: dict[int, tuple] = {}
    src.collect(lambda t, d, job=None: got.__setitem__(d["index"], (d.get("slurm_job"), d.get("slurm_user"), job))
                if t == "gpu" else None)
    src.close()
    assert got == {0: ("4242", None, "slurm-4242"), 1: ("4243", "root", "slurm-4243"), 2: (None, None, None)}


def test_the_gpu_map_is_bounded_and_reread(tmp_path: Path) -> None:
    import os

    m = tmp_path / "map"
    m.mkdir()
    now = [0.0]
    gm = slurm.GpuMap(m, recheck=10.0, clock=lambda: now[0], background=False)
    assert gm.get(0, "GPU-x") is None  # empty: no prolog ran yet
    (m / "0").write_text("4242\n")
    assert gm.get(0, "GPU-x") is None  # read at most every 10 s ...
    now[0] = 10.0
    assert gm.get(0, "GPU-x") == ("4242", None)  # ... then the new file is seen
    os.mkfifo(m / "1")  # a FIFO would block a read forever: skipped unread
    (m / "2").write_bytes(b"9" * 30 + b"\n")  # not a Slurm job id
    (m / "3").write_bytes(b"1; rm -rf /\n")
    (m / "4").write_bytes(b"5\x1b[31m\n")
    (m / "../etc").mkdir(exist_ok=True)
    (m / "notes.txt").write_text("4242\n")  # not a GPU's name
    (m / "5").write_bytes(b"55 " + b"1" * 40 + b"\n")  # a 40-digit uid: the job without a user
    (m / "6").write_bytes(b"6" * 1_000_000)  # 1 MB: read up to 64 KiB, no job id that long
    for i in range(300):
        (m / f"GPU-{i:04d}").write_text("1\n")
    now[0] = 20.0
    assert gm.get(1, "GPU-y") is None and gm.get(2, "") is None and gm.get(3, "") is None and gm.get(4, "") is None
    assert gm.get(5, "") == ("55", None) and gm.get(6, "") is None
    assert len(gm.jobs) <= slurm.MAX_MAP_FILES
    assert gm.get(0, "GPU-x") == ("4242", None)  # the others cost only themselves
    missing = slurm.GpuMap(tmp_path / "absent", background=False)
    assert missing.get(0, "GPU-x") is None


def test_no_file_in_the_map_folder_can_hang_the_tick_or_empty_the_map(tmp_path: Path) -> None:
    """Issue 69's attacks on the folder: a FIFO (one swapped in after a stat too: the type
    is checked on the opened descriptor), a symlink to a blocking file, 300 junk names that
    sort before the GPUs' files. Each costs its own GPU at most; no read blocks."""
    import os
    import time

    m, elsewhere = tmp_path / "map", tmp_path / "elsewhere"
    m.mkdir()
    elsewhere.mkdir()
    os.mkfifo(m / "0")
    os.mkfifo(elsewhere / "fifo")
    (elsewhere / "job").write_text("999\n")
    os.symlink(elsewhere / "fifo", m / "1")
    os.symlink(elsewhere / "job", m / "3")  # a link, even to a good file: refused (O_NOFOLLOW)
    for i in range(300):
        (m / f"!{i:03d}").write_text("666\n")  # sort first; were the first 256 names read
        (m / f"{i:04d}").write_text("666\n")  # a GPU's name, but of no GPU here
    (m / "2").write_text("4242\n")
    (m / "GPU-aaaa").write_text("4343\n")
    gm = slurm.GpuMap(m)
    t0 = time.monotonic()
    for i, uuid in enumerate(("GPU-zero", "GPU-one", "GPU-two", "GPU-three", "GPU-aaaa")):
        gm.get(i, uuid)
    assert time.monotonic() - t0 < 0.5
    assert gm.read_done.wait(5)
    assert [gm.get(i, u) for i, u in enumerate(("GPU-zero", "GPU-one", "GPU-two", "GPU-three", "GPU-aaaa"))] == [
        None, None, ("4242", None), None, ("4343", None)]
    assert set(gm.jobs) == {"2", "GPU-aaaa"}  # 0000..0299 and the junk were never read
    assert slurm._read_regular(m / "0", 4096) is None and slurm._read_regular(m / "1", 4096) is None


def test_a_map_read_that_hangs_never_holds_the_tick(tmp_path: Path, monkeypatch) -> None:
    """A file system that does not answer (a hung NFS mount): the read waits in its own
    thread, the tick reads the last map, and no second read piles up behind the first."""
    import threading
    import time

    m = tmp_path / "map"
    m.mkdir()
    (m / "0").write_text("4242\n")
    now = [0.0]
    gm = slurm.GpuMap(m, recheck=10.0, clock=lambda: now[0])
    gm.get(0, "GPU-x")
    assert gm.read_done.wait(5) and gm.get(0, "GPU-x") == ("4242", None)
    release, calls = threading.Event(), []

    def hung(path, limit):
        calls.append(path)
        release.wait(30)
        return b"77\n"

    monkeypatch.setattr(slurm, "_read_regular", hung)
    gm.read_done.clear()
    for step in range(1, 6):
        now[0] = 10.0 * step
        t0 = time.monotonic()
        assert gm.get(0, "GPU-x") == ("4242", None)  # the last map, at once
        assert time.monotonic() - t0 < 0.1
    time.sleep(0.1)
    assert len(calls) == 1  # one read in flight, however many ticks passed
    release.set()
    assert gm.read_done.wait(5) and gm.get(0, "GPU-x") == ("77", None)


def test_a_bad_gpu_map_option_is_one_line() -> None:
    from cmdare.agent.sources.gpu import GpuSource
    from cmdare.wire.units import ConfigError

    with pytest.raises(ConfigError, match="slurm_gpu_map: expected '' or an absolute path"):
        GpuSource.parse_config("sources.gpu", {"slurm_gpu_map": "relative/dir"})


def _cgroup_fs(version: int) -> Path | None:
    """A writable cgroup hierarchy to make Slurm's layout in (root only): v1's freezer, or v2."""
    import os

    if os.geteuid() != 0:
        return None
    for p in ((Path("/sys/fs/cgroup/freezer"),) if version == 1 else
              (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))):
        if (p / "cgroup.procs").exists() and os.access(p, os.W_OK) and \
                ((p / "cgroup.controllers").exists() == (version == 2)):
            return p
    return None


@pytest.mark.parametrize(("version", "layout", "want"), [
    (1, "slurm/uid_1000/job_{job}/step_0/task_0", {"slurm_step": "0", "uid": 1000}),
    (2, "system.slice/slurmstepd.scope/job_{job}/step_batch/user/task_0", {"slurm_step": "batch"}),
])
def test_real_cgroups_made_as_slurmd_makes_them(version: int, layout: str, want: dict) -> None:
    """A real process moved into a real cgroup laid out as slurmd's cgroup plugin lays it out
    (v1 and v2), with SLURM_* in its real environment: the resolver reads this machine's
    /proc and names its job, step and user; the GPU source's sample carries them."""
    import os
    import random
    import subprocess
    import sys

    from cmdare.agent.sources.gpu import GpuSource
    from tests.fakes.nvml import FakeNvml

    root = _cgroup_fs(version)
    if root is None:
        pytest.skip(f"needs root and a writable cgroup v{version} hierarchy (slurmd's layout is made there)")
    job = str(random.randint(10**8, 10**9))
    leaf = root / layout.format(job=job)
    made = []
    for p in reversed([leaf, *leaf.relative_to(root).parents][:-1]):  # only the folders this test makes
        q = p if p.is_absolute() else root / p
        if not q.exists():
            q.mkdir()
            made.append(q)
    env = {**os.environ, "SLURM_JOB_ID": job, "SLURM_JOB_NAME": "resnet50", "SLURM_JOB_USER": "alice"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        (leaf / "cgroup.procs").write_text(str(child.pid))
        info = slurm.Resolver().resolve(child.pid)
        assert info["slurm_job"] == job and info["slurm_job_name"] == "resnet50" and info["slurm_user"] == "alice"
        assert {k: info[k] for k in want} == want

        class OnThisProcess(FakeNvml):  # GPU 0's process is the real one
            def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802 (NVML's name)
                got = super().nvmlDeviceGetComputeRunningProcesses(h)
                if h.index == 0:
                    got[0].pid = child.pid
                return got

        src = GpuSource(GpuSource.parse_config("sources.gpu", {"kubernetes": False}), nvml=OnThisProcess(gpus=1))
        out: list[tuple] = []
        src.collect(lambda t, d, job=None: out.append((d, job)) if t == "gpu" else None)
        src.close()
        (d, sent_as), = out
        assert d["processes"][0]["slurm_job"] == job and d["slurm_job"] == job and sent_as == f"slurm-{job}"
    finally:
        child.kill()
        child.wait()
        for q in reversed(made):
            q.rmdir()
