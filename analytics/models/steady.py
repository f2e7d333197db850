"""Steady-state speed from step telemetry: the input of the speed and cluster models.

Per job, run and rank, the step intervals in time order: drop the ramp (every interval that
starts in the first 10 % of the rank's stepping time, and at least the first two) and the
tail (the last interval); from at least three that remain, the median of the per-interval
steps/s.  The job's cluster speed: parameter-server jobs (``ps`` > 0) sum their worker
ranks' speeds (each worker steps on its own); other jobs take the lowest rank's speed (in
synchronous training every rank steps together).  Several runs of a job pool their kept
intervals.  A job is used when its declaration gives the accelerator (found in the
catalogue), FLOPs per step and parameter count.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

import duckdb

from .. import catalog
from ..db import AnalyticsError

RAMP_SHARE = 0.10
MIN_RAMP_INTERVALS = 2
MIN_KEPT = 3


# Computed in DuckDB (a fleet's step intervals need not fit in memory): per job, run and
# rank, the first intervals' times, the last one's and the stepping time; keep the intervals
# after the ramp and before the tail; then per job and rank the median over the kept
# intervals of all its runs. Aggregates and a hash join, not a window (ordering every
# interval cost twice as much: bench/findings.py); intervals sharing a time stamp at the
# ramp's or the tail's edge are left out together.
STEADY_SQL = f"""
WITH s AS (
    SELECT job, run, rank, ts, steps,
           coalesce(steps / nullif(steps_per_second, 0), step_mean_seconds * steps) AS span
    FROM steps WHERE ($job IS NULL OR job = $job) AND ($jobs IS NULL OR list_contains($jobs, job))),
k AS (SELECT * FROM s WHERE span > 0 AND steps > 0),
g AS (SELECT job, run, rank, min(ts, {MIN_RAMP_INTERVALS}) AS firsts, max(ts) AS last,
             min(epoch(ts) - span) AS t_start, max(epoch(ts)) AS t_end
      FROM k GROUP BY job, run, rank)
SELECT k.job, coalesce(k.rank, 0) AS rank, median(k.steps / k.span) AS rate, count(*) AS kept
FROM k JOIN g ON k.job IS NOT DISTINCT FROM g.job AND k.run IS NOT DISTINCT FROM g.run AND k.rank IS NOT DISTINCT FROM g.rank
WHERE k.ts > g.firsts[{MIN_RAMP_INTERVALS}] AND k.ts < g.last
  AND epoch(k.ts) - k.span >= g.t_start + {RAMP_SHARE} * (g.t_end - g.t_start)
GROUP BY ALL HAVING count(*) >= {MIN_KEPT}
"""


def steady_rates(
    con: duckdb.DuckDBPyConnection, job: str | None = None, jobs: list[str] | None = None
) -> dict[str, dict[int, float]]:
    """job -> rank -> steady steps/s (see the module doc), of every job, of ``job``, or of
    the ``jobs`` listed; ranks with too few intervals are absent."""
    out: dict[str, dict[int, float]] = {}
    for j, rank, rate, _ in con.execute(STEADY_SQL, {"job": job, "jobs": jobs}).fetchall():
        out.setdefault(j, {})[int(rank)] = float(rate)
    return out


@dataclass
class JobSpeed:
    job: str
    model: str
    accelerator: str
    workers: int
    ps: int
    flops_per_step: float
    params: float
    tensors: float
    batch_size: float | None
    speed: float  # cluster steps/s, steady state
    t0: dt.datetime
    t1: dt.datetime
    acc: catalog.Accelerator | None = None

    @property
    def entry(self) -> catalog.Accelerator:
        """The accelerator's catalogue entry (``job_speeds`` looks it up for every job it returns)."""
        if self.acc is None:
            raise AnalyticsError(f"{self.job}: accelerator {self.accelerator!r} not in the catalogue")
        return self.acc


def job_speeds(
    con: duckdb.DuckDBPyConnection, job: str | None = None, jobs: list[str] | None = None
) -> tuple[list[JobSpeed], list[str]]:
    """Steady-state speed of every job (or of ``job``, or of the ``jobs`` listed) with a
    usable declaration; and why others were left out."""
    only = {"job": job, "jobs": jobs}
    decl = con.execute(
        """SELECT job, arg_max(model, ts), arg_max(accelerator, ts), arg_max(world_size, ts), arg_max(ps, ts),
                  arg_max(flops_per_step, ts), arg_max(params, ts), arg_max(tensors, ts), arg_max(batch_size, ts)
           FROM jobs WHERE ($job IS NULL OR job = $job) AND ($jobs IS NULL OR list_contains($jobs, job)) GROUP BY job""",
        only,
    ).fetchall()
    span = {
        j: (t0, t1)
        for j, t0, t1 in con.execute(
            "SELECT job, min(ts), max(ts) FROM steps WHERE ($job IS NULL OR job = $job) "
            "AND ($jobs IS NULL OR list_contains($jobs, job)) GROUP BY job",
            only,
        ).fetchall()
    }
    rates = steady_rates(con, job, jobs)
    cat = catalog.load()
    out, skipped = [], []
    for name, model, accel, world, ps, flops, params, tensors, batch in decl:
        if name not in span:
            continue
        missing = [
            k for k, v in (("accelerator", accel), ("flops_per_step", flops), ("params", params)) if not v
        ]
        if missing:
            skipped.append(f"{name}: no {', '.join(missing)} declared")
            continue
        try:
            acc = catalog.lookup(accel, cat)
        except AnalyticsError:
            skipped.append(f"{name}: accelerator {accel!r} not in the catalogue")
            continue
        good = rates.get(name)
        if not good:
            skipped.append(f"{name}: too few step intervals for a steady state")
            continue
        ps_n = int(ps or 0)
        speed = math.fsum(good.values()) if ps_n > 0 else good[min(good)]
        # to 10 significant digits: DuckDB's parallel sums differ in the last bits from run
        # to run, and a nonlinear fit (the cluster's k-norm) would carry that into its
        # coefficients; rounded, the same data gives the same fit
        speed = float(f"{speed:.10g}")
        out.append(
            JobSpeed(
                name,
                model or name,
                acc.name,
                int(world or 1),
                ps_n,
                float(flops),
                float(params),
                float(tensors or 1),
                float(batch) if batch else None,
                speed,
                span[name][0],
                span[name][1],
                acc,
            )
        )
    out.sort(key=lambda j: j.job)  # the database's order varies; a fit's should not
    return out, skipped
