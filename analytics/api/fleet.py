"""The fleet at a glance: the counts of the fleet page's stat strip and its per-GPU
utilisation heatmap. One place for both front ends (the HTTP API's ``/api/v1/fleet``
resources, which the pages read, and ``analyze report --html``).

A GPU's state over the window, one of (first that applies):
``failing``: lost, or any Xid or ECC event; ``throttled``: a throttle reason in at least
``THROTTLED_PCT`` of its samples; ``busy``: mean utilisation at least ``BUSY_PCT``;
``idle`` otherwise. The stat strip counts each GPU that is not failing as busy or idle by
its utilisation, and ``throttled`` among those: a GPU at 94 % with a throttle reason is
busy and throttled, never neither (busy + idle + failing = the GPUs).
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import duckdb

from .. import processes, queries
from ..db import AnalyticsError, has_column

BUSY_PCT = 10.0
THROTTLED_PCT = 10.0
MAX_CELLS = 2_000_000  # heatmap cells (GPUs x buckets) one answer may hold
MAX_COLUMNS = 1_440  # buckets across, at most (one a minute for a day)
ROLLUP_AFTER = 6 * 3600  # seconds: a window this long or longer reads the 5-minute rollups
ROLLUP_BUCKET = "INTERVAL 300 SECOND"
EPOCH = dt.datetime(1970, 1, 1)


HELD = "(pod IS NOT NULL OR slurm_job IS NOT NULL)"  # a GPU sample a scheduler's pod or job holds

def gpu_state(row: dict[str, Any]) -> str:
    if row.get("lost") or (row.get("xid_events") or 0) > 0 or (row.get("ecc_errors") or 0) > 0:
        return "failing"
    if (row.get("throttled_pct") or 0) >= THROTTLED_PCT:
        return "throttled"
    if (row.get("util_pct") or 0) >= BUSY_PCT:
        return "busy"
    return "idle"


def use_rollup(con: duckdb.DuckDBPyConnection, since: dt.datetime | None, until: dt.datetime | None) -> bool:
    """Whether a window is long enough to read 5-minute rollups (ROLLUP_AFTER or more; all
    the data counts as long): their edges are 5-minute boundaries."""
    if not _has(con, "gpu_5m"):
        return False
    if since is None:
        return True
    end = until or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    return (end - since).total_seconds() >= ROLLUP_AFTER


def gpu_rows(con: duckdb.DuckDBPyConnection, since: dt.datetime | None,
             until: dt.datetime | None) -> list[dict[str, Any]]:
    """Per GPU over the window: util_pct, throttled_pct, xid_events, ecc_errors, lost (what
    ``gpu_state`` reads); from the rollups for long windows, else from the samples."""
    if not use_rollup(con, since, until):
        cols, rows = queries.gpu(con, None, since, until)
        return [dict(zip(cols, r, strict=True)) for r in rows]
    cur = con.execute(
        f"""WITH g AS (
                SELECT node, "index", any_value(uuid) AS uuid, 100 * sum(util_sum) / nullif(sum(util_samples), 0) AS util_pct,
                       100 * sum(throttled) / nullif(sum(throttle_samples), 0) AS throttled_pct
                FROM gpu_5m WHERE ($s IS NULL OR bucket >= time_bucket({ROLLUP_BUCKET}, $s::TIMESTAMP))
                  AND ($u IS NULL OR bucket < $u) GROUP BY node, "index"),
            ev AS (
                SELECT node, uuid, sum(count) FILTER (WHERE kind = 'xid') AS xid_events,
                       sum(count) FILTER (WHERE kind LIKE 'ecc%') AS ecc_errors, bool_or(kind = 'lost') AS lost
                FROM gpu_events WHERE ($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts < $u) GROUP BY ALL)
            SELECT g.node, g."index" AS gpu, g.util_pct, g.throttled_pct, coalesce(ev.xid_events, 0) AS xid_events,
                   coalesce(ev.ecc_errors, 0) AS ecc_errors, coalesce(ev.lost, false) AS lost
            FROM g LEFT JOIN ev USING (node, uuid)""", {"s": since, "u": until})
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def summary(con: duckdb.DuckDBPyConnection, since: dt.datetime | None, until: dt.datetime | None,
            lost_after: float = 3, with_nodes: bool = True, horizon: dt.datetime | None = None) -> dict[str, Any]:
    """Nodes by liveness (None without ``with_nodes``: a caller that reads the node table
    anyway counts them there), GPUs by state, jobs with steps in the window, stored findings
    by severity, alerts by state, and goodput of those jobs' time inside the window."""
    nodes: dict[str, int] | None = None
    if with_nodes:
        nodes = {}
        cols, rows = queries.nodes(con, lost_after, None, horizon)
        for row in rows:
            st = dict(zip(cols, row, strict=True))["state"] or "unknown"
            nodes[st] = nodes.get(st, 0) + 1
    gpus = {"busy": 0, "idle": 0, "throttled": 0, "failing": 0}
    for r in gpu_rows(con, since, until):
        state = gpu_state(r)
        if state == "failing":
            gpus["failing"] += 1
            continue
        gpus["busy" if (r.get("util_pct") or 0) >= BUSY_PCT else "idle"] += 1
        gpus["throttled"] += state == "throttled"  # of the busy and idle ones
    running = con.execute(
        "SELECT DISTINCT job FROM steps WHERE job IS NOT NULL AND ($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts < $u) ORDER BY job",
        {"s": since, "u": until}).fetchall()
    jobs = [j for (j,) in running]
    findings: dict[str, int] = {}
    if _has(con, "findings"):
        for sev, n in con.execute(
                "SELECT severity, count(*) FROM findings WHERE ($s IS NULL OR window_end >= $s) "
                "AND ($u IS NULL OR window_start < $u) GROUP BY severity ORDER BY severity", {"s": since, "u": until}).fetchall():
            findings[sev] = n
    alerts: dict[str, int] = {}
    if _has(con, "alerts"):
        for st, n in con.execute("SELECT state, count(*) FROM alerts GROUP BY state ORDER BY state").fetchall():
            alerts[st] = n
    return {"since": _iso(since), "until": _iso(until), "nodes": nodes, "gpus": gpus,
            "gpu_thresholds": {"busy_pct": BUSY_PCT, "throttled_pct": THROTTLED_PCT},
            "jobs": {"running": len(jobs)}, "findings": findings, "alerts": alerts,
            "goodput": _goodput(con, jobs, since, until)}


def _goodput(con: duckdb.DuckDBPyConnection, jobs: list[str], since: dt.datetime | None,
             until: dt.datetime | None) -> dict[str, Any]:
    """Productive seconds over wall seconds summed over ``jobs`` within the window (each job's
    goodput cut at its edges), with the badput parts."""
    from ..goodput import epoch
    from ..goodput.accounting import account_many, stored_findings

    parts: dict[str, float] = {}
    jobs = jobs[:500]  # bounded work: a fleet page must answer (stored findings only: no detector runs)
    lo = since or dt.datetime(1970, 1, 1)
    hi = until or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    accs = account_many(con, jobs, epoch(since), epoch(until), stored_findings(con, jobs, lo, hi))
    for j in sorted(accs):  # summed in one order: the same figures, to the last bit, on every call
        acc = accs[j]
        for k, v in (acc.seconds | {"wall": acc.total}).items():
            parts[k] = parts.get(k, 0.0) + v
    wall = parts.get("wall", 0.0)
    return {"jobs": min(len(jobs), 500), "wall_seconds": wall,
            "productive_pct": round(100 * parts.get("productive", 0.0) / wall, 2) if wall > 0 else None,
            "parts": {k: v for k, v in parts.items() if k != "wall"}}


GROUPS = ("auto", "gpu", "node", "job")
AUTO_GPU_ROWS = 10_000  # ``auto``: a row per GPU up to this many GPUs in scope, past it a row per job


def heatmap(con: duckdb.DuckDBPyConnection, since: dt.datetime | None, until: dt.datetime | None,
            columns: int = 120, label: tuple[str, str] | None = None, group: str = "auto",
            job: str | None = None, node: str | None = None) -> dict[str, Any]:
    """Mean GPU utilisation (%) per row and time bucket over [since, until); ``columns``
    buckets across (at most MAX_COLUMNS). A cell with no sample is None.

    ``group``: a row per ``gpu`` (grouped by job, then node, then GPU index), per ``node``
    (its GPUs' samples together) or per ``job`` (the GPUs whose samples carry the job, at
    the time of each sample; samples of no job are one row, ``job`` None); ``auto``: per GPU
    while the scope holds at most AUTO_GPU_ROWS GPUs, else per job: a fleet too large to
    show GPU by GPU shows job by job, and ``job`` (or ``node``) drills down into one job's
    (one node's) GPUs."""
    if not 1 <= columns <= MAX_COLUMNS:
        raise AnalyticsError(f"columns: from 1 to {MAX_COLUMNS}, got {columns}")
    if group not in GROUPS:
        raise AnalyticsError(f"group: one of {', '.join(GROUPS)}, got {group[:40]!r}")
    rolled = use_rollup(con, since, until)
    table, tcol = ("gpu_5m", "bucket") if rolled else ("gpu_samples", "ts")
    where, params = queries._where(node, since, until, label)
    if rolled:
        where = where.replace("ts >= ?", f"bucket >= time_bucket({ROLLUP_BUCKET}, ?::TIMESTAMP)").replace("ts < ?", "bucket < ?")
    if job is not None:
        where, params = (where + " AND" if where else " WHERE") + " job = ?", [*params, job]
    lo, hi, approx = con.execute(  # the GPUs in scope, roughly (HyperLogLog): enough to choose the rows
        f'SELECT min({tcol}), max({tcol}), approx_count_distinct(hash(node, "index")) FROM {table}{where}',
        params).fetchall()[0]
    if lo is None:
        return {"start": _iso(since), "step_seconds": None, "times": [], "rows": [], "util_pct": [], "rollup": rolled,
                "group": "gpu" if group == "auto" else group, "gpus": 0}
    if group == "auto":
        group = "gpu" if job is not None or node is not None or approx <= AUTO_GPU_ROWS else "job"
    start, step, n = _buckets(since, until, lo, hi, columns, rolled)
    if group == "gpu" and approx * n > MAX_CELLS * 1.1:  # refused before the scan (the estimate errs by a few %)
        raise AnalyticsError(f"heatmap: about {approx:,} GPUs x {n} buckets is over {MAX_CELLS:,} cells: fewer "
                             "columns, a narrower window, a --label filter or a coarser group (group=job)")
    util = "100 * sum(util_sum) / nullif(sum(util_samples), 0)" if rolled else "avg(util_gpu_ratio) * 100"
    key = {"gpu": 'node, "index"', "node": "node", "job": "job"}[group]
    got = con.execute(
        f"""SELECT {key}, any_value(uuid), any_value(name), list(b ORDER BY b), list(u ORDER BY b)
            FROM (SELECT {key}, {"any_value(uuid)" if group == "gpu" else "NULL"} AS uuid, any_value(name) AS name,
                         CAST(floor(epoch({tcol} - ?::TIMESTAMP) / ?) AS INTEGER) AS b,
                         CAST(round({util}) AS INTEGER) AS u
                  FROM {table}{where} GROUP BY {key}, b)
            GROUP BY {key}""",
        [start, step, *params]).fetchall()
    # a node's or a job's GPUs (and a job's nodes): those with samples in the window, counted
    # once from their distinct (job, node, GPU) rows (a count(DISTINCT) per bucket costs 4x the map)
    size: dict[Any, tuple[int, int]] = {} if group == "gpu" else {
        k: (g, m) for k, g, m in con.execute(
            f"""SELECT {key}, count(*), count(DISTINCT node)
                FROM (SELECT DISTINCT job, node, "index" FROM {table}{where}) GROUP BY {key}""", params).fetchall()}
    if len(got) * n > MAX_CELLS:
        raise AnalyticsError(f"heatmap: {len(got):,} {group}s x {n} buckets is over {MAX_CELLS:,} cells: "
                             "fewer columns, a narrower window, a --label filter or a coarser group")
    out_rows, values = [], []
    job_of = dict(con.execute("SELECT node, job FROM nodes").fetchall()) if group != "job" else {}
    if group == "gpu":
        got.sort(key=lambda g: (job if job is not None else job_of.get(g[0]) or "~", g[0], g[1]))
    elif group == "node":
        got.sort(key=lambda g: (job_of.get(g[0]) or "~", g[0]))
    else:
        got.sort(key=lambda g: (g[0] is None, g[0] or ""))
    for g in got:
        bs, us = g[-2], g[-1]
        line: list[int | None] = [None] * n
        for b, u in zip(bs, us, strict=True):
            if 0 <= b < n and u is not None:
                line[b] = u
        if group == "gpu":
            out_rows.append({"job": job if job is not None else job_of.get(g[0]), "node": g[0], "gpu": g[1],
                             "uuid": g[2], "name": g[3]})
        elif group == "node":
            out_rows.append({"job": job_of.get(g[0]), "node": g[0], "gpus": size[g[0]][0], "name": g[2]})
        else:
            out_rows.append({"job": g[0], "nodes": size[g[0]][1], "gpus": size[g[0]][0], "name": g[2]})
        values.append(line)
    gpus = len(out_rows) if group == "gpu" else sum(r["gpus"] for r in out_rows)
    return {"start": _iso(start), "step_seconds": step, "rollup": rolled, "group": group, "gpus": gpus,
            "times": [_iso(start + dt.timedelta(seconds=step * i)) for i in range(n)],
            "rows": out_rows, "util_pct": values}


def _buckets(since: dt.datetime | None, until: dt.datetime | None, lo: dt.datetime, hi: dt.datetime,
             columns: int, rolled: bool) -> tuple[dt.datetime, float, int]:
    """The heatmap's first bucket, bucket width (seconds) and bucket count."""
    start = since or lo
    # the right edge: until, else now for a window from a time (a live page), else the last sample
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    end = until or (max(now, hi) if since else hi + dt.timedelta(seconds=300 if rolled else 1))
    span = max(round((end - start).total_seconds()), 1.0)  # whole seconds: now is a moving edge
    step = max(1.0, math.ceil(span / columns))
    if rolled:  # whole rollup buckets: the start on a 5-minute boundary, the step a multiple of 5 minutes
        start = start - dt.timedelta(seconds=(start - EPOCH).total_seconds() % 300)
        span = max((end - start).total_seconds(), 1.0)
        step = 300.0 * max(1, math.ceil(span / columns / 300))
    return start, step, max(1, math.ceil(span / step))


def _has(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]).fetchall()[0][0])


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else t.strftime("%Y-%m-%d %H:%M:%S")


def job_series(con: duckdb.DuckDBPyConnection, job: str, since: dt.datetime | None, until: dt.datetime | None,
               columns: int = 120) -> dict[str, Any]:
    """One job over time (``columns`` buckets): steps/s summed over its ranks, step time
    (mean, and the spread: the mean of the ranks' p95 and the largest step), input-wait
    share; and per rank the mean step time over the window (slowest first)."""
    if not 1 <= columns <= MAX_COLUMNS:
        raise AnalyticsError(f"columns: from 1 to {MAX_COLUMNS}, got {columns}")
    p = {"j": job, "s": since, "u": until}
    w = "WHERE job = $j AND ($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts < $u)"
    lo, hi = con.execute(f"SELECT min(ts), max(ts) FROM steps {w}", p).fetchall()[0]
    held = False
    if lo is None:  # a Kubernetes pod's or Slurm job that never stepped: its GPUs are those its samples name
        lo, hi = con.execute(f"SELECT min(ts), max(ts) FROM gpu_samples {w} AND {HELD}", p).fetchall()[0]
        held = lo is not None
    if lo is None:
        return {"job": job, "start": _iso(since), "step_seconds": None, "times": [], "series": {}, "ranks": [],
                "gpus": {"allocated": 0, "active": 0, "busy_pct": BUSY_PCT, "rows": []}, "checkpoints": []}
    start = since or lo
    end = until or (hi + dt.timedelta(seconds=1))
    step = max(1.0, math.ceil(max((end - start).total_seconds(), 1.0) / columns))
    n = max(1, math.ceil(max((end - start).total_seconds(), 1.0) / step))
    rows = con.execute(
        f"""WITH r AS (
                SELECT CAST(floor(epoch(ts - $start::TIMESTAMP) / $step) AS INTEGER) AS b, run, rank,
                       sum(steps) AS steps, sum(interval_seconds) AS secs,
                       sum(step_mean_seconds * steps) / nullif(sum(steps), 0) AS mean_s,
                       avg(step_p95_seconds) AS p95_s, max(step_max_seconds) AS max_s,
                       sum(wait_mean_seconds * steps) / nullif(sum(step_mean_seconds * steps), 0) AS wait
                FROM steps {w} GROUP BY ALL)
            SELECT b, sum(steps / nullif(secs, 0)) AS sps, avg(mean_s), avg(p95_s), max(max_s), avg(wait)
            FROM r GROUP BY b ORDER BY b""",
        {**p, "start": start, "step": step}).fetchall()
    series: dict[str, list[float | None]] = {k: [None] * n for k in
                                             ("steps_per_second", "step_mean_s", "step_p95_s", "step_max_s", "input_wait_pct")}
    for b, sps, mean_s, p95, mx, wait in rows:
        if not 0 <= b < n:
            continue
        for k, v, nd in (("steps_per_second", sps, 3), ("step_mean_s", mean_s, 4), ("step_p95_s", p95, 4),
                         ("step_max_s", mx, 4), ("input_wait_pct", None if wait is None else 100 * wait, 1)):
            series[k][b] = None if v is None or not math.isfinite(v) else round(float(v), nd)
    ranks = con.execute(
        f"""SELECT run, rank, any_value(node) AS node, sum(steps) AS steps,
                   round(sum(step_mean_seconds * steps) / nullif(sum(steps), 0), 4) AS step_mean_s,
                   round(avg(step_p95_seconds), 4) AS step_p95_s,
                   round(100 * sum(wait_mean_seconds * steps) / nullif(sum(step_mean_seconds * steps), 0), 1) AS input_wait_pct
            FROM steps {w} GROUP BY run, rank ORDER BY step_mean_s DESC NULLS LAST, run, rank""", p)
    rcols = [d[0] for d in ranks.description]
    rank_rows = [dict(zip(rcols, r, strict=True)) for r in ranks.fetchall()]
    med = sorted(r["step_mean_s"] for r in rank_rows if r["step_mean_s"] is not None)
    if med:
        m = med[len(med) // 2]
        for r in rank_rows:
            r["vs_median_pct"] = None if r["step_mean_s"] is None or m <= 0 else round(100 * (r["step_mean_s"] / m - 1), 1)
    gpu_rows = _job_gpus(con, p, w, held)
    series["gpu_util_pct"] = _gpu_util(con, p, w, held, start, step, n)
    ck = con.execute(
        f"""SELECT strftime(ts, '%Y-%m-%d %H:%M:%S') AS ts, node, rank, action, round(seconds, 3) AS seconds,
                   round(bytes / 2^20, 1) AS mib, step, ok FROM checkpoints {w} ORDER BY ts LIMIT {MAX_JOB_CHECKPOINTS}""",
        p)
    ccols = [d[0] for d in ck.description]
    return {"job": job, "start": _iso(start), "step_seconds": step,
            "times": [_iso(start + dt.timedelta(seconds=step * i)) for i in range(n)],
            "series": series, "ranks": rank_rows,
            "gpus": {"allocated": len(gpu_rows), "active": sum(g["active"] for g in gpu_rows), "busy_pct": BUSY_PCT,
                     "rows": gpu_rows},
            "checkpoints": [dict(zip(ccols, r, strict=True)) for r in ck.fetchall()]}


MAX_JOB_GPUS = 4096  # GPUs a job page lists
MAX_JOB_CHECKPOINTS = 1000  # checkpoints a job page lists (the first ones in the window)
ACTIVE_SECONDS = 3600  # a finding whose window ended this recently is active; a job with steps this recent runs
MAX_METRIC_JOBS = 200  # jobs whose goodput one scrape exports (the most recent)


def _gpu_util(con: duckdb.DuckDBPyConnection, p: dict[str, Any], w: str, held: bool, start: dt.datetime, step: float,
              n: int) -> list[float | None]:
    """The mean utilisation of the job's GPUs (those ``_job_gpus`` lists) per column, in %:
    the graphics engine's activity where GPM gives it, else GPU_UTIL."""
    mine = f"job = $j AND {HELD}" if held else f"node IN (SELECT DISTINCT node FROM steps {w})"
    out: list[float | None] = [None] * n
    for b, u in con.execute(
            f"""SELECT CAST(floor(epoch(ts - $start::TIMESTAMP) / $step) AS INTEGER) AS b,
                       avg(coalesce(gr_engine_active_ratio, util_gpu_ratio)) * 100
                FROM gpu_samples WHERE {mine} AND ($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts < $u)
                GROUP BY b""", {**p, "start": start, "step": step}).fetchall():
        if 0 <= b < n and u is not None and math.isfinite(u):
            out[b] = round(float(u), 1)
    return out


def _job_gpus(con: duckdb.DuckDBPyConnection, p: dict[str, Any], w: str, held: bool) -> list[dict[str, Any]]:
    """``job_series``'s GPU rows: each GPU's utilisation and memory over the window, whether
    it was active, what the job's own processes used of it and how many others held it."""
    # the GPUs of the job's nodes over the window: allocated, and which of them really worked
    # (a TPU VM's cores in the same table: duty cycle as utilisation, HBM as memory)
    # (a pod's job: the GPUs its pod held, and every process on them is the pod's)
    mine = f"job = $j AND {HELD}" if held else f"node IN (SELECT DISTINCT node FROM steps {w})"
    gpus = con.execute(
        f"""SELECT * FROM (
              SELECT node, "index" AS gpu, any_value(name) AS name,
                     round(coalesce(avg(gr_engine_active_ratio), avg(util_gpu_ratio)) * 100, 1) AS util_pct,
                     round(max(mem_used_bytes) / 2^30, 2) AS mem_used_gib
              FROM gpu_samples WHERE {mine}
                AND ($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts < $u)
              GROUP BY node, "index"
              UNION ALL
              SELECT node, device, 'TPU core', round(avg(duty_cycle_ratio) * 100, 1), round(max(hbm_used_bytes) / 2^30, 2)
              FROM tpu_samples WHERE node IN (SELECT DISTINCT node FROM steps {w})
                AND ($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts < $u)
              GROUP BY node, device)
            ORDER BY node, gpu LIMIT {MAX_JOB_GPUS}""", p)
    gcols = [d[0] for d in gpus.description]
    gpu_rows = [dict(zip(gcols, r, strict=True)) for r in gpus.fetchall()]
    # what the job's own processes used of each GPU (their PIDs as its ranks declared them,
    # the GPU's process list from NVML), and how many other processes held it
    cond = ((f"job = $j AND {HELD}" if held else "node IN (SELECT node FROM jobs WHERE job = $j)")
            + " AND ($s IS NULL OR ts >= $s) AND ($u IS NULL OR ts < $u)")
    declared = ("SELECT DISTINCT node, pid FROM pp" if held else
                "SELECT DISTINCT node, pid FROM jobs WHERE job = $j AND pid IS NOT NULL")
    use = {(n, i): (sm, own, other) for n, i, sm, own, other in con.execute(
        f"""WITH pp AS ({processes.process_rows(cond)}),
                 pj AS ({declared})
            SELECT pp.node, pp."index", round(avg(pp.sm) FILTER (WHERE pj.pid IS NOT NULL) * 100, 1),
                   count(DISTINCT pp.pid) FILTER (WHERE pj.pid IS NOT NULL),
                   count(DISTINCT pp.pid) FILTER (WHERE pj.pid IS NULL)
            FROM pp LEFT JOIN pj ON pj.node = pp.node AND pj.pid = pp.pid GROUP BY ALL""", p).fetchall()}
    for g in gpu_rows:
        g["active"] = (g["util_pct"] or 0) >= BUSY_PCT
        sm, own, other = use.get((g["node"], g["gpu"]), (None, None, None))  # no process list: unknown, not 0
        g["job_sm_pct"], g["job_processes"], g["other_processes"] = sm, own, other
    return gpu_rows


def conclusions(con: duckdb.DuckDBPyConnection, now: dt.datetime | None = None) -> dict[str, Any]:
    """What the collector exports to Prometheus besides its own counters: active findings
    per (job, kind, severity), and goodput per running job (productive share of wall time
    and badput seconds per category), so that a team's Grafana shows cmdare's conclusions."""
    now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    since = now - dt.timedelta(seconds=ACTIVE_SECONDS)
    findings: list[tuple[str, str, str, int]] = []
    if _has(con, "findings"):
        # active: not resolved by the collector's detector schedule, and standing on the last
        # hour's telemetry (a finding stored by hand is never resolved: its window ages out)
        findings = [(j or "", k, s, n) for j, k, s, n in con.execute(
            f"SELECT job, kind, severity, count(*) FROM findings WHERE window_end >= ? "
            f"{'AND resolved_at IS NULL ' if has_column(con, 'findings', 'resolved_at') else ''}"
            "GROUP BY ALL ORDER BY ALL", [since]).fetchall()]
    jobs = [j for (j,) in con.execute(
        "SELECT job FROM steps WHERE job IS NOT NULL AND ts >= ? GROUP BY job ORDER BY max(ts) DESC LIMIT ?",
        [since, MAX_METRIC_JOBS]).fetchall()]
    from ..goodput.accounting import account_many, stored_findings

    found = stored_findings(con, jobs, dt.datetime(1970, 1, 1), now) if jobs else {}
    # accelerator-seconds per bucket ("wall": their total); stored findings only
    good = {j: a.seconds | {"wall": a.total} for j, a in account_many(con, jobs, None, None, found).items()}
    return {"findings": findings, "goodput": good}
