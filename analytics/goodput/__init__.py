"""Goodput of a training job: its wall time split into productive step time and badput.

The job's wall time runs from its first declaration (or first step) to the end of its last
step or checkpoint.  It is cut into pieces, each instant counted once, in this order of
precedence (a higher one wins where two overlap):

1. ``checkpoint_save`` / ``checkpoint_restore``: the checkpoint records' durations;
2. ``revocation``: work lost to a revocation (the revoked run's steps after the job's last
   good save at or before that run's last step: redone after the restart), and time from
   the notice until steps resume (the replacement's start-up included);
3. ``input_wait``, ``communication`` and ``productive``: the step intervals' time, split by
   their input-wait share and then their share of gradient communication that computation
   did not hide (``comm_mean_seconds``: the data-parallel adapters, ``run.add_comm_wait``);
4. ``startup``: from a run's declaration to its first step;
5. ``idle``: whatever is left (evaluation, gaps without telemetry, a crash's downtime).

So the parts add up to the wall time exactly.  Time is the reference rank's (the lowest
rank of each run; all ranks step together in synchronous training); checkpoints of any
rank count.  Within one step interval the split is by totals: the interval's input-wait
share of its time is input wait, its communication share (at most what input wait left)
communication.  A notice counts for a run when the run was stepping on
the notice's node at the time (its last step there no more than a minute before it) and
stopped stepping there soon after (within 10 minutes: a run that steps on for hours on that
node was not revoked).
Google's ml-goodput-measurement uses the same badput families (start-up, data loading,
checkpoint save / restore, wasted progress and recovery after a disruption).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

import duckdb

from cmdare.collector.rollup import STEP_SPAN

from ..db import AnalyticsError, has_column, has_view
from ..queries import needs_schema

CATEGORIES = (
    "productive",
    "input_wait",
    "communication",
    "startup",
    "checkpoint_save",
    "checkpoint_restore",
    "revocation",
    "idle",
)
# precedence: lower number wins where pieces overlap (the order is what counts: sorted() is
# stable, so a number moved by one onto its neighbour's keeps the listed order)
PRIORITY = {
    "checkpoint_save": 0,
    "checkpoint_restore": 1,
    "revocation": 2,
    "input_wait": 3,
    "communication": 4,
    "productive": 5,
    "startup": 6,
}
NOTICE_WINDOW = 60.0  # seconds: a run stepping on the node this recently is hit by its notice
STOPPED_WITHIN = 600.0  # ... when it stopped stepping there this soon after (else the VM was not taken from it)


@dataclass
class Goodput:
    job: str
    start: float
    end: float
    seconds: dict[str, float]  # per category; they add up to the wall time

    @property
    def wall(self) -> float:
        return self.end - self.start


def epoch(t: dt.datetime | None) -> float | None:
    """A naive UTC time (the database's) as the epoch seconds ``goodput`` takes."""
    return None if t is None else t.replace(tzinfo=dt.timezone.utc).timestamp()


def goodput(con: duckdb.DuckDBPyConnection, job: str, since: float | None = None,
            until: float | None = None) -> Goodput:
    """``job``'s goodput over its whole run, or over the window [since, until) (epoch
    seconds): the pieces are those of the whole run (lost work is judged against the run's
    checkpoints wherever they fall), cut at the window's edges; the parts still add up to
    the window's wall time (the part of it the job ran)."""
    needs_schema(con, 4, "analyze goodput")
    got = goodput_many(con, [job], since, until)
    if job not in got:
        known = [r[0] for r in con.execute("SELECT DISTINCT job FROM steps ORDER BY 1 LIMIT 10").fetchall()]
        hint = f" (jobs with steps: {', '.join(known)})" if known else " (no job has sent steps yet)"
        raise AnalyticsError(f"no steps for job {job!r}{hint}")
    return got[job]


# the reference rank's step intervals (lowest rank of each run) of the jobs asked for
_SPAN = STEP_SPAN.format(s="s.")  # an interval's stepping time, as the rollup's start_min times it
_REF = f"""ref AS (SELECT job, run, min(rank) AS rank FROM steps WHERE {{jobs}} GROUP BY job, run),
    st AS (SELECT s.job, s.run, s.node, epoch(s.ts) AS t, s.steps AS n, s.first_step, s.last_step, {_SPAN} AS span,
                  least(1, greatest(0, coalesce(s.wait_mean_seconds / nullif(s.step_mean_seconds, 0), 0))) AS w
           FROM steps s JOIN ref USING (job, run, rank))"""


def goodput_many(con: duckdb.DuckDBPyConnection, jobs: list[str] | None, since: float | None = None,
                 until: float | None = None) -> dict[str, Goodput]:
    """The goodput of each of ``jobs`` (None: every job with steps) that has steps, in one
    sweep inside DuckDB: every piece's start and end, the count of open pieces of each
    category at each instant, and each instant-to-next assigned to the open category of
    highest precedence (none: idle). Work lost to revocations is judged per run in Python
    for the few jobs a notice hit."""
    got = sweep(con, jobs, [(None, 0, since, until)])
    return {job: g for (job, _k), g in got.items()}


Window = tuple[str | None, int, float | None, float | None]  # (job or None: every job, key, lo, hi)


# Each run's first and last instant from the steps rollup's ``start_min`` and ``last_ts``
# (migration 023): a fiftieth of the rows. A run with rollup rows from before the column (a
# lake's older files: null) is read from its intervals, as before.
_RUNS_ROLLED = """rr AS (SELECT job, run, min(start_min) AS first, max(epoch(last_ts)) AS last,
                       count(*) FILTER (WHERE start_min IS NULL) AS missing
                FROM steps_5m JOIN ref USING (job, run, rank) GROUP BY ALL),
            r AS (SELECT job, run, first, last FROM rr WHERE missing = 0
                  UNION ALL SELECT s.job, s.run, min(epoch(s.ts) - {span}), max(epoch(s.ts))
                  FROM steps s JOIN ref USING (job, run, rank) SEMI JOIN rr ON rr.job = s.job AND rr.run = s.run
                                                                             AND rr.missing > 0
                  GROUP BY ALL)"""
# Only the intervals that overlap some window are then read: of each job a window names, those
# overlapping its windows merged into ranges, of every other job those overlapping the windows
# for all of them; one scan and a hash semi join on the job (an EXISTS or'ed with the rest was
# decorrelated through a grouping of every interval: 1.3 s a fleet-week). A kept fleet-week
# materialises the pieces of its edges and last hours, not every interval of the week.
_NEAR = """SELECT s.*, {span} AS span FROM steps s JOIN ref USING (job, run, rank)
                SEMI JOIN rng ON rng.job = s.job AND (rng.lo IS NULL OR epoch(s.ts) > rng.lo)
                              AND (rng.hi IS NULL OR epoch(s.ts) - {span} < rng.hi)"""
_RANGES = """rng AS (SELECT unnest($gj::VARCHAR[]) AS job, unnest($glo::DOUBLE[]) AS lo, unnest($ghi::DOUBLE[]) AS hi
                     UNION ALL
                     SELECT j.job, e.lo, e.hi FROM (SELECT DISTINCT job FROM ref) j,
                            (SELECT unnest($elo::DOUBLE[]) AS lo, unnest($ehi::DOUBLE[]) AS hi) e
                     WHERE NOT list_contains($gj::VARCHAR[], j.job)),"""


def _ranges(windows: list[Window]) -> dict[str, Any]:
    """The windows as the time ranges whose intervals are read (parameters of ``_RANGES``):
    each named job's merged into as few as cover them (a job's windows are hours: one range
    per window cost a comparison per interval and window), and those of the windows for
    every other job (``elo``, ``ehi``)."""
    inf = math.inf
    per: dict[str | None, list[list[float]]] = {}
    for job, _k, lo, hi in sorted(windows, key=lambda w: (w[0] or "", -inf if w[2] is None else w[2])):
        a, b = -inf if lo is None else lo, inf if hi is None else hi
        rs = per.setdefault(job, [])
        if rs and a <= rs[-1][1]:
            rs[-1][1] = max(rs[-1][1], b)
        else:
            rs.append([a, b])
    out: dict[str, Any] = {"gj": [], "glo": [], "ghi": [], "elo": [], "ehi": []}
    for j, rs in sorted(per.items(), key=lambda x: (x[0] is None, x[0] or "")):
        for a, b in rs:
            if j is not None:
                out["gj"].append(j)
            out["glo" if j is not None else "elo"].append(None if a == -inf else a)
            out["ghi" if j is not None else "ehi"].append(None if b == inf else b)
    return out




# an interval's share of gradient communication computation did not hide (migration 027; a
# database or lake file before it: none)
COMM = "least(1, greatest(0, coalesce(s.comm_mean_seconds / nullif(s.step_mean_seconds, 0), 0)))"


def _sweep_sql(cond: str, ranks: str, only: str, sums: str, case: str, rolled: bool = False,
               comm: str = COMM) -> str:
    """The sweep's one statement (see ``sweep``): ``cond`` picks the jobs, ``ranks`` the table
    each run's lowest rank is read from, ``only`` restricts the ordered pieces, ``sums`` and
    ``case`` count the open pieces of each category and name the winning one; ``rolled``: the
    runs' first and last instants from the steps rollup, and only the intervals that overlap
    a window read (``_ranges``)."""
    runs = _RUNS_ROLLED.format(span=_SPAN) if rolled else \
        "r AS (SELECT job, run, min(t - span) AS first, max(t) AS last FROM st GROUP BY ALL)"
    src = f"({_NEAR.format(span=_SPAN)})" if rolled else \
        f"(SELECT s.*, {_SPAN} AS span FROM steps s JOIN ref USING (job, run, rank))"
    return f"""WITH ref AS (SELECT job, run, min(rank) AS rank FROM {ranks} WHERE {cond} GROUP BY job, run),
            wins AS (SELECT unnest($wj::VARCHAR[]) AS job, unnest($wk::INTEGER[]) AS k, unnest($wlo::DOUBLE[]) AS lo,
                            unnest($whi::DOUBLE[]) AS hi),
            {_RANGES if rolled else ""}
            st AS MATERIALIZED (
                SELECT s.job, s.run, epoch(s.ts) AS t, s.span,
                       least(1, greatest(0, coalesce(s.wait_mean_seconds / nullif(s.step_mean_seconds, 0), 0))) AS w,
                       {comm} AS c
                FROM {src} s),
            d AS (SELECT j.job, j.run, min(epoch(j.ts)) AS declared FROM jobs j JOIN ref USING (job, run, rank)
                  GROUP BY ALL),
            {runs},
            c AS (SELECT job, max(epoch(ts)) AS t FROM checkpoints WHERE {cond} GROUP BY job),
            span AS (SELECT r.job, min(coalesce(d.declared, r.first)) AS a, max(r.last) AS last, min(r.first) AS first
                     FROM r LEFT JOIN d USING (job, run) GROUP BY r.job),
            span2 AS (SELECT span.*, greatest(span.last, coalesce((SELECT max(c.t) FROM c WHERE c.job = span.job
                                                                    AND c.t >= span.first), span.last)) AS b
                      FROM span),
            win AS (SELECT job, k, lo, greatest(lo, hi) AS hi FROM (
                        SELECT span2.job, wins.k, CASE WHEN wins.lo IS NULL THEN a ELSE greatest(a, wins.lo) END AS lo,
                               CASE WHEN wins.hi IS NULL THEN b ELSE least(b, wins.hi) END AS hi
                        FROM span2 JOIN wins ON wins.job = span2.job
                             OR (wins.job IS NULL AND span2.job NOT IN (SELECT job FROM wins WHERE job IS NOT NULL)))),
            other AS (
                SELECT d.job, d.declared AS a, r.first AS b, 'startup' AS cat FROM d JOIN r USING (job, run)
                UNION ALL SELECT job, epoch(ts) - coalesce(seconds, 0), epoch(ts),
                                 CASE WHEN action = 'save' THEN 'checkpoint_save' ELSE 'checkpoint_restore' END
                          FROM checkpoints WHERE {cond}
                UNION ALL SELECT unnest($rj::VARCHAR[]), unnest($ra::DOUBLE[]), unnest($rb::DOUBLE[]), 'revocation'),
            allp AS (SELECT job, t - span AS a, t AS b, NULL AS cat, span, w, least(c, 1 - w) AS c FROM st WHERE span > 0
                     UNION ALL SELECT job, a, b, cat, NULL, NULL, NULL FROM other WHERE b > a),
            flag AS (SELECT *, max(b) OVER (PARTITION BY job ORDER BY a, b ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                                 AS prev_b,
                               lead(a) OVER (PARTITION BY job ORDER BY a, b) AS next_a
                     FROM allp {only}),
            marked AS (SELECT f.*, win.k, win.lo, win.hi,
                              f.cat IS NULL AND coalesce(f.prev_b <= f.a, true) AND coalesce(f.next_a >= f.b, true)
                              AND f.a >= win.lo AND f.b <= win.hi AS clean
                       FROM flag f JOIN win USING (job) WHERE f.b > win.lo AND f.a < win.hi),
            direct AS (SELECT job, k, sum(span * w) AS iw, sum(span * c) AS cm, sum(span * (1 - w - c)) AS pr
                       FROM marked WHERE clean GROUP BY job, k),
            pieces AS (SELECT job, k, a, a + span * w AS b, 'input_wait' AS cat, lo, hi FROM marked
                       WHERE NOT clean AND cat IS NULL
                       UNION ALL SELECT job, k, a + span * w, a + span * (w + c), 'communication', lo, hi FROM marked
                       WHERE NOT clean AND cat IS NULL
                       UNION ALL SELECT job, k, a + span * (w + c), b, 'productive', lo, hi FROM marked WHERE NOT clean AND cat IS NULL
                       UNION ALL SELECT job, k, a, b, cat, lo, hi FROM marked WHERE cat IS NOT NULL),
            clipped AS (SELECT job, k, greatest(a, lo) AS a, least(b, hi) AS b, cat FROM pieces
                        WHERE least(b, hi) > greatest(a, lo)),
            pts AS (SELECT job, k, a AS t, cat, 1 AS d FROM clipped UNION ALL SELECT job, k, b, cat, -1 FROM clipped),
            run AS (SELECT job, k, t, lead(t) OVER (PARTITION BY job, k ORDER BY t, d) AS t2, {sums}
                    FROM pts WINDOW w AS (PARTITION BY job, k ORDER BY t, d ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
            SELECT job, k, CASE {case} ELSE 'idle' END AS cat, sum(t2 - t), NULL FROM run WHERE t2 > t GROUP BY ALL
            UNION ALL SELECT job, k, 'input_wait', iw, NULL FROM direct
            UNION ALL SELECT job, k, 'communication', cm, NULL FROM direct
            UNION ALL SELECT job, k, 'productive', pr, NULL FROM direct
            UNION ALL SELECT job, k, '', lo, hi FROM win"""


def sweep(con: duckdb.DuckDBPyConnection, jobs: list[str] | None, windows: list[Window],
          restrict: bool = False) -> dict[tuple[str, int], Goodput]:
    """The goodput of each of ``jobs`` (None: every job with steps) over each of ``windows``
    ((job, key, lo, hi) in epoch seconds, None: unbounded; job None: every job no other
    window names), keyed by (job, key): the pieces are the whole run's (see ``goodput``),
    cut at each window's edges, and a window is cut to the job's span. With ``restrict``, only the pieces that
    overlap some window are ordered (exact: a piece inside a window overlaps only pieces
    that overlap the window too) -- for windows covering a small part of the jobs' time."""
    cond = "job IN (SELECT unnest($jobs::VARCHAR[]))" if jobs is not None else "job IS NOT NULL"
    params: dict[str, Any] = {"jobs": jobs} if jobs is not None else {}
    # revocations: the jobs stepping on a notice's node around it (a superset, cheap: by time),
    # then per run in Python which notices hit, the lost work and the time to resume
    cand = con.execute(
        f"""SELECT DISTINCT s.job FROM revocations v JOIN steps s ON s.node = v.node
            WHERE v.revokes AND s.ts BETWEEN v.ts - INTERVAL {int(NOTICE_WINDOW)} SECOND AND v.ts + INTERVAL 1 DAY
              AND s.{cond}""", params).fetchall()
    rev = _revocations(con, sorted(j for (j,) in cand))
    prio = sorted(PRIORITY, key=PRIORITY.get)  # type: ignore[arg-type]
    sums = ", ".join(f"sum(d) FILTER (WHERE cat = '{c}') OVER w AS \"{c}\"" for c in prio)
    case = " ".join(f"WHEN coalesce(\"{c}\", 0) > 0 THEN '{c}'" for c in prio)
    # each run's lowest rank: from the steps rollup where there is one (the same ranks, every
    # interval counted, read from a fiftieth of the rows; raw rows retention deleted still
    # count there, as their run's rank did)
    ranks = "steps_5m" if has_view(con, "steps_5m") else "steps"
    rolled = ranks == "steps_5m" and has_column(con, "steps_5m", "start_min")
    rng = _ranges(windows) if rolled else {}
    only = ("SEMI JOIN win ON win.job = allp.job AND allp.b > win.lo AND allp.a < win.hi"  # (EXISTS: a hash of every piece)
            if restrict else "")
    # One query: the reference rank's intervals once (materialised), each job's span cut to
    # each window, and the split. A step interval that overlaps nothing (no other piece, no
    # window edge) is its own split (input wait, then productive): summed directly. Only the
    # others go through the sweep, which is exact because the direct ones share no instant
    # with anything.
    comm = COMM if has_column(con, "steps", "comm_mean_seconds") else "0.0"
    rows = con.execute(
        _sweep_sql(cond, ranks, only, sums, case, rolled, comm),
        params | rng | {"wj": [w[0] for w in windows], "wk": [w[1] for w in windows],
                  "wlo": [w[2] for w in windows], "whi": [w[3] for w in windows],
                  "rj": [j for j, ps in rev.items() for _ in ps],
                  "ra": [a for ps in rev.values() for a, _b in ps],
                  "rb": [b for ps in rev.values() for _a, b in ps]}).fetchall()
    out: dict[tuple[str, int], Goodput] = {}
    for job, k, cat, v, hi in rows:
        if cat == "":
            out[(job, k)] = Goodput(job, float(v), float(hi), dict.fromkeys(CATEGORIES, 0.0))
    for job, k, cat, v, _hi in rows:
        if cat not in ("", "idle"):  # the sweep's idle covers only its own pieces: idle is what the rest leaves
            out[(job, k)].seconds[cat] += float(v)
    for g in out.values():
        g.seconds["idle"] = max(0.0, g.wall - sum(v for k, v in g.seconds.items() if k != "idle"))
    return out


def _revocations(con: duckdb.DuckDBPyConnection, jobs: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Each job's revocation pieces: from each notice that hit one of its runs until steps
    resumed, and the hit run's steps after its last good save (redone). The jobs together:
    each run's span on each node is aggregated in DuckDB (a job's reference intervals were
    read into Python one job at a time: a scan of every step per job), then only the lost
    intervals of the runs a notice hit are read."""
    if not jobs:
        return {}
    ranks = "steps_5m" if has_view(con, "steps_5m") else "steps"  # each run's lowest rank (see ``sweep``)
    ref = _REF.replace("FROM steps WHERE {jobs}", f"FROM {ranks} WHERE {{jobs}}").format(
        jobs="job IN (SELECT unnest($jobs::VARCHAR[]))")
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for job, run, node, lo, hi in con.execute(
            f"WITH {ref} SELECT job, run, node, min(t - span), max(t) FROM st GROUP BY ALL ORDER BY job, min(t), run, node",
            {"jobs": jobs}).fetchall():
        r = runs.setdefault(job, {}).setdefault(run, {"first": lo, "last": hi, "nodes": {}})
        r["first"], r["last"] = min(r["first"], lo), max(r["last"], hi)
        r["nodes"][node] = (lo, hi)
    ckpts: dict[str, list[tuple[Any, ...]]] = {}
    for job, *c in con.execute(
            """SELECT job, action, epoch(ts) AS t, step, coalesce(ok, true) FROM checkpoints
               WHERE job IN (SELECT unnest(?::VARCHAR[])) ORDER BY job, ts""", [jobs]).fetchall():
        ckpts.setdefault(job, []).append(tuple(c))
    nodes = sorted({n for rs in runs.values() for r in rs.values() for n in r["nodes"]})
    notices = con.execute(
        "SELECT node, epoch(ts) FROM revocations WHERE revokes AND node IN (SELECT unnest(?::VARCHAR[])) ORDER BY ts",
        [nodes]).fetchall()
    out: dict[str, list[tuple[float, float]]] = {}
    lost: list[tuple[str, str, float]] = []  # (job, run, steps numbered above this were lost)
    for job, rs in runs.items():
        pieces = out.setdefault(job, [])
        lost_from: dict[str, float] = {}
        for node, tn in notices:
            for run, r in rs.items():
                span = r["nodes"].get(node)
                if span is None or not span[0] <= tn <= span[1] + NOTICE_WINDOW or span[1] > tn + STOPPED_WITHIN:
                    continue
                saves = [c for c in ckpts.get(job, []) if c[0] == "save" and c[3] and c[1] <= r["last"] and c[2] is not None]
                lost_from[run] = max((c[2] for c in saves), default=-math.inf)  # no good save: every step, step 0 too
                after = [x["first"] for x in rs.values() if x["first"] >= r["last"]]
                resume = min(after) if after else max(x["last"] for x in rs.values())
                pieces.append((tn, max(tn, resume)))  # resumed before the notice came: no time
        lost += [(job, run, f) for run, f in lost_from.items()]
    if lost:
        for job, _run, t, n, first, last, span, f in con.execute(
                f"""WITH {ref}, hit AS (SELECT unnest($lj::VARCHAR[]) AS job, unnest($lr::VARCHAR[]) AS run,
                                               unnest($lf::DOUBLE[]) AS f)
                    SELECT st.job, st.run, t, n, first_step, last_step, span, hit.f FROM st JOIN hit USING (job, run)
                    WHERE last_step IS NOT NULL AND last_step > hit.f ORDER BY st.job, t""",
                {"jobs": jobs, "lj": [x[0] for x in lost], "lr": [x[1] for x in lost],
                 "lf": [x[2] for x in lost]}).fetchall():
            k = last - max(f, (1 if first is None else first) - 1)  # runs numbered from 0 too
            frac = min(1.0, k / n) if n else 1.0
            out[job].append((t - span * frac, t))
    return {j: ps for j, ps in out.items() if ps}
