"""checkpoint_overhead: checkpoint saves that take a large share of a job's wall time, with
the interval that balances them against the revocation rate (Young/Daly)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import duckdb

from cmdare.wire.plugin import Option, Requirement

from .. import catalog
from ..units import DETECTORS, Detector, Finding, Scope
from . import evidence


def mtbf_hours(curve: dict[str, Any]) -> float | None:
    """Mean time between revocations of a Kaplan-Meier curve: the area under it to its last
    time over the share revoked by then (exact for a constant hazard)."""
    times, surv = curve.get("times") or [], curve.get("surv") or []
    if not times:
        return None
    area, prev_t, prev_s = 0.0, 0.0, 1.0
    for t, s in zip(times, surv, strict=False):
        area += (t - prev_t) * prev_s
        prev_t, prev_s = t, s
    gone = 1.0 - prev_s
    return area / gone if gone > 0 else None


FEW_SAVES = 5  # a job with fewer saves has its Young/Daly interval from the overhead fit's save time


def young_daly_seconds(save_seconds: float, mtbf_seconds: float) -> float:
    """The checkpoint interval that balances save time against work lost to failures."""
    return math.sqrt(2.0 * save_seconds * mtbf_seconds)


def _fmt(seconds: float) -> str:
    d = dt.timedelta(seconds=seconds)
    if d >= dt.timedelta(minutes=90):
        return f"{d / dt.timedelta(hours=1):.1f} h"
    if d >= dt.timedelta(seconds=90):
        return f"{d / dt.timedelta(minutes=1):.0f} min"
    return f"{seconds:.0f} s"


@DETECTORS.register
class CheckpointOverhead(Detector):
    name = "checkpoint_overhead"
    ORDER = 70  # where analyze bottlenecks runs and lists it
    FINDS = "checkpoint overhead"
    ACTION = 'checkpoint every {young_daly_interval_seconds} s (Young/Daly for the measured save time and revocation rate) instead of every {interval_seconds} s'  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        "max_share": Option("float", 0.05, "share of wall time spent saving checkpoints above which a job is reported", lo=0, hi=1),
        "critical_share": Option("float", 0.25, "share that makes it critical", lo=0, hi=1),
        "default_mtbf": Option("duration", 86400.0, "mean time between revocations assumed where no lifetime fit covers the job's VMs"),
        "min_saves": Option("int", 2, "saves a job needs before it is judged", lo=1),
    }
    REQUIRES = (Requirement("table", "checkpoints"), Requirement("table", "steps"))

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        where, params = scope.where(ts="c.ts", job="c.job")
        s = evidence.spans(con, scope)
        rows = con.execute(
            f"""WITH per_rank AS (
                    SELECT job, coalesce(rank, 0) AS rank, count(*) AS saves, sum(seconds) AS secs,
                           min(ts) AS first, max(ts) AS last
                    FROM checkpoints c WHERE action = 'save' AND coalesce(ok, true) AND seconds > 0 AND {where}
                    GROUP BY ALL),
                wall AS (SELECT job, min(t0) AS t0, max(t1) AS t1 FROM {s} GROUP BY job)
                SELECT p.job, arg_max(p.saves, p.secs), max(p.secs), w.t0, w.t1
                FROM per_rank p JOIN wall w USING (job) GROUP BY p.job, w.t0, w.t1 ORDER BY p.job""",
            params,
        ).fetchall()
        if not rows:
            return []
        fit = evidence.latest_fit(con, "lifetime")
        over = evidence.latest_fit(con, "overhead")
        out = []
        for job, saves, secs, t0, t1 in rows:
            wall = (t1 - t0).total_seconds()  # the span of its steps (never empty: joined above)
            if saves < o["min_saves"] or wall <= 0:  # one step record without an interval: no wall time
                continue
            share = secs / wall
            if share < o["max_share"]:
                continue
            mean_save = secs / saves
            mtbf, mtbf_from, fits = self._mtbf(con, job, fit)
            if mtbf is None:
                mtbf, mtbf_from = o["default_mtbf"], "assumed (default_mtbf)"
            fitted = self._fitted_save(con, job, over)
            save_for_interval, save_from = mean_save, "measured"
            if fitted is not None and saves < FEW_SAVES:  # a few saves: the fit over many models says more
                save_for_interval, save_from = fitted, f"overhead fit {over['fit_id']}"  # type: ignore[index]
                fits = (*fits, over["fit_id"])  # type: ignore[index]
            best = young_daly_seconds(save_for_interval, mtbf)
            every = wall / saves
            out.append(
                Finding(
                    self.name,
                    job,
                    f"checkpoint saves take {share:.0%} of wall time ({saves} saves of {mean_save:.1f} s, every "
                    f"{_fmt(every)}); with {_fmt(mtbf)} between revocations ({mtbf_from}) save every {_fmt(best)}",
                    severity="critical" if share >= o["critical_share"] else "warning",
                    confidence=0.9 if fits else 0.75,
                    evidence={
                        "save_share": round(share, 4),
                        "saves": int(saves),
                        "mean_save_seconds": round(mean_save, 3),
                        "interval_seconds": round(every, 1),
                        "mtbf_seconds": round(mtbf, 1),
                        "mtbf_from": mtbf_from,
                        "young_daly_interval_seconds": round(best, 1),
                        "young_daly_save_seconds_from": save_from,
                        **({"fitted_save_seconds": round(fitted, 3)} if fitted is not None else {}),
                        "share_at_young_daly": round(mean_save / best, 4),
                    },
                    window_start=t0,
                    window_end=t1,
                    fit_ids=fits,
                )
            )
        return out

    def _fitted_save(self, con: duckdb.DuckDBPyConnection, job: str, over: dict[str, Any] | None) -> float | None:
        """The overhead fit's save time for this job's checkpoints (their mean size, the job's
        declared tensors), where the fit has a save model and the size is inside its range."""
        m = (over or {}).get("model", {}).get("checkpoint_save")
        if not m:
            return None
        size, tensors = con.execute(
            """SELECT avg(bytes) / 1e6, (SELECT arg_max(tensors, ts) FROM jobs WHERE job = $job)
               FROM checkpoints WHERE job = $job AND action = 'save' AND bytes > 0""", {"job": job}).fetchall()[0]
        if not size:
            return None
        from ..models.overhead_records import predict_save

        p = predict_save(m, float(size), int(tensors) if tensors else None)
        return None if p["extrapolates"] else float(p["seconds"])

    def _mtbf(
        self, con: duckdb.DuckDBPyConnection, job: str, fit: dict[str, Any] | None
    ) -> tuple[float | None, str, tuple[str, ...]]:
        """MTBF (seconds) of the job's VMs from the lifetime fit's curve for their region and
        accelerator (the first of its nodes with a curve)."""
        if fit is None:
            return None, "", ()
        from ..models.lifetime import _group_key

        cat = catalog.load()
        curves = fit["model"].get("curves", {})
        for region, acc in con.execute(
            """SELECT arg_max(i.region, i.ts), arg_max(i.accelerator, i.ts) FROM instance_identity i
               WHERE i.node IN (SELECT node FROM steps WHERE job = ?) GROUP BY i.node ORDER BY i.node""",
            [job],
        ).fetchall():
            key = "/".join(_group_key(region, acc, cat))
            if key in curves:
                h = mtbf_hours(curves[key])
                if h:
                    return dt.timedelta(hours=h).total_seconds(), f"lifetime fit, {key}", (fit["fit_id"],)
        return None, "", ()
