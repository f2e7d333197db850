"""comm_bound: data-parallel jobs whose steps wait on communication computation did not hide:
from their steps' communication wait (the tracking library's run.add_comm_wait), and from
their imported PyTorch profiler traces (analyze import trace; analytics/imports/traces.py)."""

from __future__ import annotations

from typing import Any

import duckdb

from cmdare.wire.plugin import Option

from ..imports import traces
from ..units import DETECTORS, Detector, Finding, Scope


@DETECTORS.register
class CommBound(Detector):
    name = "comm_bound"
    ORDER = 120  # where analyze bottlenecks runs and lists it
    FINDS = "communication-bound data-parallel jobs"
    ACTION = ("hide the gradient communication behind backward: larger DDP buckets (bucket_cap_mb), gradient "
              "accumulation or a larger per-GPU batch, fewer nodes with more GPUs each (the ring inside NVLink), "
              "FSDP's hybrid sharding, or a compression hook")  # what to do, where no recommender answers it
    OPTIONS = {
        "min_exposed": Option("float", 0.15, "share of step time spent in communication computation did not hide "
                              "(mean over ranks and steps) that makes a finding", lo=0, hi=1),
        "critical_exposed": Option("float", 0.35, "that share which makes it critical", lo=0, hi=1),
    }
    # no requirement: most jobs have no imported trace, and every analyze bottlenecks would
    # say so; without traces (or before migration 026) it finds nothing, quietly
    REQUIRES = ()

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        out = self._telemetry(con, scope)
        if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'trace_ranks'").fetchall()[0][0]:
            return out
        return out + self._traces(con, scope)

    def _telemetry(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        """The steps' communication wait over the window: its share of step time, per job."""
        from . import evidence

        o = self.options
        if not evidence.has_column(con, "steps", "comm_share_ratio"):
            return []
        rows = con.execute(
            """SELECT job, sum(comm_mean_seconds * steps) / nullif(sum(step_mean_seconds * steps), 0) AS share,
                      sum(comm_mean_seconds * steps) / sum(steps) AS comm_s, sum(step_mean_seconds * steps) / sum(steps),
                      count(DISTINCT rank), sum(steps), min(ts - to_microseconds(CAST(interval_seconds * 1e6 AS BIGINT))),
                      max(ts)
               FROM steps WHERE comm_mean_seconds IS NOT NULL AND job IS NOT NULL AND ($job IS NULL OR job = $job)
                 AND ($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts < $u)
               GROUP BY job HAVING sum(steps) > 0 ORDER BY job""",
            {"job": scope.job, "s": scope.since, "u": scope.until}).fetchall()
        out = []
        memo: dict[tuple, Any] = {}  # the model runs' scaling, read once per model and accelerator
        for job, share, comm_s, step_s, ranks, steps, t0, t1 in rows:
            if share is None or share < o["min_exposed"]:
                continue
            ev = {"exposed_comm_pct": round(100 * share, 2), "exposed_comm_ms": round(1e3 * comm_s, 3),
                  "step_ms": round(1e3 * step_s, 3), "ranks": int(ranks), "steps": int(steps)}
            ev |= _topology(con, job, step_s, t0, t1, memo)
            where = ""
            if ev.get("nodes", 1) > 1:
                where = (f"; the ring spans {ev['nodes']} nodes of {ev['gpus_per_node']} GPU(s)"
                         + (f", {ev['allreduce_mb_per_step']:g} MB a rank a step" if "allreduce_mb_per_step" in ev else "")
                         + (f", hosts sending {ev['host_net_tx_mb_s']:g} MB/s" if "host_net_tx_mb_s" in ev else ""))
            out.append(Finding(
                self.name, job,
                f"{100 * share:.0f} % of each step waits on communication computation did not hide "
                f"({ev['exposed_comm_ms']:g} ms of {ev['step_ms']:g} ms, {int(ranks)} rank(s), as the job reports it"
                f"{where})",
                severity="critical" if share >= o["critical_exposed"] else "warning",
                confidence=min(1.0, 0.5 + steps / 2000), subject="telemetry", evidence=ev,
                # sized by the all-reduce model where its gradient bytes are known
                suggests=("cluster",) if "grad_mb" in ev else (),
                window_start=t0, window_end=t1))
        return out

    def _traces(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        # a trace is judged as of its import (its own clock is the profiler's, not the fleet's)
        rows = con.execute(
            """SELECT job, min(imported_at), max(imported_at), any_value(world_size), count(*) FROM trace_ranks
               WHERE ($job IS NULL OR job = $job) AND ($s IS NULL OR imported_at >= $s)
                 AND ($u IS NULL OR imported_at < $u) GROUP BY job ORDER BY job""",
            {"job": scope.job, "s": scope.since, "u": scope.until}).fetchall()
        out = []
        for job, t0, t1, world, ranks in rows:
            b = traces.breakdown(con, job)
            steps = [s for s in b["steps"] if s["exposed_comm_pct"] is not None]
            if not steps or not b["ranks"]:
                continue
            share = sum(s["exposed_comm_pct"] for s in steps) / len(steps) / 100
            if share < o["min_exposed"]:
                continue
            overlap = [r["overlap_pct"] for r in b["ranks"] if r["overlap_pct"] is not None]
            step_ms = sorted(s["median_ms"] for s in steps)[len(steps) // 2]
            slow = max({s["slowest_rank"] for s in steps}, key=[s["slowest_rank"] for s in steps].count)
            ev = {"exposed_comm_pct": round(100 * share, 2), "step_ms": step_ms, "ranks_traced": int(ranks),
                  "steps": len(steps), "slowest_rank": int(slow),
                  "exposed_comm_ms": round(sum(s["exposed_comm_ms"] for s in steps) / len(steps), 3)}
            if overlap:
                ev["overlap_pct"] = round(sum(overlap) / len(overlap), 2)
            if world:
                ev["world_size"] = int(world)
            out.append(Finding(
                self.name, job,
                f"{100 * share:.0f} % of each step waits on communication computation did not hide "
                f"({ev['exposed_comm_ms']:g} ms of {step_ms:g} ms; "
                + (f"{ev['overlap_pct']:g} % of communication overlapped; " if overlap else "")
                + f"{int(ranks)} rank(s) traced{f' of {world}' if world else ''})",
                severity="critical" if share >= o["critical_exposed"] else "warning",
                confidence=min(1.0, 0.6 + 0.1 * len(steps) + 0.1 * int(ranks)), subject="trace", evidence=ev,
                window_start=t0, window_end=t1))
        return out


def _topology(con: duckdb.DuckDBPyConnection, job: str, step_s: float, t0: object, t1: object,
              memo: dict[tuple, Any]) -> dict[str, Any]:
    """What the job declared of its shape (world size, GPUs per node, gradient bytes: the
    PyTorch adapter declares them for a DDP model) and what its hosts' network sent over
    the window: the ring's nodes, the bytes a ring all-reduce moves per rank and step
    (2 (n - 1) / n of the gradients) and the rate the step cadence asks of it."""
    from ..models import allreduce as ar
    from . import evidence

    out: dict[str, Any] = {}
    if evidence.has_column(con, "jobs", "grad_bytes"):
        world, per_node, grad = con.execute(
            """SELECT arg_max(world_size, ts) FILTER (WHERE world_size > 0),
                      arg_max(gpus_per_node, ts) FILTER (WHERE gpus_per_node > 0),
                      arg_max(grad_bytes, ts) FILTER (WHERE grad_bytes > 0)
               FROM jobs WHERE job = ?""", [job]).fetchall()[0]
        if world:
            out["world_size"] = int(world)
        if world and per_node:
            out |= {"gpus_per_node": int(per_node), "nodes": -(-int(world) // int(per_node))}
        if grad:
            out["grad_mb"] = round(grad / 1e6, 3)
            if world and world > 1:
                moved = ar.moved(int(world), grad) / 1e6  # what a ring all-reduce moves per rank
                out["allreduce_mb_per_step"] = round(moved, 3)
                if step_s > 0:
                    out["allreduce_mb_s"] = round(moved / step_s, 1)
    if evidence.has_column(con, "host_5m", "net_tx_first"):
        (rate,) = con.execute(
            """WITH n AS (SELECT DISTINCT node FROM steps WHERE job = $job AND ts >= $t0 AND ts <= $t1),
                    h AS (SELECT node, (arg_max(net_tx_last, last_ts) FILTER (WHERE net_tx_last IS NOT NULL)
                                        - arg_min(net_tx_first, first_ts) FILTER (WHERE net_tx_first IS NOT NULL))
                                       / nullif(epoch(max(last_ts) - min(first_ts)), 0) AS r
                          FROM host_5m SEMI JOIN n USING (node)
                          WHERE bucket >= time_bucket(INTERVAL 5 MINUTE, $t0::TIMESTAMP) AND bucket <= $t1
                          GROUP BY node)
               SELECT avg(r) FROM h WHERE r >= 0""", {"job": job, "t0": t0, "t1": t1}).fetchall()[0]
        if rate is not None:
            out["host_net_tx_mb_s"] = round(rate / 1e6, 3)
    if evidence.has_column(con, "gpu_samples", "nvlink_total_tx_bytes_per_second"):
        (nvl,) = con.execute(
            """SELECT avg(nvlink_total_tx_bytes_per_second) FROM gpu_samples
               WHERE node IN (SELECT DISTINCT node FROM steps WHERE job = $job AND ts >= $t0 AND ts <= $t1)
                 AND ts >= $t0 AND ts <= $t1 AND nvlink_total_tx_bytes_per_second >= 0""",
            {"job": job, "t0": t0, "t1": t1}).fetchall()[0]
        if nvl is not None:
            out["nvlink_tx_mb_s"] = round(nvl / 1e6, 3)  # per GPU: what its NVLinks sent (GPM)
    out |= _scaling(con, job, memo)
    return out


def _scaling(con: duckdb.DuckDBPyConnection, job: str, memo: dict[tuple, Any]) -> dict[str, Any]:
    """The scaling efficiency of the job's model across the world sizes its runs measured
    (speedup over one GPU per GPU, "ranks:efficiency" pairs), from the all-reduce model's
    runs; only where one of them ran on a single GPU (the base)."""
    from ..models import allreduce as ar

    sh = ar.shape(con, job)
    if sh is None:
        return {}
    key = (sh["model"], sh["accelerator"])
    if key in memo:
        return memo[key]
    memo[key] = {}
    rs, _ = ar.runs(con, sh["model"], sh["accelerator"])
    base = [r.step_s for r in rs if r.world == 1]
    if not base or len({r.world for r in rs}) < 2:
        return {}
    one = min(base)
    eff: dict[int, float] = {}
    for r in rs:
        eff[r.world] = max(eff.get(r.world, 0.0), one / r.step_s)
    memo[key] = {"scaling_efficiency": ",".join(f"{n}:{e:.2f}" for n, e in sorted(eff.items()))}
    return memo[key]
