"""Which pod or Slurm job holds a GPU, and which tracked job each such holder ran: what
goodput (analytics/goodput/accounting.py) and the GPU detectors (analytics/detectors/evidence.py ``held_by``)
both need. Imports neither of them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb

from .db import has_column, has_view


def _held_rows(a: str) -> str:
    """The GPU rollup's rows (alias ``a``) a scheduler's pod or job held in [$t0, $t1) (``$only``:
    that job's)."""
    return f"""FROM gpu_5m {a} WHERE ({a}.namespace IS NOT NULL OR {a}.slurm_job IS NOT NULL)
                 AND {a}.job IS NOT NULL AND {a}.job <> '' AND ($only::VARCHAR IS NULL OR {a}.job = $only)
                 AND ($t0::TIMESTAMP IS NULL OR {a}.last_ts >= $t0) AND ($t1::TIMESTAMP IS NULL OR {a}.first_ts < $t1)"""


def _ran_tracked(con: duckdb.DuckDBPyConnection, held: str, p: dict[str, Any]) -> dict[str, str]:
    """The pods' and Slurm jobs (``held``: their GPU rollup rows, alias ``g``) that ran a
    tracked job: a process on their GPUs in the first 10 minutes they held them on a node
    is a PID a rank declared there (``track``). Those minutes only: the process lists are
    read from the raw samples. Pod's or Slurm job -> the tracked job it ran."""
    from cmdare.wire.plugin import Requirement

    from . import processes
    from .units import table_missing

    if table_missing(con, Requirement("table", "jobs")) is not None:  # (remembered within a detector run)
        return {}
    cand = f"SELECT g.job, g.node, min(g.first_ts) AS f {held} GROUP BY g.job, g.node"
    cond = (f"EXISTS (SELECT 1 FROM ({cand}) c WHERE c.job = gpu_samples.job AND c.node = gpu_samples.node "
            "AND gpu_samples.ts >= c.f AND gpu_samples.ts < c.f + INTERVAL 10 MINUTE)")
    return dict(con.execute(
        f"""SELECT pp.held_job, min(d.job) FROM ({processes.process_rows(cond)}) pp
            JOIN jobs d ON d.node = pp.node AND d.pid = pp.pid
            WHERE pp.held_job IS NOT NULL AND d.job IS NOT NULL AND d.job <> '' GROUP BY pp.held_job""", p).fetchall())


def tracked_holders(con: duckdb.DuckDBPyConnection, t0: dt.datetime | None, t1: dt.datetime | None
                    ) -> dict[str, str] | None:
    """Pods' and Slurm jobs in [t0, t1) that ran a tracked job -> it; None: no scheduler named a GPU."""
    if not has_view(con, "gpu_5m") or not has_column(con, "gpu_rollup_5m", "slurm_job"):
        return None
    p = {"t0": t0, "t1": t1, "only": None}
    if con.execute(f"SELECT 1 {_held_rows('g')} LIMIT 1", p).fetchone() is None:
        return None
    return _ran_tracked(con, _held_rows("g"), p)
