"""Overhead and VM-lifetime models (see perfmodel for the speed models).

Overhead: checkpoint save and restore time against checkpoint size (OLS per action,
seconds = a + b * GB, held-out error leaving one model architecture out); time to resume
after a revocation (notice to the job's next step, on any node); VM start-up (boot to
the agent's first start in that life) by region, accelerator and spot flag: means with
95 % t intervals.

Lifetime: Kaplan-Meier survival of spot / preemptible VM lives per (region,
accelerator) (statsmodels ``SurvfuncRight``); a life ending 'revoked' is an event, every
other life (alive, stopped by its owner, lost to a crash) is censored at its last sign of
life.  With two groups or more, a Cox proportional-hazards fit (``PHReg``) gives the
hazard ratios of regions and accelerators.  P(revoked within H hours) = 1 - S(H), with a
log(-log) interval from Greenwood's standard error.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb
import numpy as np

from . import catalog
from .db import AnalyticsError
from .perfmodel import ALPHA, Fit, Linear, logo_cv
from .queries import needs_schema


def _mean_ci(xs: list[float]) -> dict[str, float]:
    from scipy import stats

    a = np.asarray(xs, dtype=float)
    m = float(a.mean())
    if len(a) < 2:
        return {"n": len(a), "mean": m, "lower": float("nan"), "upper": float("nan")}
    h = float(stats.t.ppf(1 - ALPHA / 2, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))
    return {"n": len(a), "mean": m, "median": float(np.median(a)), "lower": m - h, "upper": m + h}


def fit_overhead(con: duckdb.DuckDBPyConnection) -> Fit:
    needs_schema(con, 4, "analyze fit overhead")
    rows = con.execute(
        """WITH m AS (SELECT job, arg_max(model, ts) AS model FROM jobs GROUP BY job)
           SELECT c.action, c.seconds, c.bytes / 1e9, coalesce(m.model, c.job), c.ts
           FROM checkpoints c LEFT JOIN m USING (job)
           WHERE c.ok AND c.bytes > 0 AND c.seconds > 0"""
    ).fetchall()
    model: dict[str, Any] = {"checkpoint": {}, "coefficients": {}}
    cv_all: dict[str, Any] = {}
    notes = []
    for action in ("save", "restore"):
        r = [x for x in rows if x[0] == action]
        groups = sorted({x[3] for x in r})
        if len(r) < 5 or len(groups) < 3:
            notes.append(
                f"checkpoint {action}: needs at least 5 timings from 3 model architectures, "
                f"the database has {len(r)} from {len(groups)}"
            )
            continue
        X = np.array([[x[2], 1.0] for x in r])
        y = np.array([x[1] for x in r])
        cols = ["gb", "const"]
        cv = logo_cv(X, y, [x[3] for x in r], cols, False)
        lin = Linear.fit(X, y, cols)
        model["checkpoint"][action] = lin.__dict__
        model["coefficients"][f"{action}_seconds_per_gb"] = lin.params[0]
        model["coefficients"][f"{action}_fixed_seconds"] = lin.params[1]
        cv_all[action] = {"mape": cv["mape"], "r2": cv["r2"], "rows": len(r), "groups": len(groups)}
    resume = con.execute(
        """SELECT epoch(min(s.ts - to_microseconds(CAST(s.steps / nullif(s.steps_per_second, 0) * 1e6 AS BIGINT)))
                        - r.ts)
           FROM revocations r JOIN steps s0 ON s0.node = r.node AND s0.ts BETWEEN r.ts - INTERVAL 60 SECOND AND r.ts
           JOIN steps s ON s.job = s0.job AND s.ts > r.ts AND s.run <> s0.run
           WHERE r.revokes GROUP BY r.id, r.ts"""
    ).fetchall()
    if resume:
        model["resume_after_revocation_seconds"] = _mean_ci([x[0] for x in resume if x[0] is not None])
    restart = con.execute(
        """WITH r AS (
               SELECT job, run, min(epoch(ts) - coalesce(steps / nullif(steps_per_second, 0), 0)) AS first_t,
                      max(epoch(ts)) AS last_t
               FROM steps GROUP BY job, run),
           g AS (SELECT job, first_t - lag(last_t) OVER (PARTITION BY job ORDER BY first_t) AS gap FROM r)
           SELECT gap FROM g WHERE gap > 0"""
    ).fetchall()
    if restart:
        # any restart of a job (a new run): previous run's last step to the new run's first
        model["resume_after_restart_seconds"] = _mean_ci([x[0] for x in restart])
    starts = con.execute(
        """WITH s AS (
               SELECT node, round(boot_time) AS boot, min(epoch(ts)) - any_value(boot_time) AS secs
               FROM lifecycle_events WHERE event = 'agent_start' GROUP BY node, round(boot_time))
           SELECT coalesce(l.region, '?'), coalesce(l.accelerator, '?'), coalesce(l.spot, false), s.secs
           FROM s JOIN instance_lives() l ON l.node = s.node AND round(epoch(l.boot_time)) = s.boot
           WHERE s.secs >= 0"""
    ).fetchall()
    if starts:
        by: dict[str, list[float]] = {}
        for region, acc, spot, secs in starts:
            by.setdefault(f"{region}/{acc}/{'spot' if spot else 'on-demand'}", []).append(secs)
        model["vm_startup_seconds"] = {k: _mean_ci(v) for k, v in sorted(by.items())}
    if (
        not model["checkpoint"]
        and "resume_after_revocation_seconds" not in model
        and not starts
        and not restart
    ):
        raise AnalyticsError(
            "the overhead fit found no checkpoint timings, revocations or VM starts; " + "; ".join(notes)
        )
    cv = {
        "mape": cv_all.get("save", cv_all.get("restore", {})).get("mape"),
        "r2": cv_all.get("save", cv_all.get("restore", {})).get("r2"),
        "by_action": cv_all,
    }
    ts = [x[4] for x in rows]
    return Fit(
        "overhead",
        "ols-size+means",
        model,
        len(rows),
        len({x[3] for x in rows}),
        cv,
        min(ts) if ts else None,
        max(ts) if ts else None,
        ["gb", "const"],
        notes=notes,
    )


def predict_checkpoint(fit: dict[str, Any], action: str, gb: float) -> tuple[float, float, float]:
    m = fit["model"]["checkpoint"].get(action)
    if m is None:
        raise AnalyticsError(f"the overhead fit {fit['fit_id']} has no checkpoint {action} model")
    mean, lo, hi = Linear(**m).predict(np.array([gb, 1.0]))
    return mean, max(0.0, lo), hi


# -- lifetimes ----------------------------------------------------------------------------
def _group_key(region: str | None, accel: str | None, cat: dict[str, catalog.Accelerator]) -> tuple[str, str]:
    acc = "?"
    if accel:
        try:
            acc = catalog.lookup(accel, cat).name
        except AnalyticsError:
            acc = accel
    return (region or "?", acc)


def fit_lifetime(con: duckdb.DuckDBPyConnection, lost_after: float = 3) -> Fit:
    import statsmodels.api as sm

    needs_schema(con, 4, "analyze fit lifetime")
    rows = con.execute(
        """SELECT node, region, accelerator, lifetime_seconds / 3600.0, end_reason = 'revoked', boot_time, last_seen
           FROM instance_lives(lost_after := ?) WHERE spot AND lifetime_seconds > 0""",
        [lost_after],
    ).fetchall()
    events = sum(1 for r in rows if r[4])
    if len(rows) < 10 or events < 3:
        raise AnalyticsError(
            f"the lifetime fit needs at least 10 spot VM lives with 3 revocations; the database has "
            f"{len(rows)} lives with {events} revocations (spot lives come from the agent's cloud source)"
        )
    cat = catalog.load()
    groups: dict[str, dict[str, list]] = {}
    for _node, region, acc, hours, ev, _, _ in rows:
        k = "/".join(_group_key(region, acc, cat))
        g = groups.setdefault(k, {"t": [], "e": []})
        g["t"].append(hours)
        g["e"].append(1 if ev else 0)
    curves = {}
    for k, g in sorted(groups.items()):
        sf = sm.SurvfuncRight(np.array(g["t"]), np.array(g["e"]))
        curves[k] = {
            "n": len(g["t"]),
            "events": int(sum(g["e"])),
            "times": [float(x) for x in sf.surv_times],
            "surv": [float(x) for x in sf.surv_prob],
            "se": [float(x) for x in sf.surv_prob_se],
            "median_hours": None if not np.isfinite(sf.quantile(0.5)) else float(sf.quantile(0.5)),
        }
    model: dict[str, Any] = {"curves": curves, "coefficients": {}}
    notes = []
    if len(groups) >= 2:
        import pandas as pd

        df = pd.DataFrame(
            [
                {
                    "t": r[3],
                    "e": int(r[4]),
                    **dict(zip(("region", "acc"), _group_key(r[1], r[2], cat), strict=False)),
                }
                for r in rows
            ]
        )
        covs = pd.get_dummies(df[["region", "acc"]], drop_first=True, dtype=float)
        covs = covs.loc[:, covs.std() > 0]
        if covs.shape[1]:
            try:
                ph = sm.PHReg(df["t"].to_numpy(), covs.to_numpy(), status=df["e"].to_numpy()).fit()
                model["coefficients"] = {
                    f"hazard_ratio[{c}]": float(math.exp(b))
                    for c, b in zip(covs.columns, ph.params, strict=False)
                }
                model["phreg"] = {
                    "columns": list(covs.columns),
                    "params": [float(x) for x in ph.params],
                    "bse": [float(x) for x in ph.bse],
                }
            except Exception as e:  # a degenerate design (e.g. a group without events)
                notes.append(f"PHReg not fitted: {type(e).__name__}: {e}")
    cv = {
        "mape": None,
        "r2": None,
        "lives": len(rows),
        "revoked": events,
        "censored": len(rows) - events,
        **_heldout_brier(rows, cat),
    }
    return Fit(
        "lifetime",
        "kaplan-meier",
        model,
        len(rows),
        len(groups),
        cv,
        min(r[5] for r in rows),
        max(r[6] for r in rows),
        ["region", "accelerator"],
        notes=notes,
    )


def _km_at(times: np.ndarray, status: np.ndarray, h: float) -> float:
    """Kaplan-Meier S(h) (1 without data)."""
    import statsmodels.api as sm

    if len(times) == 0 or status.sum() == 0:
        return 1.0
    sf = sm.SurvfuncRight(times, status)
    s = 1.0
    for t, v in zip(sf.surv_times, sf.surv_prob, strict=True):
        if t <= h:
            s = float(v)
    return s


def _heldout_brier(rows: list[tuple], cat: dict[str, catalog.Accelerator], folds: int = 5) -> dict[str, Any]:
    """Held-out error of P(revoked within H) at H = the median observed lifetime: five
    folds by VM (a VM's life is never in both), the Brier score over the test lives whose
    outcome at H is known (revoked by H, or seen alive past H), against the same score of
    one pooled curve without groups (skill > 0: the groups help)."""
    keys = np.array(["/".join(_group_key(r[1], r[2], cat)) for r in rows])
    t = np.array([r[3] for r in rows], dtype=float)
    e = np.array([1 if r[4] else 0 for r in rows])
    h = float(np.median(t))
    fold = np.arange(len(rows)) % folds
    np.random.default_rng(0).shuffle(fold)
    err, err_pooled, n = 0.0, 0.0, 0
    for k in range(folds):
        test, train = fold == k, fold != k
        pooled = 1 - _km_at(t[train], e[train], h)
        by = {g: 1 - _km_at(t[train & (keys == g)], e[train & (keys == g)], h) for g in set(keys[test])}
        for i in np.flatnonzero(test):
            if e[i] and t[i] <= h:
                y = 1.0
            elif t[i] > h:
                y = 0.0
            else:
                continue  # censored before H: outcome unknown
            err += (by[keys[i]] - y) ** 2
            err_pooled += (pooled - y) ** 2
            n += 1
    if n == 0:
        return {}
    b, bp = err / n, err_pooled / n
    return {
        "horizon_hours": h,
        "brier": b,
        "brier_pooled": bp,
        "brier_skill": 1 - b / bp if bp else None,
        "scored_lives": n,
        "folds": folds,
    }


def predict_revocation(fit: dict[str, Any], region: str, gpu: str, hours: float) -> dict[str, Any]:
    cat = catalog.load()
    key = "/".join(_group_key(region, gpu, cat))
    curves = fit["model"]["curves"]
    if key not in curves:
        raise AnalyticsError(
            f"no lifetime curve for region {region!r} and accelerator {gpu!r} in fit {fit['fit_id']} "
            f"(it has: {', '.join(sorted(curves))})"
        )
    c = curves[key]
    s, se = 1.0, 0.0
    for t, sv, e in zip(c["times"], c["surv"], c["se"], strict=False):
        if t <= hours:
            s, se = sv, e
    from scipy import stats

    z = float(stats.norm.ppf(1 - ALPHA / 2))
    if 0 < s < 1 and se > 0:
        ll = math.log(-math.log(s))
        h = z * se / abs(s * math.log(s))
        s_lo, s_hi = math.exp(-math.exp(ll + h)), math.exp(-math.exp(ll - h))
    elif s >= 1:  # no revocation seen this early: an upper bound from the lives at risk
        s_lo, s_hi = ALPHA ** (1.0 / max(1, c["n"])), 1.0
    else:
        s_lo, s_hi = 0.0, 0.0
    return {
        "probability": 1 - s,
        "lower": 1 - s_hi,
        "upper": 1 - s_lo,
        "group": key,
        "lives": c["n"],
        "revocations": c["events"],
    }
