"""memory_bound: a job whose GPUs spend their time waiting on device memory bandwidth
(GPM DRAM activity high while the engine is busy), where faster math would not help."""

from __future__ import annotations

import duckdb

from cmdare.wire.plugin import Option, Requirement

from .. import evidence
from ..units import DETECTORS, Detector, Finding, Scope


@DETECTORS.register
class MemoryBound(Detector):
    name = "memory_bound"
    OPTIONS = {
        "min_dram": Option("float", 0.6, "DRAM bandwidth use (of the GPU's maximum) at which a GPU is memory bound", lo=0, hi=1),
        "busy": Option("float", 0.5, "graphics-engine activity above which a GPU counts as busy", lo=0, hi=1),
        "min_samples": Option("int", 30, "samples with profiling activity a job needs before it is judged", lo=1),
    }
    REQUIRES = (Requirement("table", "gpu_samples"), Requirement("table", "steps"))

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        jobs: dict[str, list[tuple]] = {}
        for r in evidence.job_activity(con, scope):
            if r[5] is not None and r[9] is not None and r[4] >= o["min_samples"] and r[5] >= o["busy"]:
                jobs.setdefault(r[0], []).append(r)
        out = []
        for job, gpus in jobs.items():
            bound = [r for r in gpus if r[9] >= o["min_dram"]]
            if len(bound) * 2 <= len(gpus):
                continue  # half or fewer of its busy GPUs: not the job's bottleneck
            n = sum(r[4] for r in bound)
            dram, sm, tensor = (sum((r[i] or 0) * r[4] for r in bound) / n for i in (9, 6, 7))
            out.append(Finding(
                self.name, job,
                f"job {job}: memory-bandwidth bound on {len(bound)} of {len(gpus)} busy GPUs (DRAM "
                f"{dram * 100:.0f} % of its maximum, SMs {sm * 100:.0f} % active): larger batches, fused kernels "
                "or a GPU with faster memory help; more FLOPS do not",
                severity="info", confidence=min(1.0, n / (4 * o["min_samples"])),
                subject=",".join(f"{r[1]}:{r[2]}" for r in bound)[:200],
                evidence={"gpus": len(bound), "busy_gpus": len(gpus), "dram_active": round(dram, 4),
                          "sm_active": round(sm, 4), "tensor_active": round(tensor, 4), "samples": int(n)},
                window_start=min(r[11] for r in bound), window_end=max(r[12] for r in bound),
            ))
        return out
