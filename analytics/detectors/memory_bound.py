"""memory_bound: a job whose GPUs spend their time waiting on device memory bandwidth
(GPM DRAM activity high while the engine is busy), where faster math would not help."""

from __future__ import annotations

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..units import DETECTORS, Detector, Finding, Scope
from . import evidence


@DETECTORS.register
class MemoryBound(Detector):
    name = "memory_bound"
    ORDER = 90  # where analyze bottlenecks runs and lists it
    FINDS = "memory-bound GPUs"
    ACTION = 'raise arithmetic intensity: a larger batch, mixed precision, or fused kernels'  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        "min_dram": Option("float", 0.6, "DRAM bandwidth use (of the GPU's maximum) at which a GPU is memory bound", lo=0, hi=1),
        **evidence.GPM_OPTIONS,
    }
    REQUIRES = (Requirement("table", "gpu_samples"), Requirement("table", "steps"))

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        jobs = {job: [g for g in gpus if g.dram is not None and g.gr >= o["busy"]]
                for job, gpus in evidence.profiled_gpus(con, scope, o["min_samples"]).items()}
        out = []
        for job, gpus in jobs.items():
            bound = [g for g in gpus if g.dram >= o["min_dram"]]
            if not gpus or len(bound) * 2 <= len(gpus):
                continue  # half or fewer of its busy GPUs: not the job's bottleneck
            n = sum(g.samples for g in bound)
            dram, sm, tensor = (sum((getattr(g, k) or 0) * g.samples for g in bound) / n for k in ("dram", "sm", "tensor"))
            out.append(Finding(
                self.name, job,
                f"job {job}: memory-bandwidth bound on {len(bound)} of {len(gpus)} busy GPUs (DRAM "
                f"{dram * 100:.0f} % of its maximum, SMs {sm * 100:.0f} % active): larger batches, fused kernels "
                "or a GPU with faster memory help; more FLOPS do not",
                severity="info", confidence=min(1.0, n / (4 * o["min_samples"])),
                subject=",".join(f"{g.node}:{g.index}" for g in bound)[:200],
                evidence={"gpus": len(bound), "busy_gpus": len(gpus), "dram_active": round(dram, 4),
                          "sm_active": round(sm, 4), "tensor_active": round(tensor, 4), "samples": int(n)},
                window_start=min(g.t0 for g in bound), window_end=max(g.t1 for g in bound),
            ))
        return out
