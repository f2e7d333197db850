"""input_bound: jobs whose accelerators wait for input."""

from __future__ import annotations

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..units import DETECTORS, Detector, Finding, Scope
from ..verdicts import INPUT_BOUND_CLASSES, input_bound_class
from . import evidence


@DETECTORS.register
class InputBound(Detector):
    name = "input_bound"
    ORDER = 20  # where analyze bottlenecks runs and lists it
    FINDS = "input-bound jobs"
    ACTION = 'add input workers or move preprocessing off the training hosts (analyze recommend data-workers / placement)'  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        "max_gpu_util": Option("float", 0.5, "accelerator utilisation below which the hardware points at input", lo=0, hi=1),
        "busy_cpu": Option("float", 0.85, "host CPU utilisation at which the input pipeline counts as saturated", lo=0, hi=1),
        "min_steps": Option("int", 20, "steps a job needs before it is judged", lo=1),
    }
    REQUIRES = (Requirement("table", "steps"),)

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        rows = evidence.job_steps(con, scope)
        gpu: dict[str, float] = {}
        cpu: dict[str, float] = {}
        if evidence.has_rows(con, "gpu_samples"):
            g = evidence.gpu_summary(con, scope)
            gpu = dict(con.execute(f"SELECT job, sum(util_n) / nullif(sum(samples), 0) FROM {g} "
                                   "WHERE job IS NOT NULL GROUP BY job").fetchall())
        if evidence.has_rows(con, "host_samples"):
            h = evidence.job_hosts(con, scope)
            cpu = dict(con.execute(f"SELECT job, sum(cpu * n) / nullif(sum(n), 0) FROM {h} GROUP BY job").fetchall())
        not_bound = INPUT_BOUND_CLASSES[0][1]
        out = []
        for job, steps, share, with_wait, t0, t1 in rows:
            if (steps or 0) < o["min_steps"]:
                continue
            u, c = gpu.get(job), cpu.get(job)
            hw_known = u is not None and c is not None
            hw = hw_known and u < o["max_gpu_util"] and c >= o["busy_cpu"]
            ev: dict[str, float | str | None] = {
                "input_wait_share": None if share is None else round(share, 4),
                "gpu_util_ratio": None if u is None else round(u, 3),
                "host_cpu_util_ratio": None if c is None else round(c, 3),
                "steps": int(steps),
            }
            cls = input_bound_class(share) if with_wait and share is not None else None
            if cls is not None:
                if cls == not_bound:
                    continue
                ev["profiler_class"] = cls
                conf = 0.95 if hw else 0.8 if not hw_known else 0.7
                severity = "warning" if cls == INPUT_BOUND_CLASSES[-1][1] else "info"
                how = f"{share:.0%} of step time waiting for input ({cls})"
                if hw_known:
                    how += f"; accelerators {u:.0%} busy, host CPU {c:.0%}" + (" (saturated)" if hw else "")
            elif hw:
                ev["profiler_class"] = None
                conf, severity = 0.6, "warning"
                how = f"no input-wait data; accelerators {u:.0%} busy while the host CPU is {c:.0%} (saturated)"
            else:
                continue
            ev["evidence"] = "input wait + hardware" if cls and hw_known else "input wait" if cls else "hardware only"
            out.append(
                Finding(
                    self.name,
                    job,
                    f"input-bound: {how}",
                    severity=severity,
                    confidence=conf,
                    evidence=ev,
                    suggests=("data-workers", "placement"),
                    window_start=t0,
                    window_end=t1,
                )
            )
        return out
