"""The speed model: single-worker step time from model complexity (FLOPs per step,
parameters, parameter tensors) over accelerator capability (the catalogue's peak FLOPs and
memory bandwidth); the family with the lowest held-out (leave one architecture out) error
wins.  Measured on CM-DARE's real runs (10 CNN architectures on K80 and P100):
compute+tensors 7.6 %, power 10.8 %, loglinear 15.1 %, roofline 22.1 % (docs/models.md)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import catalog
from .ranges import ranges_of
from .regression import Fit, fit_model, logo_cv, model_from, need_data
from .steady import JobSpeed

# -- speed: single-worker step time from model complexity over accelerator capability -----
SPEED_FAMILIES: dict[str, tuple[list[str], bool, str | None]] = {
    # step time = a*compute + b*weights + c*tensors + d: compute-bound, memory-bound and
    # per-tensor (kernel launch, optimizer) terms, each in seconds on that accelerator
    "roofline": (["compute_s", "weights_s", "tensors", "const"], False, None),
    # log step time linear in the logs of the same quantities: power laws
    "loglinear": (["log_compute_s", "log_weights_s", "log_tensors", "const"], True, None),
    # a power law in compute time and parameter tensors, with the accelerator's own
    # exponent (no weight-traffic term: it overfits the few architectures a fleet has)
    "power": (["log_compute_s", "log_tensors", "log_peak_tflops", "const"], True, None),
    # t = a*compute + b*tensors/peak^e + d: compute time plus a per-tensor cost (kernel
    # launches, one PS request per tensor) that a faster accelerator (and the host that
    # comes with it) shrinks, plus a fixed cost; fitted on relative error
    "compute+tensors": (["compute_s", "tensors", "peak_tflops"], False, "compute+tensors"),
}


def speed_features(
    flops: float, params: float, tensors: float, acc: catalog.Accelerator, family: str
) -> np.ndarray:
    compute = flops / acc.peak_flops
    weights = 4.0 * params / acc.bandwidth if acc.bandwidth else 0.0
    if family == "roofline":
        return np.array([compute, weights, tensors, 1.0])
    if family == "power":
        return np.array([math.log(compute), math.log(max(tensors, 1.0)), math.log(acc.peak_flops / 1e12), 1.0])
    if family == "compute+tensors":
        return np.array([compute, max(tensors, 1.0), acc.peak_flops / 1e12])
    return np.array([math.log(compute), math.log(max(weights, 1e-9)), math.log(max(tensors, 1.0)), 1.0])



def range_inputs(flops: float, params: float, tensors: float | None) -> dict[str, float]:
    """The inputs whose fitted ranges a prediction is checked against: FLOPs per step,
    parameters, tensors and FLOPs per tensor (how much work each kernel gets: a network of
    narrow layers is launch-bound where the fitted ones were compute-bound; CM-DARE's
    shakeshake_w16_d26, 3.8x below any other architecture, is the fit's worst, 25 %)."""
    out = {"flops_per_step": flops, "params": params}
    if tensors:
        out |= {"tensors": tensors, "flops_per_tensor": flops / tensors}
    return out


def split_by_range(rows: list[dict[str, Any]], ape: np.ndarray) -> dict[str, Any]:
    """Held-out error apart for the rows whose inputs lie inside what the fit without their
    architecture saw, and for those it extrapolated to (as a prediction would say)."""
    from .ranges import check

    inside = []
    for r in rows:
        rg = ranges_of([q for q in rows if q["model"] != r["model"]])
        ex, _, _ = check({"model": {"input_ranges": rg}},
                         **{k: v for k, v in r.items() if k not in ("model", "accelerator")},
                         accelerator=r["accelerator"])
        inside.append(not ex)
    m = np.array(inside, dtype=bool)

    def part(sel: np.ndarray) -> dict[str, Any]:
        return {"rows": int(sel.sum()), "mape": float(ape[sel].mean()) if sel.any() else None}

    return {"in_range": part(m), "extrapolated": part(~m)}


def fit_speed(jobs: list[JobSpeed]) -> Fit:
    single = [j for j in jobs if j.workers == 1]
    groups = sorted({j.model for j in single})
    need_data(
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
    for fam, (cols, log_t, law) in SPEED_FAMILIES.items():
        X = np.array([speed_features(j.flops_per_step, j.params, j.tensors, j.entry, fam) for j in single])
        cv = logo_cv(X, y, [j.model for j in single], cols, log_t, law)
        tried[fam] = {"cv_mape": cv["mape"], "cv_r2": cv["r2"]}
        if best is None or cv["mape"] < best[0]:
            best = (cv["mape"], fam, X, cv)
    assert best is not None
    _, fam, X, cv = best
    cols, log_t, law = SPEED_FAMILIES[fam]
    m = fit_model(X, y, cols, log_t, law)
    cv["families"] = tried
    names = ["log_a", "log_b", "e", "log_d"] if law else cols
    rows = [range_inputs(j.flops_per_step, j.params, j.tensors) | {"accelerator": j.entry.name, "model": j.model}
            for j in single]
    ranges = ranges_of(rows)
    cv |= split_by_range(rows, np.abs(np.array(cv["predictions"]) - y) / y)
    return Fit(
        "speed",
        fam,
        {"nonlinear" if law else "linear": m.__dict__, "coefficients": dict(zip(names, m.params, strict=False)),
         "input_ranges": ranges},
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
    m = model_from(fit["model"])
    t, lo, hi = m.predict(speed_features(flops, params, tensors, acc, fit["family"]))
    lo = max(lo, 1e-9)
    return 1.0 / max(t, 1e-9), 1.0 / hi, 1.0 / lo
