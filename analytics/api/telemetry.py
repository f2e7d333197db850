"""Telemetry resources: nodes, instances, revocations, GPUs, TPUs, processes, hosts, jobs,
steps, goodput, and SQL."""

from __future__ import annotations

import datetime as dt
from typing import Any

from .. import processes, queries
from ..db import Database
from .base import Table, _table


def nodes(db: Database, lost_after: float = 3, label: str | None = None) -> Table:
    """Every node seen (cmdare.analytics.queries.nodes); ``label``: KEY=VALUE. A serving
    collector judges liveness as of its ingest horizon (``db.horizon``)."""
    ends = db.file_end()
    t = _table(db, queries.nodes, lost_after, queries.parse_label(label), db.horizon(), ends)
    return _ended(t, ends)


def instances(db: Database, lost_after: float = 3, since: dt.datetime | None = None, region: str | None = None,
              gpu_type: str | None = None) -> Table:
    """Every life of every VM."""
    return _table(db, queries.instances, lost_after, since, region, gpu_type)


def revocations(db: Database, since: dt.datetime | None = None, region: str | None = None,
                gpu_type: str | None = None) -> Table:
    """Revocation and maintenance notices and the work they cost."""
    return _table(db, queries.revocations, since, region, gpu_type)


def gpu(db: Database, node: str | None = None, since: dt.datetime | None = None, until: dt.datetime | None = None,
        label: str | None = None, every: float | None = None) -> Table:
    """Per GPU (per ``every`` seconds): utilisation, memory, power, temperature, throttling, errors."""
    return _table(db, queries.gpu, node, since, until, queries.parse_label(label), every)


def tpu(db: Database, node: str | None = None, since: dt.datetime | None = None, until: dt.datetime | None = None,
        label: str | None = None) -> Table:
    """Per TPU device: TensorCore duty cycle, HBM used and bandwidth, the jobs on its node."""
    return _table(db, queries.tpu, node, since, until, queries.parse_label(label))


def gpu_processes(db: Database, node: str | None = None, since: dt.datetime | None = None,
                  until: dt.datetime | None = None, job: str | None = None) -> Table:
    """Per GPU and process: the job and rank it is (by PID), its share of the GPU's samples,
    SM / memory share and memory; ``job``: that job's only."""
    return _table(db, processes.gpu_processes, node, since, until, job)


def host(db: Database, node: str | None = None, since: dt.datetime | None = None, until: dt.datetime | None = None,
         label: str | None = None, every: float | None = None) -> Table:
    """Per node (per ``every`` seconds): CPU, load, memory, processes, network and disk."""
    return _table(db, queries.host, node, since, until, queries.parse_label(label), every)


def jobs(db: Database, since: dt.datetime | None = None) -> Table:
    """Training jobs with their speed and input-bound verdict."""
    return _table(db, queries.jobs, since)


def runs(db: Database, job: str | None = None, since: dt.datetime | None = None) -> Table:
    """Every run and rank (of one job, or all) and how it stands or ended."""
    ends = db.file_end()
    return _ended(_table(db, queries.runs, job, since, ends), ends)


def _ended(t: Table, ends: dt.datetime | None) -> Table:
    """``t`` with the note that a file no collector is filling ends at ``ends``."""
    if ends is not None:
        t.notes = [*t.notes, f"this database ends at {ends:%Y-%m-%d %H:%M:%S} UTC (no collector is writing it): "
                   "nodes and runs are judged as of then, never lost for the time after it"]
    return t


def steps(db: Database, job: str, node: str | None = None, since: dt.datetime | None = None) -> Table:
    """One job per run and rank."""
    return _table(db, queries.steps, job, node, since)


def goodput(db: Database, job: str, since: dt.datetime | None = None, until: dt.datetime | None = None,
            every: float | None = None) -> Table:
    """A job's accelerator time (within [since, until) when given; per window of ``every``
    seconds) in closed goodput / badput buckets, GPU-hours and dollars (cmdare.analytics.goodput.accounting)."""
    from ..goodput import epoch
    from ..goodput.accounting import job_table

    with db.read() as con:
        cols, rows = job_table(con, job, epoch(since), epoch(until), every)
        notes = processes.gpu_use_notes(con, job, since, until)
    return Table(list(cols), [tuple(r) for r in rows], notes=notes)


def fleet_goodput(db: Database, since: dt.datetime | None = None, until: dt.datetime | None = None,
                  by: str = "fleet", every: float | None = None, detect: bool = True) -> Table:
    """Every job's accelerator time in the range, rolled up ``by`` job, region, accelerator,
    fleet or a node label (e.g. team); ``notes`` says what was not counted."""
    from ..goodput.accounting import fleet_table

    with db.read() as con:
        cols, rows, notes = fleet_table(con, since, until, by, every, detect)
    return Table(cols, rows, notes=notes)


def sql(db: Database, query: str, max_rows: int | None = None, timeout: float | None = None,
        max_bytes: int | None = None) -> Any:
    """One read-only SELECT within row, byte and time limits (cmdare.analytics.safesql)."""
    from .. import safesql

    rows, secs, size = max_rows or safesql.MAX_ROWS, timeout or safesql.TIMEOUT, max_bytes or safesql.MAX_BYTES
    pool = getattr(db, "sql_pool", None)
    if pool is not None:  # a lake server: in a worker process (analytics/server/sqlpool.py)
        from ..scoping import current

        return pool.run(query, rows, secs, size, current())

    def read() -> Any:
        with db.read(safesql.CONFIG) as con:  # every query of the process admitted by one memory budget
            return safesql.run(con, query, rows, secs, size, budget=safesql.BUDGET)

    return safesql.answered_by(read, secs)
