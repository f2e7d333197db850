"""The analyses behind ``analyze nodes|gpu|host|sql``.  Each returns (columns, rows)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import duckdb

from .db import AnalyticsError, has_column, has_view
from .verdicts import input_bound_sql, throttled_sql

Result = tuple[list[str], list[tuple[Any, ...]]]


def _run(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | dict[str, Any]) -> Result:
    cur = con.execute(sql, params)
    cols = [d[0] for d in cur.description]
    return cols, cur.fetchall()


def needs_schema(con: duckdb.DuckDBPyConnection, version: int, what: str) -> None:
    """A clear error when the database predates the tables an analysis reads."""
    have = con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchall()[0][0]
    if have < version:
        raise AnalyticsError(
            f"{what} needs database schema {version}, this database has {have}: "
            "run cmdare-collector migrate --db <file> (or any collector command) once"
        )


def nodes(con: duckdb.DuckDBPyConnection, lost_after: float = 3, label: tuple[str, str] | None = None,
          horizon: dt.datetime | None = None, ends: dt.datetime | None = None) -> Result:
    """Every node seen: role, job, cloud identity and state of its latest life (alive, or
    how it ended: revoked / stopped / lost after ``lost_after`` silent heartbeat
    intervals), first/last seen, agent version and counters from its latest heartbeat,
    GPUs seen, sources currently not ok, and events stamped far from the collector's clock
    (count, latest skew in seconds; ``clock skew``: a node seen only through those).
    ``horizon``: up to when the database holds everything sent (a collector behind: Kafka
    away, a backlog); a node lost now but alive as of then is ``unknown (collector
    behind)``, as the NodeLost rule judges it. ``ends``: where a file no collector fills
    ends (``Database.file_end``): every state is as of then."""
    needs_schema(con, 7, "analyze nodes")
    behind = ends is None and horizon is not None and horizon < dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    # GPUs seen: from the 5-minute rollups where they are (exact: rolled rows and the raw rows
    # pending; 5x-30x fewer rows than the samples, and kept past the samples' retention)
    gpus = "gpu_5m" if has_view(con, "gpu_5m") else "gpu_samples"
    then = ("""
        past AS (
            SELECT node, arg_max(coalesce(end_reason, state), boot_time) AS state
            FROM instance_lives(lost_after := $lost, asof_ts := $horizon) GROUP BY node),""" if behind else "")
    return _run(
        con,
        f"""
        WITH hb AS (
            SELECT node, arg_max(agent_version, ts) AS agent_version, arg_max(seq, ts) AS last_seq,
                   arg_max(spool_pending, ts) AS spool_pending, arg_max(dropped_total, ts) AS dropped
            FROM heartbeats GROUP BY node),
        g AS (SELECT node, count(DISTINCT uuid) AS gpus FROM {gpus} GROUP BY node),
        st AS (
            SELECT node, string_agg(source || '=' || state, ', ' ORDER BY source) AS problems FROM (
                SELECT node, source, arg_max(state, ts) AS state FROM agent_status GROUP BY node, source)
            WHERE state <> 'ok' GROUP BY node),
        sk AS (
            SELECT node, count(*) AS skewed_events, round(arg_max(skew_seconds, received_at)) AS clock_skew_s
            FROM clock_skew GROUP BY node),{then}
        life AS (
            SELECT node, arg_max(cloud, boot_time) AS cloud, arg_max(zone, boot_time) AS zone,
                   arg_max(instance_type, boot_time) AS instance_type, arg_max(spot, boot_time) AS spot,
                   arg_max(coalesce(end_reason, state), boot_time) AS state, count(*) AS lives
            FROM instance_lives(lost_after := $lost{", asof_ts := $ends" if ends else ""}) GROUP BY node)
        SELECT n.node, n.role, n.job, life.cloud, life.zone, life.instance_type, life.spot,
               coalesce({"CASE WHEN life.state = 'lost' AND past.state = 'alive' THEN 'unknown (collector behind)' "
                         "ELSE life.state END" if behind else "life.state"},
                        CASE WHEN sk.node IS NULL THEN 'unknown' ELSE 'clock skew' END) AS state,
               coalesce(life.lives, 0) AS lives,
               strftime(n.first_seen, '%Y-%m-%d %H:%M:%S') AS first_seen,
               strftime(n.last_seen, '%Y-%m-%d %H:%M:%S') AS last_seen, hb.agent_version,
               hb.last_seq AS heartbeats, coalesce(g.gpus, 0) AS gpus, hb.spool_pending, hb.dropped,
               coalesce(st.problems, '') AS not_ok, sk.clock_skew_s, coalesce(sk.skewed_events, 0) AS skewed_events
        FROM nodes n LEFT JOIN hb USING (node) LEFT JOIN g USING (node) LEFT JOIN st USING (node)
        LEFT JOIN life USING (node) LEFT JOIN sk USING (node){" LEFT JOIN past USING (node)" if behind else ""}
        {"WHERE json_extract_string(n.labels, $lk) = $lv" if label else ""}
        ORDER BY n.node""",
        {"lost": lost_after, **({"horizon": horizon} if behind else {}), **({"ends": ends} if ends else {}),
         **({"lk": f'$."{label[0]}"', "lv": label[1]} if label else {})},
    )


def _life_filters(
    region: str | None, gpu_type: str | None, alias: str, since: tuple[str, dt.datetime | None]
) -> tuple[str, list[Any]]:
    """SQL conditions on a life's region and accelerator (the cloud's, else the GPU model
    the node's samples name): case-insensitive substrings, e.g. ``v100``; and ``since``:
    (column, cutoff) for the window."""
    clauses: list[str] = []
    params: list[Any] = []
    if since[1] is not None:
        clauses.append(f"{since[0]} >= ?")
        params.append(since[1])
    if region:
        clauses.append(f"lower({alias}.region) LIKE '%' || lower(?) || '%'")
        params.append(region)
    if gpu_type:
        clauses.append(
            f"(lower({alias}.accelerator) LIKE '%' || lower(?) || '%' OR EXISTS (SELECT 1 FROM gpu_samples g "
            f"WHERE g.node = {alias}.node AND lower(g.name) LIKE '%' || lower(?) || '%'))"
        )
        params += [gpu_type, gpu_type]
    return " AND ".join(clauses), params


def instances(
    con: duckdb.DuckDBPyConnection,
    lost_after: float = 3,
    cutoff: dt.datetime | None = None,
    region: str | None = None,
    gpu_type: str | None = None,
) -> Result:
    """Every life of every VM: identity, boot, first/last seen, state and how it ended,
    lifetime, notices seen."""
    needs_schema(con, 4, "analyze instances")
    cond, params = _life_filters(region, gpu_type, "l", ("l.last_seen", cutoff))
    return _run(
        con,
        f"""
        SELECT l.node, l.cloud, l.region, l.zone, l.instance_type, l.spot, l.accelerator,
               l.accelerator_count AS accelerators, l.instance_id,
               strftime(l.boot_time, '%Y-%m-%d %H:%M:%S') AS booted,
               strftime(l.last_seen, '%Y-%m-%d %H:%M:%S') AS last_seen, l.state, l.end_reason,
               round(l.lifetime_seconds / 3600, 3) AS lifetime_h, l.notices
        FROM instance_lives(lost_after := ?) l
        {"WHERE " + cond if cond else ""}
        ORDER BY l.node, l.boot_time""",
        [lost_after, *params],
    )


def revocations(
    con: duckdb.DuckDBPyConnection,
    cutoff: dt.datetime | None = None,
    region: str | None = None,
    gpu_type: str | None = None,
    lost_after: float = 3,
) -> Result:
    """Every notice: when it was seen, the node and its identity, kind and action, the
    cloud's deadline and the lead time it gave, when the node was last seen, and for each
    training job on the node, the progress lost since its last checkpoint (steps and
    seconds of work from the last successful save to the last step the node reported)."""
    needs_schema(con, 4, "analyze revocations")
    cond, params = _life_filters(region, gpu_type, "r", ("r.ts", cutoff))
    return _run(
        con,
        f"""
        WITH lives AS (SELECT * FROM instance_lives(lost_after := ?)),
        r AS (
            SELECT v.*, l.region, l.zone, l.instance_type, l.accelerator, l.spot, l.last_seen, l.end_reason,
                   l.boot_time AS booted,
                   lead(l.boot_time) OVER (PARTITION BY l.node ORDER BY l.boot_time) AS next_boot
            FROM revocations v ASOF LEFT JOIN lives l ON v.node = l.node AND v.ts >= l.boot_time),
        work AS (  -- per notice and job: the last step the node reported in that life
            SELECT r.node AS rnode, r.id, s.job, max(s.last_step) AS last_step, max(s.ts) AS last_step_ts
            FROM r JOIN steps s ON s.node = r.node AND s.ts >= coalesce(r.booted, r.ts - INTERVAL 1 DAY)
            GROUP BY r.node, r.id, s.job),
        ck AS (  -- the job's last good save at or before that step
            SELECT w.rnode, w.id, w.job, w.last_step, w.last_step_ts, max(c.step) AS ckpt_step,
                   arg_max(c.ts, c.step) AS ckpt_ts, count(c.id) AS saves
            FROM work w LEFT JOIN checkpoints c ON c.job = w.job AND c.action = 'save' AND c.ok
                 AND c.step <= w.last_step AND c.ts <= w.last_step_ts
            GROUP BY ALL)
        SELECT strftime(r.ts, '%Y-%m-%d %H:%M:%S') AS noticed, r.node, r.cloud, r.region, r.zone,
               r.instance_type, r.accelerator, r.spot, r.kind, r.action, r.revokes,
               strftime(make_timestamp(CAST(r.deadline * 1e6 AS BIGINT)), '%Y-%m-%d %H:%M:%S') AS deadline,
               round(r.lead_seconds, 1) AS lead_s,
               round(epoch(r.last_seen - r.ts), 1) AS seen_after_notice_s, r.end_reason,
               ck.job, ck.last_step, ck.ckpt_step AS checkpoint_step,
               CASE WHEN ck.saves > 0 THEN ck.last_step - ck.ckpt_step END AS steps_lost,
               CASE WHEN ck.saves > 0 THEN round(epoch(ck.last_step_ts - ck.ckpt_ts), 1) END AS work_lost_s
        FROM r LEFT JOIN ck ON ck.id = r.id AND ck.rnode = r.node
        {"WHERE " + cond if cond else ""}
        ORDER BY r.ts, r.node, ck.job""",
        [lost_after, *params],
    )


LABEL_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
MAX_BUCKETS = 10_000  # rows per series a bucketed table may have: past it, --every is too fine


def parse_label(text: str | None) -> tuple[str, str] | None:
    """``KEY=VALUE`` (a node label, e.g. ``team=vision``) -> (key, value); a one-line error
    quoting at most a short excerpt."""
    if text is None:
        return None
    key, eq, value = text.partition("=")
    if not eq or not LABEL_KEY.fullmatch(key) or len(value) > 256:
        raise AnalyticsError(f"--label: expected KEY=VALUE (a node label, e.g. team=vision), got {text[:40]!r}")
    return key, value


def _where(node: str | None, cutoff: dt.datetime | None, until: dt.datetime | None = None,
           label: tuple[str, str] | None = None) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if node:
        clauses.append("node = ?")
        params.append(node)
    if cutoff is not None:
        clauses.append("ts >= ?")
        params.append(cutoff)
    if until is not None:
        clauses.append("ts < ?")
        params.append(until)
    if label is not None:
        clauses.append("node IN (SELECT node FROM nodes WHERE json_extract_string(labels, ?) = ?)")
        params += [f'$."{label[0]}"', label[1]]
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _bucket_expr(every: float | None, con: duckdb.DuckDBPyConnection, table: str, where: str,
                 params: list[Any]) -> str:
    """The SQL of a row's ``every``-second bucket (its start, as text), or "" for none;
    refused when the window would hold more than MAX_BUCKETS of them."""
    if every is None:
        return ""
    if not (every >= 1 and every < 1e9):
        raise AnalyticsError(f"--every: from 1s to 30y, got {every:g} s")
    lo, hi = con.execute(f"SELECT min(ts), max(ts) FROM {table}{where}", params).fetchall()[0]
    if lo is not None and (hi - lo).total_seconds() / every > MAX_BUCKETS:
        raise AnalyticsError(f"--every {every:g}s: more than {MAX_BUCKETS:,} buckets over the window: "
                             "use a coarser --every or a narrower --since / --until")
    return f"strftime(time_bucket(INTERVAL {int(every * 1e6)} MICROSECONDS, ts), '%Y-%m-%d %H:%M:%S')"


def gpu(con: duckdb.DuckDBPyConnection, node: str | None = None, cutoff: dt.datetime | None = None,
        until: dt.datetime | None = None, label: tuple[str, str] | None = None, every: float | None = None,
        scan: bool = False) -> Result:
    """Per GPU over the window [cutoff, until) (and per ``every`` seconds: a leading
    ``bucket`` column, its start): the job of the Kubernetes pod or Slurm job holding it
    (``held_by``; ``namespace``, ``pod``, ``slurm_job``), samples, utilisation mean/max,
    memory, power, temperature, share of samples with a throttle reason, ECC and Xid events;
    ``label``: only nodes with that label. Without ``every`` the window's whole 5-minute
    buckets are read from the rollup (analytics/rolled.py ``whole_gpu``); ``scan``: every
    sample read instead (the answer that must equal; tests and benchmarks)."""
    if every is None and not scan:  # the whole buckets of the window from the 5-minute rollup
        from .rolled import whole_gpu

        whole = whole_gpu(con, node, cutoff, until, label)
        if whole is not None:
            return _mig_to_parents(whole, False)
    where, params = _where(node, cutoff, until, label)  # used for samples and events alike
    b = _bucket_expr(every, con, "gpu_samples", where, params)
    sel, key = (f"{b} AS bucket, ", "bucket, ") if b else ("", "")
    cols_rows = _run(
        con,
        f"""
        WITH ev AS (
            SELECT {sel}node, uuid, sum(count) FILTER (WHERE kind = 'xid') AS xid,
                   sum(count) FILTER (WHERE kind LIKE 'ecc%') AS ecc,
                   bool_or(kind = 'lost') AS lost
            FROM gpu_events{where} GROUP BY ALL)
        SELECT {key}s.node, s."index" AS gpu, any_value(s.name) AS name,
               max(CASE WHEN s.pod IS NOT NULL OR s.slurm_job IS NOT NULL THEN s.job END) AS held_by,
               count(*) AS samples,
               round(avg(util_gpu_ratio) * 100, 1) AS util_pct, round(max(util_gpu_ratio) * 100, 1) AS util_max_pct,
               round(max(mem_used_bytes) / 2^30, 2) AS mem_used_gib, round(any_value(mem_total_bytes) / 2^30, 2) AS mem_total_gib,
               round(avg(power_watts), 1) AS power_w, round(max(temp_celsius), 1) AS temp_max_c,
               round(avg(CASE WHEN {throttled_sql("throttle_mask")} THEN 1 ELSE 0 END) * 100, 1) AS throttled_pct,
               coalesce(any_value(ev.ecc), 0) AS ecc_errors, coalesce(any_value(ev.xid), 0) AS xid_events,
               coalesce(any_value(ev.lost), false) AS lost,
               strftime(max(s.ts), '%Y-%m-%d %H:%M:%S') AS last_sample,
               any_value(s.parent_index) AS parent, any_value(s.mig_profile) AS mig_profile,
               round(any_value(s.mig_slice_ratio) * 100, 1) AS mig_share_pct,
               round(avg(gr_engine_active_ratio) * 100, 1) AS gr_active_pct,
               round(avg(sm_active_ratio) * 100, 1) AS sm_active_pct,
               round(avg(tensor_active_ratio) * 100, 1) AS tensor_pct,
               round(avg(dram_active_ratio) * 100, 1) AS dram_pct,
               round((max(energy_joules_total) - min(energy_joules_total)) / 3.6e6, 4) AS energy_kwh,
               max(nvlink_errors_total) - min(nvlink_errors_total) AS nvlink_errors,
               max(s.namespace) AS namespace, max(s.pod) AS pod, max(s.slurm_job) AS slurm_job
        FROM (SELECT {sel}* FROM gpu_samples{where}) s LEFT JOIN ev USING ({key}node, uuid)
        GROUP BY {key}s.node, s."index" ORDER BY {key}s.node, gpu""",
        params + params,
    )
    if b:
        from .rolled import fill

        cols_rows = fill(con, "gpu", cols_rows, every, node, cutoff, until, label)  # type: ignore[arg-type]
    return _mig_to_parents(cols_rows, bool(b))


def _mig_to_parents(result: Result, bucketed: bool) -> Result:
    """A MIG parent's activity, where it has none of its own (GPU_UTIL reads nothing in
    MIG mode; GPM is per GPU instance): its instances' activity weighted by their share of
    its SMs (a 1g instance of an A100 busy 70 % is a tenth of the GPU busy); its memory
    used, where it reports none: the instances' sum."""
    cols, rows = result
    ix = {c: i for i, c in enumerate(cols)}
    pct = ("gr_active_pct", "sm_active_pct", "tensor_pct", "dram_pct")

    def key(r: tuple, gpu: Any) -> tuple:
        return (r[0], r[ix["node"]], gpu) if bucketed else (r[ix["node"]], gpu)

    inst: dict[tuple, list[tuple]] = {}
    for r in rows:
        if r[ix["parent"]] is not None:
            inst.setdefault(key(r, r[ix["parent"]]), []).append(r)
    if not inst:
        return cols, rows
    out = []
    for r in rows:
        kids = inst.get(key(r, r[ix["gpu"]])) if r[ix["parent"]] is None else None
        if kids:
            filled = list(r)
            for c in pct:
                have = [(k[ix[c]], k[ix["mig_share_pct"]]) for k in kids if k[ix[c]] is not None and k[ix["mig_share_pct"]]]
                if filled[ix[c]] is None and have:
                    filled[ix[c]] = round(sum(v * w / 100 for v, w in have), 1)
            mem = [k[ix["mem_used_gib"]] for k in kids if k[ix["mem_used_gib"]] is not None]
            if filled[ix["mem_used_gib"]] is None and mem:
                filled[ix["mem_used_gib"]] = round(sum(mem), 2)
            r = tuple(filled)
        out.append(r)
    return cols, out


def host(
    con: duckdb.DuckDBPyConnection, node: str | None = None, cutoff: dt.datetime | None = None,
    until: dt.datetime | None = None, label: tuple[str, str] | None = None, every: float | None = None,
) -> Result:
    """Per node over the window [cutoff, until) (and per ``every`` seconds: a leading
    ``bucket`` column, its start): CPU mean/max, load, memory, and network / disk rates
    derived from the counters (first to last sample of the bucket; a counter reset in
    between is not corrected); ``label``: only nodes with that label."""
    where, params = _where(node, cutoff, until, label)
    b = _bucket_expr(every, con, "host_samples", where, params)
    sel, key = (f"{b} AS bucket, ", "bucket, ") if b else ("", "")
    out = _run(
        con,
        f"""
        WITH s AS (SELECT {sel}* FROM host_samples{where}),
        base AS (
            SELECT {key}node, count(*) AS samples, round(avg(cpu_util_ratio) * 100, 1) AS cpu_pct,
                   round(max(cpu_util_ratio) * 100, 1) AS cpu_max_pct, arg_max(load1, ts) AS load1,
                   round(max(mem_used_bytes) / 2^30, 2) AS mem_used_gib,
                   round(arg_max(mem_total_bytes, ts) / 2^30, 2) AS mem_total_gib,
                   arg_max(procs, ts) AS procs, min(ts) AS t0, max(ts) AS t1
            FROM s GROUP BY ALL),
        net AS (
            SELECT {key}node, sum(rx) AS rx, sum(tx) AS tx FROM (
                SELECT {key}node, n.nic, max(n.rx_bytes_total) - min(n.rx_bytes_total) AS rx,
                       max(n.tx_bytes_total) - min(n.tx_bytes_total) AS tx
                FROM (SELECT {key}node, unnest(from_json(net, '[{{"nic":"VARCHAR","rx_bytes_total":"UBIGINT","tx_bytes_total":"UBIGINT"}}]')) AS n FROM s)
                GROUP BY ALL) GROUP BY ALL),
        disk AS (
            SELECT {key}node, sum(r) AS r, sum(w) AS w FROM (
                SELECT {key}node, d.disk, max(d.read_bytes_total) - min(d.read_bytes_total) AS r,
                       max(d.write_bytes_total) - min(d.write_bytes_total) AS w
                FROM (SELECT {key}node, unnest(from_json(disk, '[{{"disk":"VARCHAR","read_bytes_total":"UBIGINT","write_bytes_total":"UBIGINT"}}]')) AS d FROM s)
                GROUP BY ALL) GROUP BY ALL)
        SELECT {"b.bucket, " if b else ""}b.node, b.samples, b.cpu_pct, b.cpu_max_pct, b.load1, b.mem_used_gib,
               b.mem_total_gib, b.procs,
               round(net.rx / nullif(epoch(b.t1 - b.t0), 0) / 1e6, 3) AS net_rx_mb_s,
               round(net.tx / nullif(epoch(b.t1 - b.t0), 0) / 1e6, 3) AS net_tx_mb_s,
               round(disk.r / nullif(epoch(b.t1 - b.t0), 0) / 1e6, 3) AS disk_read_mb_s,
               round(disk.w / nullif(epoch(b.t1 - b.t0), 0) / 1e6, 3) AS disk_write_mb_s,
               strftime(b.t1, '%Y-%m-%d %H:%M:%S') AS last_sample
        FROM base b LEFT JOIN net USING ({key}node) LEFT JOIN disk USING ({key}node)
        ORDER BY {"b.bucket, " if b else ""}b.node""",
        params,
    )
    if b:
        from .rolled import fill

        out = fill(con, "host", out, every, node, cutoff, until, label)  # type: ignore[arg-type]
    return out


# per step aggregate: the time its steps covered, and its wait / step time totals
_STEP_SUMS = """steps, examples, steps / nullif(steps_per_second, 0) AS span,
    step_mean_seconds * steps AS step_time, wait_mean_seconds * steps AS wait_time"""


# how a job's latest run stands, from its ranks' states (runs()): running while any rank
# runs, else the worst end of its ranks
JOB_STATE = ("crashed", "failed", "node lost", "node revoked", "interrupted", "node stopped", "finished")
_WORST = "CASE state " + " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(JOB_STATE)) + " ELSE 99 END"
JOB_STATE_SQL = f"""
        rr AS (SELECT * FROM runs(since := $since)),
        latest AS (SELECT job, arg_max(run, first_seen) AS run FROM rr GROUP BY job),
        jstate AS (
            SELECT rr.job, CASE WHEN bool_or(state = 'running') THEN 'running' ELSE arg_min(state, {_WORST}) END
                       AS state,
                   CASE WHEN NOT bool_or(state = 'running') THEN max(ended_at) END AS ended_at
            FROM rr JOIN latest USING (job, run) GROUP BY rr.job)"""


def jobs(con: duckdb.DuckDBPyConnection, cutoff: dt.datetime | None = None) -> Result:
    """Every training job seen (declared or stepping): model, size, ranks, nodes, steps/s
    (mean over ranks), examples/s (all examples over the time the job stepped: ranks side
    by side add up, a restart's runs do not), input-wait share and verdict, and how its
    latest run stands (running, or how it ended: see ``runs``)."""
    where = " WHERE ts >= $since" if cutoff is not None else ""
    share = "sum(s.wait_time) / nullif(sum(s.step_time), 0)"
    return _run(
        con,
        f"""
        WITH decl AS (
            SELECT job, arg_max(model, ts) AS model, arg_max(params, ts) AS params,
                   arg_max(world_size, ts) AS world_size, arg_max(batch_size, ts) AS batch_size,
                   arg_max(framework, ts) AS framework, arg_max(accelerator, ts) AS accelerator
            FROM jobs GROUP BY job),{JOB_STATE_SQL},
        st AS (SELECT job, run, rank, node, ts, {_STEP_SUMS} FROM steps{where}),
        per_rank AS (
            SELECT job, run, rank, any_value(node) AS node, sum(steps) AS steps, sum(examples) AS examples,
                   sum(span) AS span, sum(step_time) AS step_time, sum(wait_time) AS wait_time,
                   min(ts) AS t0, max(ts) AS t1
            FROM st GROUP BY job, run, rank),
        -- the time the job stepped: the union of its intervals over all runs and ranks
        -- (ranks side by side count once, a restart's runs one after the other add up)
        iv AS (SELECT job, ts - to_microseconds(CAST(span * 1e6 AS BIGINT)) AS a, ts AS b FROM st WHERE span > 0),
        isl AS (
            SELECT job, a, b, sum(CASE WHEN a > prev_b THEN 1 ELSE 0 END)
                       OVER (PARTITION BY job ORDER BY a, b ROWS UNBOUNDED PRECEDING) AS k
            FROM (SELECT job, a, b, max(b) OVER (PARTITION BY job ORDER BY a, b
                                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_b
                  FROM iv)),
        cover AS (
            SELECT job, sum(epoch(e) - epoch(s)) AS seconds
            FROM (SELECT job, k, min(a) AS s, max(b) AS e FROM isl GROUP BY job, k) GROUP BY job),
        agg AS (
            SELECT s.job, count(DISTINCT s.run) AS runs, count(*) AS ranks, count(DISTINCT s.node) AS nodes,
                   sum(s.steps) AS steps, avg(s.steps / nullif(s.span, 0)) AS steps_per_s,
                   sum(s.examples) / nullif(any_value(c.seconds), 0) AS examples_per_s, {share} AS share,
                   max(s.t1) AS t1
            FROM per_rank s LEFT JOIN cover c USING (job) GROUP BY s.job)
        SELECT coalesce(a.job, d.job) AS job, d.model, d.params, d.world_size, d.batch_size, d.framework,
               d.accelerator, coalesce(a.runs, 0) AS runs, coalesce(a.ranks, 0) AS ranks,
               coalesce(a.nodes, 0) AS nodes, coalesce(a.steps, 0) AS steps,
               round(a.steps_per_s, 3) AS steps_per_s, round(a.examples_per_s, 1) AS examples_per_s,
               round(a.share * 100, 1) AS input_wait_pct, {input_bound_sql("a.share")} AS input_bound,
               strftime(a.t1, '%Y-%m-%d %H:%M:%S') AS last_step, coalesce(js.state, 'running') AS state,
               strftime(js.ended_at, '%Y-%m-%d %H:%M:%S') AS ended
        FROM agg a FULL OUTER JOIN decl d ON a.job = d.job LEFT JOIN jstate js ON js.job = coalesce(a.job, d.job)
        {_HELD_JOBS if has_column(con, "gpu_5m", "slurm_job") else ""}
        ORDER BY 1""",
        {"since": cutoff},
    )


# jobs no rank declared nor stepped that a Kubernetes pod's GPUs name (their job label, else
# namespace/pod: cmdare.agent.sources.gpu.kubelet) or a Slurm job's (slurm-<id>), from the GPU
# rollup, in one of SCHED_STATES
POD_STATE, SLURM_STATE = "pod (no steps)", "slurm job (no steps)"
SCHED_STATES = (POD_STATE, SLURM_STATE)
_HELD_JOBS = """UNION ALL
        SELECT job, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, count(DISTINCT node), 0, NULL, NULL, NULL, NULL,
               NULL, CASE WHEN max(namespace) IS NOT NULL THEN '""" + POD_STATE + """' ELSE '""" + SLURM_STATE + """' END,
               NULL
        FROM gpu_5m WHERE (namespace IS NOT NULL OR slurm_job IS NOT NULL) AND job IS NOT NULL AND job <> ''
          AND ($since IS NULL OR last_ts >= $since)
          AND job NOT IN (SELECT job FROM agg WHERE job IS NOT NULL) AND job NOT IN (SELECT job FROM decl WHERE job IS NOT NULL)
        GROUP BY job"""


def runs(con: duckdb.DuckDBPyConnection, job: str | None = None, cutoff: dt.datetime | None = None,
         ends: dt.datetime | None = None) -> Result:
    """Every run and rank (of one job, or all) with how it stands: running, finished,
    failed (the error or exit code), interrupted, crashed, or its node's end (``runs()``);
    ``ends``: where a file no collector fills ends: nodes judged alive as of then."""
    return _run(
        con,
        """
        SELECT job, run, rank, node, role, pid, state,
               strftime(first_seen, '%Y-%m-%d %H:%M:%S') AS started,
               strftime(last_step_at, '%Y-%m-%d %H:%M:%S') AS last_step,
               strftime(ended_at, '%Y-%m-%d %H:%M:%S') AS ended, steps,
               coalesce(left(error, 120), CAST(exit_code AS VARCHAR), signal) AS why
        FROM runs(since := $since, horizon := $ends)
        WHERE $job IS NULL OR job = $job
        ORDER BY job, first_seen, run, rank""",
        {"job": job, "since": cutoff, "ends": ends},
    )


def steps(
    con: duckdb.DuckDBPyConnection,
    job: str,
    node: str | None = None,
    cutoff: dt.datetime | None = None,
) -> Result:
    """Per run and rank of one job: steps/s, examples/s, step time, input-wait share and
    verdict, slow steps, and the node's mean GPU and CPU utilisation while it stepped."""
    known = [r[0] for r in con.execute("SELECT DISTINCT job FROM steps ORDER BY 1").fetchall()]
    if job not in known:
        more = f", and {len(known) - 3} more: analyze jobs" if len(known) > 3 else ""
        hint = f" (jobs with steps: {', '.join(known[:3])}{more})" if known else " (no job has sent steps yet)"
        raise AnalyticsError(f"no steps for job {job!r}{hint}")
    where, params = _where(node, cutoff)
    where = (where + " AND job = ?") if where else " WHERE job = ?"
    params = params + [job]
    share = "sum(wait_time) / nullif(sum(step_time), 0)"
    return _run(
        con,
        f"""
        WITH s AS (
            SELECT run, rank, node, ts, gpu_util_ratio, host_cpu_util_ratio, {_STEP_SUMS}
            FROM step_hardware{where}),
        slow AS (SELECT run, rank, count(*) AS slow FROM slow_steps{where} GROUP BY run, rank)
        SELECT s.run, s.rank, any_value(s.node) AS node, count(*) AS intervals, sum(s.steps) AS steps,
               round(sum(s.steps) / nullif(sum(s.span), 0), 3) AS steps_per_s,
               round(sum(s.examples) / nullif(sum(s.span), 0), 1) AS examples_per_s,
               round(sum(s.step_time) / nullif(sum(s.steps), 0) * 1e3, 2) AS step_ms,
               round({share} * 100, 1) AS input_wait_pct, {input_bound_sql(share)} AS input_bound,
               coalesce(any_value(slow.slow), 0) AS slow_steps,
               round(avg(s.gpu_util_ratio) * 100, 1) AS gpu_util_pct,
               round(avg(s.host_cpu_util_ratio) * 100, 1) AS cpu_pct,
               strftime(max(s.ts), '%Y-%m-%d %H:%M:%S') AS last_step
        FROM s LEFT JOIN slow USING (run, rank)
        GROUP BY s.run, s.rank ORDER BY s.run, s.rank""",
        params + params,
    )


def tpu(con: duckdb.DuckDBPyConnection, node: str | None = None, cutoff: dt.datetime | None = None,
        until: dt.datetime | None = None, label: tuple[str, str] | None = None) -> Result:
    """Per TPU device over [cutoff, until): samples, TensorCore duty cycle mean / max, HBM
    used (peak) and total, HBM bandwidth use where libtpu reports it, the jobs on its node."""
    where, params = _where(node, cutoff, until, label)
    return _run(
        con,
        f"""SELECT node, device, count(*) AS samples, round(avg(duty_cycle_ratio) * 100, 1) AS duty_pct,
                   round(max(duty_cycle_ratio) * 100, 1) AS duty_max_pct,
                   round(max(hbm_used_bytes) / 2^30, 2) AS hbm_used_gib, round(max(hbm_total_bytes) / 2^30, 2) AS hbm_total_gib,
                   round(avg(hbm_bandwidth_ratio) * 100, 1) AS hbm_bw_pct,
                   string_agg(DISTINCT nullif(job, ''), ',' ORDER BY nullif(job, '')) AS jobs,
                   strftime(max(ts), '%Y-%m-%d %H:%M:%S') AS last_sample
            FROM tpu_samples{where} GROUP BY node, device ORDER BY node, device""",
        params,
    )
