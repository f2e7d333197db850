"""tensor_idle: a busy job whose GPUs' tensor pipes sit idle (mixed precision off), and
memory-bandwidth-bound jobs, from the GPM profiling activity (Hopper and later)."""

from __future__ import annotations

import duckdb

from cmdare.wire.plugin import Option, Requirement

from .. import evidence
from ..units import DETECTORS, Detector, Finding, Scope


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


@DETECTORS.register
class TensorIdle(Detector):
    name = "tensor_idle"
    OPTIONS = {
        "busy": Option("float", 0.5, "graphics-engine activity above which a GPU counts as busy", lo=0, hi=1),
        "max_tensor": Option("float", 0.05, "tensor-pipe activity below which the tensor cores count as idle", lo=0, hi=1),
        "min_fp32": Option("float", 0.1, "FP32-pipe activity that shows the math runs in FP32 instead", lo=0, hi=1),
        "min_samples": Option("int", 30, "samples with profiling activity a job needs before it is judged", lo=1),
    }
    REQUIRES = (Requirement("table", "gpu_samples"), Requirement("table", "steps"))

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        jobs: dict[str, list[tuple]] = {}
        for r in evidence.job_activity(con, scope):
            if r[5] is not None and r[7] is not None and r[4] >= o["min_samples"]:
                jobs.setdefault(r[0], []).append(r)
        out = []
        for job, gpus in jobs.items():
            busy = [r for r in gpus if r[5] >= o["busy"]]
            idle = [r for r in busy if r[7] < o["max_tensor"] and (r[8] or 0) >= o["min_fp32"]]
            if not busy or len(idle) < len(busy):
                continue  # some busy GPU uses its tensor cores: not this job's pattern
            n = sum(r[4] for r in idle)
            gr, tensor, fp32 = (sum((r[i] or 0) * r[4] for r in idle) / n for i in (5, 7, 8))
            nodes = sorted({r[1] for r in idle})
            out.append(Finding(
                self.name, job,
                f"job {job}: tensor cores idle ({_pct(tensor)}) on {len(idle)} busy GPU{'s' if len(idle) != 1 else ''} "
                f"(engine {_pct(gr)} active, FP32 pipe {_pct(fp32)}): the model trains in FP32; "
                "mixed precision (bf16/fp16 autocast) would run its matrix products on the tensor cores",
                severity="warning", confidence=min(1.0, n / (4 * o["min_samples"])),
                node=nodes[0] if len(nodes) == 1 else None,
                subject=",".join(f"{r[1]}:{r[2]}" for r in idle)[:200],
                evidence={"gpus": len(idle), "gr_engine_active": round(gr, 4), "tensor_active": round(tensor, 4),
                          "fp32_active": round(fp32, 4), "samples": int(n)},
                window_start=min(r[11] for r in idle), window_end=max(r[12] for r in idle),
            ))
        return out
