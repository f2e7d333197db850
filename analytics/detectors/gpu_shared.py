"""gpu_shared: one GPU used by processes of two or more training jobs at once (their ranks'
PIDs from the tracking library, the GPU's process list from NVML)."""

from __future__ import annotations

import duckdb

from cmdare.wire.plugin import Option, Requirement

from .. import processes
from ..units import DETECTORS, Detector, Finding, Scope


@DETECTORS.register
class GpuShared(Detector):
    name = "gpu_shared"
    ORDER = 110  # where analyze bottlenecks runs and lists it
    FINDS = "GPUs shared between jobs"
    ACTION = "give each job its own GPUs (a scheduler's GPU limits, MIG, or CUDA_VISIBLE_DEVICES)"  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        "min_samples": Option("int", 3, "samples a GPU must show two jobs' processes in before it is reported", lo=1),
    }
    REQUIRES = (Requirement("table", "gpu_samples"), Requirement("table", "jobs"))

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        where, params = Scope(None, scope.since, scope.until).where()
        rows = con.execute(
            f"""WITH p AS ({processes.process_rows(where)}),
                    j AS (SELECT node, pid, any_value(job) AS job FROM jobs
                          WHERE pid IS NOT NULL AND job IS NOT NULL AND job <> '' GROUP BY node, pid),
                    a AS (SELECT p.node, p."index", p.ts, {processes.JOB_OF} AS job, avg(p.sm) AS sm
                          FROM p LEFT JOIN j ON j.node = p.node AND j.pid = p.pid
                          WHERE {processes.JOB_OF} IS NOT NULL GROUP BY ALL),
                    shared AS (SELECT node, "index", ts FROM a GROUP BY ALL HAVING count(DISTINCT job) >= 2)
                SELECT a.node, a."index", a.job, count(DISTINCT a.ts), avg(a.sm), min(a.ts), max(a.ts)
                FROM a SEMI JOIN shared USING (node, "index", ts)
                GROUP BY a.node, a."index", a.job ORDER BY a.node, a."index", a.job""",
            params,
        ).fetchall()
        gpus: dict[tuple[str, int], list[tuple]] = {}
        for r in rows:
            gpus.setdefault((r[0], r[1]), []).append(r)
        out = []
        for (node, index), rs in gpus.items():
            n = max(r[3] for r in rs)
            if n < self.options["min_samples"]:
                continue
            jobs = [r[2] for r in rs]
            if scope.job is not None and scope.job not in jobs:
                continue
            use = ", ".join(f"{r[2]} {r[4] * 100:.0f} % SM" if r[4] is not None else r[2] for r in rs)
            ev: dict[str, float | int | str | None] = {"jobs": len(jobs), "samples": int(n)}
            for i, r in enumerate(rs[:8]):
                ev[f"job{i + 1}"] = r[2]
                ev[f"job{i + 1}_sm"] = None if r[4] is None else round(r[4], 4)
            for job in jobs:
                if scope.job is not None and job != scope.job:
                    continue
                out.append(Finding(
                    self.name, job,
                    f"GPU {index} on {node} is shared by {len(jobs)} jobs ({use}) in {n} samples: each runs slower "
                    "than alone and its speed fits mislead; give each job its own GPUs (or MIG instances)",
                    severity="warning", confidence=1.0, node=node, subject=str(index), evidence=ev,
                    window_start=min(r[5] for r in rs), window_end=max(r[6] for r in rs),
                ))
        return out
