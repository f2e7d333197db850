"""What several detectors read, computed once per run (kept in ``Scope.cache``) as DuckDB
temporary tables, so that a fleet-wide ``analyze bottlenecks`` scans each telemetry table
once (bench/findings.py):

- ``spans``: per job and node, when the job's steps came from it (the first interval's
  start to the last step), its lowest rank and its step count.  A GPU or host sample
  belongs to a job when it was taken on one of the job's nodes during that span;
- ``gpu_buckets``: per GPU (node, index) and 5-minute bucket: samples, mean utilisation,
  mean memory used, samples with a throttle mask, throttled samples
  (``verdicts.throttled_sql``) and their reasons (the masks or-ed); read from the 5-minute
  rollup where the scope holds whole buckets (a pass over ``gpu_samples`` was most of a
  fleet-wide run's time: bench/findings.py), from the samples at the scope's edges;
- ``host_buckets``: per node and bucket: mean CPU utilisation;
- ``job_gpus`` / ``job_hosts``: those buckets joined to the job spans they fall in.

Temporary tables work on read-only connections too, and go with the connection.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from typing import Any

import duckdb

from cmdare.wire.plugin import Requirement

from .db import AnalyticsError
from .units import Scope, table_missing
from .verdicts import throttled_sql

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


def spans(con: duckdb.DuckDBPyConnection, scope: Scope) -> str:
    """Temp table (job, node, rank, ranks, t0, t1, steps) of the jobs in scope."""
    where, params = scope.where()
    return _temp(
        con,
        scope,
        "spans",
        f"""SELECT job, node, min(coalesce(rank, 0)) AS rank, count(DISTINCT coalesce(rank, 0)) AS ranks,
                  min(ts - to_microseconds(CAST(coalesce(interval_seconds, 0) * 1e6 AS BIGINT))) AS t0,
                  max(ts) AS t1, sum(steps) AS steps
           FROM steps WHERE job IS NOT NULL AND job <> '' AND {where} GROUP BY job, node""",
        params,
    )


_RAW_GPU = f"""SELECT node, "index", make_timestamp(bi * {BUCKET_SECONDS * 1_000_000}) AS b, n, util, mem, mask_n,
                  thr_n, thr_mask
           FROM (SELECT node, "index", epoch_us(ts) // {BUCKET_SECONDS * 1_000_000} AS bi, count(*) AS n,
                        avg(util_gpu_ratio) AS util, avg(mem_used_bytes) AS mem, count(throttle_mask) AS mask_n,
                        count(*) FILTER ({{thr}}) AS thr_n, bit_or(throttle_mask) FILTER ({{thr}}) AS thr_mask
                 FROM gpu_samples WHERE {{where}} GROUP BY node, "index", bi)"""
# the same columns from the 5-minute rollup (collector/rollup.py keeps them)
_ROLLED_GPU = """SELECT node, "index", bucket AS b, samples AS n, util_sum / nullif(util_samples, 0) AS util,
                  mem_sum / nullif(mem_samples, 0) AS mem, throttle_samples AS mask_n, throttled AS thr_n, thr_mask
           FROM gpu_5m WHERE ($lo IS NULL OR bucket >= $lo) AND ($hi IS NULL OR bucket < $hi)"""


def _bucket(t: dt.datetime) -> dt.datetime:
    """The start of ``t``'s 5-minute bucket (as DuckDB's time_bucket and the rollup)."""
    us = (t - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    return dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us - us % (BUCKET_SECONDS * 1_000_000))


def rolled(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the database keeps the rollup columns the GPU buckets need (migration 015)."""
    return bool(con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'gpu_rollup_5m' "
                            "AND column_name = 'thr_mask'").fetchall()[0][0]) and has_rows(con, "gpu_5m")


def gpu_buckets(con: duckdb.DuckDBPyConnection, scope: Scope) -> str:
    """Temp table of per-GPU 5-minute buckets (see the module doc): the buckets wholly inside
    the scope's time range from the rollup (``gpu_5m``, exact however far behind the
    rollup is), the partial ones at its edges from the samples."""
    thr = throttled_sql("throttle_mask")
    if not rolled(con):
        where, params = _time_where(scope)
        return _temp(con, scope, "gpu_buckets", _RAW_GPU.format(thr=thr, where=where), params)
    step = dt.timedelta(seconds=BUCKET_SECONDS)
    s, u = scope.since, scope.until
    lo = None if s is None else (s if _bucket(s) == s else _bucket(s) + step)  # first whole bucket
    hi = None if u is None else _bucket(u)  # whole buckets end before u's own
    edge = ["false"]
    if lo is not None:
        edge.append("ts < $lo")
    if hi is not None:
        edge.append("ts >= $hi")
    raw = _RAW_GPU.format(thr=thr, where=f"($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts <= $u) AND ({' OR '.join(edge)})")
    return _temp(con, scope, "gpu_buckets", f"{_ROLLED_GPU} UNION ALL {raw}",
                 {"lo": lo, "hi": hi, "s": s, "u": u})


def host_buckets(con: duckdb.DuckDBPyConnection, scope: Scope) -> str:
    where, params = _time_where(scope)
    return _temp(
        con,
        scope,
        "host_buckets",
        f"""SELECT node, time_bucket(INTERVAL {BUCKET_SECONDS} SECOND, ts) AS b, count(*) AS n,
                  avg(cpu_util_ratio) AS cpu
           FROM host_samples WHERE {where} GROUP BY ALL""",
        params,
    )


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


def job_gpus(con: duckdb.DuckDBPyConnection, scope: Scope) -> str:
    """Temp table: each GPU bucket taken during a job's span on its node, with the job."""
    return _join(con, scope, "job_gpus", gpu_buckets(con, scope))


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
        g = job_gpus(con, scope)
        for job, node, util, thr in con.execute(
            f"""SELECT job, node, sum(util * n) / nullif(sum(n), 0), sum(thr_n) / nullif(sum(mask_n), 0)
                FROM {g} GROUP BY job, node"""
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
    from .models.store import latest

    try:
        return latest(con, kind)
    except AnalyticsError:  # no fit of that kind: the unit goes without it
        return None
