"""5-minute rollups of GPU samples, maintained as data arrives, so that a day of a large
fleet reads in well under a second (the fleet page: 1,000 nodes x 8 GPUs x 24 h at 10 s is
69 million samples, 2.3 million rollup rows).

How they stay right without a coordinator:

- each write that stores GPU samples records, in the same transaction, the time range it
  touched per node (``rollup_dirty``: node, lo, hi); duplicates and late samples included;
- ``run()`` (the writer calls it every ``Writer.rollup_every`` seconds, between batches,
  and on close) recomputes every 5-minute bucket those ranges touch from the raw samples,
  replaces those rollup rows and clears the ranges, in one transaction;
- readers use the view ``gpu_5m``: rollup rows outside the pending ranges plus the raw
  samples inside them, aggregated the same way, so a read is exact however far behind the
  rollup is (a read-only ``analyze`` included).

One aggregate list (``AGGREGATES``) defines both the rollup and the view's raw side.
"""

from __future__ import annotations

import duckdb

BUCKET_SECONDS = 300
BUCKET = f"INTERVAL {BUCKET_SECONDS} SECOND"
GPU_IDLE_BIT = 0x1  # nvmlClocksEventReasonGpuIdle: the GPU idles, not throttled (cmdare.analytics.verdicts)

# per (bucket, node, GPU index): what the pages and detectors read at 5-minute resolution
AGGREGATES = f"""any_value(uuid) AS uuid, any_value(name) AS name, any_value(job) AS job,
    count(*) AS samples, sum(util_gpu_ratio) AS util_sum, count(util_gpu_ratio) AS util_samples,
    max(util_gpu_ratio) AS util_max,
    count(*) FILTER (WHERE throttle_mask & ~{GPU_IDLE_BIT} <> 0) AS throttled,
    count(throttle_mask) AS throttle_samples, max(mem_used_bytes) AS mem_used_max,
    max(mem_total_bytes) AS mem_total_bytes, sum(power_watts) AS power_sum, count(power_watts) AS power_samples,
    max(temp_celsius) AS temp_max, min(ts) AS first_ts, max(ts) AS last_ts,
    sum(mem_used_bytes) AS mem_sum, count(mem_used_bytes) AS mem_samples,
    bit_or(throttle_mask) FILTER (WHERE throttle_mask & ~{GPU_IDLE_BIT} <> 0) AS thr_mask"""

KEY = f'time_bucket({BUCKET}, ts) AS bucket, node, "index"'


def dirty_sql(src: str, ts: str = "ts", where: str = "") -> str:
    """Record the time range per node that rows of ``src`` touch (in the writer's
    transaction); ``ts``: the SQL of a row's timestamp in ``src``."""
    return (f"INSERT INTO rollup_dirty SELECT node, min({ts}), max({ts}) FROM {src} "
            f"{'WHERE ' + where if where else ''} GROUP BY node")


def view_sql() -> str:
    """``gpu_5m``: exact 5-minute aggregates (rollup rows, and raw samples where the rollup
    has not caught up)."""
    return f"""CREATE OR REPLACE VIEW gpu_5m AS
WITH d AS (SELECT node, time_bucket({BUCKET}, min(lo)) AS b0, time_bucket({BUCKET}, max(hi)) AS b1
           FROM rollup_dirty GROUP BY node)
SELECT r.* FROM gpu_rollup_5m r ANTI JOIN d ON r.node = d.node AND r.bucket BETWEEN d.b0 AND d.b1
UNION ALL BY NAME
SELECT {KEY}, {AGGREGATES}
FROM gpu_samples s SEMI JOIN d ON s.node = d.node AND s.ts >= d.b0 AND s.ts < d.b1 + {BUCKET}
GROUP BY ALL"""


def run(con: duckdb.DuckDBPyConnection) -> int:
    """Bring ``gpu_rollup_5m`` up to date with every pending range, in one transaction;
    the rollup rows written."""
    (pending,) = con.execute("SELECT count(*) FROM rollup_dirty").fetchone()
    if not pending:
        return 0
    con.execute("BEGIN")
    try:
        con.execute(f"""CREATE OR REPLACE TEMP TABLE _rd AS
            SELECT node, time_bucket({BUCKET}, min(lo)) AS b0, time_bucket({BUCKET}, max(hi)) AS b1
            FROM rollup_dirty GROUP BY node""")
        con.execute("DELETE FROM gpu_rollup_5m r USING _rd d WHERE r.node = d.node AND r.bucket BETWEEN d.b0 AND d.b1")
        (n,) = con.execute(f"""INSERT INTO gpu_rollup_5m BY NAME
            SELECT {KEY}, {AGGREGATES}
            FROM gpu_samples s SEMI JOIN _rd d ON s.node = d.node AND s.ts >= d.b0 AND s.ts < d.b1 + {BUCKET}
            GROUP BY ALL""").fetchone()
        con.execute("DELETE FROM rollup_dirty")
        con.execute("DROP TABLE _rd")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return n
