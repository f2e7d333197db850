"""Findings: run the detectors (``bottlenecks``), the stored findings, one job's detail."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ..db import AnalyticsError, Database, has_column
from ..queries import SCHED_STATES, needs_schema
from ..units import Finding, Scope
from .base import Table
from .telemetry import jobs, runs, steps


@dataclass
class Bottlenecks:
    """What ``bottlenecks`` found: the findings (sorted), one line per detector that could
    not run, the detectors that ran, and how many were stored (None: not stored, and why)."""

    findings: list[Finding]
    skipped: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    stored: int | None = None
    not_stored: str = ""  # "no-store" or "read-only" when stored is None
    next: list[Any] = field(default_factory=list)  # findings.NextStep: the recommendations they suggest, tried


def _known_job(con: Any, job: str) -> None:
    known = con.execute(
        "SELECT (SELECT count(*) FROM jobs WHERE job = $j) + (SELECT count(*) FROM steps WHERE job = $j)", {"j": job}
    ).fetchall()[0][0]
    if not known and has_column(con, "gpu_5m", "slurm_job"):  # a Kubernetes pod's or Slurm job (its GPUs name it)
        known = con.execute("SELECT count(*) FROM (SELECT 1 FROM gpu_5m WHERE job = $j AND (namespace IS NOT NULL OR slurm_job IS NOT NULL) LIMIT 1)",
                            {"j": job}).fetchall()[0][0]
    if not known:
        raise AnalyticsError(f"--job {job}: no such job in the database (analyze jobs lists them)")


def detector_options(config: dict[str, dict[str, Any]] | None, sets: list[str] | None) -> dict[str, dict[str, Any]]:
    """Detector options: a config file's tables, then ``DETECTOR.OPTION=VALUE`` overrides
    (``bottlenecks`` checks them, before it opens anything)."""
    from .. import findings

    return findings.merged(config or {}, findings.parse_set(list(sets or [])))


def bottlenecks(db: Database, job: str | None = None, since: dt.datetime | None = None,
                kinds: list[str] | None = None, options: dict[str, dict[str, Any]] | None = None,
                store: bool = True, next_steps: bool = True) -> Bottlenecks:
    """Run the detectors over ``job`` (None: all) since ``since``; with ``store``, replace
    the findings table's rows of this scope (a database that cannot be written is analysed
    without storing: ``not_stored`` says why); with ``next_steps``, run the recommendations
    the findings suggest and say which answer (``next``)."""
    from .. import findings

    options = options or {}
    findings.check_options(options)
    writable = store and db.writable()
    ctx = db.write() if writable else db.read()
    with ctx as con:
        if job is not None:
            _known_job(con, job)
        scope = Scope(job, since, None)
        out = findings.run(con, scope, list(kinds or []) or None, options)
        stored = findings.store(con, out, scope) if writable else None
        nxt = findings.next_steps(con, out.findings) if next_steps else []
    return Bottlenecks(out.findings, out.skipped, out.ran, stored,
                       "" if writable else ("no-store" if not store else "read-only"), nxt)




def stored_findings(db: Database, job: str | None = None, since: dt.datetime | None = None) -> Table:
    """The findings table (what the last ``bottlenecks`` runs stored), worst first."""
    with db.read() as con:
        needs_schema(con, 8, "stored findings")
        cur = con.execute(
            """SELECT kind, job, node, rank, subject, severity, confidence, window_start, window_end, summary,
                      evidence::VARCHAR AS evidence, first_detected, detected_at
               FROM findings WHERE ($job IS NULL OR job = $job) AND ($since IS NULL OR window_end >= $since)
               ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, confidence DESC,
                        kind, job, node""",
            {"job": job, "since": since})
        return Table([d[0] for d in cur.description], cur.fetchall())


def job_detail(db: Database, job: str) -> dict[str, Table]:
    """One job: its row of ``jobs``, its runs and ranks with their state, its steps per run
    and rank, its stored findings."""
    summary = jobs(db)
    i = summary.columns.index("job")
    rows = [r for r in summary.rows if r[i] == job]
    if not rows:
        raise AnalyticsError(f"no such job {job!r} (analyze jobs lists them)")
    pod = rows[0][summary.columns.index("state")] in SCHED_STATES  # a pod's or Slurm job: no steps to list
    return {"summary": Table(summary.columns, rows), "runs": runs(db, job),
            "steps": Table(["run", "rank"], []) if pod else steps(db, job), "findings": stored_findings(db, job)}
