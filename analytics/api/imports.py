"""Imports: training events (jobs, steps, scalars) sent to a database."""

from __future__ import annotations

from typing import Any

from ..db import AnalyticsError, Database

IMPORT_TYPES = ("train_job", "train_steps", "train_scalar")


def import_events(db: Database, job: str, lines: list[bytes]) -> dict[str, Any]:
    """Store prepared import events (wire-format JSON lines of ``job``: train_job,
    train_steps, train_scalar only) through the collector's writer (writes); the counts
    stored. Anything else is refused whole, with nothing written."""
    return import_jobs(db, [(job, lines)])[0]


def import_jobs(db: Database, jobs: list[tuple[str, list[bytes]]]) -> list[dict[str, Any]]:
    """import_events for several jobs on one connection (``analyze import tensorboard
    --manifest``): every job's events are checked before any is stored; then each job is
    one transaction, in order. The counts stored, a dict per job."""
    import json

    if getattr(db, "lake", None) is not None:
        raise AnalyticsError("import into a lake: events reach a lake through a collector "
                             "(write them to a spool and run cmdare-collector spool DIR --lake URI)")

    from cmdare.collector.writer import Writer

    for job, lines in jobs:
        for i, line in enumerate(lines):
            try:
                ev = json.loads(line)
            except ValueError:
                raise AnalyticsError(f"import: event {i + 1} is not JSON") from None
            if not isinstance(ev, dict) or ev.get("type") not in IMPORT_TYPES or ev.get("job") != job:
                raise AnalyticsError(f"import: event {i + 1} is not a {'/'.join(IMPORT_TYPES)} event of job {job!r}")
    out = []
    with db.write() as con:
        for job, lines in jobs:
            if not lines:  # only open it (the CLI checks the database before reading files)
                out.append({"steps": 0, "scalars": 0, "duplicates": 0})
                continue
            from ..imports.tbimport import drop_stored

            kept, stored = drop_stored(con, job, lines)
            w = Writer(con).write([(f"import:{job}", b"".join(x if x.endswith(b"\n") else x + b"\n" for x in kept))])
            if w.dead:
                raise AnalyticsError(f"{w.dead} imported events of job {job!r} were rejected by the writer; "
                                     "see dead_letters")
            out.append({"steps": w.rows.get("steps", 0), "scalars": w.rows.get("scalars", 0),
                        "duplicates": w.duplicates + stored})
    return out
