"""Goodput by the hour, kept as data arrives (issue 54), so a fleet's week reads in about a
second instead of ordering every step interval it holds (bench/goodput.py).

- ``refresh`` (the collector's writer runs it with the rollups; ``maintain`` too) computes,
  for every whole hour inside a job's span, the seconds of each category but idle that the
  raw sweep (cmdare.analytics.goodput) gives that hour, and stores them in
  ``goodput_hours`` with a **fingerprint** of what they were computed from;
- ``fleet`` (``analyze goodput --fleet``) sums the stored hours whose fingerprint is the
  same now, and runs the raw sweep over the rest of the range only (the edges, the last
  hours, any hour whose data changed since): exact at any lag.

An hour's value depends on the pieces that overlap it. The fingerprint of hour H holds the
``steps_5m`` rollup rows of H and H+1 (records, steps, step time, last record; a record of
H+1 may have started in H) and the checkpoints of H and H+1, and the job's own: its
declarations and each run's reference rank. A late record, checkpoint or declaration
changes it, so the hour is read raw until ``refresh`` computes it again. A job is not kept
by the hour (always read raw) when a revocation notice may have hit it (its lost work and
time to resume reach across hours), when a record or checkpoint reaches back more than an
hour before its own hour, or when an interval's step time exceeds its reporting interval
by more than a second (the rollup's reach assumes it does not).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import duckdb

from ..db import has_column
from . import CATEGORIES, NOTICE_WINDOW, Goodput, Window, goodput_many, sweep

log = logging.getLogger("cmdare.goodput")

HOUR = 3600.0
KEPT = tuple(c for c in CATEGORIES if c != "idle")
# in every fingerprint: raised when what an hour keeps changes (2: the communication
# category, migration 029), so hours kept before are read raw until computed again
VERSION = 2

# per (job, hour): the fingerprint of what the hour's goodput is computed from, and
# whether the job can be kept by the hour at all
_FP = """
WITH s AS (SELECT job, time_bucket(INTERVAL 1 HOUR, bucket) AS hour,
                  concat_ws(',', sum(records), sum(steps), round(sum(span_seconds), 6), max(last_ts)) AS f,
                  bool_and(t0 >= time_bucket(INTERVAL 1 HOUR, bucket) - INTERVAL 1 HOUR) AS near
           FROM steps_5m WHERE job IS NOT NULL AND job <> '' GROUP BY ALL),
     c AS (SELECT job, time_bucket(INTERVAL 1 HOUR, ts) AS hour,
                  concat_ws(',', count(*), sum(epoch_us(ts)), round(sum(coalesce(seconds, 0)), 6),
                            string_agg(action, '' ORDER BY action)) AS f,
                  bool_and(ts - to_microseconds(CAST(coalesce(seconds, 0) * 1e6 AS BIGINT))
                           >= time_bucket(INTERVAL 1 HOUR, ts) - INTERVAL 1 HOUR) AS near
           FROM checkpoints WHERE job IS NOT NULL GROUP BY ALL),
     h AS (SELECT job, hour, coalesce(s.f, '') || ';' || coalesce(c.f, '') AS f,
                  coalesce(s.near, true) AND coalesce(c.near, true) AS near
           FROM s FULL JOIN c USING (job, hour)),
     ranks AS (SELECT job, string_agg(run || ':' || r, ',' ORDER BY run) AS f
               FROM (SELECT job, run, min(rank) AS r FROM steps_5m WHERE job IS NOT NULL GROUP BY ALL) GROUP BY job),
     decl AS (SELECT job, concat_ws(',', count(*), max(ts), sum(epoch_us(ts))) AS f FROM jobs GROUP BY job),
     hit AS (SELECT DISTINCT s.job FROM revocations v JOIN steps_5m s ON s.node = v.node
             WHERE v.revokes AND s.bucket BETWEEN v.ts - INTERVAL {back} SECOND AND v.ts + INTERVAL 1 DAY),
     whole AS (SELECT job, bool_and(near) AS near FROM h GROUP BY job)
SELECT h.job, h.hour, '{version}|' || h.f || '|' || coalesce(n.f, '') || '|' || coalesce(ranks.f, '') || '|' || coalesce(decl.f, '') AS fp,
       whole.near AND hit.job IS NULL AS ok
FROM h LEFT JOIN h n ON n.job = h.job AND n.hour = h.hour + INTERVAL 1 HOUR
     LEFT JOIN ranks ON ranks.job = h.job LEFT JOIN decl ON decl.job = h.job
     LEFT JOIN hit ON hit.job = h.job JOIN whole ON whole.job = h.job
"""


def kept(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the database keeps goodput by the hour (migration 022 and the steps rollup)."""
    n = con.execute("""SELECT count(*) FROM (SELECT table_name AS n FROM duckdb_tables() UNION ALL
                       SELECT view_name FROM duckdb_views() WHERE NOT internal) WHERE n IN ('goodput_hours', 'steps_5m')"""
                    ).fetchall()[0][0]
    return n == 2


def fingerprints(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, dt.datetime], tuple[str, bool]]:
    """(job, hour) -> (fingerprint now, whether the job can be kept by the hour)."""
    return {(j, h): (fp, bool(ok)) for j, h, fp, ok in
            con.execute(_FP.format(back=int(NOTICE_WINDOW) + 300, version=VERSION)).fetchall()}


def _epoch(t: dt.datetime) -> float:
    return t.replace(tzinfo=dt.timezone.utc).timestamp()


def _stamp(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).replace(tzinfo=None)


def _stretched(con: duckdb.DuckDBPyConnection, hours: list[tuple[str, dt.datetime]]) -> set[str]:
    """The jobs with a step interval in those hours (or the next) whose step time exceeds
    its reporting interval by more than a second (the fingerprint's reach assumes none
    does). Only those hours' records are read: the hours a refresh computes are few."""
    if not hours:
        return set()
    spans: list[list[dt.datetime]] = []  # the hours and the next, merged into stretches
    for h in sorted({h for _, h in hours}):
        if spans and h <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], h + dt.timedelta(hours=2))
        else:
            spans.append([h, h + dt.timedelta(hours=2)])
    near = " OR ".join(f"(ts >= $a{i} AND ts < $b{i})" for i in range(len(spans)))
    return {j for (j,) in con.execute(
        f"""SELECT DISTINCT job FROM steps WHERE job IN (SELECT unnest($jobs::VARCHAR[])) AND ({near})
              AND coalesce(steps / nullif(steps_per_second, 0), step_mean_seconds * steps) > coalesce(interval_seconds, 0) + 1""",
        {"jobs": sorted({j for j, _ in hours}), **{f"a{i}": a for i, (a, _) in enumerate(spans)},
         **{f"b{i}": b for i, (_, b) in enumerate(spans)}}).fetchall()}


def refresh(con: duckdb.DuckDBPyConnection) -> int:
    """Bring ``goodput_hours`` up to date: every hour with data of a job that can be kept,
    whose stored fingerprint differs from its fingerprint now, computed again by the raw
    sweep (only its pieces ordered) and marked whole or not (readers use whole ones only);
    rows whose data changed and cannot be computed now are dropped. One transaction;
    returns the whole hours written."""
    if not kept(con):
        return 0
    todo, gone = plan(con)
    return store(con, compute(con, todo), gone)


Todo = list[tuple[str, dt.datetime, str]]  # (job, hour, fingerprint now)


def plan(con: duckdb.DuckDBPyConnection) -> tuple[Todo, list[tuple[str, dt.datetime]]]:
    """(the hours to compute, with their fingerprints; the stored hours to drop)."""
    now = fingerprints(con)
    stored = dict(((j, h), fp) for j, h, fp in con.execute("SELECT job, hour, fp FROM goodput_hours").fetchall())
    todo = sorted((j, h) for (j, h), (fp, ok) in now.items() if ok and stored.get((j, h)) != fp)
    stretched = _stretched(con, todo)
    gone = [(j, h) for (j, h), fp in stored.items() if now.get((j, h), ("", False)) != (fp, True) or j in stretched]
    return [(j, h, now[(j, h)][0]) for j, h in todo if j not in stretched], gone


def compute(con: duckdb.DuckDBPyConnection, todo: Todo) -> list[list]:
    """The goodput_hours rows of ``todo`` (one sweep; any slice of a plan's hours computes
    alone: Spark's tasks each take a slice, collector/lakespark.py)."""
    windows: list[Window] = [(j, i, _epoch(h), _epoch(h) + HOUR) for i, (j, h, _) in enumerate(todo)]
    got = sweep(con, sorted({j for j, _, _ in todo}), windows, restrict=True) if windows else {}
    rows = []
    for i, (j, h, fp) in enumerate(todo):
        g = got.get((j, i))
        if g is not None:  # kept whole or not (a job's first and last hours): not computed again while unchanged
            whole = g.start == _epoch(h) and g.end == _epoch(h) + HOUR
            rows.append([j, h, fp, whole, *(g.seconds[c] for c in KEPT)])
    return rows


def store(con: duckdb.DuckDBPyConnection, rows: list[list], gone: list[tuple[str, dt.datetime]]) -> int:
    """Drop ``gone``, write ``rows`` (one transaction); the whole hours written."""
    con.execute("BEGIN")
    try:
        if gone:
            con.execute("""DELETE FROM goodput_hours WHERE (job, hour) IN
                           (SELECT (unnest($j::VARCHAR[]), unnest($h::TIMESTAMP[])))""",
                        {"j": [j for j, _ in gone], "h": [h for _, h in gone]})
        if rows:
            con.execute(f"""INSERT OR REPLACE INTO goodput_hours (job, hour, fp, whole, {", ".join(KEPT)})
                            SELECT * FROM (SELECT unnest($c0::VARCHAR[]), unnest($c1::TIMESTAMP[]), unnest($c2::VARCHAR[]),
                                                  unnest($c3::BOOLEAN[]),
                                                  {", ".join(f"unnest($c{4 + i}::DOUBLE[])" for i in range(len(KEPT)))})""",
                        {f"c{i}": [r[i] for r in rows] for i in range(4 + len(KEPT))})
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return sum(1 for r in rows if r[3])


def refresh_lake(uri: str, catalog: str | None, compute_rows: Any = None) -> int:
    """``refresh`` on a lake (``cmdare-collector maintain``): planned and stored through
    a LakeDatabase, whose write replaces the lake's ``goodput_hours`` when it changed;
    ``compute_rows(uri, catalog, todo)`` computes the rows elsewhere (Spark's executors)."""
    from ..lakedb import LakeDatabase

    db = LakeDatabase(uri, catalog)
    with db.write() as con:
        if not kept(con):
            return 0
        todo, gone = plan(con)
        rows = compute(con, todo) if compute_rows is None else compute_rows(uri, catalog, todo)
        return store(con, rows, gone)


def compute_lake(uri: str, catalog: str | None, todo: Todo) -> list[list]:
    """``compute`` on a lake read of its own (one Spark task's slice)."""
    from ..lakedb import LakeDatabase

    with LakeDatabase(uri, catalog).read() as con:
        return compute(con, todo)


def fleet(con: duckdb.DuckDBPyConnection, since: float | None, until: float | None,
          stats: dict[str, int] | None = None) -> dict[str, Goodput]:
    """Every job's goodput over [since, until) (epoch seconds; None: unbounded): the stored
    hours whose fingerprint holds, the raw sweep over the rest (see the module doc); the
    same as ``goodput_many`` over the range. ``stats`` gets ``kept`` (hours read from the
    table) and ``raw`` (stretches swept raw)."""
    stats = stats if stats is not None else {}
    stats.update(kept=0, raw=1)
    if (not kept(con) or not con.execute("SELECT count(*) FROM (SELECT 1 FROM goodput_hours LIMIT 1)").fetchall()[0][0]
            or not has_column(con, "goodput_hours", "communication")):  # (a lake's hours from before migration 029)
        return goodput_many(con, None, since, until)
    lo = _stamp(since) if since is not None else None
    hi = _stamp(until) if until is not None else None
    now = fingerprints(con)
    valid: dict[str, list[tuple[float, dict[str, float]]]] = {}
    for j, h, fp, *kept_vals in con.execute(
            f"""SELECT job, hour, fp, {", ".join(KEPT)} FROM goodput_hours
                WHERE whole AND ($lo IS NULL OR hour >= $lo) AND ($hi IS NULL OR hour + INTERVAL 1 HOUR <= $hi)
                ORDER BY job, hour""", {"lo": lo, "hi": hi}).fetchall():
        if now.get((j, h)) == (fp, True):
            valid.setdefault(j, []).append((_epoch(h), dict(zip(KEPT, kept_vals, strict=True))))
    windows: list[Window] = [(None, 0, since, until)]  # every job without a kept hour: the whole range
    for j, hours in valid.items():  # the gaps between its kept hours, and the range's edges
        edge: float | None = since
        for t, _ in hours:
            if edge is None or t > edge:
                windows.append((j, len(windows), edge, t))
            edge = t + HOUR
        windows.append((j, len(windows), edge, until))
    stats.update(kept=sum(len(h) for h in valid.values()), raw=len(windows))
    got = sweep(con, None, windows, restrict=True)
    out: dict[str, Goodput] = {}
    for (j, _k), g in got.items():
        if g.end <= g.start:
            continue
        acc = out.setdefault(j, Goodput(j, g.start, g.end, dict.fromkeys(CATEGORIES, 0.0)))
        acc.start, acc.end = min(acc.start, g.start), max(acc.end, g.end)
        for c in KEPT:
            acc.seconds[c] += g.seconds[c]
    for j, hours in valid.items():
        for t, vals in hours:
            acc = out.setdefault(j, Goodput(j, t, t + HOUR, dict.fromkeys(CATEGORIES, 0.0)))
            acc.start, acc.end = min(acc.start, t), max(acc.end, t + HOUR)
            for c in KEPT:
                acc.seconds[c] += vals[c]
    for g in out.values():
        g.seconds["idle"] = max(0.0, g.wall - sum(g.seconds[c] for c in KEPT))
    return out
