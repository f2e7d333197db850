"""A job's input pipeline as telemetry shows it: its consumers (training ranks, ``steps``)
and its input workers (``data_batches``, from ``track.Run.produced`` with role ``data``),
for ``analyze recommend data-workers --job`` and ``placement --job``.

- Consumers' target time per batch: step compute time (step time minus input wait: the gap
  between one batch's arrival and the next request, what the tf.data service calls a
  consumer's target time), steps of 10 s or more left out as the service does.
- Workers' processing time per batch: ``process_mean_seconds``, weighted by batches.
- Configurations over time: per minute, how many input workers ran on a host of the job's
  training ranks (local) and elsewhere (remote), and the consumers' median batch time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import duckdb

from cmdare.wire.plugin import Requirement

from .db import AnalyticsError
from .units import table_missing

GAP_IGNORED = 10.0  # seconds: longer gaps are pauses, not consumption (tf.data service)


@dataclass
class InputTelemetry:
    job: str
    window_seconds: float
    consumer_s: list[float]  # per training rank: compute seconds per batch
    consumer_examples: list[float]  # per training rank: examples per step (0: not reported)
    worker_s: list[float]  # per input worker: processing seconds per batch
    worker_elements: list[float]  # per input worker: elements per batch (0: not reported)
    current: int  # input workers seen in the window
    configs: dict[tuple[int, int], float] = field(default_factory=dict)  # (remote, local) -> batch seconds
    config_minutes: dict[tuple[int, int], int] = field(default_factory=dict)
    order: list[tuple[int, int]] = field(default_factory=list)  # configurations in the order first seen


def read(con: duckdb.DuckDBPyConnection, job: str, window: float = 600.0, min_minutes: int = 2) -> InputTelemetry:
    """The job's input telemetry; a one-line error when it lacks what the rules need."""
    for t in ("steps", "data_batches"):
        why = table_missing(con, Requirement("table", t, ""))
        if why and "no rows" not in why:
            raise AnalyticsError(f"--job {job}: {why}")
    n = con.execute("SELECT count(*) FROM steps WHERE job = ?", [job]).fetchall()[0][0]
    if not n:
        jobs = [r[0] for r in con.execute("SELECT DISTINCT job FROM steps WHERE job IS NOT NULL ORDER BY 1 LIMIT 8").fetchall()]
        raise AnalyticsError(f"--job {job}: no such job with step telemetry (jobs: {', '.join(jobs) or 'none'})")
    d = con.execute("SELECT count(*) FROM data_batches WHERE job = ?", [job]).fetchall()[0][0]
    if not d:
        raise AnalyticsError(
            f"--job {job}: no input-worker telemetry: input workers report it with "
            "track.init(job, role='data') and run.produced(pipeline) (docs/training.md)"
        )
    end = con.execute(
        "SELECT greatest((SELECT max(ts) FROM steps WHERE job = $1), (SELECT max(ts) FROM data_batches WHERE job = $1))",
        [job],
    ).fetchall()[0][0]
    cons = con.execute(
        f"""SELECT node, run, rank,
                   sum((step_mean_seconds - coalesce(wait_mean_seconds, 0)) * steps) / sum(steps),
                   sum(coalesce(examples, 0)) / sum(steps)
            FROM steps
            WHERE job = $1 AND ts > $2 - INTERVAL {float(window)} SECOND AND steps > 0
              AND step_mean_seconds < {GAP_IGNORED} AND step_mean_seconds > coalesce(wait_mean_seconds, 0)
            GROUP BY ALL ORDER BY node, run, rank""",
        [job, end],
    ).fetchall()
    work = con.execute(
        f"""SELECT node, run, rank, sum(process_mean_seconds * batches) / sum(batches),
                   sum(coalesce(elements, 0)) / sum(batches)
            FROM data_batches
            WHERE job = $1 AND ts > $2 - INTERVAL {float(window)} SECOND AND batches > 0 AND process_mean_seconds > 0
            GROUP BY ALL ORDER BY node, run, rank""",
        [job, end],
    ).fetchall()
    if not cons:
        raise AnalyticsError(f"--job {job}: no training steps in the last {window:g} s of its telemetry")
    if not work:
        raise AnalyticsError(f"--job {job}: no input-worker batches in the last {window:g} s of its telemetry")
    tel = InputTelemetry(
        job, window, [r[3] for r in cons], [r[4] for r in cons], [r[3] for r in work], [r[4] for r in work], len(work)
    )
    # per minute: input workers local / remote to the job's training hosts, consumers' batch time
    rows = con.execute(
        """WITH s AS (SELECT time_bucket(INTERVAL 1 MINUTE, ts) AS m, node, step_mean_seconds
                      FROM steps WHERE job = $1 AND steps > 0 AND step_mean_seconds < $2),
                hosts AS (SELECT DISTINCT m, node FROM s),
                d AS (SELECT DISTINCT time_bucket(INTERVAL 1 MINUTE, ts) AS m, node, run, rank
                      FROM data_batches WHERE job = $1 AND batches > 0),
                c AS (SELECT d.m, count(*) FILTER (WHERE h.node IS NULL) AS remote,
                             count(*) FILTER (WHERE h.node IS NOT NULL) AS local
                      FROM d LEFT JOIN hosts h ON h.m = d.m AND h.node = d.node GROUP BY d.m),
                b AS (SELECT m, median(step_mean_seconds) AS batch FROM s GROUP BY m)
           SELECT c.m, c.remote, c.local, b.batch FROM c JOIN b USING (m) ORDER BY c.m""",
        [job, GAP_IGNORED],
    ).fetchall()
    # a configuration's first minute mixes in the one before: left out where it has more
    by: dict[tuple[int, int], list[float]] = {}
    prev = None
    for _, rem, loc, batch in rows:
        key = (int(rem), int(loc))
        if key != prev:
            prev = key
            if key not in by:
                tel.order.append(key)
            by.setdefault(key, [])
            continue
        by[key].append(batch)
    for key, xs in by.items():
        if len(xs) >= min_minutes - 1 and xs:
            tel.configs[key] = statistics.median(xs)
            tel.config_minutes[key] = len(xs) + 1
    return tel
