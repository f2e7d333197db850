"""straggler: ranks whose step time stays well above their peers'."""

from __future__ import annotations

import datetime as dt
import statistics

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..units import DETECTORS, Detector, Finding, Scope
from . import evidence


@DETECTORS.register
class Straggler(Detector):
    name = "straggler"
    ORDER = 30  # where analyze bottlenecks runs and lists it
    FINDS = "stragglers"
    ACTION = 'move the slow rank off its node, or find what else runs there (analyze host, analyze gpu --processes)'  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        "window": Option("duration", 300.0, "windows in which ranks are compared with each other"),
        "min_ranks": Option("int", 3, "ranks a job needs in a window to compare them", lo=3),
        "z": Option("float", 3.5, "robust z-score (median / MAD across the job's ranks) above which a rank is slow", lo=0),
        "min_slowdown": Option("float", 1.2, "step time over the ranks' median at least this (a noise floor)", lo=1),
        "min_spread": Option("float", 0.02, "least MAD, as a share of the median (ranks in lock-step have none)", lo=0, hi=1),
        "min_windows": Option("int", 2, "slow windows a rank needs before it is reported", lo=1),
        "persistent_share": Option("float", 0.5, "share of its windows a persistent straggler is slow in", lo=0, hi=1),
    }
    REQUIRES = (Requirement("table", "steps"),)

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        win = max(1, int(o["window"]))
        rows = self._query(con, scope, win)
        if not rows:
            return []
        hw = evidence.node_hardware(con, scope)
        out = []
        for job, rank, node, windows, slow, slowdown, zmax, typical, t0, t1, ranks in rows:
            share = slow / windows
            persistent = share >= o["persistent_share"]
            h = hw.get((job, node))
            peers = [v for (j, n), v in hw.items() if j == job and n != node]
            ev: dict[str, float | int | str | bool | None] = {
                "slowdown": round(slowdown, 3),
                "slow_windows": int(slow),
                "windows": int(windows),
                "slow_share": round(share, 3),
                "max_z": round(min(zmax, 1e6), 2),
                "ratio_all_windows": round(typical, 3),
                "ranks": int(ranks),
                "persistent": persistent,
            }
            notes = []
            if h is not None:
                ev.update(
                    gpu_util_ratio=None if h.gpu_util is None else round(h.gpu_util, 3),
                    throttled_share=None if h.throttled_share is None else round(h.throttled_share, 3),
                    host_cpu_util_ratio=None if h.cpu_util is None else round(h.cpu_util, 3),
                    xids=h.xids,
                )
                if h.throttled_share:
                    notes.append(f"GPU throttled {h.throttled_share:.0%} of the time")
                if h.xids:
                    notes.append(f"{h.xids} Xid errors")
                cpus = [p.cpu_util for p in peers if p.cpu_util is not None]
                if h.cpu_util is not None and cpus:
                    peer = statistics.median(cpus)
                    ev["peer_host_cpu_util_ratio"] = round(peer, 3)
                    if h.cpu_util - peer >= 0.2:
                        notes.append(f"host CPU {h.cpu_util:.0%} vs peers' {peer:.0%}")
            what = "persistent" if persistent else "transient"
            hw_note = f"; its node showed {', '.join(notes)}" if notes else ""
            out.append(
                Finding(
                    self.name,
                    job,
                    f"rank {rank} on {node}: {what} straggler, steps {slowdown:.2f}x its {ranks - 1} peers' median "
                    f"in {slow} of {windows} windows{hw_note}",
                    severity=("critical" if slowdown >= 2 else "warning") if persistent else "info",
                    confidence=min(0.95, 0.6 + 0.35 * share) if persistent else 0.5,
                    node=node,
                    rank=int(rank),
                    evidence=ev,
                    window_start=t0,
                    window_end=None if t1 is None else t1 + dt.timedelta(seconds=win),
                )
            )
        return out

    def _windows(self, con: duckdb.DuckDBPyConnection, scope: Scope, win: int) -> tuple[str, dict]:
        """SQL of (job, rank, node, w, t): each rank's median step time per window, and its
        parameters.  With 5-minute windows, a window of a rank held in one row of the
        ``steps_5m`` rollup (one node, one run) is read from it; the others (a rank that
        moved node or restarted inside the window, the scope's partial edges) from ``steps``."""
        raw = f"""SELECT job, coalesce(rank, 0) AS rank, any_value(node) AS node, epoch_us(ts) // {win * 1_000_000} AS w,
                         median(coalesce(1 / nullif(steps_per_second, 0), step_mean_seconds)) AS t
                  FROM steps WHERE job IS NOT NULL AND job <> '' AND steps > 0 AND {{where}}
                  GROUP BY job, coalesce(rank, 0), w"""
        if win != evidence.BUCKET_SECONDS or not evidence.has_view(con, "steps_5m"):
            where, params = evidence.named_where(scope)
            return raw.format(where=where), params
        whole, edge, params = evidence.split(scope)
        b = f"epoch_us(bucket) // {win * 1_000_000}"
        return f"""WITH r AS (
                    SELECT job, coalesce(rank, 0) AS rank, any_value(node) AS node, {b} AS w,
                           any_value(step_median) AS t, count(*) AS k
                    FROM steps_5m WHERE job IS NOT NULL AND job <> '' AND stepping_records > 0 AND {whole}
                    GROUP BY ALL),
                several AS (SELECT job, rank, w FROM r WHERE k > 1)
                SELECT job, rank, node, w, t FROM r WHERE k = 1
                UNION ALL {raw.format(where=f"(({edge}) OR (job, coalesce(rank, 0), epoch_us(ts) // {win * 1_000_000}) "
                                            "IN (SELECT (job, rank, w) FROM several))")}""", params

    def _query(self, con: duckdb.DuckDBPyConnection, scope: Scope, win: int) -> list[tuple]:
        o = self.options
        slow = f"(zs >= {float(o['z'])} AND ratio >= {float(o['min_slowdown'])})"
        windows, params = self._windows(con, scope, win)
        return con.execute(
            f"""WITH s AS ({windows}),
                m AS (
                    SELECT job, w, median(t) AS med, count(*) AS k FROM s WHERE t > 0
                    GROUP BY job, w HAVING count(*) >= {int(o['min_ranks'])}),
                d AS (
                    SELECT s.*, m.med, m.k FROM s JOIN m USING (job, w) WHERE s.t > 0),
                mad AS (SELECT job, w, median(abs(t - med)) AS mad FROM d GROUP BY job, w),
                dm AS (SELECT d.*, mad.mad FROM d JOIN mad USING (job, w)),
                sp AS (SELECT *, greatest(1.4826 * mad, {float(o['min_spread'])} * med) AS spread FROM dm),
                -- no spread at all (min_spread 0, ranks in lock-step): any slower rank is
                -- infinitely far out, the others not at all
                z AS (
                    SELECT *, t / med AS ratio,
                           CASE WHEN spread > 0 THEN (t - med) / spread
                                WHEN t > med THEN 'inf'::DOUBLE ELSE 0 END AS zs FROM sp)
                SELECT job, rank, any_value(node), count(*) AS windows,
                       count(*) FILTER {slow} AS slow, median(ratio) FILTER {slow} AS slowdown,
                       max(zs), median(ratio), make_timestamp(min(w) FILTER {slow} * {win * 1_000_000}),
                       make_timestamp(max(w) FILTER {slow} * {win * 1_000_000}), max(k)
                FROM z GROUP BY job, rank HAVING count(*) FILTER {slow} >= {int(o['min_windows'])}
                ORDER BY job, rank""",
            params,
        ).fetchall()
