"""Performance models fitted from the database (CM-DARE / spotDNN, as a product): training
speed, cluster scaling, overheads and VM lifetimes, each with held-out error, stored in
``model_fits`` and used for predictions with intervals.

Steady-state speed (the input of the speed and cluster models).  Per job, run and rank,
the step intervals in time order: drop the ramp (every interval that starts in the first
10 % of the rank's stepping time, and at least the first two) and the tail (the last
interval); from at least three that remain, the median of the per-interval steps/s.
The job's cluster speed: parameter-server jobs (``ps`` > 0) sum their worker ranks'
speeds (each worker steps on its own); other jobs take the lowest rank's speed (in
synchronous training every rank steps together).  Several runs of a job pool their kept
intervals.  A job is used when its declaration gives the accelerator (found in the
catalogue), FLOPs per step and parameter count.

Error is always held out: leave-one-group-out cross-validation, where a group is a model
architecture (speed, cluster, checkpoint overhead), so no architecture is in both the
training and the test fold.  MAPE and R^2 are over the held-out predictions.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from . import catalog
from .db import AnalyticsError

RAMP_SHARE = 0.10
MIN_RAMP_INTERVALS = 2
MIN_KEPT = 3
ALPHA = 0.05  # 95 % intervals


# -- steady state -----------------------------------------------------------------------
# Computed in DuckDB (a fleet's step intervals need not fit in memory): per job, run and
# rank, number the intervals in time order, keep those after the ramp and before the tail,
# then per job and rank the median over the kept intervals of all its runs.
STEADY_SQL = f"""
WITH s AS (
    SELECT job, run, rank, ts, steps,
           coalesce(steps / nullif(steps_per_second, 0), step_mean_seconds * steps) AS span
    FROM steps),
w AS (
    SELECT job, rank, ts, steps / span AS rate, epoch(ts) - span AS begins,
           row_number() OVER p AS i, count(*) OVER p AS n,
           min(epoch(ts) - span) OVER p AS t_start, max(epoch(ts)) OVER p AS t_end
    FROM s WHERE span > 0 AND steps > 0
    WINDOW p AS (PARTITION BY job, run, rank ORDER BY ts
                 ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING))
SELECT job, coalesce(rank, 0) AS rank, median(rate) AS rate, count(*) AS kept
FROM w
WHERE i > {MIN_RAMP_INTERVALS} AND i < n AND begins >= t_start + {RAMP_SHARE} * (t_end - t_start)
GROUP BY ALL HAVING count(*) >= {MIN_KEPT}
"""


def steady_rates(con: duckdb.DuckDBPyConnection) -> dict[str, dict[int, float]]:
    """job -> rank -> steady steps/s (see the module doc); ranks with too few intervals
    are absent."""
    out: dict[str, dict[int, float]] = {}
    for job, rank, rate, _ in con.execute(STEADY_SQL).fetchall():
        out.setdefault(job, {})[int(rank)] = float(rate)
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


def job_speeds(con: duckdb.DuckDBPyConnection) -> tuple[list[JobSpeed], list[str]]:
    """Steady-state speed of every job with a usable declaration; and why others were
    left out."""
    decl = con.execute(
        """SELECT job, arg_max(model, ts), arg_max(accelerator, ts), arg_max(world_size, ts), arg_max(ps, ts),
                  arg_max(flops_per_step, ts), arg_max(params, ts), arg_max(tensors, ts), arg_max(batch_size, ts)
           FROM jobs GROUP BY job"""
    ).fetchall()
    span = {
        job: (t0, t1)
        for job, t0, t1 in con.execute("SELECT job, min(ts), max(ts) FROM steps GROUP BY job").fetchall()
    }
    rates = steady_rates(con)
    cat = catalog.load()
    out, skipped = [], []
    for job, model, accel, world, ps, flops, params, tensors, batch in decl:
        if job not in span:
            continue
        missing = [
            k for k, v in (("accelerator", accel), ("flops_per_step", flops), ("params", params)) if not v
        ]
        if missing:
            skipped.append(f"{job}: no {', '.join(missing)} declared")
            continue
        try:
            acc = catalog.lookup(accel, cat)
        except AnalyticsError:
            skipped.append(f"{job}: accelerator {accel!r} not in the catalogue")
            continue
        good = rates.get(job)
        if not good:
            skipped.append(f"{job}: too few step intervals for a steady state")
            continue
        ps_n = int(ps or 0)
        speed = sum(good.values()) if ps_n > 0 else good[min(good)]
        out.append(
            JobSpeed(
                job,
                model or job,
                acc.name,
                int(world or 1),
                ps_n,
                float(flops),
                float(params),
                float(tensors or 1),
                float(batch) if batch else None,
                speed,
                span[job][0],
                span[job][1],
                acc,
            )
        )
    return out, skipped


# -- least squares with stored, reusable results -----------------------------------------
@dataclass
class Linear:
    """An OLS fit reduced to what prediction needs (stored as JSON)."""

    columns: list[str]
    params: list[float]
    cov: list[list[float]]
    scale: float
    df_resid: float
    log_target: bool = False

    @classmethod
    def fit(cls, X: np.ndarray, y: np.ndarray, columns: list[str], log_target: bool = False) -> Linear:
        import statsmodels.api as sm

        r = sm.OLS(np.log(y) if log_target else y, X).fit()
        return cls(
            columns,
            [float(v) for v in r.params],
            r.cov_params().tolist(),
            float(r.scale),
            float(r.df_resid),
            log_target,
        )

    def predict(self, x: np.ndarray, alpha: float = ALPHA) -> tuple[float, float, float]:
        """(prediction, lower, upper) of one observation: the OLS prediction interval
        (t distribution), back-transformed for a log target."""
        from scipy import stats

        b, c = np.asarray(self.params), np.asarray(self.cov)
        mean = float(x @ b)
        se = math.sqrt(max(0.0, float(x @ c @ x) + self.scale))
        q = float(stats.t.ppf(1 - alpha / 2, max(1.0, self.df_resid)))
        lo, hi = mean - q * se, mean + q * se
        if self.log_target:
            return math.exp(mean), math.exp(lo), math.exp(hi)
        return mean, lo, hi

    def point(self, x: np.ndarray) -> float:
        m = float(x @ np.asarray(self.params))
        return math.exp(m) if self.log_target else m


def logo_cv(
    X: np.ndarray, y: np.ndarray, groups: list[str], columns: list[str], log_target: bool
) -> dict[str, Any]:
    """Leave-one-group-out: each group is predicted by a fit on all the others.  Returns
    MAPE, R^2 (held out) and the folds (for the test that they are disjoint)."""
    preds = np.empty_like(y, dtype=float)
    folds = []
    g = np.asarray(groups)
    for grp in sorted(set(groups)):
        test = g == grp
        train = ~test
        m = Linear.fit(X[train], y[train], columns, log_target)
        preds[test] = [m.point(x) for x in X[test]]
        folds.append({"test_group": grp, "train_groups": sorted(set(g[train])), "test_rows": int(test.sum())})
    ape = np.abs(preds - y) / y
    ss_res = float(np.sum((y - preds) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return {
        "mape": float(ape.mean()),
        "r2": 1 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        "folds": folds,
        "predictions": preds.tolist(),  # held out, row order (reports; not stored)
        "worst": sorted(
            ({"group": gr, "ape": float(a)} for gr, a in zip(groups, ape, strict=False)),
            key=lambda d: -d["ape"],
        )[:5],
    }


def _need(n: int, groups: int, min_rows: int, min_groups: int, what: str, hint: str) -> None:
    if n < min_rows or groups < min_groups:
        raise AnalyticsError(
            f"{what} needs at least {min_rows} configurations from {min_groups} model architectures "
            f"for a held-out error; the database has {n} from {groups} ({hint})"
        )


# -- speed: single-worker step time from model complexity over accelerator capability -----
SPEED_FAMILIES = {
    # step time = a*compute + b*weights + c*tensors + d: compute-bound, memory-bound and
    # per-tensor (kernel launch, optimizer) terms, each in seconds on that accelerator
    "roofline": (["compute_s", "weights_s", "tensors", "const"], False),
    # log step time linear in the logs of the same quantities: power laws
    "loglinear": (["log_compute_s", "log_weights_s", "log_tensors", "const"], True),
}


def speed_features(
    flops: float, params: float, tensors: float, acc: catalog.Accelerator, family: str
) -> np.ndarray:
    compute = flops / acc.peak_flops
    weights = 4.0 * params / acc.bandwidth if acc.bandwidth else 0.0
    if family == "roofline":
        return np.array([compute, weights, tensors, 1.0])
    return np.array([math.log(compute), math.log(max(weights, 1e-9)), math.log(max(tensors, 1.0)), 1.0])


@dataclass
class Fit:
    kind: str
    family: str
    model: dict[str, Any]
    rows: int
    groups: int
    cv: dict[str, Any]
    data_from: dt.datetime | None
    data_to: dt.datetime | None
    features: list[str] = field(default_factory=list)
    fit_id: str = ""
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "fit_id": self.fit_id,
            "kind": self.kind,
            "family": self.family,
            "features": self.features,
            "rows": self.rows,
            "groups": self.groups,
            "cv_mape": self.cv.get("mape"),
            "cv_r2": self.cv.get("r2"),
            "data_from": self.data_from.isoformat(sep=" ") if self.data_from else None,
            "data_to": self.data_to.isoformat(sep=" ") if self.data_to else None,
            "coefficients": self.model.get("coefficients", {}),
            **{k: v for k, v in self.model.items() if k.endswith("_seconds")},  # overhead means
            "notes": self.notes,
        }


def fit_speed(jobs: list[JobSpeed]) -> Fit:
    single = [j for j in jobs if j.workers == 1]
    groups = sorted({j.model for j in single})
    _need(
        len(single),
        len(groups),
        5,
        3,
        "the speed fit",
        "single-worker jobs with accelerator, FLOPs per step and parameters declared",
    )
    y = np.array([1.0 / j.speed for j in single])
    best: tuple[float, str, Any, dict[str, Any]] | None = None
    tried = {}
    for fam, (cols, log_t) in SPEED_FAMILIES.items():
        X = np.array([speed_features(j.flops_per_step, j.params, j.tensors, j.acc, fam) for j in single])
        cv = logo_cv(X, y, [j.model for j in single], cols, log_t)
        tried[fam] = {"cv_mape": cv["mape"], "cv_r2": cv["r2"]}
        if best is None or cv["mape"] < best[0]:
            best = (cv["mape"], fam, X, cv)
    assert best is not None
    _, fam, X, cv = best
    cols, log_t = SPEED_FAMILIES[fam]
    lin = Linear.fit(X, y, cols, log_t)
    cv["families"] = tried
    return Fit(
        "speed",
        fam,
        {"linear": lin.__dict__, "coefficients": dict(zip(cols, lin.params, strict=False))},
        len(single),
        len(groups),
        cv,
        min(j.t0 for j in single),
        max(j.t1 for j in single),
        cols,
    )


def predict_speed(
    fit: dict[str, Any], acc: catalog.Accelerator, flops: float, params: float, tensors: float
) -> tuple[float, float, float]:
    """Single-worker steps/s (and its interval) from a stored speed fit."""
    lin = Linear(**fit["model"]["linear"])
    t, lo, hi = lin.predict(speed_features(flops, params, tensors, acc, fit["family"]))
    lo = max(lo, 1e-9)
    return 1.0 / max(t, 1e-9), 1.0 / hi, 1.0 / lo


# -- cluster: per-worker step time as workers and parameter servers grow -----------------
CLUSTER_COLS = ["t1_s", "weights_gb", "weights_gb_x_workers_per_ps", "const"]


def cluster_features(t1: float, params: float, workers: float, ps: float) -> np.ndarray:
    s = 4.0 * params / 1e9  # parameter bytes pushed and pulled per step, GB
    return np.array([t1, s, s * workers / max(ps, 1.0), 1.0])


def fit_cluster(jobs: list[JobSpeed], speed_fit: dict[str, Any] | None) -> Fit:
    """Per-worker step time t_w = a*T1 + b*S + c*S*W/P + d (spotDNN's communication term
    with PS-bandwidth contention: each step moves the parameters S to and from the
    parameter servers, whose bandwidth W workers share).  T1: the measured single-worker
    step time of the same model on the same accelerator, else the speed fit's."""
    ps_jobs = [j for j in jobs if j.ps >= 1]
    single = {(j.model, j.accelerator): 1.0 / j.speed for j in jobs if j.workers == 1}
    rows, notes = [], []
    for j in ps_jobs:
        t1 = single.get((j.model, j.accelerator))
        if t1 is None and speed_fit is not None:
            t1 = 1.0 / predict_speed(speed_fit, j.acc, j.flops_per_step, j.params, j.tensors)[0]
        if t1 is None:
            notes.append(f"{j.job}: no single-worker time for {j.model} on {j.accelerator} (fit speed first)")
            continue
        rows.append((j, t1))
    groups = sorted({j.model for j, _ in rows})
    _need(
        len(rows), len(groups), 6, 3, "the cluster fit", "parameter-server jobs (ps >= 1) with declarations"
    )
    X = np.array([cluster_features(t1, j.params, j.workers, j.ps) for j, t1 in rows])
    y = np.array([j.workers / j.speed for j, _ in rows])  # seconds per step of one worker
    cv = logo_cv(X, y, [j.model for j, _ in rows], CLUSTER_COLS, False)
    # report held-out error on the quantity users get: cluster steps/s
    lin = Linear.fit(X, y, CLUSTER_COLS)
    return Fit(
        "cluster",
        "ps-contention",
        {"linear": lin.__dict__, "coefficients": dict(zip(CLUSTER_COLS, lin.params, strict=False))},
        len(rows),
        len(groups),
        cv,
        min(j.t0 for j, _ in rows),
        max(j.t1 for j, _ in rows),
        CLUSTER_COLS,
        notes=notes,
    )


def predict_cluster(fit: dict[str, Any], workers: list[float], ps: int, params: float) -> dict[str, float]:
    """Cluster steps/s for workers given by their single-worker step times T1_i
    (heterogeneous allowed: T_exp = 1 / sum(1/t_i), spotDNN), with an interval from each
    worker's prediction interval, the speed the PS caps a homogeneous cluster at, and the
    workers that reach 90 % of that cap."""
    lin = Linear(**fit["model"]["linear"])
    w = len(workers)
    v = lo = hi = 0.0
    for t1 in workers:
        t, tl, th = lin.predict(cluster_features(t1, params, w, ps))
        v += 1.0 / max(t, 1e-9)
        lo += 1.0 / max(th, 1e-9)
        hi += 1.0 / max(tl, 1e-9) if tl > 0 else float("inf")
    a, b, c, d = lin.params
    s = 4.0 * params / 1e9
    k = c * s / max(ps, 1)
    out = {"steps_per_second": v, "lower": lo, "upper": hi, "expected_step_seconds": 1.0 / v}
    if k > 0:
        base = sum(a * t1 for t1 in workers) / w + b * s + d
        out["ps_limit_steps_per_second"] = 1.0 / k  # the asymptote as workers grow
        out["workers_at_90pct_of_limit"] = 9.0 * base / k
    return out
