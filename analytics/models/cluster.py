"""The cluster model: per-worker step time as workers and parameter servers grow, from the
single-worker time (measured, or the speed model's) and the weights each PS serves."""

from __future__ import annotations

from typing import Any

import numpy as np

from .ranges import ranges_of
from .regression import Fit, Linear, logo_cv, need_data
from .speed import predict_speed
from .steady import JobSpeed

# -- cluster: per-worker step time as workers and parameter servers grow -----------------
CLUSTER_COLS = ["t1_s", "weights_gb", "weights_gb_x_workers_per_ps", "const"]


def weights_gb(params: float) -> float:
    """Parameter bytes pushed and pulled per step (fp32), GB."""
    return 4.0 * params / 1e9


def cluster_features(t1: float, params: float, workers: float, ps: float) -> np.ndarray:
    s = weights_gb(params)
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
    need_data(
        len(rows), len(groups), 6, 3, "the cluster fit", "parameter-server jobs (ps >= 1) with declarations"
    )
    X = np.array([cluster_features(t1, j.params, j.workers, j.ps) for j, t1 in rows])
    y = np.array([j.workers / j.speed for j, _ in rows])  # seconds per step of one worker
    # fitted on relative error: a small model's per-worker milliseconds weigh as much as a
    # large one's seconds (on absolute error the large models decide the fit: CM-DARE's
    # runs, leave one architecture out, 10.5 % -> 8.6 % from a measured run)
    cv = logo_cv(X, y, [j.model for j, _ in rows], CLUSTER_COLS, False, relative=True)
    lin = Linear.fit(X, y, CLUSTER_COLS, relative=True)
    ranges = ranges_of([{"workers": j.workers, "ps": j.ps, "workers_per_ps": j.workers / j.ps, "params": j.params,
                         "t1_seconds": t1, "accelerator": j.acc.name if j.acc else j.accelerator, "model": j.model}
                        for j, t1 in rows])
    return Fit(
        "cluster",
        "ps-contention",
        {"linear": lin.__dict__, "coefficients": dict(zip(CLUSTER_COLS, lin.params, strict=False)),
         "input_ranges": ranges},
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
    a, b, _, d = lin.params
    s = weights_gb(params)
    out = {"steps_per_second": v, "lower": lo, "upper": hi, "expected_step_seconds": 1.0 / v}
    limit = ps_limit(fit, ps, params)
    if limit is not None:
        base = sum(a * t1 for t1 in workers) / w + b * s + d
        out["ps_limit_steps_per_second"] = limit  # the asymptote as workers grow
        out["workers_at_90pct_of_limit"] = 9.0 * base * limit
    if len(set(workers)) == 1:  # homogeneous: where one more worker stops paying (Cachew's 7 %)
        k = knee_workers(fit, workers[0], ps, params)
        if k is not None:
            out["knee_workers"] = k
            out["knee_steps_per_second"] = k / lin.point(cluster_features(workers[0], params, k, ps))
    return out


KNEE = 0.07  # one more worker must add more than this share of speed (Cachew)


def knee_workers(fit: dict[str, Any], t1: float, ps: int, params: float, most: int = 4096) -> int | None:
    """The worker count past which one more worker adds ``KNEE`` of speed or less, by the
    fit, for homogeneous workers of single-worker time ``t1``: the plateau a user sees
    (the PS limit is where the speed tends, often far past any count worth paying for);
    None when the fit gives no positive step time there."""
    lin = Linear(**fit["model"]["linear"])

    def speed(w: int) -> float:
        t = lin.point(cluster_features(t1, params, w, ps))
        return w / t if t > 0 else float("nan")

    prev = speed(1)
    for w in range(1, most):
        nxt = speed(w + 1)
        if not (prev > 0 and nxt > 0):
            return None
        if nxt / prev - 1.0 <= KNEE:
            return w
        prev = nxt
    return most


def ps_limit(fit: dict[str, Any], ps: int, params: float) -> float | None:
    """The cluster steps/s that ``ps`` parameter servers cap a model of ``params``
    parameters at, whatever the workers (the fit's contention term: 1 / k, k = c x GB moved
    a step / PS); None when the fit has no contention for it."""
    c = Linear(**fit["model"]["linear"]).params[2]
    k = c * weights_gb(params) / max(ps, 1)
    return 1.0 / k if k > 0 else None


def single_worker_seconds(fit: dict[str, Any], speed: float, workers: int, ps: int, params: float) -> float | None:
    """The single-worker step time T1 that gives cluster ``speed`` (steps/s) with ``workers``
    homogeneous workers and ``ps`` PS: the fit solved for T1; None when no positive T1 does."""
    a, b, c, d = Linear(**fit["model"]["linear"]).params
    s = weights_gb(params)
    t1 = (workers / speed - b * s - c * s * workers / max(ps, 1) - d) / a if a > 0 else -1.0
    return t1 if t1 > 0 else None
