"""The library calls behind the pages (cmdare.dashboards) and their API resources: the
fleet at a glance, one job over time, what to do about a job, its scaling curve, the stored
fits. cmdare.analytics.api re-exports them, where every front end finds them."""

from __future__ import annotations

import datetime as dt
from typing import Any

from .. import queries
from ..db import AnalyticsError, Database
from ..queries import needs_schema
from .findings import _known_job, bottlenecks
from .models import cluster_prediction, latest_or_none
from .recommend import recommend

# -- the fleet and one job over time (what the pages draw) ------------------------------------

def fleet_summary(db: Database, since: dt.datetime | None = None, until: dt.datetime | None = None,
                  lost_after: float = 3, with_nodes: bool = True) -> dict[str, Any]:
    """The fleet page's stat strip (cmdare.analytics.api.fleet.summary)."""
    from . import fleet

    with db.read() as con:
        return fleet.summary(con, since, until, lost_after, with_nodes, db.horizon())


def gpu_heatmap(db: Database, since: dt.datetime | None = None, until: dt.datetime | None = None,
                columns: int = 120, label: str | None = None, group: str = "auto", job: str | None = None,
                node: str | None = None) -> dict[str, Any]:
    """Mean utilisation per GPU, node or job and time bucket; ``job`` / ``node``: that
    job's (node's) GPUs only (cmdare.analytics.api.fleet.heatmap)."""
    from . import fleet

    with db.read() as con:
        return fleet.heatmap(con, since, until, columns, queries.parse_label(label), group, job, node)


def job_series(db: Database, job: str, since: dt.datetime | None = None, until: dt.datetime | None = None,
               columns: int = 120) -> dict[str, Any]:
    """One job's speed, step time and input wait over time, and its ranks slowest first."""
    from . import fleet

    with db.read() as con:
        _known_job(con, job)
        return fleet.job_series(con, job, since, until, columns)


# -- models and a job's advice (the models page, the job page) -------------------------------

def stored_fits(db: Database) -> list[dict[str, Any]]:
    """The latest stored fit of each kind: family, when, rows and groups, held-out error
    (and its split inside / outside the fitted ranges), the families tried, the groups
    predicted worst, coefficients, input ranges, and the held-out predictions against the
    measured values."""
    import json

    out = []
    with db.read() as con:
        needs_schema(con, 5, "stored fits")
        rows = con.execute(
            """SELECT kind, fit_id, family, fitted_at, rows, groups, cv_mape, cv_r2, features, coefficients, model, cv
               FROM model_fits QUALIFY row_number() OVER (PARTITION BY kind ORDER BY fitted_at DESC, fit_id DESC) = 1
               ORDER BY kind""").fetchall()
    for kind, fid, fam, at, n, g, mape, r2, feats, coefs, model, cv in rows:
        m = json.loads(model) if model else {}
        c = json.loads(cv) if cv else {}
        out.append({"kind": kind, "fit_id": fid, "family": fam, "fitted_at": at, "rows": n, "groups": g,
                    "cv_mape": mape, "cv_r2": r2, "features": json.loads(feats) if isinstance(feats, str) else feats,
                    "coefficients": json.loads(coefs) if isinstance(coefs, str) else coefs,
                    "input_ranges": m.get("input_ranges"), "families": c.get("families"), "worst": c.get("worst"),
                    "in_range": c.get("in_range"), "extrapolated": c.get("extrapolated"),
                    "held_out": c.get("held_out", [])})
    return out


def job_advice(db: Database, job: str) -> dict[str, Any]:
    """What to do about one job now: its findings (the detectors run afresh, nothing
    stored) and every recommendation they suggest, run, with its evidence and the fits it
    rests on; or why it cannot answer."""
    from .. import codec
    from ..findings import NEXT_OPTIONS

    b = bottlenecks(db, job, store=False, next_steps=True)
    recs = []
    for n in b.next:
        item: dict[str, Any] = {"kind": n.kind, "command": n.command, "ok": n.ok, "reason": n.reason or None}
        if n.ok:
            try:
                opt = NEXT_OPTIONS[n.kind][0]
                item["recommendations"] = [codec.recommendation_json(r) for r in recommend(db, n.kind, **{opt: job})]
            except AnalyticsError as e:
                item |= {"ok": False, "reason": str(e).splitlines()[0][:200]}
        recs.append(item)
    from ..detectors import DETECTORS

    answered = {n.kind for n in b.next}
    # a finding no recommender answers carries its own action (the detector's ACTION)
    actions = [{"kind": f.kind, "node": f.node, "action": DETECTORS.get(f.kind).action(f)} for f in b.findings
               if not set(f.suggests) & answered and DETECTORS.get(f.kind).ACTION]
    return {"job": job, "findings": [codec.finding_json(f) for f in b.findings], "skipped": b.skipped,
            "recommendations": recs, "actions": actions}


def scaling_curve(db: Database, job: str) -> dict[str, Any]:
    """Cluster steps/s against workers for ``job``'s model on its accelerator and PS count:
    the runs measured (every job of that model, accelerator and PS count), and the cluster
    fit's prediction from this job with its interval (and where it extrapolates), for 1 ..
    twice the most workers measured (at least 8)."""
    from .. import models

    with db.read() as con:
        _known_job(con, job)
        # the jobs of the same model (as declared; the accelerator is matched below, through
        # the catalogue's names), not every job's steady state
        peers = [j for (j,) in con.execute(
            """WITH d AS (SELECT job, arg_max(model, ts) AS m FROM jobs GROUP BY job)
               SELECT job FROM d WHERE m IS NOT DISTINCT FROM (SELECT m FROM d WHERE job = ?)""", [job]).fetchall()]
        speeds, _ = models.job_speeds(con, jobs=peers or [job])
        me = next((j for j in speeds if j.job == job), None)
        if me is None:
            return {"job": job, "measured": [], "predicted": [], "note": "no steady speed for this job yet"}
        same = sorted((j for j in speeds if j.model == me.model and j.accelerator == me.accelerator
                       and j.ps == me.ps), key=lambda j: (j.workers, j.job))
        cfit = latest_or_none(con, "cluster")
        measured = [{"job": j.job, "workers": j.workers, "steps_per_second": round(j.speed, 4)} for j in same]
        out: dict[str, Any] = {"job": job, "model": me.model, "accelerator": me.accelerator, "ps": me.ps,
                               "measured": measured, "predicted": []}
        if cfit is None or me.ps < 1:
            out["note"] = ("no cluster fit: analyze fit cluster (with parameter-server runs of 3 architectures)"
                           if me.ps >= 1 else "not a parameter-server job: the cluster fit does not apply")
            return out
        top = max(8, 2 * max(j.workers for j in same))
        cache: dict[str, Any] = {}  # the fits and the job's anchor: once for every worker count
        for w in range(1, top + 1):
            try:
                p = cluster_prediction(con, [("", w)], me.ps, None, job, cache=cache)
            except AnalyticsError as e:
                out["note"] = str(e).splitlines()[0][:200]
                break
            out["predicted"].append({"workers": w, "steps_per_second": p["prediction"], "interval": p["interval"],
                                     "extrapolated": bool(p.get("extrapolated"))})
            out["fit_id"] = p["fit_id"]
    return out
