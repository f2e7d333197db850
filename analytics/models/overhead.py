"""The overhead model: checkpoint save and restore time against checkpoint size (OLS per action,
seconds = a + b * GB, held-out error leaving one model architecture out); time to resume
after a revocation (notice to the job's next step, on any node); VM start-up (boot to
the agent's first start in that life) by region, accelerator and spot flag: means with
95 % t intervals.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb
import numpy as np

from ..db import AnalyticsError
from ..queries import needs_schema
from .regression import ALPHA, Fit, Linear, logo_cv


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
