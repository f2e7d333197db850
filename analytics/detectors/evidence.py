"""What several detectors read, computed once per run (kept in ``Scope.cache``) as DuckDB
temporary tables, so that a fleet-wide ``analyze bottlenecks`` scans each telemetry table
once (bench/findings.py):

- ``spans``: per job and node, when the job's steps came from it (the first interval's
  start to the last step), its lowest rank and its step count (from the ``steps_5m``
  rollup likewise).  A GPU or host sample
  belongs to a job when it was taken on one of the job's nodes during that span;
- ``gpu_buckets``: per GPU (node, index) and 5-minute bucket: samples, mean utilisation,
  mean memory used, samples with a throttle mask, throttled samples
  (``verdicts.throttled_sql``) and their reasons (the masks or-ed); read from the 5-minute
  rollup where the scope holds whole buckets (a pass over ``gpu_samples`` was most of a
  fleet-wide run's time: bench/findings.py), from the samples at the scope's edges;
- ``host_buckets``: per node and bucket: mean CPU utilisation (from the ``host_5m`` rollup
  likewise);
- ``gpu_summary``: those buckets joined to the job spans they fall in and summed per job,
  node and GPU in the same pass (what the GPU detectors aggregate);
- ``job_gpus`` / ``job_hosts``: buckets joined to the job spans they fall in (GPUs: of a
  few flagged nodes).

Temporary tables work on read-only connections too, and go with the connection.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..db import AnalyticsError, has_column, has_view
from ..units import Scope, table_missing
from ..verdicts import throttled_sql

BUCKET_SECONDS = 300
_ids = itertools.count(1)


def _temp(con: duckdb.DuckDBPyConnection, scope: Scope, key: str, sql: str, params: list[Any] | dict[str, Any]) -> str:
    """The temporary table ``key`` of this run, created from ``sql`` the first time."""
    name = scope.cache.get(key)
    if name is None:
        name = f"_cmdare_{key}_{next(_ids)}"
        con.execute(f"CREATE TEMP TABLE {name} AS {sql}", params)
        scope.cache[key] = name
    return name


def _time_where(scope: Scope, ts: str = "ts") -> tuple[str, list[Any]]:
    return Scope(None, scope.since, scope.until).where(ts=ts)


def split(scope: Scope) -> tuple[str, str, dict[str, Any]]:
    """The scope as (condition on a rollup's rows: the whole 5-minute buckets inside it,
    condition on raw rows' ``ts``: the rows of the partial buckets at its edges, their named
    parameters, the job's included): every row in scope is read once, from one side."""
    step = dt.timedelta(seconds=BUCKET_SECONDS)
    s, u = scope.since, scope.until
    lo = None if s is None else (s if bucket_start(s) == s else bucket_start(s) + step)  # first whole bucket
    hi = None if u is None else bucket_start(u)  # whole buckets end before u's own
    edge = ["false"]
    if lo is not None:
        edge.append("ts < $lo")
    if hi is not None:
        edge.append("ts >= $hi")
    job = "($job IS NULL OR job = $job)"
    # the whole buckets by their first sample's time, not by ``bucket``: the same rows (lo and
    # hi are bucket starts, and first_ts lies in its bucket), but a filter on ``bucket`` is
    # pushed through the exact views' GROUP BY into their raw side and evaluated on every
    # raw sample before the pending-range join (3.7 s against 0.005 s for a 15-minute scope
    # of 1,000 nodes: bench/detect_rounds.py)
    return (f"($lo IS NULL OR first_ts >= $lo) AND ($hi IS NULL OR first_ts < $hi) AND {job}",
            f"($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts <= $u) AND ({' OR '.join(edge)}) AND {job}",
            {"lo": lo, "hi": hi, "s": s, "u": u, "job": scope.job})


def named_where(scope: Scope) -> tuple[str, dict[str, Any]]:
    """``Scope.where`` with named parameters (``$s``, ``$u``, ``$job``: those of ``split``), for
    statements that read the rollups or the raw rows alike."""
    return ("($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts <= $u) AND ($job IS NULL OR job = $job)",
            {"s": scope.since, "u": scope.until, "job": scope.job})


def spans(con: duckdb.DuckDBPyConnection, scope: Scope) -> str:
    """Temp table (job, node, rank, ranks, t0, t1, steps) of the jobs in scope (whole
    5-minute buckets from the ``steps_5m`` rollup, the scope's edges from ``steps``)."""
    raw = """SELECT job, node, coalesce(rank, 0) AS rank,
                    ts - to_microseconds(CAST(coalesce(interval_seconds, 0) * 1e6 AS BIGINT)) AS t0, ts AS t1, steps
             FROM steps WHERE job IS NOT NULL AND job <> '' AND {where}"""
    agg = """SELECT job, node, min(rank) AS rank, count(DISTINCT rank) AS ranks, min(t0) AS t0, max(t1) AS t1,
                    sum(steps) AS steps FROM ({rows}) GROUP BY job, node"""
    params: Any  # (positional for the raw rows alone, named with the rollup's)
    if not has_view(con, "steps_5m"):
        where, params = scope.where()
        return _temp(con, scope, "spans", agg.format(rows=raw.format(where=where)), params)
    whole, edge, params = split(scope)
    rolled = f"""SELECT job, node, coalesce(rank, 0) AS rank, t0, last_ts AS t1, steps
                 FROM steps_5m WHERE job IS NOT NULL AND job <> '' AND {whole}"""
    return _temp(con, scope, "spans", agg.format(rows=f"{rolled} UNION ALL {raw.format(where=edge)}"), params)


# ``gjob``: the job of the Kubernetes pod or Slurm job holding the GPU (the samples' job where
# they name one; not an agent's own job label): what a GPU outside every stepping job's span is
# attributed to
_RAW_GPU = f"""SELECT node, "index", make_timestamp(bi * {BUCKET_SECONDS * 1_000_000}) AS b, n, util, mem, mask_n,
                  thr_n, thr_mask, 'gpu' AS kind, gjob
           FROM (SELECT node, "index", epoch_us(ts) // {BUCKET_SECONDS * 1_000_000} AS bi, count(*) AS n,
                        coalesce(avg(gr_engine_active_ratio), avg(util_gpu_ratio)) AS util,
                        avg(mem_used_bytes) AS mem, count(throttle_mask) AS mask_n,
                        count(*) FILTER ({{thr}}) AS thr_n, bit_or(throttle_mask) FILTER ({{thr}}) AS thr_mask,
                        max(nullif(job, '')) FILTER (namespace IS NOT NULL OR slurm_job IS NOT NULL) AS gjob
                 FROM gpu_samples WHERE {{where}} GROUP BY node, "index", bi)"""
# the same columns from the 5-minute rollup (collector/rollup.py keeps them)
# utilisation: the graphics engine's activity where GPM gives it (NVML's GPU_UTIL counts a GPU
# busy while one tiny kernel runs, and reads nothing on MIG), else GPU_UTIL
_ROLLED_GPU = """SELECT node, "index", bucket AS b, samples AS n,
                  coalesce(gr_sum / nullif(gr_n, 0), util_sum / nullif(util_samples, 0)) AS util,
                  mem_sum / nullif(mem_samples, 0) AS mem, throttle_samples AS mask_n, throttled AS thr_n, thr_mask,
                  'gpu' AS kind, CASE WHEN (namespace IS NOT NULL OR slurm_job IS NOT NULL) THEN nullif(job, '') END AS gjob
           FROM gpu_5m WHERE {whole}"""
# a TPU VM's cores as accelerators beside the GPUs (duty cycle as their utilisation, HBM as
# memory; no throttle reasons): the idle and input-bound detectors judge them the same way
_RAW_TPU = f"""SELECT node, device AS "index", make_timestamp(bi * {BUCKET_SECONDS * 1_000_000}) AS b, n, util, mem,
                  0 AS mask_n, 0 AS thr_n, NULL::BIGINT AS thr_mask, 'tpu' AS kind, NULL::VARCHAR AS gjob
           FROM (SELECT node, device, epoch_us(ts) // {BUCKET_SECONDS * 1_000_000} AS bi, count(*) AS n,
                        avg(duty_cycle_ratio) AS util, avg(hbm_used_bytes) AS mem
                 FROM tpu_samples WHERE {{where}} GROUP BY node, device, bi)"""


def bucket_start(t: dt.datetime) -> dt.datetime:
    """The start of ``t``'s 5-minute bucket (as DuckDB's time_bucket and the rollup)."""
    us = (t - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    return dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us - us % (BUCKET_SECONDS * 1_000_000))


def rolled(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the database keeps the rollup columns the GPU buckets need (migration 015)
    and the view over them (a schema check: the view's rows, pending ones included, would
    cost an aggregation to count)."""
    return has_column(con, "gpu_rollup_5m", "thr_mask") and has_view(con, "gpu_5m")


def _bucket_rows(con: duckdb.DuckDBPyConnection, scope: Scope) -> tuple[str, dict[str, Any]]:
    """The SQL of the per-GPU 5-minute bucket rows in the scope's time range (see the module
    doc: whole buckets from the rollup, exact however far behind it is, the partial ones at
    the edges from the samples) and its named parameters."""
    thr = throttled_sql("throttle_mask")
    tpu = has_rows(con, "tpu_samples")
    if not rolled(con):
        where, params = named_where(Scope(None, scope.since, scope.until))
        sql = _RAW_GPU.format(thr=thr, where=where)
        if tpu:
            sql += " UNION ALL " + _RAW_TPU.format(where=where)
        return sql, params
    whole, edge, params = split(Scope(None, scope.since, scope.until))
    sql = f"{_ROLLED_GPU.format(whole=whole)} UNION ALL {_RAW_GPU.format(thr=thr, where=edge)}"
    if tpu:  # (no TPU rollup: a TPU fleet's samples are few) every bucket from the samples
        sql += " UNION ALL " + _RAW_TPU.format(where="($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts <= $u)")
    return sql, params


def gpu_buckets(con: duckdb.DuckDBPyConnection, scope: Scope) -> str:
    """Temp table of per-GPU 5-minute buckets (see the module doc)."""
    return _temp(con, scope, "gpu_buckets", *_bucket_rows(con, scope))


def held_by(con: duckdb.DuckDBPyConnection, scope: Scope) -> str:
    """The condition under which a GPU bucket ``g`` on a stepping job ``s``'s node, in its
    span, is that job's: no scheduler holds the GPU (``gjob`` NULL), or its holder is the
    job itself, or a pod or Slurm job that ran it (a rank's declared PID on its GPUs:
    ``holders.tracked_holders``; where no process links the job to any holder, a node's
    only holder during its span). Another job's GPU on a shared node (a Slurm job beside a
    tracked one) is never the tracked job's evidence."""
    name = scope.cache.get("held_ran")
    if name is None:
        from ..holders import tracked_holders

        ran = tracked_holders(con, scope.since, scope.until)
        pairs = set((ran or {}).items())
        if ran is not None and has_view(con, "gpu_5m"):
            # where no process evidence links a stepping job to a holder on a node (NVML lists no
            # processes there) and the job has no GPU there that no scheduler holds, the node's
            # one holder during its span is taken to be its own (the job runs inside it)
            sp = spans(con, scope)
            held = "(g.namespace IS NOT NULL OR g.slurm_job IS NOT NULL) AND nullif(g.job, '') IS NOT NULL"
            for job, holders, unheld in con.execute(
                    f"""SELECT s.job, list(DISTINCT g.job) FILTER ({held}), bool_or(NOT ({held}))
                        FROM {sp} s JOIN gpu_5m g ON g.node = s.node AND g.last_ts >= s.t0 AND g.first_ts <= s.t1
                        GROUP BY s.job, s.node""").fetchall():
                if not unheld and len(holders or []) == 1 and not any(j == job for _, j in pairs):
                    pairs.add((holders[0], job))
        name = _temp(con, scope, "held_ran", "SELECT unnest($h::VARCHAR[]) AS h, unnest($j::VARCHAR[]) AS j",
                     {"h": [h for h, _ in sorted(pairs)], "j": [j for _, j in sorted(pairs)]})
    return f"(g.gjob IS NULL OR g.gjob = s.job OR EXISTS (SELECT 1 FROM {name} r WHERE r.h = g.gjob AND r.j = s.job))"


IDLE_UTIL = 0.05  # gpu_idle's defaults, at which gpu_summary counts idle time in the same pass
MIN_MEM = 1 << 30


def gpu_summary(con: duckdb.DuckDBPyConnection, scope: Scope, idle_util: float = IDLE_UTIL,
                min_mem: int = MIN_MEM) -> str:
    """Temp table, one row per job, node, GPU and kind (``job`` NULL: the GPU's buckets
    outside every job's span), from one pass over the bucket rows joined to the job spans:
    ``samples``, ``idle`` (samples in buckets of mean utilisation below ``idle_util``),
    ``util_n`` (utilisation x samples), ``mem`` (mean of the buckets' memory), first and
    last bucket ``b0``/``b1``, ``max_n`` (a full bucket's samples), throttle counts
    ``thr_n``/``mask_n``/``thr_mask`` and the first and last throttled bucket, and, for
    buckets idle with at least ``min_mem`` bytes in use, ``alloc_n``, ``alloc_mem_sum``,
    ``alloc_rows``, ``alloc_b0``/``alloc_b1``. What the GPU detectors and ``node_hardware``
    aggregate, so a fleet's buckets are read and joined once (bench/findings.py)."""
    rows, params = _bucket_rows(con, scope)
    # a bucket in a stepping job's span is that job's; else the job its samples name where that
    # job has no steps in scope (a Kubernetes pod's or an agent's job no rank declared)
    own = "g.gjob"
    if scope.job is not None:
        own, params = "CASE WHEN g.gjob = $gjob THEN g.gjob END", {**params, "gjob": scope.job}
    if has_rows(con, "steps"):
        s = spans(con, scope)
        src = f"""SELECT coalesce(s.job, CASE WHEN g.gjob NOT IN (SELECT job FROM {s}) THEN {own} END) AS job,
                         s.rank AS job_rank, g.* EXCLUDE (gjob)
                  FROM ({rows}) g LEFT JOIN {s} s ON g.node = s.node
                  AND g.b + INTERVAL {BUCKET_SECONDS} SECOND > s.t0 AND g.b <= s.t1 AND {held_by(con, scope)}"""
    else:
        src = f"SELECT {own} AS job, NULL::BIGINT AS job_rank, g.* EXCLUDE (gjob) FROM ({rows}) g"
    idle = f"util < {float(idle_util)}"
    alloc = f"{idle} AND mem >= {int(min_mem)}"
    sql = f"""SELECT job, any_value(job_rank) AS job_rank, node, "index", kind, sum(n) AS samples,
                     sum(n) FILTER ({idle}) AS idle, sum(util * n) AS util_n, avg(mem) AS mem,
                     min(b) AS b0, max(b) AS b1, max(n) AS max_n,
                     sum(thr_n) AS thr_n, sum(mask_n) AS mask_n, bit_or(thr_mask) AS thr_mask,
                     min(b) FILTER (thr_n > 0) AS thr_b0, max(b) FILTER (thr_n > 0) AS thr_b1,
                     sum(n) FILTER ({alloc}) AS alloc_n, sum(mem) FILTER ({alloc}) AS alloc_mem_sum,
                     count(mem) FILTER ({alloc}) AS alloc_rows,
                     min(b) FILTER ({alloc}) AS alloc_b0, max(b) FILTER ({alloc}) AS alloc_b1
              FROM ({src}) GROUP BY job, node, "index", kind"""
    return _temp(con, scope, f"gpu_summary_{float(idle_util)!r}_{int(min_mem)}".replace(".", "_").replace("-", "m"),
                 sql, params)


def host_buckets(con: duckdb.DuckDBPyConnection, scope: Scope) -> str:
    """Temp table (node, b, n, cpu) per node and 5-minute bucket (whole buckets from the
    ``host_5m`` rollup, the scope's edges from ``host_samples``)."""
    raw = f"""SELECT node, time_bucket(INTERVAL {BUCKET_SECONDS} SECOND, ts) AS b, count(*) AS n,
                     avg(cpu_util_ratio) AS cpu
              FROM host_samples WHERE {{where}} GROUP BY ALL"""
    params: Any  # (positional for the raw rows alone, named with the rollup's)
    if not has_view(con, "host_5m"):
        where, params = _time_where(scope)
        return _temp(con, scope, "host_buckets", raw.format(where=where), params)
    whole, edge, params = split(Scope(None, scope.since, scope.until))
    rolled = f"SELECT node, bucket AS b, samples AS n, cpu_sum / nullif(cpu_samples, 0) AS cpu FROM host_5m WHERE {whole}"
    return _temp(con, scope, "host_buckets", f"{rolled} UNION ALL {raw.format(where=edge)}", params)


def job_steps(con: duckdb.DuckDBPyConnection, scope: Scope) -> list[tuple]:
    """Per job in scope: (job, steps, input wait / step time over the intervals that report
    a wait, intervals reporting one, first and last record time), ordered by job; whole
    buckets from the ``steps_5m`` rollup, the scope's edges from ``steps``."""
    raw = """SELECT job, sum(steps) AS steps, sum(wait_mean_seconds * steps) AS ww,
                    sum(step_mean_seconds * steps) FILTER (wait_mean_seconds IS NOT NULL) AS sw,
                    count(wait_mean_seconds) AS wn, min(ts) AS t0, max(ts) AS t1
             FROM steps WHERE job IS NOT NULL AND job <> '' AND {where} GROUP BY job"""
    params: Any  # (named with the rollup's, positional for the raw rows alone)
    if has_view(con, "steps_5m"):
        whole, edge, params = split(scope)
        rows = f"""SELECT job, sum(steps) AS steps, sum(wait_weighted) AS ww, sum(step_weighted_waited) AS sw,
                          sum(wait_records) AS wn, min(first_ts) AS t0, max(last_ts) AS t1
                   FROM steps_5m WHERE job IS NOT NULL AND job <> '' AND {whole} GROUP BY job
                   UNION ALL {raw.format(where=edge)}"""
    else:
        where, params = scope.where()
        rows = raw.format(where=where)
    return con.execute(
        f"""SELECT job, sum(steps), sum(ww) / nullif(sum(sw), 0), sum(wn), min(t0), max(t1)
            FROM ({rows}) GROUP BY job ORDER BY job""", params).fetchall()


def _join(con: duckdb.DuckDBPyConnection, scope: Scope, key: str, buckets: str) -> str:
    s = spans(con, scope)
    return _temp(
        con,
        scope,
        key,
        f"""SELECT s.job, s.rank AS job_rank, g.* FROM {buckets} g JOIN {s} s ON g.node = s.node
            AND g.b + INTERVAL {BUCKET_SECONDS} SECOND > s.t0 AND g.b <= s.t1""",
        [],
    )


def job_gpus(con: duckdb.DuckDBPyConnection, scope: Scope, nodes: list[str]) -> str:
    """Temp table: each GPU bucket of ``nodes`` taken during a job's span on its node, with
    the job (per-bucket detail for a few flagged nodes; ``gpu_summary`` for the fleet)."""
    rows, params = _bucket_rows(con, scope)
    s = spans(con, scope)
    return _temp(
        con,
        scope,
        f"job_gpus_{abs(hash(tuple(sorted(nodes))))}",
        f"""SELECT s.job, s.rank AS job_rank, g.* FROM ({rows}) g JOIN {s} s ON g.node = s.node
            AND g.b + INTERVAL {BUCKET_SECONDS} SECOND > s.t0 AND g.b <= s.t1 AND {held_by(con, scope)}
            WHERE g.node IN (SELECT unnest($nodes::VARCHAR[]))""",
        {**params, "nodes": sorted(nodes)},
    )


def job_hosts(con: duckdb.DuckDBPyConnection, scope: Scope) -> str:
    return _join(con, scope, "job_hosts", host_buckets(con, scope))


def has_rows(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """The table or view exists and has rows (the check of a unit's ``table`` requirement)."""
    return table_missing(con, Requirement("table", table)) is None


@dataclass(frozen=True)
class NodeHardware:
    """What a node's hardware showed during a job: for the evidence of findings about it."""

    gpu_util: float | None
    throttled_share: float | None
    cpu_util: float | None
    xids: int


def node_hardware(con: duckdb.DuckDBPyConnection, scope: Scope) -> dict[tuple[str, str], NodeHardware]:
    """(job, node) -> its hardware during the job (None where the node sent no such samples)."""
    key = "node_hardware"
    if key in scope.cache:
        return scope.cache[key]
    out: dict[tuple[str, str], list[Any]] = {}
    if has_rows(con, "gpu_samples"):
        g = gpu_summary(con, scope)
        for job, node, util, thr in con.execute(
            f"""SELECT job, node, sum(util_n) / nullif(sum(samples), 0), sum(thr_n) / nullif(sum(mask_n), 0)
                FROM {g} WHERE job IS NOT NULL GROUP BY job, node"""
        ).fetchall():
            out[(job, node)] = [util, thr, None, 0]
    if has_rows(con, "host_samples"):
        h = job_hosts(con, scope)
        for job, node, cpu in con.execute(
            f"SELECT job, node, sum(cpu * n) / nullif(sum(n), 0) FROM {h} GROUP BY job, node"
        ).fetchall():
            out.setdefault((job, node), [None, None, None, 0])[2] = cpu
    if has_rows(con, "gpu_events"):
        s = spans(con, scope)
        where, params = _time_where(scope, "e.ts")
        for job, node, n in con.execute(
            f"""SELECT s.job, s.node, sum(e.count) FROM gpu_events e JOIN {s} s ON e.node = s.node
                AND e.ts BETWEEN s.t0 AND s.t1 WHERE e.kind = 'xid' AND {where} GROUP BY ALL""",
            params,
        ).fetchall():
            out.setdefault((job, node), [None, None, None, 0])[3] = int(n or 0)
    res = {k: NodeHardware(*v) for k, v in out.items()}
    scope.cache[key] = res
    return res


@dataclass(frozen=True)
class Declaration:
    job: str
    model: str | None
    accelerator: str | None
    workers: int
    ps: int
    flops_per_step: float | None
    params: float | None
    tensors: float | None


def declarations(con: duckdb.DuckDBPyConnection, scope: Scope) -> dict[str, Declaration]:
    """job -> its latest declaration (the jobs in scope; the scope's window is not applied:
    a job declares itself once, when it starts)."""
    key = "declarations"
    if key not in scope.cache:
        where, params = Scope(scope.job).where()
        rows = con.execute(
            f"""SELECT job, arg_max(model, ts), arg_max(accelerator, ts), arg_max(world_size, ts), arg_max(ps, ts),
                      arg_max(flops_per_step, ts), arg_max(params, ts), arg_max(tensors, ts)
               FROM jobs WHERE job IS NOT NULL AND {where} GROUP BY job ORDER BY job""",
            params,
        ).fetchall()
        scope.cache[key] = {
            r[0]: Declaration(r[0], r[1], r[2], int(r[3] or 1), int(r[4] or 0), r[5], r[6], r[7]) for r in rows
        }
    return scope.cache[key]


def latest_fit(con: duckdb.DuckDBPyConnection, kind: str) -> dict[str, Any] | None:
    """The latest stored fit of ``kind`` (fit_id and model), or None."""
    if not has_rows(con, "model_fits"):
        return None
    from ..models.store import latest

    try:
        return latest(con, kind)
    except AnalyticsError:  # no fit of that kind: the unit goes without it
        return None


class GpuActivity(NamedTuple):
    """One GPU's profiling activity while a job ran on its node (``job_activity``)."""

    job: str
    node: str
    index: int  # type: ignore[assignment]  # the GPU's index, over tuple.index
    name: str | None
    samples: int
    gr: float | None  # graphics-engine active, 0..1 (None: no GPM on this GPU)
    sm: float | None
    tensor: float | None
    fp32: float | None
    dram: float | None
    nvlink_errors: int | None
    t0: dt.datetime
    t1: dt.datetime


# the options the detectors that judge GPM activity share (tensor_idle, memory_bound)
GPM_OPTIONS = {
    "busy": Option("float", 0.5, "graphics-engine activity above which a GPU counts as busy", lo=0, hi=1),
    "min_samples": Option("int", 30, "samples with profiling activity a GPU needs before it is judged", lo=1),
}


def profiled_gpus(con: duckdb.DuckDBPyConnection, scope: Scope, min_samples: int) -> dict[str, list[GpuActivity]]:
    """job -> its GPUs that report GPM activity in ``min_samples`` samples or more."""
    out: dict[str, list[GpuActivity]] = {}
    if not _any_gpm(con, scope):  # most fleets: no profiling at all, so no join to read
        return out
    for g in job_activity(con, scope):
        if g.gr is not None and g.samples >= min_samples:
            out.setdefault(g.job, []).append(g)
    return out


def _any_gpm(con: duckdb.DuckDBPyConnection, scope: Scope) -> bool:
    """Whether any 5-minute bucket ``job_activity`` could read has GPM activity."""
    if "any_gpm" not in scope.cache:
        if not has_view(con, "gpu_5m") or not has_column(con, "gpu_5m", "gr_sum"):
            scope.cache["any_gpm"] = False
        else:
            where, params = Scope(None, scope.since, scope.until).where(ts="g.last_ts")
            scope.cache["any_gpm"] = bool(con.execute(
                f"SELECT EXISTS (SELECT 1 FROM gpu_5m g WHERE g.gr_n > 0 AND {where})", params).fetchall()[0][0])
    return bool(scope.cache["any_gpm"])


def job_activity(con: duckdb.DuckDBPyConnection, scope: Scope) -> list[GpuActivity]:
    """Per job, node and GPU in scope: (job, node, index, name, samples, graphics-engine
    active, SM active, tensor pipes, FP32 pipe, DRAM bandwidth (means over the samples that
    have them, 0..1, None where the GPU gave none: no GPM), NVLink errors counted in scope,
    first bucket, last sample), from the ``gpu_5m`` rollup view (exact at any lag) at
    5-minute resolution: the buckets a job's span touches on its node."""
    if "job_activity" in scope.cache:  # tensor_idle and memory_bound share one read
        return scope.cache["job_activity"]
    if not has_view(con, "gpu_5m") or not has_column(con, "gpu_5m", "gr_sum"):
        return []
    s = spans(con, scope)
    where, params = Scope(None, scope.since, scope.until).where(ts="g.last_ts")
    rows = con.execute(
        f"""SELECT s.job, g.node, g."index", any_value(g.name), sum(g.samples),
                   sum(g.gr_sum) / nullif(sum(g.gr_n), 0), sum(g.sm_active_sum) / nullif(sum(g.sm_active_n), 0),
                   sum(g.tensor_sum) / nullif(sum(g.tensor_n), 0), sum(g.fp32_sum) / nullif(sum(g.fp32_n), 0),
                   sum(g.dram_sum) / nullif(sum(g.dram_n), 0), max(g.nvl_err_max) - min(g.nvl_err_min),
                   min(g.bucket), max(g.last_ts)
            FROM gpu_5m g JOIN {s} s ON g.node = s.node
                 AND g.bucket + INTERVAL {BUCKET_SECONDS} SECOND > s.t0 AND g.bucket <= s.t1
            WHERE {where}
            GROUP BY s.job, g.node, g."index" ORDER BY s.job, g.node, g."index" """,
        params,
    ).fetchall()
    out = [GpuActivity(*r) for r in rows]
    scope.cache["job_activity"] = out
    return out
