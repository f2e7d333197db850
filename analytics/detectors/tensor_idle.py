"""tensor_idle: a busy job whose GPUs' tensor pipes sit idle (mixed precision off), and
memory-bandwidth-bound jobs, from the GPM profiling activity (Hopper and later)."""

from __future__ import annotations

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..units import DETECTORS, Detector, Finding, Scope
from . import evidence


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


@DETECTORS.register
class TensorIdle(Detector):
    name = "tensor_idle"
    ORDER = 80  # where analyze bottlenecks runs and lists it
    FINDS = "tensor pipes idle"
    ACTION = 'enable mixed precision (bf16 / fp16) so the Tensor Cores do the work'  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        **evidence.GPM_OPTIONS,
        "max_tensor": Option("float", 0.05, "tensor-pipe activity below which the tensor cores count as idle", lo=0, hi=1),
        "min_fp32": Option("float", 0.1, "FP32-pipe activity that shows the math runs in FP32 instead", lo=0, hi=1),
    }
    REQUIRES = (Requirement("table", "gpu_samples"), Requirement("table", "steps"))

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        jobs = {job: [g for g in gpus if g.tensor is not None]
                for job, gpus in evidence.profiled_gpus(con, scope, o["min_samples"]).items()}
        out = []
        for job, gpus in jobs.items():
            busy = [g for g in gpus if g.gr >= o["busy"]]
            idle = [g for g in busy if g.tensor < o["max_tensor"] and (g.fp32 or 0) >= o["min_fp32"]]
            if not busy or len(idle) < len(busy):
                continue  # some busy GPU uses its tensor cores: not this job's pattern
            n = sum(g.samples for g in idle)
            gr, tensor, fp32 = (sum((getattr(g, k) or 0) * g.samples for g in idle) / n for k in ("gr", "tensor", "fp32"))
            nodes = sorted({g.node for g in idle})
            out.append(Finding(
                self.name, job,
                f"job {job}: tensor cores idle ({_pct(tensor)}) on {len(idle)} busy GPU{'s' if len(idle) != 1 else ''} "
                f"(engine {_pct(gr)} active, FP32 pipe {_pct(fp32)}): the model trains in FP32; "
                "mixed precision (bf16/fp16 autocast) would run its matrix products on the tensor cores",
                severity="warning", confidence=min(1.0, n / (4 * o["min_samples"])),
                node=nodes[0] if len(nodes) == 1 else None,
                subject=",".join(f"{g.node}:{g.index}" for g in idle)[:200],
                evidence={"gpus": len(idle), "gr_engine_active": round(gr, 4), "tensor_active": round(tensor, 4),
                          "fp32_active": round(fp32, 4), "samples": int(n)},
                window_start=min(g.t0 for g in idle), window_end=max(g.t1 for g in idle),
            ))
        return out
