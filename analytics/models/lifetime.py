"""The lifetime model: Kaplan-Meier survival of spot / preemptible VM lives per (region,
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

from .. import catalog
from ..db import AnalyticsError
from ..queries import needs_schema
from .regression import ALPHA, Fit


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
    recorded = con.execute(
        """SELECT node, region, accelerator, lifetime_seconds / 3600.0, end_reason = 'revoked', boot_time, last_seen
           FROM instance_lives(lost_after := ?) WHERE spot AND lifetime_seconds > 0""",
        [lost_after],
    ).fetchall()
    imported = _imported(con)
    rows = [(*r, "recorded") for r in recorded] + [(*r, "imported") for r in imported]
    events = sum(1 for r in rows if r[4])
    if len(rows) < 10 or events < 3:
        raise AnalyticsError(
            f"the lifetime fit needs at least 10 spot VM lives with 3 revocations; the database has "
            f"{len(rows)} lives with {events} revocations (spot lives come from the agent's cloud source, "
            "or from records: analyze import lives FILE.csv)"
        )
    cat = catalog.load()
    groups: dict[str, dict[str, list]] = {}
    for _node, region, acc, hours, ev, _, _, src in rows:
        k = "/".join(_group_key(region, acc, cat))
        g = groups.setdefault(k, {"t": [], "e": [], "src": []})
        g["t"].append(hours)
        g["e"].append(1 if ev else 0)
        g["src"].append(src)
    # each region its own curve: blending a thin region's with its accelerator's was measured
    # worse (docs/models.md, "Spot VM lives")
    curves = {k: _curve(g) for k, g in sorted(groups.items())}
    model: dict[str, Any] = {"curves": curves, "coefficients": {}, "sources": _sources([r[7] for r in rows])}
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
        "imported_lives": len(imported),
        "recorded_lives": len(recorded),
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
        min((r[5] for r in rows if r[5] is not None), default=None),
        max((r[6] for r in rows if r[6] is not None), default=None),
        ["region", "accelerator"],
        notes=notes,
    )


def _imported(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """Imported spot lives (analyze import lives), each VM once; none on an older schema."""
    from ..imports import lives

    try:
        return lives.latest(con)
    except AnalyticsError:  # a database from before the lives import: only recorded lives
        return []


def _sources(src: list[str]) -> dict[str, Any]:
    """Which lives a curve or fit stands on, in words and counts."""
    n_imp, n_rec = src.count("imported"), src.count("recorded")
    used = "both" if n_imp and n_rec else "imported" if n_imp else "recorded"
    return {"lives_used": used, "imported": n_imp, "recorded": n_rec}


def lives_summary(curves: list[dict[str, Any]]) -> dict[str, Any]:
    """Which lives the answer from these curves stands on (recommenders' assumptions)."""
    imp = sum(c.get("imported", 0) for c in curves)
    rec = sum(c.get("recorded", c["n"]) for c in curves)
    return {"lives_used": "both" if imp and rec else "imported" if imp else "recorded",
            "imported_lives": imp, "recorded_lives": rec}


def _curve(g: dict[str, list]) -> dict[str, Any]:
    import statsmodels.api as sm

    sf = sm.SurvfuncRight(np.array(g["t"]), np.array(g["e"]))
    return {
        "n": len(g["t"]),
        "events": int(sum(g["e"])),
        "times": [float(x) for x in sf.surv_times],
        "surv": [float(x) for x in sf.surv_prob],
        "se": [float(x) for x in sf.surv_prob_se],
        "median_hours": None if not np.isfinite(sf.quantile(0.5)) else float(sf.quantile(0.5)),
        # how long a fair share of the lives were followed (3, or a tenth, still observed): the
        # curve holds from its last revocation to here (lives censored later, as at a 24 h cap)
        "followed_hours": float(sorted(g["t"], reverse=True)[min(len(g["t"]), max(3, math.ceil(len(g["t"]) / 10))) - 1]),
        **_sources(g["src"]),
    }


def _step(c: dict[str, Any], t: float) -> tuple[float, float]:
    """(S(t), its standard error) of a stored curve (1, 0 before its first time)."""
    s, se = 1.0, 0.0
    for x, v, e in zip(c["times"], c["surv"], c["se"], strict=False):
        if x <= t:
            s, se = v, e
    return s, se


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
    one pooled curve without groups (skill > 0: the groups help). The lives are sorted
    first, so the folds (and the score) do not depend on the order the database returned."""
    rows = sorted(rows, key=repr)
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


def revocation_probability(c: dict[str, Any], hours: float) -> tuple[float, float, float]:
    """P(revoked within ``hours``) = 1 - S(hours) of a stored curve, with its 95 % interval
    (log(-log) from Greenwood's standard error; before any revocation, an upper bound from
    the lives at risk)."""
    s, se = _step(c, hours)
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
    return 1 - s, 1 - s_hi, 1 - s_lo


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
    p, lo, hi = revocation_probability(c, hours)
    return {
        "probability": p,
        "lower": lo,
        "upper": hi,
        "group": key,
        "lives": c["n"],
        "revocations": c["events"],
        "lives_used": c.get("lives_used", "recorded"),
        "imported_lives": c.get("imported", 0),
        "recorded_lives": c.get("recorded", c["n"]),
    }
