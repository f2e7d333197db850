"""Goodput of a training job: its wall time split into productive step time and badput.

The job's wall time runs from its first declaration (or first step) to the end of its last
step or checkpoint.  It is cut into pieces, each instant counted once, in this order of
precedence (a higher one wins where two overlap):

1. ``checkpoint_save`` / ``checkpoint_restore``: the checkpoint records' durations;
2. ``revocation``: work lost to a revocation (the revoked run's steps after the job's last
   good save at or before that run's last step: redone after the restart), and time from
   the notice until steps resume (the replacement's start-up included);
3. ``input_wait`` and ``productive``: the step intervals' time, split by their input-wait
   share;
4. ``startup``: from a run's declaration to its first step;
5. ``idle``: whatever is left (evaluation, gaps without telemetry, a crash's downtime).

So the parts add up to the wall time exactly.  Time is the reference rank's (the lowest
rank of each run; all ranks step together in synchronous training); checkpoints of any
rank count.  Within one step interval the split is by totals: the interval's input-wait
share of its time is input wait.  A notice counts for a run when the run was stepping on
the notice's node at the time (its last step there no more than a minute before it).
Google's ml-goodput-measurement uses the same badput families (start-up, data loading,
checkpoint save / restore, wasted progress and recovery after a disruption).
"""

from __future__ import annotations

import datetime as dt
import heapq
from dataclasses import dataclass
from typing import Any

import duckdb

from .db import AnalyticsError
from .queries import Result, needs_schema

CATEGORIES = (
    "productive",
    "input_wait",
    "startup",
    "checkpoint_save",
    "checkpoint_restore",
    "revocation",
    "idle",
)
# precedence: lower number wins where pieces overlap
PRIORITY = {
    "checkpoint_save": 0,
    "checkpoint_restore": 1,
    "revocation": 2,
    "input_wait": 3,
    "productive": 4,
    "startup": 5,
}
NOTICE_WINDOW = 60.0  # seconds: a run stepping on the node this recently is hit by its notice


@dataclass
class Goodput:
    job: str
    start: float
    end: float
    seconds: dict[str, float]
    runs: int
    notices: int
    steps_lost: int

    @property
    def wall(self) -> float:
        return self.end - self.start

    def result(self) -> Result:
        rows = [
            (c, round(self.seconds[c], 3), round(100 * self.seconds[c] / self.wall, 2) if self.wall else None)
            for c in CATEGORIES
        ]
        rows.append(("wall", round(self.wall, 3), 100.0 if self.wall else None))
        return ["category", "seconds", "pct"], rows


def _sweep(pieces: list[tuple[float, float, str]], start: float, end: float) -> dict[str, float]:
    """Length of [start, end] covered by each category, the highest precedence winning;
    uncovered time is idle."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    points: list[tuple[float, int, str]] = []
    for a, b, cat in pieces:
        a, b = max(a, start), min(b, end)
        if b > a:
            points += [(a, 1, cat), (b, -1, cat)]
    points.sort()
    active = dict.fromkeys(PRIORITY, 0)
    heap: list[tuple[int, str]] = []
    t = start
    for x, delta, cat in points:
        if x > t:
            while heap and active[heap[0][1]] == 0:
                heapq.heappop(heap)
            out[heap[0][1] if heap else "idle"] += x - t
            t = x
        active[cat] += delta
        if delta > 0:
            heapq.heappush(heap, (PRIORITY[cat], cat))
    if end > t:
        out["idle"] += end - t
    return out


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
    steps = con.execute(
        """
        WITH ref AS (SELECT run, min(rank) AS rank FROM steps WHERE job = ? GROUP BY run)
        SELECT s.run, s.node, epoch(s.ts) AS t, s.steps, s.first_step, s.last_step,
               coalesce(s.steps / nullif(s.steps_per_second, 0), s.step_mean_seconds * s.steps) AS span,
               coalesce(s.wait_mean_seconds / nullif(s.step_mean_seconds, 0), 0) AS wait_share
        FROM steps s JOIN ref USING (run, rank) WHERE s.job = ? ORDER BY s.ts""",
        [job, job],
    ).fetchall()
    if not steps:
        known = [r[0] for r in con.execute("SELECT DISTINCT job FROM steps ORDER BY 1 LIMIT 10").fetchall()]
        hint = f" (jobs with steps: {', '.join(known)})" if known else " (no job has sent steps yet)"
        raise AnalyticsError(f"no steps for job {job!r}{hint}")
    decls = con.execute(
        """
        WITH ref AS (SELECT run, min(rank) AS rank FROM steps WHERE job = ? GROUP BY run)
        SELECT j.run, min(epoch(j.ts)) FROM jobs j JOIN ref USING (run, rank) WHERE j.job = ? GROUP BY j.run""",
        [job, job],
    ).fetchall()
    ckpts = con.execute(
        """SELECT action, epoch(ts) AS t, coalesce(seconds, 0), step, coalesce(ok, true)
           FROM checkpoints WHERE job = ? ORDER BY ts""",
        [job],
    ).fetchall()
    nodes = sorted({s[1] for s in steps})
    notices = con.execute(
        f"""SELECT node, epoch(ts) FROM revocations WHERE revokes AND node IN ({", ".join("?" * len(nodes))})
            ORDER BY ts""",
        nodes,
    ).fetchall()

    pieces: list[tuple[float, float, str]] = []
    runs: dict[str, dict[str, Any]] = {}
    for run, node, t, _n, _first, _last, span, _share in steps:
        span = max(0.0, span or 0.0)
        r = runs.setdefault(run, {"first": t - span, "last": t, "nodes": {}})
        r["first"], r["last"] = min(r["first"], t - span), max(r["last"], t)
        lo, hi = r["nodes"].get(node, (t - span, t))
        r["nodes"][node] = (min(lo, t - span), max(hi, t))
    for run, t in decls:
        if run in runs:
            runs[run]["declared"] = t
            pieces.append((t, runs[run]["first"], "startup"))
    for action, t, secs, _step, _ok in ckpts:
        pieces.append((t - secs, t, "checkpoint_save" if action == "save" else "checkpoint_restore"))

    # revocations: which runs they hit, where their lost work starts, when steps resumed
    lost_from: dict[str, float] = {}  # run -> steps numbered above this were lost
    hit_notices = 0
    for node, tn in notices:
        for run, r in runs.items():
            span = r["nodes"].get(node)
            if span is None or not span[0] <= tn <= span[1] + NOTICE_WINDOW:
                continue
            hit_notices += 1
            saves = [c for c in ckpts if c[0] == "save" and c[4] and c[1] <= r["last"] and c[3] is not None]
            lost_from[run] = max((c[3] for c in saves), default=0)
            after = [x["first"] for x in runs.values() if x["first"] >= r["last"]]
            resume = min(after) if after else max(x["last"] for x in runs.values())
            pieces.append((tn, resume, "revocation"))
    steps_lost = 0
    for run, _node, t, n, first, last, span, share in steps:
        span = max(0.0, span or 0.0)
        a = t - span
        if run in lost_from and last is not None and last > lost_from[run]:
            lost = last - max(lost_from[run], (first or 1) - 1)
            frac = min(1.0, lost / n) if n else 1.0
            steps_lost += int(lost)
            pieces.append((t - span * frac, t, "revocation"))
        w = min(1.0, max(0.0, share or 0.0))
        pieces.append((a, a + span * w, "input_wait"))
        pieces.append((a + span * w, t, "productive"))

    start = min([r.get("declared", r["first"]) for r in runs.values()])
    end = max([r["last"] for r in runs.values()] + [c[1] for c in ckpts if c[1] >= start])
    if since is not None:
        start = max(start, since)
    if until is not None:
        end = min(end, until)
    end = max(end, start)  # a window the job did not run in: no wall time
    return Goodput(job, start, end, _sweep(pieces, start, end), len(runs), hit_notices, steps_lost)
