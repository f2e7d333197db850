"""gpu_throttled: GPUs that spend a share of their time throttled, and what it costs the job.

Throttled means a reason bit in NVML's clocks-event mask (the idle bit aside) *and*, where
the GPU also ran unthrottled in the window, an SM clock at least ``min_clock_drop`` below
its clock then: a reason bit alone (``sw_power_cap`` set while the clock stays at 100 %)
is no slowdown and no finding."""

from __future__ import annotations

import datetime as dt
import functools
import operator

import duckdb

from cmdare.wire.events import THROTTLE_BITS
from cmdare.wire.plugin import Option, Requirement

from ..units import DETECTORS, Detector, Finding, Scope
from ..verdicts import GPU_IDLE_BIT, throttled_sql
from . import evidence
from .evidence import BUCKET_SECONDS


def reasons(mask: int | None) -> str:
    """The NVML reason names in a clocks-event mask (the idle bit left out)."""
    if not mask:
        return ""
    return ",".join(name for bit, name in THROTTLE_BITS.items() if mask & bit and bit != GPU_IDLE_BIT)


@DETECTORS.register
class GpuThrottled(Detector):
    name = "gpu_throttled"
    ORDER = 50  # where analyze bottlenecks runs and lists it
    FINDS = "throttled GPUs"
    ACTION = "check the node's cooling and power limit (nvidia-smi -q -d PERFORMANCE) or move the job off it"  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        "min_share": Option("float", 0.2, "share of a GPU's samples throttled at which it is reported", lo=0, hi=1),
        "min_samples": Option("int", 30, "samples with a throttle mask a GPU needs before it is judged", lo=1),
        "critical_slowdown": Option("float", 1.3, "step-time slowdown while throttled that makes it critical", lo=1),
        "min_clock_drop": Option("float", 0.05, "how far the SM clock while throttled must fall below its clock "
                                 "while not (a share) for a reason bit to count as throttling", lo=0, hi=1),
    }
    REQUIRES = (Requirement("table", "gpu_samples"), Requirement("table", "steps"))

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        g = evidence.gpu_summary(con, scope)
        rows = con.execute(
            f"""SELECT job, node, "index", sum(thr_n) / sum(mask_n) AS share, sum(mask_n),
                       bit_or(thr_mask), min(thr_b0), max(thr_b1)
                FROM {g} WHERE job IS NOT NULL GROUP BY job, node, "index"
                HAVING sum(mask_n) >= {int(o['min_samples'])} AND sum(thr_n) > 0
                   AND sum(thr_n) / sum(mask_n) >= {float(o['min_share'])}
                ORDER BY job, node, "index" """
        ).fetchall()
        if not rows:
            return []
        clocks = self._clocks(con, scope, sorted({r[1] for r in rows}))
        by_node: dict[tuple[str, str], list[tuple]] = {}
        for r in rows:
            by_node.setdefault((r[0], r[1]), []).append(r)
        out = []
        slowdowns = self._slowdowns(con, scope, evidence.job_gpus(con, scope, sorted({n for _, n in by_node})),
                                    list(by_node))
        for (job, node), rs in by_node.items():
            slow, slow_from = slowdowns.get((job, node), (None, None))
            share = sum(r[3] * r[4] for r in rs) / sum(r[4] for r in rs)
            mask = functools.reduce(operator.or_, (r[5] for r in rs))  # each GPU here was throttled
            clk = [(a, b) for r in rs for a, b in [clocks.get((node, r[2]), (None, None))] if a and b]
            clock_ratio = sum(a / b for a, b in clk) / len(clk) if clk else None
            if clock_ratio is not None and clock_ratio > 1 - o["min_clock_drop"]:
                continue  # a reason bit (sw_power_cap at the limit it never reaches) with the clock where it was
            why = reasons(mask) or "unknown reason"
            effect = f"; steps {slow:.2f}x slower than {slow_from}" if slow is not None else ""
            out.append(
                Finding(
                    self.name,
                    job,
                    f"{len(rs)} GPUs on {node} throttled {share:.0%} of the time ({why})"
                    + (f", SM clock at {clock_ratio:.0%}" if clock_ratio else "")
                    + effect,
                    severity="critical" if slow is not None and slow >= o["critical_slowdown"] else "warning",
                    confidence=0.9 if slow is not None else 0.75,
                    node=node,
                    subject=",".join(str(r[2]) for r in rs),
                    evidence={
                        "throttled_share": round(share, 3),
                        "gpus": len(rs),
                        "reasons": why,
                        "sm_clock_ratio": None if clock_ratio is None else round(clock_ratio, 3),
                        "step_slowdown": None if slow is None else round(slow, 3),
                        "slowdown_against": slow_from,
                    },
                    window_start=min(r[6] for r in rs),
                    window_end=max(r[7] for r in rs) + dt.timedelta(seconds=BUCKET_SECONDS),
                )
            )
        return out

    def _clocks(
        self, con: duckdb.DuckDBPyConnection, scope: Scope, nodes: list[str]
    ) -> dict[tuple[str, int], tuple[float | None, float | None]]:
        """(node, GPU) -> mean SM clock while throttled and while not, for the flagged nodes
        only (whole 5-minute buckets from ``gpu_5m``, the scope's edges from the samples)."""
        thr = throttled_sql("throttle_mask")
        raw = f"""SELECT node, "index", sum(sm_clock_hz) FILTER ({thr}) AS ts_, count(sm_clock_hz) FILTER ({thr}) AS tn,
                         sum(sm_clock_hz) FILTER (NOT {thr}) AS os, count(sm_clock_hz) FILTER (NOT {thr}) AS on_
                  FROM gpu_samples WHERE node IN (SELECT unnest($nodes)) AND {{where}} GROUP BY ALL"""
        if evidence.has_column(con, "gpu_5m", "clk_ok_n"):
            whole, edge, params = evidence.split(Scope(None, scope.since, scope.until))
            rows = f"""SELECT node, "index", sum(clk_thr_sum) AS ts_, sum(clk_thr_n) AS tn, sum(clk_ok_sum) AS os,
                              sum(clk_ok_n) AS on_
                       FROM gpu_5m WHERE node IN (SELECT unnest($nodes)) AND {whole} GROUP BY ALL
                       UNION ALL {raw.format(where=edge)}"""
        else:
            where, params = evidence.named_where(Scope(None, scope.since, scope.until))
            rows = raw.format(where=where)
        return {
            (n, i): (a, b)
            for n, i, a, b in con.execute(
                f"""SELECT node, "index", sum(ts_) / nullif(sum(tn), 0), sum(os) / nullif(sum(on_), 0)
                    FROM ({rows}) GROUP BY ALL""",
                {**params, "nodes": nodes},
            ).fetchall()
        }

    def _slowdowns(
        self, con: duckdb.DuckDBPyConnection, scope: Scope, g: str, targets: list[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[float | None, str | None]]:
        """(job, node) -> the node's step time in buckets mostly throttled over those mostly
        not; without unthrottled time, over the job's other nodes' step time.  One statement
        for every flagged node (a statement each cost ~5 ms, and more under ingest)."""
        raw = f"""SELECT job, node, time_bucket(INTERVAL {BUCKET_SECONDS} SECOND, ts) AS b,
                         sum(coalesce(steps / nullif(steps_per_second, 0), step_mean_seconds * steps)) AS span,
                         sum(steps) AS steps
                  FROM steps WHERE job IN (SELECT job FROM t) AND steps > 0 AND {{where}} GROUP BY ALL"""
        if evidence.has_view(con, "steps_5m"):  # whole buckets from the rollup, the scope's edges raw
            whole, edge, params = evidence.split(scope)
            per = f"""SELECT job, node, bucket AS b, sum(span_seconds) AS span, sum(stepping_steps) AS steps
                      FROM steps_5m WHERE job IN (SELECT job FROM t) AND stepping_records > 0 AND {whole} GROUP BY ALL
                      UNION ALL {raw.format(where=edge)}"""
        else:
            where, params = evidence.named_where(scope)
            per = raw.format(where=where)
        rows = con.execute(
            f"""WITH t AS (SELECT unnest($jobs) AS job, unnest($nodes) AS node),
                st AS (SELECT job, node, b, sum(span) AS span, sum(steps) AS steps FROM ({per}) GROUP BY ALL),
                th AS (SELECT job, node, b, sum(thr_n) / nullif(sum(mask_n), 0) AS share FROM {g}
                       WHERE (job, node) IN (SELECT (job, node) FROM t) GROUP BY ALL)
                SELECT t.job, t.node,
                       sum(st.span) FILTER (st.node = t.node AND th.share >= 0.5)
                           / sum(st.steps) FILTER (st.node = t.node AND th.share >= 0.5),
                       sum(st.span) FILTER (st.node = t.node AND th.share < 0.5)
                           / sum(st.steps) FILTER (st.node = t.node AND th.share < 0.5),
                       sum(st.span) FILTER (st.node <> t.node) / sum(st.steps) FILTER (st.node <> t.node),
                       sum(st.span) FILTER (st.node = t.node) / sum(st.steps) FILTER (st.node = t.node)
                FROM t JOIN st ON st.job = t.job
                LEFT JOIN th ON th.job = t.job AND th.node = t.node AND th.b = st.b
                GROUP BY t.job, t.node""",
            {**params, "jobs": [j for j, _ in targets], "nodes": [n for _, n in targets]},
        ).fetchall()
        out: dict[tuple[str, str], tuple[float | None, str | None]] = {}
        for job, node, thr, ok, peers, mine in rows:
            if thr and ok:
                out[(job, node)] = (thr / ok, "while unthrottled")
            elif mine and peers:
                out[(job, node)] = (mine / peers, "the job's other nodes")
        return out
