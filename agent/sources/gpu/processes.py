"""Per-process GPU use: the compute processes and their memory (every tick), and, where
NVML samples it, each process's share of the GPU's SMs and memory interface since the
newest sample seen (``nvmlDeviceGetProcessUtilization``)."""

from __future__ import annotations

from typing import Any

from .fields import AT, Call, procs_text
from .slurm import FIELDS

_AT = AT["processes"]


def _procs(v: Any, d: dict[str, Any], t: list[str]) -> None:
    procs, texts = [], []
    for p in v:
        pid, mem = int(p.pid), p.usedGpuMemory
        if mem is None:
            procs.append({"pid": pid})
            texts.append(f'{{"pid":{pid}}}')
        else:
            mem = int(mem)
            procs.append({"pid": pid, "used_bytes": mem})
            texts.append(f'{{"pid":{pid},"used_bytes":{mem}}}')
    d["processes"] = procs
    t[_AT] = "[" + ",".join(texts) + "]"


# R470 and older drivers answer only the _v2 call
LIST = Call("nvmlDeviceGetComputeRunningProcesses", ("processes",), _procs,
            fallback="nvmlDeviceGetComputeRunningProcesses_v2")
UTILISATION = "nvmlDeviceGetProcessUtilization"


def attribute(resolver: Any, d: dict[str, Any], t: list[str]) -> None:
    """Each listed process's Slurm job, step and user (slurm.py), where it runs in one."""
    changed = False
    for p in d["processes"]:
        info = resolver.resolve(p["pid"])
        for k in FIELDS:
            if k in info:
                p[k] = info[k]
                changed = True
    if changed:
        t[_AT] = procs_text(d["processes"])


def utilisation(src: Any, g: Any, d: dict[str, Any], t: list[str]) -> None:
    """SM / memory shares into the processes listed this tick (their text made again)."""
    procs = d.get("processes")
    if not procs:
        return
    samples = src.call(g, UTILISATION, g.proc_ts)
    if not samples:
        return
    by_pid = {}
    for smp in samples:
        ts = int(smp.timeStamp)
        if ts > g.proc_ts:
            g.proc_ts = ts
        by_pid[int(smp.pid)] = (min(1.0, smp.smUtil / 100.0), min(1.0, smp.memUtil / 100.0))
    changed = False
    for p in procs:
        u = by_pid.get(p["pid"])
        if u is not None:
            p["sm_ratio"], p["mem_ratio"] = u
            changed = True
    if changed:
        t[_AT] = procs_text(procs)
