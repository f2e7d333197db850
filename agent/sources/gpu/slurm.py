"""Slurm jobs of the processes on the GPUs: which Slurm job, step and user each GPU process
belongs to, read from the node's own ``/proc`` (no call to slurmctld, no change to anyone's
training code), so ``analyze gpu --processes`` names the Slurm job of a process no rank of
a tracked job declared.

- ``/proc/PID/cgroup``: slurmd puts each step's tasks in a cgroup of its own. cgroup v1
  (one line per controller): ``4:devices:/slurm/uid_1000/job_1234/step_0/task_0`` (or
  ``/slurm_<node>/...`` with several slurmds on a host); cgroup v2 (one ``0::`` line):
  ``0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0``. The job id and step
  (a number, ``batch``, ``extern`` or ``interactive``) come from the path; the user id
  from ``uid_N`` where v1 has it, else ``/proc/PID/status``.
- ``/proc/PID/environ``, where the agent may read it (its own user's processes, or as
  root): ``SLURM_JOB_NAME`` and ``SLURM_JOB_USER`` (``SLURM_JOB_ID`` / ``SLURM_STEP_ID``
  where the cgroup gave none).

Each PID is read once per process start (the start time in ``/proc/PID/stat``, checked every
30 s: a PID reused by another process is read again within that); what cannot be read costs
that field only. Every value is bounded: ids of digits, names of printable characters up to
128, a file read up to 64 KiB.
"""

from __future__ import annotations

import math
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_READ = 65536
MAX_NAME = 128
_JOB = re.compile(r"/job_(\d{1,20})(?:/step_(\d{1,10}|batch|extern|interactive))?(?:/|$)")
_UID = re.compile(r"/uid_(\d{1,10})/")
_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def _read(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_READ)
    except OSError:  # gone, not ours to read, not a process
        return None


def _name(b: bytes) -> str:
    return _PRINTABLE.sub("?", b.decode("utf-8", "replace"))[:MAX_NAME]


def from_cgroup(text: str) -> dict[str, Any]:
    """The Slurm job, step and uid a ``/proc/PID/cgroup`` text names (empty: none)."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or "slurm" not in parts[2]:
            continue
        m = _JOB.search(parts[2])
        if m is None:
            continue
        out["slurm_job"] = m.group(1)
        if m.group(2):
            out["slurm_step"] = m.group(2)
        u = _UID.search(parts[2])
        if u:
            out["uid"] = int(u.group(1))
        break
    return out


def from_environ(raw: bytes) -> dict[str, str]:
    """The SLURM_* variables a ``/proc/PID/environ`` (NUL-separated) holds, bounded."""
    out = {}
    for item in raw.split(b"\0"):
        if not item.startswith(b"SLURM_"):
            continue
        k, _, v = item.partition(b"=")
        if k in (b"SLURM_JOB_ID", b"SLURM_STEP_ID", b"SLURM_JOB_NAME", b"SLURM_JOB_USER"):
            out[k.decode()] = _name(v)
    return out


class Resolver:
    """PID -> its Slurm job fields (``slurm_job``, ``slurm_step``, ``slurm_job_name``,
    ``slurm_user``, ``uid``), or {} for a process in no Slurm job; cached per process start."""

    def __init__(self, proc: str | Path = "/proc", max_cached: int = 4096, recheck: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = Path(proc)
        self.cache: dict[int, tuple[bytes | None, dict[str, Any], float]] = {}  # pid -> (start, info, checked)
        self.max_cached = max_cached
        self.recheck, self.clock = recheck, clock

    def _start(self, pid: int) -> bytes | None:
        stat = _read(self.proc / str(pid) / "stat")
        if stat is None:
            return None
        fields = stat.rpartition(b")")[2].split()  # after the command name, which may hold spaces
        return fields[19] if len(fields) > 19 else b""  # starttime (field 22)

    def resolve(self, pid: int) -> dict[str, Any]:
        now = self.clock()
        hit = self.cache.get(pid)
        if hit is not None and now - hit[2] < self.recheck:
            return hit[1]  # every tick: a lookup (reading /proc each tick cost the agent 1.35x -> 1.52x its bare calls)
        start = self._start(pid)
        if start is not None and hit is not None and hit[0] == start:
            info = hit[1]  # the same process
        else:
            info = self._read(pid) if start is not None else {}
        if len(self.cache) >= self.max_cached:
            self.cache.clear()
        self.cache[pid] = (start, info, now)
        return info

    def _read(self, pid: int) -> dict[str, Any]:
        base = self.proc / str(pid)
        cg = _read(base / "cgroup")
        info = from_cgroup(cg.decode("utf-8", "replace")) if cg else {}
        env = _read(base / "environ")
        envs = from_environ(env) if env else {}
        if "slurm_job" not in info and envs.get("SLURM_JOB_ID", "").isdigit() and len(envs["SLURM_JOB_ID"]) <= 20:
            info["slurm_job"] = envs["SLURM_JOB_ID"]
            step = envs.get("SLURM_STEP_ID", "")
            if step.isdigit() and len(step) <= 10:
                info["slurm_step"] = step
        if "slurm_job" not in info:
            return {}
        if envs.get("SLURM_JOB_NAME"):
            info["slurm_job_name"] = envs["SLURM_JOB_NAME"]
        if envs.get("SLURM_JOB_USER"):
            info["slurm_user"] = envs["SLURM_JOB_USER"]
        if "uid" not in info:
            st = _read(base / "status")
            for line in (st or b"").splitlines():
                if line.startswith(b"Uid:"):
                    f = line.split()
                    if len(f) > 1 and f[1].isdigit() and len(f[1]) <= 10:
                        info["uid"] = int(f[1])
                    break
        if "slurm_user" not in info and "uid" in info:
            user = _user(info["uid"])
            if user is not None:
                info["slurm_user"] = user
        return info


FIELDS = ("slurm_job", "slurm_step", "slurm_job_name", "slurm_user")  # what a process entry carries
MAX_MAP_FILES = 256
_MAP_NAME = re.compile(r"\d{1,4}|(?:GPU|MIG)-[0-9A-Za-z_.-]{1,120}")


def _user(uid: int) -> str | None:
    import pwd

    try:
        return _name(pwd.getpwuid(uid).pw_name.encode())
    except (KeyError, OverflowError):
        return None


class GpuMap:
    """The Slurm job holding each GPU, from the files a prolog writes for dcgm-exporter's
    ``--hpc-job-mapping-dir``: one file per GPU, named by its index (or its GPU / MIG UUID),
    holding the job id (one per line; the uid after it, as Princeton's jobstats writes it,
    is read where present). A file naming two jobs (a shared GPU) names none.

    Only the files of this node's GPUs are read (the names ``get`` was asked for, at most
    ``MAX_MAP_FILES``), never a listing: other names in the folder, however many and
    however they sort, change nothing. Each is opened with ``O_NONBLOCK | O_NOFOLLOW``
    (a FIFO cannot block the open, a symlink is refused) and read only when the opened
    descriptor is a regular file, up to 4 KiB. The reads run in a thread of their own at
    most every ``recheck`` seconds (``background``): a sampling tick reads a dict, whatever
    the folder's file system does."""

    def __init__(self, folder: str | Path, recheck: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 background: bool = True) -> None:
        self.folder, self.recheck, self.clock, self.background = Path(folder), recheck, clock, background
        self.read_at = -math.inf
        self.jobs: dict[str, tuple[str, str | None]] = {}  # file name -> (job id, user)
        self.wanted: set[str] = set()  # the names asked for: this node's GPU indexes and UUIDs
        self._reading: threading.Thread | None = None
        self._pending = False
        self._lock = threading.Lock()
        self.read_done = threading.Event()  # set after each read (tests wait on it)

    def get(self, index: int, uuid: str) -> tuple[str, str | None] | None:
        new = [n for n in (str(index), uuid) if n and n not in self.wanted and _MAP_NAME.fullmatch(n)]
        if new and len(self.wanted) + len(new) <= MAX_MAP_FILES:
            self.wanted.update(new)
            self.read_at = -math.inf  # a GPU not read yet: read now
        now = self.clock()
        if now - self.read_at >= self.recheck:
            self.read_at = now
            self._refresh()
        return self.jobs.get(uuid) or self.jobs.get(str(index))

    def _refresh(self) -> None:
        if not self.background:
            self.jobs = self._read(sorted(self.wanted))
            self.read_done.set()
            return
        with self._lock:
            self._pending = True  # the reader (this one, or one already running) reads what is wanted now
            self.read_done.clear()
            if self._reading is not None:
                return  # a read in flight (or hung on the folder): it reads again when it returns
            self._reading = threading.Thread(target=self._reader, name="cmdare-slurm-gpu-map", daemon=True)
            self._reading.start()

    def _reader(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._reading = None
                    self.read_done.set()
                    return
                self._pending = False
                names = sorted(self.wanted)
            self.jobs = self._read(names)

    def _read(self, names: list[str]) -> dict[str, tuple[str, str | None]]:
        out: dict[str, tuple[str, str | None]] = {}
        for name in names:
            raw = _read_regular(self.folder / name, 4096)
            if not raw:
                continue
            lines = [ln.split() for ln in raw.decode("ascii", "replace").splitlines() if ln.strip()]
            jobs = {ln[0] for ln in lines}
            if len(jobs) != 1:
                continue
            job = next(iter(jobs))
            if not job.isdigit() or len(job) > 20:
                continue
            uid = lines[0][1] if len(lines[0]) > 1 else ""
            out[name] = (job, _user(int(uid)) if uid.isdigit() and len(uid) <= 10 else None)
        return out


def _read_regular(path: Path, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of ``path`` when it is a regular file, checked on the opened
    descriptor (no race with a swap after a stat); None for anything else: a FIFO, a
    device, a folder, a symlink (``O_NOFOLLOW``), or a file that is not there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)
