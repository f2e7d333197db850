"""``--every`` where raw samples are gone (issue 51): the collector's retention deletes raw
GPU and host samples once their rollups are built (``rollup_horizon``), so a bucketed
``analyze gpu`` / ``host`` over an older window read nothing there (1 bucket shown where
``gpu_5m`` held 7). Buckets that start before the horizon are read from the exact 5-minute
(or, for an ``every`` that is a whole number of minutes but not of five, 1-minute) views,
aggregated to ``every``; columns the rollups do not keep (a host's process count) are
empty there. A host's network and disk rates come from the counters the
rollups keep at each bucket's first and last sample (migration 025; buckets rolled before
it have none)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb

Result = tuple[list[str], list[tuple[Any, ...]]]

# one row per GPU (and bucket) from rollup-shaped rows ``r`` and its events ``ev``: the same
# columns, in the same order, as queries.gpu's from every sample; ``{held}``, ``{mig}``,
# ``{pod}``: what the rollups keep of who held the GPU (HELD, or less before migration 028)
_GPU_COLS = """r.node, r."index" AS gpu, any_value(r.name) AS name, {held} AS held_by, sum(r.samples) AS samples,
       round(sum(util_sum) / nullif(sum(util_samples), 0) * 100, 1) AS util_pct,
       round(max(util_max) * 100, 1) AS util_max_pct, round(max(mem_used_max) / 2^30, 2) AS mem_used_gib,
       round(any_value(mem_total_bytes) / 2^30, 2) AS mem_total_gib,
       round(sum(power_sum) / nullif(sum(power_samples), 0), 1) AS power_w, round(max(temp_max), 1) AS temp_max_c,
       round(sum(throttled) / sum(r.samples) * 100, 1) AS throttled_pct,
       coalesce(any_value(ev.ecc), 0) AS ecc_errors, coalesce(any_value(ev.xid), 0) AS xid_events,
       coalesce(any_value(ev.lost), false) AS lost, strftime(max(last_ts), '%Y-%m-%d %H:%M:%S') AS last_sample,
       any_value(parent_index) AS parent, {mig} AS mig_profile,
       round(any_value(mig_slice_ratio) * 100, 1) AS mig_share_pct,
       round(sum(gr_sum) / nullif(sum(gr_n), 0) * 100, 1) AS gr_active_pct,
       round(sum(sm_active_sum) / nullif(sum(sm_active_n), 0) * 100, 1) AS sm_active_pct,
       round(sum(tensor_sum) / nullif(sum(tensor_n), 0) * 100, 1) AS tensor_pct,
       round(sum(dram_sum) / nullif(sum(dram_n), 0) * 100, 1) AS dram_pct,
       round((max(energy_max) - min(energy_min)) / 3.6e6, 4) AS energy_kwh,
       max(nvl_err_max) - min(nvl_err_min) AS nvlink_errors, max(namespace) AS namespace, {pod} AS pod,
       max(slurm_job) AS slurm_job"""
HELD = {"held": "max(held_job)", "mig": "any_value(r.mig_profile)", "pod": "max(r.pod)"}  # migration 028
# before it, a GPU's namespace stood for a pod
HELD_BEFORE = {"held": "max(CASE WHEN namespace IS NOT NULL OR slurm_job IS NOT NULL THEN job END)", "mig": "NULL",
               "pod": "NULL"}

GPU_SQL = """
WITH r AS (
    SELECT time_bucket(INTERVAL {us} MICROSECONDS, bucket) AS b, * FROM {view}
    WHERE bucket < $h {cond}),
ev AS (
    SELECT time_bucket(INTERVAL {us} MICROSECONDS, ts) AS b, node, uuid,
           sum(count) FILTER (WHERE kind = 'xid') AS xid, sum(count) FILTER (WHERE kind LIKE 'ecc%') AS ecc,
           bool_or(kind = 'lost') AS lost
    FROM gpu_events WHERE ts < $h GROUP BY ALL)
SELECT strftime(r.b, '%Y-%m-%d %H:%M:%S') AS bucket, """ + _GPU_COLS + """
FROM r LEFT JOIN ev ON ev.b = r.b AND ev.node = r.node AND ev.uuid = r.uuid
GROUP BY r.b, r.node, r."index" ORDER BY r.b, r.node, gpu"""

HOST_SQL = """
SELECT strftime(time_bucket(INTERVAL {us} MICROSECONDS, bucket), '%Y-%m-%d %H:%M:%S') AS bucket, node,
       sum(samples) AS samples, round(sum(cpu_sum) / nullif(sum(cpu_samples), 0) * 100, 1) AS cpu_pct,
       round(max(cpu_max) * 100, 1) AS cpu_max_pct,
       round(sum(load1_sum) / nullif(sum(load1_samples), 0), 2) AS load1,
       round(max(mem_used_max) / 2^30, 2) AS mem_used_gib, round(any_value(mem_total_bytes) / 2^30, 2) AS mem_total_gib,
       round((arg_max(net_rx_last, last_ts) FILTER (WHERE net_rx_last IS NOT NULL) - arg_min(net_rx_first, first_ts) FILTER (WHERE net_rx_first IS NOT NULL))
              / nullif(epoch(max(last_ts) - min(first_ts)), 0) / 1e6, 3) AS net_rx_mb_s,
       round((arg_max(net_tx_last, last_ts) FILTER (WHERE net_tx_last IS NOT NULL) - arg_min(net_tx_first, first_ts) FILTER (WHERE net_tx_first IS NOT NULL))
              / nullif(epoch(max(last_ts) - min(first_ts)), 0) / 1e6, 3) AS net_tx_mb_s,
       round((arg_max(disk_read_last, last_ts) FILTER (WHERE disk_read_last IS NOT NULL) - arg_min(disk_read_first, first_ts) FILTER (WHERE disk_read_first IS NOT NULL))
              / nullif(epoch(max(last_ts) - min(first_ts)), 0) / 1e6, 3) AS disk_read_mb_s,
       round((arg_max(disk_write_last, last_ts) FILTER (WHERE disk_write_last IS NOT NULL) - arg_min(disk_write_first, first_ts) FILTER (WHERE disk_write_first IS NOT NULL))
              / nullif(epoch(max(last_ts) - min(first_ts)), 0) / 1e6, 3) AS disk_write_mb_s
FROM {view} WHERE bucket < $h {cond}
GROUP BY ALL ORDER BY 1, node"""


WHOLE_GPU_SQL = """
WITH r AS ({parts}),
ev AS (
    SELECT node, uuid, sum(count) FILTER (WHERE kind = 'xid') AS xid, sum(count) FILTER (WHERE kind LIKE 'ecc%') AS ecc,
           bool_or(kind = 'lost') AS lost
    FROM gpu_events{ev_where} GROUP BY ALL)
SELECT """ + _GPU_COLS.format(**HELD) + """
FROM r LEFT JOIN ev ON ev.node = r.node AND ev.uuid = r.uuid
GROUP BY r.node, r."index" ORDER BY r.node, gpu"""
WHOLE_SCHEMA = 28  # the migration that gave the GPU rollups what a whole window reads
STEP = 300  # the rollup a whole window reads: gpu_5m


def _schema(con: duckdb.DuckDBPyConnection) -> int:
    try:
        return con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchall()[0][0]
    except duckdb.CatalogException:
        return 0


def _edge(t: dt.datetime, up: bool) -> dt.datetime:
    """``t`` to a 5-minute boundary (``up``: the first at or after it, else at or before)."""
    s = t.replace(tzinfo=dt.timezone.utc).timestamp()
    b = (s // STEP + (1 if up and s % STEP else 0)) * STEP
    return dt.datetime.fromtimestamp(b, dt.timezone.utc).replace(tzinfo=None)


def whole_gpu(con: duckdb.DuckDBPyConnection, node: str | None, cutoff: dt.datetime | None,
              until: dt.datetime | None, label: tuple[str, str] | None) -> Result | None:
    """``analyze gpu`` without ``--every`` (one row per GPU over [cutoff, until)): the whole
    5-minute buckets inside the window read from ``gpu_5m`` (exact: rollup rows plus the raw
    rows they have not covered), only the partial buckets at its edges from the raw samples,
    all summed as the rollup sums them; the same answer as aggregating every sample, where
    raw samples are still held (before the retention horizon the rollups still answer).
    None where the database predates migration 028 or the window holds no whole bucket
    (the caller aggregates the samples)."""
    have = _schema(con)
    b0 = _edge(cutoff, up=True) if cutoff is not None else None
    b1 = _edge(until, up=False) if until is not None else None
    if have < WHOLE_SCHEMA or (b0 is not None and b1 is not None and b1 <= b0):
        return None
    from cmdare.collector.rollup import BY_VIEW

    params: dict[str, Any] = {}
    scope = ""
    if node:
        scope += " AND node = $node"
        params["node"] = node
    if label is not None:
        scope += " AND node IN (SELECT node FROM nodes WHERE json_extract_string(labels, $lk) = $lv)"
        params |= {"lk": f'$."{label[0]}"', "lv": label[1]}
    inner, edges = [], []
    if b0 is not None:
        inner.append("bucket >= $b0")
        edges.append("(ts >= $cutoff AND ts < $b0)")
        params |= {"b0": b0, "cutoff": cutoff}
    if b1 is not None:
        inner.append("bucket < $b1")
        edges.append("(ts >= $b1 AND ts < $until)")
        params |= {"b1": b1, "until": until}
    parts = f"SELECT * FROM gpu_5m WHERE true{''.join(' AND ' + c for c in inner)}{scope}"
    if edges:
        parts += (f"\n    UNION ALL BY NAME\n    {BY_VIEW['gpu_5m'].from_raw()} WHERE ({' OR '.join(edges)}){scope}"
                  " GROUP BY ALL")
    ev = [c for c, on in (("node = $node", node), ("ts >= $cutoff", cutoff), ("ts < $until", until)) if on]
    if label is not None:
        ev.append("node IN (SELECT node FROM nodes WHERE json_extract_string(labels, $lk) = $lv)")
    params |= {k: v for k, v in (("cutoff", cutoff), ("until", until)) if v is not None}
    sql = WHOLE_GPU_SQL.format(parts=parts, ev_where=(" WHERE " + " AND ".join(ev)) if ev else "")
    cur = con.execute(sql, params)
    return [d[0] for d in cur.description], cur.fetchall()


def horizon(con: duckdb.DuckDBPyConnection, src: str) -> dt.datetime | None:
    """Before when ``src``'s raw rows were deleted (None: never)."""
    try:
        return con.execute("SELECT max(before) FROM rollup_horizon WHERE src = ?", [src]).fetchall()[0][0]
    except duckdb.CatalogException:
        return None


def fill(con: duckdb.DuckDBPyConnection, kind: str, result: Result, every: float, node: str | None,
         cutoff: dt.datetime | None, until: dt.datetime | None, label: tuple[str, str] | None) -> Result:
    """``result`` (bucketed from the raw samples) with every bucket that starts before the
    retention horizon read from the rollups instead."""
    src = "gpu_samples" if kind == "gpu" else "host_samples"
    h = horizon(con, src)
    if h is None or (cutoff is not None and cutoff >= h) or every % 60:
        return result
    view = f"{kind}_5m" if every % 300 == 0 else f"{kind}_1m"
    step = 300 if view.endswith("5m") else 60
    # every bucket with any part before the horizon, whole (the views hold the rest exactly)
    floor = con.execute(f"SELECT time_bucket(INTERVAL {int(every * 1e6)} MICROSECONDS, ?::TIMESTAMP)", [h]).fetchall()[0][0]
    h = floor if floor >= h else floor + dt.timedelta(seconds=every)
    cond, params = "", {"h": h}
    if node:
        cond += " AND node = $node"
        params["node"] = node
    if cutoff is not None:
        cond += " AND bucket >= $cutoff"
        params["cutoff"] = dt.datetime.fromtimestamp(
            (cutoff.replace(tzinfo=dt.timezone.utc).timestamp() // step) * step, dt.timezone.utc).replace(tzinfo=None)
    if until is not None:
        cond += " AND bucket < $until"
        params["until"] = until
    if label is not None:
        cond += " AND node IN (SELECT node FROM nodes WHERE json_extract_string(labels, $lk) = $lv)"
        params |= {"lk": f'$."{label[0]}"', "lv": label[1]}
    held = HELD if _schema(con) >= WHOLE_SCHEMA else HELD_BEFORE
    sql = (GPU_SQL.format(us=int(every * 1e6), view=view, cond=cond, **held)
           if kind == "gpu" else HOST_SQL.format(us=int(every * 1e6), view=view, cond=cond))
    cur = con.execute(sql, params)
    got = [d[0] for d in cur.description]
    cols, rows = result
    early = [tuple(dict(zip(got, r, strict=True)).get(c) for c in cols) for r in cur.fetchall()]
    if not early:
        return result
    cut = h.strftime("%Y-%m-%d %H:%M:%S")
    return cols, early + [r for r in rows if r[0] >= cut]
