"""The cluster model: per-worker step time as workers and parameter servers grow, from the
single-worker time (measured, or the speed model's) and the weights each PS serves."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .ranges import ranges_of
from .regression import Fit, Linear, Nonlinear, knorm_k, logo_cv, model_from, need_data
from .speed import predict_speed
from .steady import JobSpeed

# -- cluster: per-worker step time as workers and parameter servers grow -----------------
CLUSTER_COLS = ["t1_s", "weights_gb", "weights_gb_x_workers_per_ps", "const"]  # the linear form (fits stored by earlier versions)
LAW = "ps-knorm"
LAW_COLS = ["t1_s", "weights_gb", "weights_gb_x_workers_per_ps", "ps"]
# what `analyze fit cluster` shows: the linear form's names, then the k-norm's exponent and
# the PS scaling exponent g (contention c*S*W/P^g)
COEFFICIENTS = [*CLUSTER_COLS, "k", "ps_exponent_g"]


def weights_gb(params: float) -> float:
    """Parameter bytes pushed and pulled per step (fp32), GB."""
    return 4.0 * params / 1e9


def cluster_features(t1: float, params: float, workers: float, ps: float) -> np.ndarray:
    """The law's inputs (``LAW_COLS``)."""
    s = weights_gb(params)
    return np.array([t1, s, s * workers / max(ps, 1.0), max(ps, 1.0)])


def _model(fit: dict[str, Any]) -> Linear | Nonlinear:
    return model_from(fit["model"])


def _x(m: Linear | Nonlinear, t1: float, params: float, workers: float, ps: float) -> np.ndarray:
    x = cluster_features(t1, params, workers, ps)
    return x if isinstance(m, Nonlinear) else np.r_[x[:3], 1.0]


def _parts(m: Linear | Nonlinear) -> tuple[float, float, float, float, float, float]:
    """(a, b, c, d, k, g): base time a*T1 + b*S + d, contention c*S*W/P^g, combined as a k-norm."""
    if isinstance(m, Nonlinear):
        la, lb, lc, ld, lk, g = m.params
        return math.exp(la), math.exp(lb), math.exp(lc), math.exp(ld), knorm_k(lk), g
    a, b, c, d = m.params
    return a, b, c, d, 1.0, 1.0


def fit_cluster(jobs: list[JobSpeed], speed_fit: dict[str, Any] | None, law: str | None = None) -> Fit:
    """Per-worker step time t_w = (base^k + (c*S*W/P^g)^k)^(1/k), base = a*T1 + b*S + d
    (spotDNN's communication term with PS-bandwidth contention: each step moves the
    parameters S to and from the parameter servers, whose bandwidth W workers share; the
    k-norm makes speed a smooth minimum of the compute and the PS limit, so the fitted
    curve flattens where a saturated PS does; k = g = 1 is the linear sum).  Fitted on
    log t (relative error).  T1: the measured single-worker step time of the same model on
    the same accelerator, else the speed fit's.  The k-norm serves only where its held-out
    error beats the linear sum's by more than the spread across architectures
    (``choose_law``; ``law``: serve this one of ``LAWS_TRIED`` instead); the fit records the
    nested error of that choice (``nested_error``)."""
    ps_jobs = [j for j in jobs if j.ps >= 1]
    single = {(j.model, j.accelerator): 1.0 / j.speed for j in jobs if j.workers == 1}
    rows, notes = [], []
    for j in ps_jobs:
        t1 = single.get((j.model, j.accelerator))
        if t1 is None and speed_fit is not None:
            t1 = 1.0 / predict_speed(speed_fit, j.entry, j.flops_per_step, j.params, j.tensors)[0]
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
    arch = [j.model for j, _ in rows]
    multi = np.array([j.workers >= 2 for j, _ in rows])
    # the law is chosen by held-out error, and the error reported is the nested one: the same
    # choice made inside each leave-one-architecture-out fold on that fold's architectures
    # only, scored on the one left out (issue 65: a law picked on two architectures followed
    # them, and did worse on new ones than the simpler law it replaced)
    chosen, choice = choose_law(X, y, arch, multi)
    if law is None:
        law = chosen
    elif law not in LAWS_TRIED:
        raise ValueError(f"cluster law {law!r}: one of {', '.join(LAWS_TRIED)}")
    else:
        choice = {**choice, "why": f"{law} asked for (held-out error chose {chosen})"}
    nested = nested_error(X, y, arch, multi)
    # fitted on relative error (log t): a small model's per-worker milliseconds weigh as much
    # as a large one's seconds (on absolute error the large models decide the fit)
    import warnings

    with warnings.catch_warnings():  # (a fold whose runs do not vary a column: still a fold)
        warnings.simplefilter("ignore")
        cv = logo_cv(_design(X, law), y, arch, _cols(law), False, law=_law_arg(law), relative=True)
    cv.update({"law": law, "law_choice": choice, "nested_mape": nested["mape"], "nested": nested})
    m = _fit(X, y, law)
    # a prediction's noise is the held-out error's, not the residuals': the runs of one
    # architecture err together (its series sits above or below the law), so in-sample
    # residuals understate what a configuration the fit has not seen will miss by
    held = np.log(np.asarray(cv["predictions"]) / y)
    m.scale = max(m.scale, float(np.mean(held**2)))
    ranges = ranges_of([{"workers": j.workers, "ps": j.ps, "workers_per_ps": j.workers / j.ps, "params": j.params,
                         "t1_seconds": t1, "accelerator": j.acc.name if j.acc else j.accelerator, "model": j.model}
                        for j, t1 in rows])
    return Fit(
        "cluster",
        "ps-contention",
        {("nonlinear" if isinstance(m, Nonlinear) else "linear"): m.__dict__,
         "coefficients": dict(zip(COEFFICIENTS, _parts(m), strict=True)), "input_ranges": ranges},
        len(rows),
        len(groups),
        cv,
        min(j.t0 for j, _ in rows),
        max(j.t1 for j, _ in rows),
        _cols(law),
        notes=notes,
    )


# -- which law: the simpler unless the held-out error says otherwise -------------------------
LINEAR = "linear-sum"  # t_w = a*T1 + b*S + c*S*W/P + d (the k-norm with k = g = 1)
LAWS_TRIED = (LINEAR, LAW)
# the flexible law must beat the simpler in held-out error at this one-sided level: on
# CM-DARE's shared half (two multi-worker architectures, the k-norm ahead by 2 and 0.6
# points) that keeps the linear sum, which did better on the architectures kept for
# acceptance; on the simulated fleet (five, the k-norm ahead 1.5-7x on four, level on one)
# the k-norm
CONFIDENCE = 0.90


def _design(X: np.ndarray, law: str) -> np.ndarray:
    return X if law == LAW else np.c_[X[:, :3], np.ones(len(X))]


def _cols(law: str) -> list[str]:
    return LAW_COLS if law == LAW else CLUSTER_COLS


def _law_arg(law: str) -> str | None:
    return LAW if law == LAW else None


def _fit(X: np.ndarray, y: np.ndarray, law: str) -> Linear | Nonlinear:
    import warnings

    with warnings.catch_warnings():  # (a fold whose runs do not vary a column: the fit is still a fit)
        warnings.simplefilter("ignore")
        if law == LAW:
            return Nonlinear.fit(X, y, LAW_COLS, LAW)
        return Linear.fit(_design(X, law), y, CLUSTER_COLS, False, True)


def fold_errors(X: np.ndarray, y: np.ndarray, arch: list[str], multi: np.ndarray, law: str,
                within: np.ndarray | None = None) -> dict[str, float]:
    """Leave one architecture out among ``within`` (all rows when None): per architecture
    with multi-worker runs, the mean relative error of its multi-worker runs' per-worker step
    time, predicted by ``law`` fitted on the other architectures (what the cluster law is
    for: speed past one worker)."""
    a = np.asarray(arch)
    inside = np.ones(len(y), bool) if within is None else within
    out: dict[str, float] = {}
    for grp in sorted(set(a[inside & multi])):
        test = inside & multi & (a == grp)
        train = inside & (a != grp)
        m = _fit(X[train], y[train], law)
        d = _design(X[test], law)
        p = np.array([m.point(x) for x in d])
        out[str(grp)] = float(np.mean(np.abs(p - y[test]) / y[test]))
    return out


def choose_law(X: np.ndarray, y: np.ndarray, arch: list[str], multi: np.ndarray,
               within: np.ndarray | None = None) -> tuple[str, dict[str, Any]]:
    """The k-norm when its held-out error beats the linear sum's on the architectures with
    multi-worker runs by more than the spread across them: a one-sided paired t bound at
    ``CONFIDENCE`` on the log ratio of each architecture's errors (relative: one
    architecture the laws both miss badly does not decide it); with two architectures that
    takes a ratio about three times its spread. Else the linear sum. What was compared, for
    the fit's record."""
    from scipy import stats

    errs = {law: fold_errors(X, y, arch, multi, law, within) for law in LAWS_TRIED}
    groups = sorted(errs[LINEAR])
    d = np.array([math.log(max(errs[LINEAR][g], 1e-9) / max(errs[LAW][g], 1e-9)) for g in groups])
    record: dict[str, Any] = {"compared": {law: {"mape": float(np.mean(list(e.values()))) if e else None,
                                                  "by_architecture": e} for law, e in errs.items()},
                              "architectures": len(groups)}
    if len(d) < 2:
        record["why"] = "fewer than two architectures with multi-worker runs: the simpler law"
        return LINEAR, record
    bound = float(np.mean(d) - stats.t.ppf(CONFIDENCE, len(d) - 1) * np.std(d, ddof=1) / math.sqrt(len(d)))
    record["improvement_lower_bound"] = bound
    if bound > 0:
        record["why"] = "the k-norm's held-out error is lower by more than the spread across architectures"
        return LAW, record
    record["why"] = "the k-norm is not better by more than the spread across architectures: the simpler law"
    return LINEAR, record


def nested_error(X: np.ndarray, y: np.ndarray, arch: list[str], multi: np.ndarray) -> dict[str, Any]:
    """The error of the whole procedure on an architecture it never saw: for each
    architecture with multi-worker runs, the law chosen (``choose_law``) on the others only,
    fitted on them, scored on its multi-worker runs. Per architecture, and the mean over
    those runs."""
    a = np.asarray(arch)
    apes: list[float] = []
    per: dict[str, dict[str, Any]] = {}
    for grp in sorted(set(a[multi])):
        train = a != grp
        law, _ = choose_law(X, y, arch, multi, train)
        m = _fit(X[train], y[train], law)
        test = multi & (a == grp)
        p = np.array([m.point(x) for x in _design(X[test], law)])
        e = np.abs(p - y[test]) / y[test]
        apes += e.tolist()
        per[str(grp)] = {"law": law, "mape": float(e.mean()), "runs": int(test.sum())}
    return {"mape": float(np.mean(apes)) if apes else None, "by_architecture": per}


def predict_cluster(fit: dict[str, Any], workers: list[float], ps: int, params: float) -> dict[str, float]:
    """Cluster steps/s for workers given by their single-worker step times T1_i
    (heterogeneous allowed: T_exp = 1 / sum(1/t_i), spotDNN), with an interval from each
    worker's prediction interval, the speed the PS caps a homogeneous cluster at, and the
    workers that reach 90 % of that cap."""
    m = _model(fit)
    w = len(workers)
    v = lo = hi = 0.0
    for t1 in workers:
        t, tl, th = m.predict(_x(m, t1, params, w, ps))
        v += 1.0 / max(t, 1e-9)
        lo += 1.0 / max(th, 1e-9)
        hi += 1.0 / max(tl, 1e-9) if tl > 0 else float("inf")
    a, b, _, d, k, _ = _parts(m)
    s = weights_gb(params)
    out = {"steps_per_second": v, "lower": lo, "upper": hi, "expected_step_seconds": 1.0 / v}
    limit = ps_limit(fit, ps, params)
    if limit is not None:
        base = sum(a * t1 for t1 in workers) / w + b * s + d
        out["ps_limit_steps_per_second"] = limit  # the asymptote as workers grow
        # speed = L / (1 + (base L / W)^k)^(1/k) reaches 0.9 L at W = base L / ((1/0.9)^k - 1)^(1/k)
        out["workers_at_90pct_of_limit"] = base * limit / ((1 / 0.9) ** k - 1) ** (1 / k)
    if len(set(workers)) == 1:  # homogeneous: where one more worker stops paying (Cachew's 7 %)
        kn = knee_workers(fit, workers[0], ps, params)
        if kn is not None:
            out["knee_workers"] = kn
            out["knee_steps_per_second"] = kn / m.point(_x(m, workers[0], params, kn, ps))
    return out


KNEE = 0.07  # one more worker must add more than this share of speed (Cachew)


def knee_workers(fit: dict[str, Any], t1: float, ps: int, params: float, most: int = 4096) -> int | None:
    """The worker count past which one more worker adds ``KNEE`` of speed or less, by the
    fit, for homogeneous workers of single-worker time ``t1``: the plateau a user sees
    (the PS limit is where the speed tends, often far past any count worth paying for);
    None when the fit gives no positive step time there."""
    m = _model(fit)

    def speed(w: int) -> float:
        t = m.point(_x(m, t1, params, w, ps))
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
    a step / PS^g); None when the fit has no contention for it."""
    _, _, c, _, _, g = _parts(_model(fit))
    kk = c * weights_gb(params) / max(ps, 1) ** g
    return 1.0 / kk if kk > 0 else None


def single_worker_seconds(fit: dict[str, Any], speed: float, workers: int, ps: int, params: float) -> float | None:
    """The single-worker step time T1 that gives cluster ``speed`` (steps/s) with ``workers``
    homogeneous workers and ``ps`` PS: the fit solved for T1; None when no positive T1 does."""
    a, b, c, d, k, g = _parts(_model(fit))
    s = weights_gb(params)
    tw = workers / speed
    cont = c * s * workers / max(ps, 1) ** g
    base = (tw**k - cont**k) ** (1 / k) if tw > cont else -1.0  # the k-norm solved for base
    t1 = (base - b * s - d) / a if a > 0 else -1.0
    return t1 if t1 > 0 else None
