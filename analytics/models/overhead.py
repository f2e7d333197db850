"""The overhead model: checkpoint save and restore time against checkpoint size (OLS per action,
seconds = a + b * GB, held-out error leaving one model architecture out); time to resume
after a revocation (notice to the job's next step, on any node); VM start-up by region,
accelerator and spot flag, in the phases the VM and the cloud report (``STARTUP_PHASES``):
means with 95 % t intervals.

VM start-up is measured, never inferred: "ready" is the agent's first start in a life only
when systemd was still booting the VM (``during_boot``: an agent started by hand hours later
says nothing about start-up), "launched" is the cloud's own launch time where its metadata
gives one (AWS ``pendingTime``). A life with neither is left out and counted.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb
import numpy as np

from ..db import AnalyticsError
from ..queries import needs_schema
from .regression import ALPHA, Fit, Linear, logo_cv


def _mean_ci(xs: list[float]) -> dict[str, Any]:
    from scipy import stats

    a = np.asarray(xs, dtype=float)
    m = float(a.mean())
    if len(a) < 2:  # one sample: no interval (None, never NaN or a zero width)
        return {"n": len(a), "mean": m, "median": m, "lower": None, "upper": None}
    h = float(stats.t.ppf(1 - ALPHA / 2, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))
    return {"n": len(a), "mean": m, "median": float(np.median(a)), "lower": m - h, "upper": m + h}


def _live_checkpoints(rows: list[Any], model: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Save and restore seconds on checkpoint size from the agents' own timings (leave one
    model architecture out), into ``model``; their cross-validation and notes."""
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
    return cv_all, notes


def fit_overhead(con: duckdb.DuckDBPyConnection) -> Fit:
    needs_schema(con, 4, "analyze fit overhead")
    rows = con.execute(
        """WITH m AS (SELECT job, arg_max(model, ts) AS model FROM jobs GROUP BY job)
           SELECT c.action, c.seconds, c.bytes / 1e9, coalesce(m.model, c.job), c.ts
           FROM checkpoints c LEFT JOIN m USING (job)
           WHERE c.ok AND c.bytes > 0 AND c.seconds > 0"""
    ).fetchall()
    model: dict[str, Any] = {"checkpoint": {}, "coefficients": {}}
    cv_all, notes = _live_checkpoints(rows, model)
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
    whole: dict[str, list[float]] = {}
    starts, left_out = vm_startups(con, whole)
    if starts:
        model["vm_startup_seconds"] = starts
    from .overhead_records import checkpoint_rows, fit_checkpoint, fit_startup, startup_rows

    if ckpt_rows := checkpoint_rows(con):
        try:
            model["checkpoint_save"] = fit_checkpoint(ckpt_rows)
        except AnalyticsError as e:  # says the same as the live-only fit's note, and what to import
            notes = [n for n in notes if not n.startswith("checkpoint save: needs")] + [str(e)]
    if vm_rows := startup_rows(con, whole):
        try:
            model["vm_startup"] = fit_startup(vm_rows)
        except AnalyticsError as e:
            notes.append(str(e))
    if left_out:
        notes.append(f"vm start-up: {left_out} VM lives left out: the boot did not start the agent (no systemd, "
                     "or started later by hand), so their start-up is not known")
    if (
        not model["checkpoint"]
        and "resume_after_revocation_seconds" not in model
        and not starts
        and not restart
        and "checkpoint_save" not in model
        and "vm_startup" not in model
    ):
        raise AnalyticsError(
            "the overhead fit found no checkpoint timings, revocations or VM starts "
            "(analyze import checkpoints|startups FILE.csv loads records); " + "; ".join(notes)
        )
    save = model.get("checkpoint_save", {}).get("cv") or cv_all.get("save", cv_all.get("restore", {}))
    cv = {"mape": save.get("mape"), "r2": save.get("r2"), "by_action": cv_all}
    if "checkpoint_save" in model:
        cv["checkpoint_save"] = model["checkpoint_save"]["cv"]
        cv["held_out"] = model["checkpoint_save"]["cv"]["held_out"]
        cv["worst"] = model["checkpoint_save"]["cv"]["worst"]
    if "vm_startup" in model:
        cv["vm_startup"] = model["vm_startup"]["cv"]
    family = "+".join(x for x in (
        f"save:{model['checkpoint_save']['family']}" if "checkpoint_save" in model else "save/restore:ols-size",
        f"startup:{model['vm_startup']['family']}" if "vm_startup" in model else "startup:means") if x)
    ts = [x[4] for x in rows]
    if "checkpoint_save" in model:  # the live-only size fit's shortfall is no news then
        notes = [n for n in notes if not n.startswith("checkpoint save: needs")]
    rec_rows = sum(model[p]["cv"]["imported"] for p in ("checkpoint_save", "vm_startup") if p in model)
    return Fit(
        "overhead",
        family,
        model,
        len(rows) + rec_rows,
        len({x[3] for x in rows}) + model.get("checkpoint_save", {}).get("cv", {}).get("groups", 0),
        cv,
        min(ts) if ts else None,
        max(ts) if ts else None,
        ["gb", "const"],
        notes=notes,
    )


# phase -> (what it is, the longest a phase of start-up can be: past it, it is not start-up)
STARTUP_PHASES = {
    "launch_to_boot": "the cloud's launch (AWS pendingTime) to the kernel's boot",
    "boot_to_ready": "the kernel's boot to the agent's first start, when the boot started it",
    "ready_to_first_step": "agent ready to the first training step on the VM (not part of the total: a job "
                           "may start later by choice)",
}
MAX_PHASE_SECONDS = 3600.0  # an hour: a longer "start-up" is a VM left idle, not a start


def vm_startups(con: duckdb.DuckDBPyConnection,
                totals: dict[str, list[float]] | None = None) -> tuple[dict[str, Any], int]:
    """Region/accelerator/spot -> start-up seconds (launch to ready where the cloud gives its
    launch time, else boot to ready: ``covers`` says which) with each phase's mean and
    interval; and how many lives could not be measured. ``totals``, when given, gets each
    group's launch-to-ready seconds per life (the lives measured whole)."""
    rows = con.execute(
        """WITH l AS (SELECT * FROM instance_lives()),
           st AS (SELECT s.node, s.ts - to_microseconds(CAST(coalesce(s.steps / nullif(s.steps_per_second, 0), 0)
                                                                 * 1e6 AS BIGINT)) AS first_t
                  FROM steps s WHERE s.node IN (SELECT node FROM l WHERE ready_at IS NOT NULL))
           SELECT coalesce(l.region, '?'), coalesce(l.accelerator, '?'), coalesce(l.spot, false),
                  epoch(l.boot_time) - epoch(l.launched_at), epoch(l.ready_at) - epoch(l.boot_time),
                  (SELECT epoch(min(st.first_t)) - epoch(l.ready_at) FROM st
                   WHERE st.node = l.node AND st.first_t >= l.ready_at
                     AND (l.ended_at IS NULL OR st.first_t <= l.ended_at))
           FROM l"""
    ).fetchall()
    ok = lambda x: x is not None and math.isfinite(x) and 0 <= x <= MAX_PHASE_SECONDS  # noqa: E731
    by: dict[str, dict[str, list[float]]] = {}
    left_out = 0
    for region, acc, spot, launch, boot, first in rows:
        if not ok(boot) or boot == 0:
            left_out += 1
            continue
        g = by.setdefault(f"{region}/{acc}/{'spot' if spot else 'on-demand'}",
                          {p: [] for p in STARTUP_PHASES})
        g["boot_to_ready"].append(boot)
        if ok(launch):
            g["launch_to_boot"].append(launch)
            if totals is not None:
                totals.setdefault(f"{region}/{acc}/{'spot' if spot else 'on-demand'}", []).append(launch + boot)
        if ok(first):
            g["ready_to_first_step"].append(first)
    out = {}
    for key, g in sorted(by.items()):
        phases = {p: _mean_ci(v) for p, v in g.items() if v}
        boot, launch = phases["boot_to_ready"], phases.get("launch_to_boot")
        parts = [boot] + ([launch] if launch else [])
        mean = sum(p["mean"] for p in parts)
        half = [p["upper"] - p["mean"] for p in parts if p["upper"] is not None]
        h = math.sqrt(sum(x * x for x in half)) if len(half) == len(parts) else None
        n_launch = len(g["launch_to_boot"])
        covers = ("launch to agent ready" if n_launch == boot["n"] else
                  "kernel boot to agent ready" if not n_launch else
                  f"kernel boot to agent ready, plus the cloud's launch phase from {n_launch} of {boot['n']} lives")
        out[key] = {"n": boot["n"], "mean": mean, "median": boot["median"] + (launch["median"] if launch else 0.0),
                    "lower": None if h is None else max(0.0, mean - h), "upper": None if h is None else mean + h,
                    "covers": covers, "phases": phases}
    return out, left_out


def predict_checkpoint(fit: dict[str, Any], action: str, gb: float) -> tuple[float, float, float]:
    m = fit["model"]["checkpoint"].get(action)
    if m is None:
        raise AnalyticsError(f"the overhead fit {fit['fit_id']} has no checkpoint {action} model")
    mean, lo, hi = Linear(**m).predict(np.array([gb, 1.0]))
    return mean, max(0.0, lo), hi
