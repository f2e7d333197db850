"""Overhead fits over imported records and live telemetry together: checkpoint save time,
and cloud VM start-up in the cloud's phases.

**Checkpoint save** (seconds from checkpoint size, and tensors / parameters where known).
Families, each fitted by least squares on relative error (every save weighs the same
whatever its length) with non-negative coefficients (a bigger checkpoint, more tensors,
never save faster): ``size`` (a + b MB), ``size+tensors`` (+ c per tensor, a per-file /
per-key cost of the index), ``size+tensors+params``; and plain OLS on size, the baseline.
A family with tensors falls back to its size-only member for a save whose tensors are not
known, in cross-validation as in a prediction. Held-out error leaves one model out (the
``model`` column; else the job's model; else one group per checkpoint size); the family
with the lowest is kept. The interval is the held-out relative errors' 2.5-97.5 %.

**VM start-up** (region, purchase option, accelerator). Families: ``group-mean`` (the mean
start-up of the VM's group: the baseline), ``group-median``, and ``phase-median``: each
phase on the level of detail where it varies, as medians (a median minimises absolute
error; start-ups have a long tail): provisioning over all VMs, staging per group shrunk
toward its purchase option and accelerator's median by k VMs' weight (k from {0, 1, 2, 4} by
cross-validation), booting per purchase option and accelerator. Held-out error leaves one
VM out. A group not measured is predicted from the coarser level that has VMs, and says
that it extrapolates. Live lives the agent measured launch to ready (AWS) join as totals.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb
import numpy as np

from ..db import AnalyticsError
from .regression import worst

CKPT_FAMILIES = {"ols-size": ("size_mb",), "size": ("size_mb",), "size+tensors": ("size_mb", "tensors"),
                 "size+tensors+params": ("size_mb", "tensors", "params")}
PHASES = ("provisioning_s", "staging_s", "booting_s")
SHRINK_K = (0.0, 1.0, 2.0, 4.0)
MIN_CKPT_ROWS, MIN_CKPT_GROUPS = 5, 3
# scale of each input inside the regression (coefficients are per MB, per 1000 tensors, per million params)
SCALE = {"size_mb": 1.0, "tensors": 1e3, "params": 1e6}


# -- checkpoint save --------------------------------------------------------------------------

def checkpoint_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Imported saves, and live saves of jobs (bytes, with the job's declared tensors and params)."""
    rows = [dict(zip(("model", "size_mb", "tensors", "params", "save_s", "source"), r, strict=True)) for r in con.execute(
        "SELECT model, size_mb, tensors, params, save_s, 'import' FROM checkpoint_records ORDER BY source, line, id"
    ).fetchall()]
    live = con.execute(
        """WITH m AS (SELECT job, arg_max(model, ts) AS model, arg_max(tensors, ts) AS tensors,
                             arg_max(params, ts) AS params FROM jobs GROUP BY job)
           SELECT coalesce(m.model, c.job), c.bytes / 1e6, m.tensors, m.params, c.seconds, 'live'
           FROM checkpoints c LEFT JOIN m USING (job)
           WHERE c.action = 'save' AND coalesce(c.ok, true) AND c.bytes > 0 AND c.seconds > 0 ORDER BY c.ts"""
    ).fetchall()
    rows += [dict(zip(("model", "size_mb", "tensors", "params", "save_s", "source"), r, strict=True)) for r in live]
    for r in rows:
        if not r["model"]:
            r["model"] = f"{r['size_mb']:.4g} MB"  # saves of one size: one model
        for k in ("tensors", "params"):
            if r[k] is not None and not r[k] > 0:
                r[k] = None
    return [r for r in rows if all(r[k] is None or math.isfinite(float(r[k])) for k in ("size_mb", "save_s"))]


def _solve(X: np.ndarray, y: np.ndarray, relative: bool) -> np.ndarray:
    if not relative:
        return np.linalg.lstsq(X, y, rcond=None)[0]
    from scipy.optimize import nnls

    w = 1.0 / y
    return nnls(X * w[:, None], y * w)[0]


def _design(rows: list[dict[str, Any]], feats: tuple[str, ...]) -> np.ndarray:
    return np.array([[1.0] + [float(r[f]) / SCALE[f] for f in feats] for r in rows])


def _members(family: str) -> list[tuple[str, ...]]:
    """The family's models, richest first: a save is predicted by the first its inputs allow."""
    feats = CKPT_FAMILIES[family]
    return [feats[:i] for i in range(len(feats), 0, -1)]


def _fit_family(rows: list[dict[str, Any]], family: str) -> dict[str, Any]:
    out = {}
    for feats in _members(family):
        have = [r for r in rows if all(r[f] is not None for f in feats)]
        if len(have) < len(feats) + 2:
            continue
        y = np.array([r["save_s"] for r in have])
        out["+".join(feats)] = {"features": list(feats), "coef": _solve(_design(have, feats), y, family != "ols-size").tolist()}
    return out


def _predict_family(models: dict[str, Any], family: str, r: dict[str, Any]) -> tuple[float, str] | None:
    for feats in _members(family):
        m = models.get("+".join(feats))
        if m is not None and all(r.get(f) is not None for f in feats):
            return float(_design([r], feats)[0] @ np.array(m["coef"])), "+".join(feats)
    return None


def fit_checkpoint(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The save-time model (or an AnalyticsError saying what is missing)."""
    groups = sorted({r["model"] for r in rows})
    if len(rows) < MIN_CKPT_ROWS or len(groups) < MIN_CKPT_GROUPS:
        raise AnalyticsError(f"checkpoint save: needs at least {MIN_CKPT_ROWS} saves of {MIN_CKPT_GROUPS} models, "
                             f"has {len(rows)} of {len(groups)} (analyze import checkpoints FILE.csv loads some)")
    y = np.array([r["save_s"] for r in rows])
    tried = {}
    for family in CKPT_FAMILIES:
        preds = np.full(len(rows), np.nan)
        for g in groups:
            models = _fit_family([r for r in rows if r["model"] != g], family)
            for i, r in enumerate(rows):
                if r["model"] == g:
                    p = _predict_family(models, family, r)
                    preds[i] = p[0] if p else np.nan
        if np.isnan(preds).any():
            continue
        rel = y / np.maximum(preds, 1e-9) - 1.0  # measured / predicted - 1: the interval's factors
        ape = np.abs(preds - y) / y
        tried[family] = {"mape": float(ape.mean()), "preds": preds, "rel": rel, "ape": ape}
    if not tried:
        raise AnalyticsError("checkpoint save: no family could be cross-validated")
    best = min((f for f in tried if f != "ols-size"), key=lambda f: tried[f]["mape"], default="ols-size")
    t = tried[best]
    ss_res, ss_tot = float(np.sum((y - t["preds"]) ** 2)), float(np.sum((y - y.mean()) ** 2))
    models = _fit_family(rows, best)
    ranges = {"size_mb": [min(r["size_mb"] for r in rows), max(r["size_mb"] for r in rows)]}
    for k in ("tensors", "params"):
        vs = [r[k] for r in rows if r[k] is not None]
        if vs:
            ranges[k] = [float(min(vs)), float(max(vs))]
    g = np.array([r["model"] for r in rows])
    return {
        "family": best,
        "models": models,
        "interval_factors": [float(np.quantile(t["rel"], 0.025)), float(np.quantile(t["rel"], 0.975))],
        "input_ranges": ranges,
        "cv": {
            "mape": t["mape"],
            "r2": 1 - ss_res / ss_tot if ss_tot > 0 else None,
            "families": {f: v["mape"] for f, v in tried.items()},
            "baseline": "ols-size",
            "rows": len(rows), "groups": len(groups),
            "imported": sum(r["source"] == "import" for r in rows), "live": sum(r["source"] == "live" for r in rows),
            "held_out": [[str(r["model"]), float(r["save_s"]), float(p)] for r, p in zip(rows, t["preds"], strict=True)][:500],
            "worst": worst((str(x), float(t["ape"][g == x].mean())) for x in groups),
        },
    }


def predict_save(m: dict[str, Any], size_mb: float, tensors: int | None = None,
                 params: int | None = None) -> dict[str, Any]:
    """Seconds to save a checkpoint of ``size_mb`` (with the model's tensors / params when
    known), its 95 % interval, which member answered and whether it extrapolates."""
    r = {"size_mb": size_mb, "tensors": tensors, "params": params}
    p = _predict_family(m["models"], m["family"], r)
    if p is None:
        raise AnalyticsError("checkpoint save: the fit has no model for these inputs: refit")
    seconds, used = max(p[0], 1e-3), p[1]
    lo_f, hi_f = m["interval_factors"]
    lo, hi = seconds * (1 + lo_f), seconds * (1 + hi_f)
    reasons, decades = [], 0.0
    for k, v in r.items():
        rng = m["input_ranges"].get(k)
        if v is None or not rng or k not in used.split("+"):
            continue
        if v > rng[1]:
            reasons.append(f"{k} {v:.3g} is {v / rng[1]:.3g}x the largest fitted ({rng[1]:.3g})")
            decades = max(decades, math.log10(v / rng[1]))
        elif v < rng[0]:
            reasons.append(f"{k} {v:.3g} is 1/{rng[0] / v:.3g} of the smallest fitted ({rng[0]:.3g})")
            decades = max(decades, math.log10(rng[0] / v))
    if decades:
        from .ranges import widen

        lo, hi = widen(seconds, max(lo, 1e-6), hi, decades)
    ignored = [k for k in ("tensors", "params") if r[k] is not None and k not in used.split("+")]
    return {"seconds": seconds, "interval": [max(0.0, lo), hi], "model": used, "extrapolates": bool(reasons),
            "extrapolation": reasons, "ignored": ignored}


# -- VM start-up --------------------------------------------------------------------------------

def norm_gpu(name: str) -> str:
    """An accelerator as start-up groups key it: the catalogue's name, else the text lower-cased."""
    from .. import catalog

    try:
        return catalog.lookup(name).name
    except AnalyticsError:
        return " ".join(name.lower().split())


def startup_rows(con: duckdb.DuckDBPyConnection, live: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Imported starts in phases; live lives measured launch to ready, as totals (``live``:
    ``vm_startups``' groups with their per-life totals)."""
    out = []
    for region, purchase, gpu, prov, stag, boot in con.execute(
        """SELECT region, purchase, gpu_type, provisioning_s, staging_s, booting_s FROM startup_records
           ORDER BY source, line, id"""
    ).fetchall():
        out.append({"region": region, "purchase": purchase, "gpu": norm_gpu(gpu), "provisioning_s": prov,
                    "staging_s": stag, "booting_s": boot, "total": prov + stag + boot, "source": "import"})
    for key, totals in (live or {}).items():
        region, acc, purchase = key.split("/")
        for t in totals:
            out.append({"region": region, "purchase": purchase, "gpu": norm_gpu(acc), "total": t, "source": "live"})
    return out


def _groupkey(r: dict[str, Any], level: str) -> tuple[str, ...]:
    return {"group": (r["region"], r["purchase"], r["gpu"]), "kind": (r["purchase"], r["gpu"]),
            "purchase": (r["purchase"],), "all": ()}[level]


LEVELS = ("group", "kind", "purchase", "all")


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per level and key: VMs, the totals' mean and median, and each phase's median."""
    out: dict[str, dict[tuple[str, ...], dict[str, Any]]] = {lv: {} for lv in LEVELS}
    for lv in LEVELS:
        by: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for r in rows:
            by.setdefault(_groupkey(r, lv), []).append(r)
        for k, rs in by.items():
            tot = np.array([r["total"] for r in rs])
            s: dict[str, Any] = {"n": len(rs), "mean": float(tot.mean()), "median": float(np.median(tot))}
            for p in PHASES:
                v = [r[p] for r in rs if p in r]
                s[p] = (float(np.median(v)), len(v)) if v else None
            out[lv][k] = s
    return out


def _first(st: dict[str, Any], r: dict[str, Any], levels: tuple[str, ...], need: str | None = None) -> tuple[dict[str, Any], str] | None:
    for lv in levels:
        s = st[lv].get(_groupkey(r, lv))
        if s is not None and (need is None or s.get(need) is not None):
            return s, lv
    return None


def _predict_startup(st: dict[str, Any], family: str, r: dict[str, Any], k: float) -> tuple[float, str]:
    """(seconds, the level the VM's group came from)."""
    if family in ("group-mean", "group-median"):
        s, lv = _first(st, r, LEVELS)  # type: ignore[misc]
        return s["mean" if family == "group-mean" else "median"], lv
    got = _first(st, r, LEVELS, "staging_s")
    if got is None:  # no phases anywhere near: totals only
        s, lv = _first(st, r, LEVELS)  # type: ignore[misc]
        return s["median"], lv
    g, lv = got
    stag, n = g["staging_s"]
    pool = _first(st, r, LEVELS[1:] if lv == "group" else LEVELS[LEVELS.index(lv):], "staging_s")
    if pool is not None and k > 0:
        stag = (n * stag + k * pool[0]["staging_s"][0]) / (n + k)
    prov = st["all"][()]["provisioning_s"][0]
    boot = _first(st, r, LEVELS[1:], "booting_s")[0]["booting_s"][0]  # type: ignore[index]
    return prov + stag + boot, lv


def fit_startup(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if len(rows) < 3:
        raise AnalyticsError(f"vm start-up: needs at least 3 VM starts, has {len(rows)} "
                             "(analyze import startups FILE.csv loads some)")
    y = np.array([r["total"] for r in rows])
    cands = [("group-mean", 0.0), ("group-median", 0.0)]
    if any("staging_s" in r for r in rows):
        cands += [("phase-median", k) for k in SHRINK_K]
    tried: dict[str, Any] = {}
    for family, k in cands:
        preds = np.empty(len(rows))
        for i, r in enumerate(rows):  # leave one VM out
            preds[i] = _predict_startup(_stats(rows[:i] + rows[i + 1:]), family, r, k)[0] if len(rows) > 1 else y[i]
        ape = np.abs(preds - y) / y
        name = family if family != "phase-median" else f"phase-median k={k:g}"
        tried[name] = {"family": family, "k": k, "mape": float(ape.mean()), "preds": preds, "rel": y / preds - 1, "ape": ape}
    best = min((n for n in tried if n != "group-mean"), key=lambda n: tried[n]["mape"])
    t = tried[best]
    st = _stats(rows)
    groups = {"/".join(key): {"n": s["n"], "mean": s["mean"], "median": s["median"],
                               **{p: s[p][0] for p in PHASES if s.get(p)}} for key, s in st["group"].items()}
    gk = np.array(["/".join(_groupkey(r, "group")) for r in rows])
    return {
        "family": t["family"], "shrink_k": t["k"],
        "rows": [{k: r.get(k) for k in ("region", "purchase", "gpu", *PHASES, "total")} for r in rows],
        "groups": groups,
        "interval_factors": [float(np.quantile(t["rel"], 0.025)), float(np.quantile(t["rel"], 0.975))],
        "cv": {"mape": t["mape"], "families": {n: v["mape"] for n, v in tried.items()}, "baseline": "group-mean",
               "rows": len(rows), "groups": len(groups),
               "imported": sum(r["source"] == "import" for r in rows), "live": sum(r["source"] == "live" for r in rows),
               "held_out": [[str(a), float(b), float(c)] for a, b, c in zip(gk, y, t["preds"], strict=True)][:500],
               "worst": worst((str(x), float(t["ape"][gk == x].mean())) for x in sorted(set(gk)))},
    }


def predict_startup(m: dict[str, Any], region: str, purchase: str, gpu_type: str) -> dict[str, Any]:
    """Seconds from a VM request to the guest ready, its interval, per-phase figures, and
    whether the group was measured."""
    rows = m["rows"]
    r = {"region": region.strip().lower(), "purchase": purchase, "gpu": norm_gpu(gpu_type)}
    st = _stats([{k: v for k, v in x.items() if v is not None} for x in rows])
    seconds, lv = _predict_startup(st, m["family"], r, m.get("shrink_k", 0.0))
    lo_f, hi_f = m["interval_factors"]
    lo, hi = seconds * (1 + lo_f), seconds * (1 + hi_f)
    reasons = []
    if lv != "group":
        what = {"kind": f"{purchase} {r['gpu']} in other regions", "purchase": f"{purchase} VMs of other accelerators",
                "all": "all VMs"}[lv]
        reasons.append(f"no {r['region']}/{purchase}/{r['gpu']} start-ups measured: from {what}")
        from .ranges import widen

        lo, hi = widen(seconds, max(lo, 1e-6), hi, 0.5)
    g = st["group"].get(_groupkey(r, "group"))
    phases = {p: g[p][0] for p in PHASES if g and g.get(p)} if g else {}
    return {"seconds": seconds, "interval": [max(0.0, lo), hi], "extrapolates": bool(reasons), "extrapolation": reasons,
            "group_vms": g["n"] if g else 0, "phases_median": phases}
