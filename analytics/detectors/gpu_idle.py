"""gpu_idle: accelerators a running job holds but does not use (a job that steps, or a
Kubernetes pod holding GPUs, named by its job label or namespace/pod), and GPUs with memory
allocated and no work."""

from __future__ import annotations

import datetime as dt

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..units import DETECTORS, Detector, Finding, Scope
from . import evidence
from .evidence import BUCKET_SECONDS

HOUR = dt.timedelta(hours=1).total_seconds()


def _gpus(rows: list[tuple]) -> str:
    return ",".join(str(r) for r in sorted(rows))


def _holders(con: duckdb.DuckDBPyConnection, found: list[Finding]) -> None:
    """Each finding's Kubernetes pod (``namespace``, ``pod``, ``container``) or Slurm job
    (``slurm_job``) in its evidence, where the scheduler held its GPUs for its job: one read
    of the finding's node, job and window (the pod's own name, not only its job's)."""
    for f in found:
        if not f.job or not f.node:
            continue
        row = con.execute(
            """SELECT max(namespace), max(pod), max(container), max(slurm_job) FROM gpu_samples
               WHERE node = ? AND job = ? AND ts >= ? AND ts < ? AND (pod IS NOT NULL OR slurm_job IS NOT NULL)""",
            [f.node, f.job, *(None if t is None else t.replace(tzinfo=None) for t in (f.window_start, f.window_end))]
        ).fetchone()
        for k, v in zip(("namespace", "pod", "container", "slurm_job"), row or (), strict=False):
            if v:
                f.evidence[k] = v


@DETECTORS.register
class GpuIdle(Detector):
    name = "gpu_idle"
    ORDER = 40  # where analyze bottlenecks runs and lists it
    FINDS = "idle GPUs"
    ACTION = 'release the idle GPUs (fewer per node, or a smaller instance type) or give the job work for them'  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        "idle_util": Option("float", evidence.IDLE_UTIL, "mean utilisation over 5 minutes below which a GPU is idle", lo=0, hi=1),
        "min_idle": Option("duration", 600.0, "idle time a GPU needs before it is reported"),
        "min_share": Option("float", 0.5, "share of the job's time its GPU must be idle", lo=0, hi=1),
        "min_mem": Option("size", evidence.MIN_MEM, "memory in use that counts as allocated (GPUs outside any job)"),
    }
    REQUIRES = (Requirement("table", "gpu_samples|tpu_samples"),)

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        out: list[Finding] = []
        g = evidence.gpu_summary(con, scope, float(o["idle_util"]), int(o["min_mem"]))
        # a stepping job's GPUs, and a Kubernetes pod's (its job by its label: no steps needed)
        per_gpu = con.execute(
            f"""SELECT job, node, "index", samples, idle, util_n / nullif(samples, 0), mem, b0, b1,
                       {BUCKET_SECONDS} / max_n AS every,  -- a full bucket's samples: the sampling interval
                       kind
                FROM {g} WHERE job IS NOT NULL ORDER BY job, node, kind, "index" """
        ).fetchall()
        jobs: dict[str, list[tuple]] = {}
        for r in per_gpu:
            jobs.setdefault(r[0], []).append(r)
        for job, gpus in jobs.items():
            flagged = [  # idle samples x the GPU's sampling interval: its idle time
                r for r in gpus if r[4] and r[4] * r[9] >= o["min_idle"] and r[4] / r[3] >= o["min_share"]
            ]
            if not flagged:
                continue
            stalled = len(flagged) == len(gpus)
            by_node: dict[tuple[str, str], list[tuple]] = {}
            for r in flagged:
                by_node.setdefault((r[1], r[10]), []).append(r)
            for (node, kind), rs in by_node.items():
                on_node = [r for r in gpus if r[1] == node and r[10] == kind]
                noun = "GPUs" if kind == "gpu" else "TPU cores"
                hours = sum(r[4] * r[9] for r in rs) / HOUR
                util = sum((r[5] or 0) for r in rs) / len(rs)
                out.append(
                    Finding(
                        self.name,
                        job,
                        f"{len(rs)} of {len(on_node)} {noun} on {node} idle while the job ran "
                        f"(mean {util:.0%} busy; {hours:.1f} {noun[:-1]}-hours wasted)"
                        + (f"; every {noun[:-1]} of the job is idle: stalled?" if stalled else ""),
                        severity="critical" if stalled else "warning",
                        confidence=0.9,
                        node=node,
                        subject=_gpus([r[2] for r in rs]),
                        evidence={
                            "idle_gpus": len(rs),
                            "gpus": len(on_node),
                            "gpu_hours_wasted": round(hours, 3),
                            "mean_util_ratio": round(util, 4),
                            "idle_share": round(sum(r[4] for r in rs) / sum(r[3] for r in rs), 3),
                            "mem_used_bytes": round(sum((r[6] or 0) for r in rs) / len(rs)),
                            "job_stalled": stalled,
                        },
                        window_start=min(r[7] for r in rs),
                        window_end=max(r[8] for r in rs) + dt.timedelta(seconds=BUCKET_SECONDS),
                    )
                )
        out += self._allocated_no_work(con, scope, g)
        _holders(con, out)
        return out

    def _allocated_no_work(self, con: duckdb.DuckDBPyConnection, scope: Scope, g: str) -> list[Finding]:
        """GPUs outside every job's span with memory held and no work (a leftover process):
        the summary's buckets outside every span (``job`` NULL) that were idle with
        ``min_mem`` in use; the sampling interval from all the GPU's buckets."""
        o = self.options
        rows = con.execute(
            f"""WITH every AS (
                    SELECT node, "index", {BUCKET_SECONDS} / max(max_n) AS every FROM {g} GROUP BY node, "index")
                SELECT node, "index", sum(alloc_n) * any_value(every) AS seconds,
                       sum(alloc_mem_sum) / sum(alloc_rows), min(alloc_b0), max(alloc_b1)
                FROM {g} JOIN every USING (node, "index")
                WHERE job IS NULL AND alloc_rows > 0
                GROUP BY node, "index" HAVING sum(alloc_n) * any_value(every) >= {float(o['min_idle'])}
                ORDER BY node, "index" """
        ).fetchall()
        by_node: dict[str, list[tuple]] = {}
        for r in rows:
            by_node.setdefault(r[0], []).append(r)
        out = []
        for node, rs in by_node.items():
            hours = sum(r[2] for r in rs) / HOUR
            mem = sum(r[3] for r in rs) / len(rs)
            job = self._job_of(con, scope, node, min(r[4] for r in rs))
            if scope.job is not None and job != scope.job:
                continue
            out.append(
                Finding(
                    self.name,
                    job,
                    f"{len(rs)} GPUs on {node} hold {mem / 2**30:.1f} GiB each with no work and no job stepping "
                    f"({hours:.1f} GPU-hours)",
                    severity="warning",
                    confidence=0.8,
                    node=node,
                    subject=_gpus([r[1] for r in rs]),
                    evidence={
                        "idle_gpus": len(rs),
                        "gpu_hours_wasted": round(hours, 3),
                        "mem_used_bytes": round(mem),
                        "in_job": False,
                    },
                    window_start=min(r[4] for r in rs),
                    window_end=max(r[5] for r in rs) + dt.timedelta(seconds=BUCKET_SECONDS),
                )
            )
        return out

    def _job_of(self, con: duckdb.DuckDBPyConnection, scope: Scope, node: str, since: dt.datetime) -> str | None:
        """The job that left the memory: the last one to step on ``node`` before ``since``,
        else the agent's job on the GPU samples."""
        if evidence.has_rows(con, "steps"):
            s = evidence.spans(con, scope)
            (job,) = con.execute(
                f"SELECT arg_max(job, t1) FROM {s} WHERE node = ? AND t0 <= ? + INTERVAL {BUCKET_SECONDS} SECOND",
                [node, since],
            ).fetchone() or (None,)
            if job:
                return job
        (job,) = con.execute(
            "SELECT arg_max(job, ts) FROM gpu_samples WHERE node = ? AND job IS NOT NULL AND job <> ''", [node]
        ).fetchone() or (None,)
        return job or None
