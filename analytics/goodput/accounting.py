"""Accelerator time of jobs in closed buckets, in GPU-hours and dollars, rolled up.

A job's accelerator time over a window is its wall time there (``goodput``: the job's own
time line, each instant once) times the accelerators it held: the distinct GPUs its samples
name in the window, else its declared world size (one accelerator a worker), else its
stepping nodes. Every accelerator-second lands in exactly one bucket:

- ``startup``, ``checkpoint_save``, ``checkpoint_restore``, ``input_wait``, ``communication``
  (gradient all-reduce computation did not hide), ``revocation`` (work lost and the time
  until steps resumed): the wall-time buckets, times the GPUs;
- the productive step time is then split by the detectors' evidence, in this order, each
  taking its share of what is left: ``idle_accelerators`` (gpu_idle: idle GPUs x their idle
  share, over the job's GPUs), ``straggler`` (the slowest rank's slowdown s: the others wait
  1 - 1/s of each step), ``ps_wait`` (ps_bound: 1 - the measured scaling efficiency);
  ``productive`` is what remains;
- ``other``: the rest of the wall time (gaps without telemetry, evaluation, a crash's
  downtime).

A Kubernetes pod's or Slurm job that never stepped (``sched_accounts``) has no wall-time
buckets to split: its GPU time is ``idle_accelerators`` or ``productive`` (busy); a note says so.

Findings are those ``analyze bottlenecks`` stored for the job and overlapping the window;
a job without stored findings has the detectors run for it (``job_table``; the fleet's
with ``--detect``). Dollars: each GPU
hour at its node's price (the price catalogue's spot or on-demand price of the node's
instance type and region, over its accelerators), the job's nodes averaged; a job whose
nodes have no catalogue price has no dollars (said, never zero).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

import duckdb

from ..codec import json_object
from ..db import AnalyticsError, has_column, has_view
from ..holders import _held_rows, _ran_tracked, tracked_holders  # noqa: F401  (tracked_holders: the API)
from ..nodecost import accelerator_name, gpu_price, job_nodes
from . import Goodput, goodput, goodput_many

BUCKETS = ("productive", "startup", "checkpoint_save", "checkpoint_restore", "input_wait", "communication", "ps_wait",
           "straggler", "idle_accelerators", "revocation", "other")
DETECTORS = ("gpu_idle", "straggler", "ps_bound")
BY = ("job", "region", "accelerator", "fleet", "namespace", "slurm_job", "user")  # or any node label key (team, ...)


@dataclass
class JobAccount:
    job: str
    start: float
    end: float
    gpus: int
    gpus_from: str
    seconds: dict[str, float]  # accelerator-seconds per bucket
    usd_per_gpu_hour: float | None
    groups: dict[str, str] = field(default_factory=dict)  # region, accelerator, labels
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def dollars(self, bucket: str | None = None) -> float | None:
        if self.usd_per_gpu_hour is None:
            return None
        s = self.total if bucket is None else self.seconds[bucket]
        return s / 3600.0 * self.usd_per_gpu_hour


# the 5-minute buckets from t0 - 5 min to t1 (``bucket >= t0 - 5 min AND bucket <= t1``),
# selected by their first sample's time, which lies in its bucket: a filter on ``bucket``
# would be pushed into the exact view's raw side and run on every raw sample (evidence.split)
BUCKETS_NEAR = """first_ts >= time_bucket(INTERVAL 300 SECOND, $t0::TIMESTAMP - INTERVAL 300000001 MICROSECOND)
                                  + INTERVAL 300 SECOND
                  AND first_ts < time_bucket(INTERVAL 300 SECOND, $t1::TIMESTAMP) + INTERVAL 300 SECOND"""


def _gpus(con: duckdb.DuckDBPyConnection, jobs: list[str], t0: dt.datetime, t1: dt.datetime) -> dict[str, tuple[int, str]]:
    """job -> (accelerators it held in [t0, t1], from where that count comes)."""
    out: dict[str, tuple[int, str]] = {}
    for j, n in con.execute(  # the 5-minute rollup (exact: pending samples are read raw), not every sample
            f"""SELECT job, count(DISTINCT (node, "index")) FROM gpu_5m WHERE job IN (SELECT unnest($jobs::VARCHAR[]))
                  AND {BUCKETS_NEAR} GROUP BY job""", {"jobs": jobs, "t0": t0, "t1": t1}).fetchall():
        if n:
            out[j] = (int(n), "GPU samples")
    rest = [j for j in jobs if j not in out]
    if rest:
        for j, w in con.execute("""SELECT job, arg_max(world_size, ts) FROM jobs WHERE job IN (SELECT unnest(?::VARCHAR[]))
                                   GROUP BY job""", [rest]).fetchall():
            if w:
                out[j] = (int(w), "declared world size")
    rest = [j for j in jobs if j not in out]
    if rest:
        for j, n in con.execute("""SELECT job, count(DISTINCT node) FROM steps WHERE job IN (SELECT unnest(?::VARCHAR[]))
                                   GROUP BY job""", [rest]).fetchall():
            out[j] = (int(n), "stepping nodes")  # steps.node is NOT NULL: a job with steps has one
    return out


def sched_accounts(con: duckdb.DuckDBPyConnection, since: float | None, until: float | None, stepped: set[str],
                   cat: dict[Any, Any], idle_util: float | None = None, only: str | None = None,
                   ran: dict[str, str] | None = None) -> dict[str, JobAccount]:
    """The accounts of the jobs a scheduler gave GPUs to (a Kubernetes pod's, a Slurm job's)
    with GPU time in [since, until) and no steps (``stepped``: the jobs that stepped): their
    GPU time from the 5-minute GPU rollup (whole buckets overlapping the window): each
    bucket's samples times the GPU's sampling interval, measured from its samples' own
    times (the span over the intervals within buckets; a GPU with one sample a bucket takes
    its node's, else the bucket width over its fullest bucket's count), so a 20-second pod
    is billed 21 s a GPU, not the bucket's 300; ``idle_accelerators`` where a bucket's
    mean utilisation is under ``idle_util`` (gpu_idle's default), ``productive`` (busy)
    elsewhere; ``only``: that job's alone. A pod or Slurm job that ran a tracked job
    (``ran``: ``tracked_holders``, read here where not given) is that job: its time is
    counted there, not again here."""
    from ..detectors import evidence

    if not has_view(con, "gpu_5m") or not has_column(con, "gpu_rollup_5m", "slurm_job"):
        return {}
    t0, t1 = (None if since is None else _stamp(since)), (None if until is None else _stamp(until))
    p: dict[str, Any] = {"t0": t0, "t1": t1, "only": only}
    held = _held_rows("b")
    if con.execute(f"SELECT 1 {held} LIMIT 1", p).fetchone() is None:
        return {}  # no scheduler named a GPU: nothing more to read
    if ran is None:
        ran = _ran_tracked(con, _held_rows("g"), p)
    if ran:  # a pod or Slurm job that ran a tracked job is that job: its time is counted there
        held += " AND b.job NOT IN (SELECT unnest($ran::VARCHAR[]))"
        p = {**p, "ran": sorted(ran)}
    rows = con.execute(
        f"""WITH b AS (SELECT job, node, "index", samples AS n, first_ts, last_ts, namespace, slurm_job, slurm_user,
                              coalesce(gr_sum / nullif(gr_n, 0), util_sum / nullif(util_samples, 0)) AS util
                       {held}),
                 g AS (SELECT node, "index", sum(epoch(last_ts) - epoch(first_ts)) / nullif(sum(n - 1), 0) AS every,
                              {evidence.BUCKET_SECONDS} / max(n) AS widest FROM b GROUP BY ALL),
                 e AS (SELECT node, "index", coalesce(every, max(every) OVER (PARTITION BY node), widest) AS every
                       FROM g)
            SELECT job, max(namespace), max(slurm_job), max(slurm_user), count(DISTINCT (node, "index")),
                   sum(n * every), coalesce(sum(n * every) FILTER (WHERE util < $idle), 0), min(first_ts), max(last_ts)
            FROM b JOIN e USING (node, "index") GROUP BY job ORDER BY job""",
        {**p, "idle": float(evidence.IDLE_UTIL if idle_util is None else idle_util)}).fetchall()
    rows = [r for r in rows if r[0] not in stepped and r[5]]
    if not rows:
        return {}
    nodes = job_nodes(con, [r[0] for r in rows], held=True)
    memo: dict[tuple, float | None] = {}
    out = {}
    for job, ns, sjob, user, n, total, idle_s, first, last in rows:
        sec = dict.fromkeys(BUCKETS, 0.0)
        sec["idle_accelerators"] = float(idle_s)
        sec["productive"] = float(total) - float(idle_s)
        usd, price_from = gpu_price(nodes.get(job, []), cat, memo)
        groups = {**_groups(nodes.get(job, []), None), **_sched_group(ns, sjob, user)}
        start = first.replace(tzinfo=dt.timezone.utc).timestamp()
        end = last.replace(tzinfo=dt.timezone.utc).timestamp()
        out[job] = JobAccount(job, start if since is None else max(start, since),
                              end if until is None else min(end, until), int(n),
                              "GPU samples (Kubernetes pod)" if ns else "GPU samples (Slurm job)",
                              sec, usd, groups, {"no_steps": True, "price_from": price_from})
    return out


def _sched_group(ns: str | None, sjob: str | None, user: str | None) -> dict[str, str]:
    return {k: v for k, v in (("namespace", ns), ("slurm_job", sjob), ("user", user)) if v}


def _sched_groups(con: duckdb.DuckDBPyConnection, jobs: list[str], t0: dt.datetime, t1: dt.datetime,
                  ran: dict[str, str]) -> dict[str, dict[str, str]]:
    """job -> the namespace, Slurm job and user its GPUs' holder had (``ran``: tracked_holders):
    what ``--by namespace | slurm_job | user`` groups a stepping job by."""
    names = {j: j for j in jobs} | {h: t for h, t in ran.items() if t in set(jobs)}
    out: dict[str, dict[str, str]] = {}
    for j, ns, sj, u in con.execute(
            f"""SELECT job, max(namespace), max(slurm_job), max(slurm_user) FROM gpu_5m
                WHERE (namespace IS NOT NULL OR slurm_job IS NOT NULL)
                  AND job IN (SELECT unnest($jobs::VARCHAR[])) AND {BUCKETS_NEAR} GROUP BY job ORDER BY job""",
            {"jobs": sorted(names), "t0": t0, "t1": t1}).fetchall():
        out.setdefault(names[j], _sched_group(ns, sj, u))  # the job's own GPU rows first, then its pod's
    return out


def _groups(nodes: list[tuple], declared_acc: str | None) -> dict[str, str]:
    def most(xs: list[Any]) -> str:
        xs = [x for x in xs if x]
        return max(sorted(set(xs)), key=xs.count) if xs else "unknown"

    out = {"region": most([n[1] for n in nodes]), "accelerator": most([accelerator_name(n[4]) or n[4] for n in nodes])}
    if out["accelerator"] == "unknown" and declared_acc:
        out["accelerator"] = declared_acc
    labels: dict[str, list[str]] = {}
    for n in nodes:
        for k, v in json_object(n[6]).items():
            labels.setdefault(str(k), []).append(str(v))
    for k, vs in labels.items():
        out["label:" + k] = most(vs)
    return out


def stored_findings(con: duckdb.DuckDBPyConnection, jobs: list[str] | None, t0: dt.datetime,
                    t1: dt.datetime) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """job -> [(kind, evidence)] of the stored findings of these kinds overlapping [t0, t1]."""
    rows = con.execute(
        f"""SELECT job, kind, evidence::VARCHAR FROM findings
            WHERE kind IN ({", ".join("?" * len(DETECTORS))}) AND job IS NOT NULL
              AND coalesce(window_end, detected_at) >= ? AND coalesce(window_start, first_detected) <= ?
              {"AND job IN (SELECT unnest(?))" if jobs is not None else ""}
            ORDER BY job, coalesce(window_start, first_detected), kind, evidence::VARCHAR""",  # overlaps: one order
        [*DETECTORS, t0, t1, *([jobs] if jobs is not None else [])]).fetchall()
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for job, kind, ev in rows:  # evidence that is no object (NULL, a list): a finding with no figures
        out.setdefault(job, []).append((kind, json_object(ev)))
    return out



def _uncovered(con: duckdb.DuckDBPyConnection, jobs: list[str], t0: dt.datetime, t1: dt.datetime) -> list[str]:
    """The jobs no detector run looked at over [t0, t1] (a database from before coverage was
    kept counts every job without stored findings as not looked at)."""
    from ..findings.current import uncovered

    try:
        return uncovered(con, jobs, t0, t1, list(DETECTORS))
    except duckdb.CatalogException:  # no finding_coverage table (an older database, read-only)
        return list(jobs)


def fresh_findings(con: duckdb.DuckDBPyConnection, job: str | None, t0: dt.datetime,
                   t1: dt.datetime) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """The same, from running the detectors now (one job, or every job)."""
    from .. import findings
    from ..units import Scope

    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    res = findings.run(con, Scope(job, t0, t1), list(DETECTORS), {})
    for f in res.findings:
        if f.job:
            out.setdefault(f.job, []).append((f.kind, dict(f.evidence)))
    return out


def shares(found: list[tuple[str, dict[str, Any]]], gpus: int) -> dict[str, float]:
    """The productive time's shares the evidence takes: idle, straggler, ps_wait (each of
    what is left after the one before)."""
    idle = sum(float(e.get("idle_gpus", 0)) * float(e.get("idle_share", 1.0)) for k, e in found
               if k == "gpu_idle" and e.get("in_job", True) is not False)
    slow = max([float(e.get("slowdown", 1.0)) for k, e in found if k == "straggler"] or [1.0])
    eff = min([float(e["efficiency"]) for k, e in found if k == "ps_bound" and e.get("efficiency") is not None] or [1.0])

    def frac(x: float) -> float:
        return min(1.0, max(0.0, x)) if math.isfinite(x) else 0.0

    return {"idle_accelerators": frac(idle / gpus) if gpus else 0.0,
            "straggler": frac(1.0 - 1.0 / slow) if slow > 0 else 0.0,
            "ps_wait": frac(1.0 - eff)}


def account_many(con: duckdb.DuckDBPyConnection, jobs: list[str], since: float | None, until: float | None,
                 found: dict[str, list[tuple[str, dict[str, Any]]]], cat: dict[Any, Any] | None = None,
                 gp: dict[str, Goodput] | None = None) -> dict[str, JobAccount]:
    """The accounts of ``jobs`` (those with steps) over [since, until), in a few queries for all."""
    from .. import prices

    gp = gp if gp is not None else goodput_many(con, jobs, since, until)
    live = [j for j in jobs if j in gp]
    if not live:
        return {}
    lo, hi = min(gp[j].start for j in live), max(gp[j].end for j in live)
    gpus = _gpus(con, live, _stamp(lo), _stamp(hi))
    nodes = job_nodes(con, live)
    declared = dict(con.execute("""SELECT job, arg_max(accelerator, ts) FROM jobs WHERE job IN (SELECT unnest(?::VARCHAR[]))
                                   GROUP BY job""", [live]).fetchall())
    cat = cat if cat is not None else prices.load()
    memo: dict[tuple, float | None] = {}
    out = {}
    for job in live:
        g = gp[job]
        n, n_from = gpus.get(job, (1, "stepping nodes"))
        sh = shares(found.get(job, []), n)
        w = g.seconds
        sec = dict.fromkeys(BUCKETS, 0.0)
        for b in ("startup", "checkpoint_save", "checkpoint_restore", "input_wait", "communication", "revocation"):
            sec[b] = w[b] * n
        left = w["productive"] * n
        for b in ("idle_accelerators", "straggler", "ps_wait"):
            sec[b] = left * sh[b]
            left -= sec[b]
        sec["productive"] = left
        sec["other"] = w["idle"] * n  # the wall time no other bucket took, times the GPUs
        usd, price_from = gpu_price(nodes.get(job, []), cat, memo)
        out[job] = JobAccount(job, g.start, g.end, n, n_from, sec, usd, _groups(nodes.get(job, []), declared.get(job)),
                              {"shares": sh, "findings": sorted({k for k, _ in found.get(job, [])}),
                               "price_from": price_from})
    return out


def rollup(accounts: list[JobAccount], by: str) -> tuple[list[str], list[list[Any]]]:
    """One row per group: accelerator-hours per bucket, total, goodput %, dollars."""
    key = {"job": lambda a: a.job, "fleet": lambda a: "fleet", "region": lambda a: a.groups.get("region", "unknown"),
           "accelerator": lambda a: a.groups.get("accelerator", "unknown"),
           "namespace": lambda a: a.groups.get("namespace") or a.groups.get("label:namespace", "(no namespace)"),
           "slurm_job": lambda a: a.groups.get("slurm_job", "(no Slurm job)"),
           "user": lambda a: a.groups.get("user") or a.groups.get("label:user", "(no user)")}.get(
        by, lambda a: a.groups.get("label:" + by, "(no " + by + " label)"))
    groups: dict[str, list[JobAccount]] = {}
    for a in accounts:
        groups.setdefault(key(a), []).append(a)
    cols = [by, "jobs", "gpu_hours", "goodput_pct", *[f"{b}_gpu_hours" for b in BUCKETS], "dollars",
            "badput_dollars", "unpriced_jobs"]
    rows = []
    for name, accs in sorted(groups.items()):
        tot = sum(a.total for a in accs)
        per = {b: sum(a.seconds[b] for a in accs) for b in BUCKETS}
        priced = [a for a in accs if a.usd_per_gpu_hour is not None]
        dollars = sum(a.dollars() or 0.0 for a in priced) if priced else None
        bad = sum((a.dollars() or 0.0) - (a.dollars("productive") or 0.0) for a in priced) if priced else None
        rows.append([name, len(accs), round(tot / 3600, 4), round(100 * per["productive"] / tot, 2) if tot else None,
                     *[round(per[b] / 3600, 4) for b in BUCKETS],
                     None if dollars is None else round(dollars, 2), None if bad is None else round(bad, 2),
                     len(accs) - len(priced)])
    return cols, rows


MAX_WINDOWS = 1000


def windows(t0: float, t1: float, every: float | None) -> list[tuple[float, float]]:
    """[t0, t1) cut at multiples of ``every`` (epoch-aligned), or whole."""
    if every is None:
        return [(t0, t1)]
    if (t1 - t0) / every > MAX_WINDOWS:
        raise AnalyticsError(f"--every: {(t1 - t0) / every:.0f} windows; at most {MAX_WINDOWS}: a longer --every "
                             "or a shorter range")
    out, a = [], t0
    while a < t1:
        b = min(t1, (math.floor(a / every) + 1) * every)
        out.append((a, b))
        a = b
    return out


def _stamp(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).replace(tzinfo=None)


def job_table(con: duckdb.DuckDBPyConnection, job: str, since: float | None, until: float | None,
              every: float | None = None) -> tuple[list[str], list[list[Any]]]:
    """One job: a row per bucket (and a ``total``) with accelerator-seconds, GPU-hours, % and
    dollars; with ``every``, those rows per window (a leading ``window`` column)."""
    from .. import prices

    cat = prices.load()
    try:
        whole = goodput(con, job, since, until)
    except AnalyticsError:  # no steps: a Kubernetes pod's job is accounted from its GPU samples
        held = sched_accounts(con, since, until, set(), cat, only=job).get(job)
        if held is None:
            raise
        if every is None:
            return _table([(None, held)], every)
        return _table([(a, x) for a, b in windows(held.start, held.end, every)
                       for x in sched_accounts(con, a, b, set(), cat, only=job).values()], every)
    found = stored_findings(con, [job], _stamp(whole.start), _stamp(whole.end)).get(job)
    if found is None and _uncovered(con, [job], _stamp(whole.start), _stamp(whole.end)):
        found = fresh_findings(con, job, _stamp(whole.start), _stamp(whole.end)).get(job, [])
    accs = [(a, account_many(con, [job], a, b, {job: found or []}, cat)[job])
            for a, b in (windows(whole.start, whole.end, every) if whole.end > whole.start else [(whole.start, whole.end)])]
    return _table(accs, every)


def _table(accs: list[tuple[Any, JobAccount]], every: float | None) -> tuple[list[str], list[list[Any]]]:
    """``job_table``'s rows: per window start and account, a row per bucket and a total."""
    rows = []
    for a, acc in accs:
        tot = acc.total
        lead = [_stamp(a if a is not None else acc.start)] if every is not None else []
        for k in (*BUCKETS, "total"):
            s = tot if k == "total" else acc.seconds[k]
            d = acc.dollars(None if k == "total" else k)
            rows.append([*lead, k, round(s, 3), round(s / 3600, 4), round(100 * s / tot, 2) if tot else None,
                         None if d is None else round(d, 4)])
    cols = (["window"] if every is not None else []) + ["category", "seconds", "gpu_hours", "pct", "dollars"]
    return cols, rows


def fleet_table(con: duckdb.DuckDBPyConnection, since: dt.datetime | None, until: dt.datetime | None, by: str,
                every: float | None = None, detect: bool = True) -> tuple[list[str], list[list[Any]], list[str]]:
    """Every job that stepped in [since, until), and every pod's or Slurm job that held GPUs
    there without stepping (``sched_accounts``), rolled up ``by`` (job, region, accelerator,
    fleet, namespace, slurm_job, user, or a node label: team); with ``every``, per window. Findings:
    those stored (the collector's detector schedule keeps them current); for jobs whose time
    no detector run covered (``finding_coverage``: an offline database), the detectors run
    now, unless ``detect`` is off."""
    from .. import prices
    from . import epoch
    from .goodhours import fleet

    whole = fleet(con, epoch(since), epoch(until))  # the kept hours where they hold, the rest raw
    jobs = sorted(j for j, g in whole.items() if g.wall > 0)
    notes: list[str] = []
    cat = prices.load()
    held = tracked_holders(con, since, until)  # and the pods' and Slurm jobs that never stepped:
    pods = {} if held is None else sched_accounts(con, epoch(since), epoch(until), set(whole), cat, ran=held)
    if not jobs and not pods:
        return [by, "jobs"], [], ["no job ran in the range"]
    spans = [(whole[j].start, whole[j].end) for j in jobs] + [(a.start, a.end) for a in pods.values()]
    lo = since or _stamp(min(t0 for t0, _ in spans))
    hi = until or _stamp(max(t1 for _, t1 in spans))
    if pods:
        notes.append(f"{len(pods)} job(s) are Kubernetes pods or Slurm jobs that sent no step telemetry (no track in their code): "
                     "their GPU time is split into busy (productive) and idle only")
    sched = _sched_groups(con, jobs, lo, hi, held) if jobs and held is not None else {}
    found = stored_findings(con, jobs, lo, hi) if jobs else {}
    missing = [j for j in _uncovered(con, jobs, lo, hi) if j not in found] if jobs else []
    if missing and detect:
        fresh = fresh_findings(con, missing[0] if len(missing) == 1 else None, lo, hi)
        for j in missing:
            found[j] = fresh.get(j, [])
    elif missing:
        notes.append(f"{len(missing)} job(s) were never looked at by the detectors in the range: their productive "
                     "time is not split by the detectors' evidence (--detect runs them now; a collector keeps "
                     "findings current)")
    out_rows: list[list[Any]] = []
    cols: list[str] = []
    for a, b in windows(epoch(lo), epoch(hi), every):  # type: ignore[arg-type]
        gp = {j: whole[j] for j in jobs} if every is None else None  # one window: the sweep above
        accs = [x for x in account_many(con, jobs, a, b, found, cat, gp).values() if x.total > 0] if jobs else []
        for x in accs:
            x.groups.update(sched.get(x.job, {}))
        accs += [x for x in (pods if every is None or held is None else
                             sched_accounts(con, a, b, set(whole), cat, ran=held)).values()
                 if x.total > 0]
        cols, rows = rollup(accs, by)
        if every is not None:
            cols = ["window", *cols]
            rows = [[_stamp(a), *r] for r in rows]
        out_rows += rows
    unpriced = sum(r[-1] for r in out_rows) if out_rows and cols and cols[-1] == "unpriced_jobs" else 0
    if unpriced:
        notes.append(f"{unpriced} job(s) run on instance types the price catalogue has no price for: no dollars "
                     "for them ($CMDARE_PRICES adds prices)")
    return cols or [by, "jobs"], out_rows, notes
