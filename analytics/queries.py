"""The analyses behind ``analyze nodes|gpu|host|sql``.  Each returns (columns, rows)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb

from .db import AnalyticsError

Result = tuple[list[str], list[tuple[Any, ...]]]


def _run(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> Result:
    cur = con.execute(sql, params)
    cols = [d[0] for d in cur.description]
    return cols, cur.fetchall()


def nodes(con: duckdb.DuckDBPyConnection) -> Result:
    """Every node seen: role, job, first/last seen, agent version and counters from its
    latest heartbeat, GPUs seen, and sources currently not ok."""
    return _run(
        con,
        """
        WITH hb AS (
            SELECT node, arg_max(agent_version, ts) AS agent_version, arg_max(seq, ts) AS last_seq,
                   arg_max(spool_pending, ts) AS spool_pending, arg_max(dropped_total, ts) AS dropped
            FROM heartbeats GROUP BY node),
        g AS (SELECT node, count(DISTINCT uuid) AS gpus FROM gpu_samples GROUP BY node),
        st AS (
            SELECT node, string_agg(source || '=' || state, ', ' ORDER BY source) AS problems FROM (
                SELECT node, source, arg_max(state, ts) AS state FROM agent_status GROUP BY node, source)
            WHERE state <> 'ok' GROUP BY node)
        SELECT n.node, n.role, n.job, strftime(n.first_seen, '%Y-%m-%d %H:%M:%S') AS first_seen,
               strftime(n.last_seen, '%Y-%m-%d %H:%M:%S') AS last_seen, hb.agent_version,
               hb.last_seq AS heartbeats, coalesce(g.gpus, 0) AS gpus, hb.spool_pending, hb.dropped,
               coalesce(st.problems, '') AS not_ok
        FROM nodes n LEFT JOIN hb USING (node) LEFT JOIN g USING (node) LEFT JOIN st USING (node)
        ORDER BY n.node""",
        [],
    )


def _where(node: str | None, cutoff: dt.datetime | None) -> tuple[str, list[Any]]:
    clauses, params = [], []
    if node:
        clauses.append("node = ?")
        params.append(node)
    if cutoff is not None:
        clauses.append("ts >= ?")
        params.append(cutoff)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def gpu(con: duckdb.DuckDBPyConnection, node: str | None = None, cutoff: dt.datetime | None = None) -> Result:
    """Per GPU over the window: samples, utilisation mean/max, memory, power, temperature,
    share of samples with a throttle reason, ECC and Xid events."""
    where, params = _where(node, cutoff)  # used for samples and events alike
    return _run(
        con,
        f"""
        WITH ev AS (
            SELECT node, uuid, sum(count) FILTER (WHERE kind = 'xid') AS xid,
                   sum(count) FILTER (WHERE kind LIKE 'ecc%') AS ecc,
                   bool_or(kind = 'lost') AS lost
            FROM gpu_events{where} GROUP BY node, uuid)
        SELECT s.node, s."index" AS gpu, any_value(s.name) AS name, count(*) AS samples,
               round(avg(util_gpu_ratio) * 100, 1) AS util_pct, round(max(util_gpu_ratio) * 100, 1) AS util_max_pct,
               round(max(mem_used_bytes) / 2^30, 2) AS mem_used_gib, round(any_value(mem_total_bytes) / 2^30, 2) AS mem_total_gib,
               round(avg(power_watts), 1) AS power_w, round(max(temp_celsius), 1) AS temp_max_c,
               round(avg(CASE WHEN throttle_mask & ~1 <> 0 THEN 1 ELSE 0 END) * 100, 1) AS throttled_pct,
               coalesce(any_value(ev.ecc), 0) AS ecc_errors, coalesce(any_value(ev.xid), 0) AS xid_events,
               coalesce(any_value(ev.lost), false) AS lost,
               strftime(max(s.ts), '%Y-%m-%d %H:%M:%S') AS last_sample
        FROM (SELECT * FROM gpu_samples{where}) s LEFT JOIN ev USING (node, uuid)
        GROUP BY s.node, s."index" ORDER BY s.node, gpu""",
        params + params,
    )


def host(
    con: duckdb.DuckDBPyConnection, node: str | None = None, cutoff: dt.datetime | None = None
) -> Result:
    """Per node over the window: CPU mean/max, load, memory, and network / disk rates
    derived from the counters (first to last sample; a counter reset in between is not
    corrected)."""
    where, params = _where(node, cutoff)
    return _run(
        con,
        f"""
        WITH s AS (SELECT * FROM host_samples{where}),
        base AS (
            SELECT node, count(*) AS samples, round(avg(cpu_util_ratio) * 100, 1) AS cpu_pct,
                   round(max(cpu_util_ratio) * 100, 1) AS cpu_max_pct, arg_max(load1, ts) AS load1,
                   round(max(mem_used_bytes) / 2^30, 2) AS mem_used_gib,
                   round(arg_max(mem_total_bytes, ts) / 2^30, 2) AS mem_total_gib,
                   arg_max(procs, ts) AS procs, min(ts) AS t0, max(ts) AS t1
            FROM s GROUP BY node),
        net AS (
            SELECT node, sum(rx) AS rx, sum(tx) AS tx FROM (
                SELECT node, n.nic, max(n.rx_bytes_total) - min(n.rx_bytes_total) AS rx,
                       max(n.tx_bytes_total) - min(n.tx_bytes_total) AS tx
                FROM (SELECT node, unnest(from_json(net, '[{{"nic":"VARCHAR","rx_bytes_total":"UBIGINT","tx_bytes_total":"UBIGINT"}}]')) AS n FROM s)
                GROUP BY node, n.nic) GROUP BY node),
        disk AS (
            SELECT node, sum(r) AS r, sum(w) AS w FROM (
                SELECT node, d.disk, max(d.read_bytes_total) - min(d.read_bytes_total) AS r,
                       max(d.write_bytes_total) - min(d.write_bytes_total) AS w
                FROM (SELECT node, unnest(from_json(disk, '[{{"disk":"VARCHAR","read_bytes_total":"UBIGINT","write_bytes_total":"UBIGINT"}}]')) AS d FROM s)
                GROUP BY node, d.disk) GROUP BY node)
        SELECT b.node, b.samples, b.cpu_pct, b.cpu_max_pct, b.load1, b.mem_used_gib, b.mem_total_gib, b.procs,
               round(net.rx / nullif(epoch(b.t1 - b.t0), 0) / 1e6, 3) AS net_rx_mb_s,
               round(net.tx / nullif(epoch(b.t1 - b.t0), 0) / 1e6, 3) AS net_tx_mb_s,
               round(disk.r / nullif(epoch(b.t1 - b.t0), 0) / 1e6, 3) AS disk_read_mb_s,
               round(disk.w / nullif(epoch(b.t1 - b.t0), 0) / 1e6, 3) AS disk_write_mb_s,
               strftime(b.t1, '%Y-%m-%d %H:%M:%S') AS last_sample
        FROM base b LEFT JOIN net USING (node) LEFT JOIN disk USING (node) ORDER BY b.node""",
        params,
    )


def sql(con: duckdb.DuckDBPyConnection, query: str) -> Result:
    """Run a user's query on the read-only connection."""
    try:
        return _run(con, query, [])
    except duckdb.Error as e:
        raise AnalyticsError(f"query failed: {str(e).splitlines()[0]}") from None
