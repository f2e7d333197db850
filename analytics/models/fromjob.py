"""Predictions anchored on a job the user ran (``analyze predict ... --from-job J``): J's
measured steady-state speed stands in for the speed fit's single-worker time, and the fits
only carry it to what J did not run (another accelerator, more workers or PS)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from .. import catalog
from ..db import AnalyticsError
from .cluster import single_worker_seconds
from .speed import predict_speed
from .steady import JobSpeed, job_speeds


@dataclass
class Anchor:
    """What job J measured, reduced to its single-worker step time on its accelerator."""

    job: JobSpeed
    t1: float  # single-worker step time on job.acc, seconds
    derived: bool  # through the cluster fit (J ran several workers)

    def t1_on(self, acc: catalog.Accelerator, speed_fit: dict[str, Any]) -> float:
        """Single-worker step time on ``acc``: the measured one on J's accelerator, else
        scaled by the speed fit's ratio between the two accelerators."""
        j = self.job
        if j.acc is not None and acc.name == j.acc.name:
            return self.t1
        assert j.acc is not None
        there = predict_speed(speed_fit, acc, j.flops_per_step, j.params, j.tensors)[0]
        here = predict_speed(speed_fit, j.acc, j.flops_per_step, j.params, j.tensors)[0]
        return self.t1 * here / there


def measured(con: duckdb.DuckDBPyConnection, job: str) -> JobSpeed:
    """Job ``job``'s steady-state speed and declaration; a one-line AnalyticsError naming the
    job and what is missing otherwise."""
    jobs, skipped = job_speeds(con, job)
    for j in jobs:
        if j.job == job:
            return j
    for why in skipped:
        if why.startswith(f"{job}: "):
            raise AnalyticsError(f"--from-job {why}")
    known = con.execute(
        "SELECT (SELECT count(*) FROM jobs WHERE job = $j), (SELECT count(*) FROM steps WHERE job = $j)", {"j": job}
    ).fetchall()[0]
    if not known[0] and not known[1]:
        raise AnalyticsError(f"--from-job {job}: no such job in the database (analyze jobs lists them)")
    if not known[0]:
        raise AnalyticsError(f"--from-job {job}: no declaration (model, accelerator, FLOPs per step, params)")
    raise AnalyticsError(f"--from-job {job}: no step telemetry yet, so no steady state")


def anchor(con: duckdb.DuckDBPyConnection, job: str, cluster_fit: dict[str, Any] | None) -> Anchor:
    """J's single-worker step time: measured (one worker), or derived from its cluster
    speed through the cluster fit (a parameter-server job with several workers)."""
    j = measured(con, job)
    if j.workers == 1:
        return Anchor(j, 1.0 / j.speed, False)
    if j.ps < 1:
        raise AnalyticsError(
            f"--from-job {job}: {j.workers} workers without parameter servers; the cluster fit "
            "derives a single-worker time only from a parameter-server job"
        )
    if cluster_fit is None:
        raise AnalyticsError(f"--from-job {job}: ran {j.workers} workers, so it needs a cluster fit (analyze fit cluster)")
    t1 = single_worker_seconds(cluster_fit, j.speed, j.workers, j.ps, j.params)
    if t1 is None:
        raise AnalyticsError(
            f"--from-job {job}: the cluster fit cannot explain its {j.speed:.3g} steps/s with {j.workers} workers "
            f"and {j.ps} PS (the PS limit is below it); refit: analyze fit cluster"
        )
    return Anchor(j, t1, True)
