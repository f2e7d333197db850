"""Profiler traces: a job's imported PyTorch profiler traces read HTA's way (analytics/imports/traces.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..db import AnalyticsError, Database


def trace(db: Database, job: str) -> dict[str, Any]:
    """``analyze trace``: per rank the temporal breakdown (idle, compute, non-compute share),
    the computation-communication overlap and the exposed communication; per profiler step
    the slowest rank and the communication computation did not hide."""
    from ..imports import traces

    with db.read() as con:
        return traces.breakdown(con, job)


def import_trace(db: Database, job: str, paths: list[str], progress: Any = None) -> dict[str, Any]:
    """``analyze import trace``: read every file (nothing stored if one is bad), then store
    each rank (writes). The files are read where this runs: a database file only."""
    from ..imports import traces

    if getattr(db, "lake", None) is not None:
        raise AnalyticsError("import trace into a lake: not supported yet (import into a database file)")
    files = [Path(p) for p in paths]
    with db.write() as con:
        return traces.import_files(con, files, job, progress=progress)


def import_trace_rank(db: Database, job: str, rank: dict[str, Any]) -> dict[str, Any]:
    """One rank read and reduced where ``analyze import trace`` ran (traces.payload), checked
    and stored (writes): the resource a collector serves, since it holds the file."""
    from ..imports import traces

    if getattr(db, "lake", None) is not None:
        raise AnalyticsError("import trace into a lake: not supported yet (import into a database file)")
    if not isinstance(job, str) or not 0 < len(job) <= 512:
        raise AnalyticsError("import trace: job must be a name of 1 to 512 characters")
    t = traces.from_payload(rank)
    with db.write() as con:
        return traces.store(con, job, [t])
