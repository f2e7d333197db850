"""1-minute and 5-minute rollups of GPU samples, host samples and step aggregates (per GPU,
per host, per job and rank), maintained as data arrives, so that a day of a large fleet
reads in well under a second (the fleet page: 1,000 nodes x 8 GPUs x 24 h at 10 s is 69
million samples, 2.3 million 5-minute rows).

How they stay right without a coordinator:

- each write that stores rows of a rolled table records, in the same transaction, the time
  range it touched per node and table (``rollup_dirty``: node, lo, hi, src); duplicates and
  late rows included;
- ``run()`` (the writer calls it every ``Writer.rollup_every`` seconds, between batches,
  and on close) recomputes every 5-minute window those ranges touch: the 1-minute rows from
  the raw rows, then the 5-minute rows (from the 1-minute rows where every aggregate
  combines exactly, else from the raw rows); replaces those rollup rows and clears the
  ranges, in one transaction;
- readers use the views (``gpu_1m``, ``gpu_5m``, ``host_1m``, ``host_5m``, ``steps_1m``,
  ``steps_5m``): rollup rows outside the pending ranges plus the raw rows inside them,
  aggregated the same way, so a read is exact however far behind the rollup is (a
  read-only ``analyze`` included);
- retention (``retain()``) deletes raw rows before a horizon only once their rollups are
  built, and records the horizon: a rebuild never reaches before it (the rollup rows of
  deleted raw rows stay as they are).

One definition per rollup (``ROLLUPS``) gives the migration's columns, the rollup SQL and
the view's raw side.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import duckdb

from .ingest import storage

WINDOW_SECONDS = 300  # the coarsest resolution: what one pending range is widened to
WINDOW = f"INTERVAL {WINDOW_SECONDS} SECOND"
BUCKET_SECONDS = WINDOW_SECONDS  # the 5-minute bucket readers align to
BUCKET = WINDOW
GPU_IDLE_BIT = 0x1  # nvmlClocksEventReasonGpuIdle: the GPU idles, not throttled (cmdare.analytics.verdicts)
_THR = f"throttle_mask & ~{GPU_IDLE_BIT} <> 0"
_STEP_T = "coalesce(1 / nullif(steps_per_second, 0), step_mean_seconds)"  # one interval's step time
# one step interval's stepping time (``{s}``: the steps table's alias and a dot, or nothing):
# the rollup's ``start_min`` and goodput's sweep (cmdare.analytics.goodput) time it alike, to the bit
STEP_SPAN = "greatest(0, coalesce(coalesce({s}steps / nullif({s}steps_per_second, 0), {s}step_mean_seconds * {s}steps), 0))"

# (column, type, from the raw rows, from finer rollup rows or None where it does not combine)
GPU = (
    ("uuid", "VARCHAR", "any_value(uuid)", "any_value(uuid)"),
    ("name", "VARCHAR", "any_value(name)", "any_value(name)"),
    ("job", "VARCHAR", "any_value(job)", "any_value(job)"),
    ("samples", "BIGINT", "count(*)", "sum(samples)"),
    ("util_sum", "DOUBLE", "sum(util_gpu_ratio)", "sum(util_sum)"),
    ("util_samples", "BIGINT", "count(util_gpu_ratio)", "sum(util_samples)"),
    ("util_max", "DOUBLE", "max(util_gpu_ratio)", "max(util_max)"),
    ("throttled", "BIGINT", f"count(*) FILTER (WHERE {_THR})", "sum(throttled)"),
    ("throttle_samples", "BIGINT", "count(throttle_mask)", "sum(throttle_samples)"),
    ("mem_used_max", "BIGINT", "max(mem_used_bytes)", "max(mem_used_max)"),
    ("mem_total_bytes", "BIGINT", "max(mem_total_bytes)", "max(mem_total_bytes)"),
    ("power_sum", "DOUBLE", "sum(power_watts)", "sum(power_sum)"),
    ("power_samples", "BIGINT", "count(power_watts)", "sum(power_samples)"),
    ("temp_max", "DOUBLE", "max(temp_celsius)", "max(temp_max)"),
    ("first_ts", "TIMESTAMP", "min(ts)", "min(first_ts)"),
    ("last_ts", "TIMESTAMP", "max(ts)", "max(last_ts)"),
    ("mem_sum", "DOUBLE", "sum(mem_used_bytes)", "sum(mem_sum)"),
    ("mem_samples", "BIGINT", "count(mem_used_bytes)", "sum(mem_samples)"),
    ("thr_mask", "BIGINT", f"bit_or(throttle_mask) FILTER (WHERE {_THR})", "bit_or(thr_mask)"),
    # SM clock while throttled and while not (the throttled detector's clock ratio)
    ("clk_thr_sum", "DOUBLE", f"sum(sm_clock_hz) FILTER (WHERE {_THR})", "sum(clk_thr_sum)"),
    ("clk_thr_n", "BIGINT", f"count(sm_clock_hz) FILTER (WHERE {_THR})", "sum(clk_thr_n)"),
    ("clk_ok_sum", "DOUBLE", f"sum(sm_clock_hz) FILTER (WHERE NOT ({_THR}))", "sum(clk_ok_sum)"),
    ("clk_ok_n", "BIGINT", f"count(sm_clock_hz) FILTER (WHERE NOT ({_THR}))", "sum(clk_ok_n)"),
    # migration 017 (GPU depth): GPM activity, NVLink errors and energy (counters: their
    # extremes), MIG identity
    ("gr_sum", "DOUBLE", "sum(gr_engine_active_ratio)", "sum(gr_sum)"),
    ("gr_n", "BIGINT", "count(gr_engine_active_ratio)", "sum(gr_n)"),
    ("sm_active_sum", "DOUBLE", "sum(sm_active_ratio)", "sum(sm_active_sum)"),
    ("sm_active_n", "BIGINT", "count(sm_active_ratio)", "sum(sm_active_n)"),
    ("tensor_sum", "DOUBLE", "sum(tensor_active_ratio)", "sum(tensor_sum)"),
    ("tensor_n", "BIGINT", "count(tensor_active_ratio)", "sum(tensor_n)"),
    ("fp32_sum", "DOUBLE", "sum(fp32_active_ratio)", "sum(fp32_sum)"),
    ("fp32_n", "BIGINT", "count(fp32_active_ratio)", "sum(fp32_n)"),
    ("dram_sum", "DOUBLE", "sum(dram_active_ratio)", "sum(dram_sum)"),
    ("dram_n", "BIGINT", "count(dram_active_ratio)", "sum(dram_n)"),
    ("nvl_err_min", "BIGINT", "min(nvlink_errors_total)", "min(nvl_err_min)"),
    ("nvl_err_max", "BIGINT", "max(nvlink_errors_total)", "max(nvl_err_max)"),
    ("energy_min", "DOUBLE", "min(energy_joules_total)", "min(energy_min)"),
    ("energy_max", "DOUBLE", "max(energy_joules_total)", "max(energy_max)"),
    ("parent_index", "BIGINT", "any_value(parent_index)", "any_value(parent_index)"),
    ("mig_slice_ratio", "DOUBLE", "any_value(mig_slice_ratio)", "any_value(mig_slice_ratio)"),
    # migration 024: who the scheduler gave the GPU to: the Kubernetes namespace of the pod, the
    # Slurm job and its user (goodput --by namespace | slurm_job | user)
    ("namespace", "VARCHAR", "max(namespace)", "max(namespace)"),
    ("slurm_job", "VARCHAR", "max(slurm_job)", "max(slurm_job)"),
    ("slurm_user", "VARCHAR", "max(slurm_user)", "max(slurm_user)"),
    # migration 028: what a whole-window ``analyze gpu`` reads from the rollups instead of
    # every sample (analytics/rolled.py ``whole_gpu``): the pod, the MIG profile, and the job
    # of the samples a scheduler held the GPU for
    ("pod", "VARCHAR", "max(pod)", "max(pod)"),
    ("mig_profile", "VARCHAR", "any_value(mig_profile)", "any_value(mig_profile)"),
    ("held_job", "VARCHAR", "max(CASE WHEN pod IS NOT NULL OR slurm_job IS NOT NULL THEN job END)", "max(held_job)"),
)
def _counter(name: str, js: str, field: str) -> tuple[tuple[str, str, str, str], ...]:
    """A host counter summed over its NICs or disks (``js``: the sample's JSON list) at the
    bucket's first and last sample reporting it, so rates after retention read as from the
    raw samples (first to last of the bucket; a counter reset in between is not corrected)."""
    total = (f"list_sum(list_transform(from_json({js}, '[{{\"{field}\":\"UBIGINT\"}}]'), "
             f"lambda x: x.{field}))::DOUBLE")
    has = f"FILTER (WHERE {js} IS NOT NULL)"
    return ((f"{name}_first", "DOUBLE", f"arg_min({total}, ts) {has}",
             f"arg_min({name}_first, first_ts) FILTER (WHERE {name}_first IS NOT NULL)"),
            (f"{name}_last", "DOUBLE", f"arg_max({total}, ts) {has}",
             f"arg_max({name}_last, last_ts) FILTER (WHERE {name}_last IS NOT NULL)"))


HOST = (
    ("job", "VARCHAR", "any_value(job)", "any_value(job)"),
    ("samples", "BIGINT", "count(*)", "sum(samples)"),
    ("cpu_sum", "DOUBLE", "sum(cpu_util_ratio)", "sum(cpu_sum)"),
    ("cpu_samples", "BIGINT", "count(cpu_util_ratio)", "sum(cpu_samples)"),
    ("cpu_max", "DOUBLE", "max(cpu_util_ratio)", "max(cpu_max)"),
    ("mem_used_sum", "DOUBLE", "sum(mem_used_bytes)", "sum(mem_used_sum)"),
    ("mem_used_samples", "BIGINT", "count(mem_used_bytes)", "sum(mem_used_samples)"),
    ("mem_used_max", "BIGINT", "max(mem_used_bytes)", "max(mem_used_max)"),
    ("mem_total_bytes", "BIGINT", "max(mem_total_bytes)", "max(mem_total_bytes)"),
    ("load1_sum", "DOUBLE", "sum(load1)", "sum(load1_sum)"),
    ("load1_samples", "BIGINT", "count(load1)", "sum(load1_samples)"),
    ("first_ts", "TIMESTAMP", "min(ts)", "min(first_ts)"),
    ("last_ts", "TIMESTAMP", "max(ts)", "max(last_ts)"),
    *(col for name, js, field in (("net_rx", "net", "rx_bytes_total"), ("net_tx", "net", "tx_bytes_total"),
                                  ("disk_read", "disk", "read_bytes_total"), ("disk_write", "disk", "write_bytes_total"))
      for col in _counter(name, js, field)),
)
# per (job, run, rank, node): what job spans, stragglers, input wait and step times read
STEPS = (
    ("records", "BIGINT", "count(*)", "sum(records)"),
    ("steps", "BIGINT", "sum(steps)", "sum(steps)"),
    # the earliest start of an interval ending in the bucket
    ("t0", "TIMESTAMP", "min(ts - to_microseconds(CAST(coalesce(interval_seconds, 0) * 1e6 AS BIGINT)))", "min(t0)"),
    ("first_ts", "TIMESTAMP", "min(ts)", "min(first_ts)"),
    ("last_ts", "TIMESTAMP", "max(ts)", "max(last_ts)"),
    ("wait_weighted", "DOUBLE", "sum(wait_mean_seconds * steps)", "sum(wait_weighted)"),
    ("step_weighted_waited", "DOUBLE", "sum(step_mean_seconds * steps) FILTER (WHERE wait_mean_seconds IS NOT NULL)",
     "sum(step_weighted_waited)"),
    ("wait_records", "BIGINT", "count(wait_mean_seconds)", "sum(wait_records)"),
    # intervals that stepped: their steps, their time, the median of their step times
    ("stepping_records", "BIGINT", "count(*) FILTER (WHERE steps > 0)", "sum(stepping_records)"),
    ("stepping_steps", "BIGINT", "sum(steps) FILTER (WHERE steps > 0)", "sum(stepping_steps)"),
    ("span_seconds", "DOUBLE", "sum(coalesce(steps / nullif(steps_per_second, 0), step_mean_seconds * steps)) "
     "FILTER (WHERE steps > 0)", "sum(span_seconds)"),
    ("step_median", "DOUBLE", f"median({_STEP_T}) FILTER (WHERE steps > 0)", None),
    ("examples", "DOUBLE", "sum(examples)", "sum(examples)"),
    # migration 023: the earliest start of an interval ending in the bucket as goodput's sweep
    # times it (epoch seconds; the steps at their rate, not the reporting interval), so each
    # run's first instant is read from the rollup instead of every interval it sent
    ("start_min", "DOUBLE", f"min(epoch(ts) - {STEP_SPAN.format(s='')})", "min(start_min)"),
)


@dataclass(frozen=True)
class Rollup:
    """One rollup: the view readers use, the table it keeps, the raw table it reads."""

    view: str
    table: str
    source: str
    seconds: int
    key: tuple[tuple[str, str], ...]  # (column, type) besides bucket
    columns: tuple[tuple[str, str, str, str | None], ...]
    finer: str | None = None  # the rollup its rows are combined from, when every column combines
    # a lake's rollup day holds only when built by this version (collector/lakerollup.py
    # ``fingerprint``): raised when the columns change, so maintenance rebuilds every day
    version: int = 1

    @property
    def key_sql(self) -> str:
        return ", ".join(f'"{c}"' for c, _ in self.key)

    def aggregates(self, combine: bool = False) -> str:
        return ", ".join(f'{fine if combine else raw} AS "{c}"' for c, _, raw, fine in self.columns)

    def ddl(self) -> str:
        cols = ", ".join(f'"{c}" {t}' for c, t in (("bucket", "TIMESTAMP NOT NULL"), *self.key,
                                                       *((c, t) for c, t, _, _ in self.columns)))
        return f"CREATE TABLE {self.table} ({cols});"

    def from_raw(self, src: str = "s") -> str:
        """SELECT of this rollup's rows from raw rows ``src`` (caller adds the WHERE)."""
        return (f"SELECT time_bucket(INTERVAL {self.seconds} SECOND, ts) AS bucket, {self.key_sql}, "
                f"{self.aggregates()} FROM {self.source} {src}")


_GKEY = (("node", "VARCHAR NOT NULL"), ("index", "BIGINT"))
_HKEY = (("node", "VARCHAR NOT NULL"),)
_SKEY = (("job", "VARCHAR"), ("run", "VARCHAR"), ("rank", "BIGINT"), ("node", "VARCHAR NOT NULL"))
ROLLUPS = (
    Rollup("gpu_1m", "gpu_rollup_1m", "gpu_samples", 60, _GKEY, GPU, version=2),
    Rollup("gpu_5m", "gpu_rollup_5m", "gpu_samples", 300, _GKEY, GPU, finer="gpu_rollup_1m", version=2),
    Rollup("host_1m", "host_rollup_1m", "host_samples", 60, _HKEY, HOST),
    Rollup("host_5m", "host_rollup_5m", "host_samples", 300, _HKEY, HOST, finer="host_rollup_1m"),
    Rollup("steps_1m", "step_rollup_1m", "steps", 60, _SKEY, STEPS),
    Rollup("steps_5m", "step_rollup_5m", "steps", 300, _SKEY, STEPS),  # medians: from the raw rows
)
BY_VIEW = {r.view: r for r in ROLLUPS}
SOURCES = tuple(dict.fromkeys(r.source for r in ROLLUPS))  # the tables whose writes mark ranges pending
TABLES = tuple(r.table for r in ROLLUPS)

# the pending windows of one source: per node, [b0, b1) on 5-minute boundaries, never before
# the raw retention horizon (rows before it are gone: their rollup rows stay)
_PENDING = f"""SELECT node, greatest(time_bucket({WINDOW}, min(lo)),
                         coalesce((SELECT max(before) FROM rollup_horizon h WHERE h.src = '{{src}}'), '-infinity'::TIMESTAMP)) AS b0,
                time_bucket({WINDOW}, max(hi)) + {WINDOW} AS b1
         FROM rollup_dirty WHERE src = '{{src}}' GROUP BY node"""


def dirty_sql(table: str, src: str, ts: str = "ts", where: str = "") -> str:
    """Record the time range per node that rows of ``src`` (bound for ``table``) touch, in
    the writer's transaction; ``ts``: the SQL of a row's timestamp in ``src``."""
    return (f"INSERT INTO rollup_dirty (node, lo, hi, src) SELECT node, min({ts}), max({ts}), '{table}' FROM {src} "
            f"{'WHERE ' + where if where else ''} GROUP BY node")


def view_sql(view: str) -> str:
    """An exact rollup view: its rollup rows outside the pending windows, and the raw rows
    inside them aggregated the same way."""
    r = BY_VIEW[view]
    return f"""CREATE OR REPLACE VIEW {r.view} AS
WITH d AS ({_PENDING.format(src=r.source)})
SELECT r.* FROM {r.table} r ANTI JOIN d ON r.node = d.node AND r.bucket >= d.b0 AND r.bucket < d.b1
UNION ALL BY NAME
{r.from_raw()} SEMI JOIN d ON s.node = d.node AND s.ts >= d.b0 AND s.ts < d.b1
GROUP BY ALL"""


def run(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Bring every rollup up to date with every pending range, in one transaction; the
    rows written per rollup table (none pending: empty)."""
    pending = [s for (s,) in con.execute("SELECT DISTINCT src FROM rollup_dirty ORDER BY 1").fetchall()]
    written: dict[str, int] = {}
    if not pending:
        return written
    con.execute("BEGIN")
    try:
        for src in pending:
            if src not in SOURCES:  # written by a newer version: its ranges are its own
                continue
            con.execute(f"CREATE OR REPLACE TEMP TABLE _rd AS {_PENDING.format(src=src)}")
            for r in (r for r in ROLLUPS if r.source == src):
                con.execute(f"DELETE FROM {r.table} r USING _rd d WHERE r.node = d.node "
                            "AND r.bucket >= d.b0 AND r.bucket < d.b1")
                if r.finer is not None:
                    sql = (f"SELECT time_bucket(INTERVAL {r.seconds} SECOND, bucket) AS bucket, {r.key_sql}, "
                           f"{r.aggregates(combine=True)} FROM {r.finer} s SEMI JOIN _rd d ON s.node = d.node "
                           "AND s.bucket >= d.b0 AND s.bucket < d.b1 GROUP BY ALL")
                else:
                    sql = (f"{r.from_raw()} SEMI JOIN _rd d ON s.node = d.node AND s.ts >= d.b0 AND s.ts < d.b1 "
                           "GROUP BY ALL")
                (n,) = con.execute(f"INSERT INTO {r.table} BY NAME {sql}").fetchall()[0]
                written[r.table] = n
            con.execute("DELETE FROM rollup_dirty WHERE src = ?", [src])
            con.execute("DROP TABLE _rd")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return written


RAW_RETAINED = ("gpu_samples", "host_samples", "tpu_samples")  # what --retain-raw deletes


def retain(con: duckdb.DuckDBPyConnection, raw_keep: float | None, rollups_keep: float | None) -> dict[str, int]:
    """Delete raw samples more than ``raw_keep`` seconds older than the newest of their
    table (their rollups first brought up to date, the horizon recorded, in one
    transaction) and rollup rows more than ``rollups_keep`` seconds older than their
    table's newest; rows deleted per table.  Relative to the newest row, not the clock (as
    Prometheus does): a replayed recording or a collector that was down loses nothing to
    a wall-clock cut.  Cuts fall on 5-minute boundaries."""
    run(con)
    out: dict[str, int] = {}
    con.execute("BEGIN")
    try:
        for keep, tables, col in ((raw_keep, RAW_RETAINED, "ts"), (rollups_keep, TABLES, "bucket")):
            if keep is None:
                continue
            for t in tables:
                (newest,) = con.execute(f"SELECT max({col}) FROM {t}").fetchall()[0]
                if newest is None:
                    continue
                cut = _floor(newest - dt.timedelta(seconds=keep))
                (n,) = con.execute(f"DELETE FROM {storage.stored(t)} WHERE {col} < ?", [cut]).fetchall()[0]
                if n:
                    out[t] = n
                if t in SOURCES:
                    con.execute("DELETE FROM rollup_horizon WHERE src = ? AND before <= ?", [t, cut])
                    con.execute("INSERT INTO rollup_horizon SELECT ?, ? WHERE NOT EXISTS "
                                "(SELECT 1 FROM rollup_horizon WHERE src = ?)", [t, cut, t])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return out


def _floor(t: dt.datetime) -> dt.datetime:
    """``t`` down to its 5-minute boundary (a retention cut keeps whole windows)."""
    us = (t - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    return dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us - us % (WINDOW_SECONDS * 1_000_000))
