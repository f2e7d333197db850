"""Profiler traces: a job's imported PyTorch profiler traces read HTA's way (analytics/traces.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..db import AnalyticsError, Database


def trace(db: Database, job: str) -> dict[str, Any]:
    """``analyze trace``: per rank the temporal breakdown (idle, compute, non-compute share),
    the computation-communication overlap and the exposed communication; per profiler step
    the slowest rank and the communication computation did not hide."""
    from .. import traces

    with db.read() as con:
        return traces.breakdown(con, job)


def import_trace(db: Database, job: str, paths: list[str], progress: Any = None) -> dict[str, Any]:
    """``analyze import trace``: read every file (nothing stored if one is bad), then store
    each rank (writes). The files are read where this runs: a database file only."""
    from .. import traces

    if getattr(db, "lake", None) is not None:
        raise AnalyticsError("import trace into a lake: not supported yet (import into a database file)")
    files = [Path(p) for p in paths]
    with db.write() as con:
        return traces.import_files(con, files, job, progress=progress)
