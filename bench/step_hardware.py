"""The step_hardware view (each step interval next to its node's GPU and CPU utilisation)
on a fleet-sized DuckDB file: the current form (migration 006: running totals + ASOF joins)
against its first form (a correlated range subquery per metric), in one run.

    python bench/step_hardware.py [--nodes 20] [--hours 24] [--gpus 8] [--skip-old]

Builds a database file of ``nodes`` agents sampling every 10 s for ``hours`` (GPU samples
per GPU, host samples) with a training rank on each node sending one step aggregate per
tick (5 jobs of 4 ranks), then times, for each form: the whole view (count and mean), the
view for one node, and ``analyze steps`` for one job (4 nodes).  Prints seconds and the
old / new ratio, and checks that ``analyze steps`` shows the same utilisation with both.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import ROOT

from cmdare.analytics import queries
from cmdare.collector.db import connect

# the first form of the view (migration 002's until views moved out of migrations): the
# baseline this benchmark compares the current one with
OLD = """CREATE VIEW step_hardware AS
SELECT s.*,
    (SELECT avg(g.util_gpu_ratio) FROM gpu_samples g
       WHERE g.node = s.node AND g.ts > s.ts - to_microseconds(CAST(s.interval_seconds * 1e6 AS BIGINT))
         AND g.ts <= s.ts) AS gpu_util_ratio,
    (SELECT avg(g.util_mem_ratio) FROM gpu_samples g
       WHERE g.node = s.node AND g.ts > s.ts - to_microseconds(CAST(s.interval_seconds * 1e6 AS BIGINT))
         AND g.ts <= s.ts) AS gpu_mem_util_ratio,
    (SELECT avg(h.cpu_util_ratio) FROM host_samples h
       WHERE h.node = s.node AND h.ts > s.ts - to_microseconds(CAST(s.interval_seconds * 1e6 AS BIGINT))
         AND h.ts <= s.ts) AS host_cpu_util_ratio
FROM steps s;"""
NEW = (ROOT / "analytics" / "sql" / "step_hardware.sql").read_text()


def build(path: Path, nodes: int, ticks: int, gpus: int) -> None:
    con = connect(path)
    t0 = 1.7e9
    con.execute(f"""INSERT INTO gpu_samples_packed (id, ts, node, "index", util_gpu_ratio, util_mem_ratio)
        SELECT uuid()::VARCHAR, to_timestamp({t0} + t * 10)::TIMESTAMP, 'n' || n, g, random(), random()
        FROM range({nodes}) a(n), range({ticks}) b(t), range({gpus}) c(g)""")
    con.execute(f"""INSERT INTO host_samples (id, ts, node, cpu_util_ratio)
        SELECT uuid()::VARCHAR, to_timestamp({t0} + t * 10)::TIMESTAMP, 'n' || n, random()
        FROM range({nodes}) a(n), range({ticks}) b(t)""")
    # the last step of a tick's aggregate ends a little before or after the agent's tick
    con.execute(f"""INSERT INTO steps (id, ts, node, job, run, rank, interval_seconds, steps,
            examples, step_mean_seconds, wait_mean_seconds, steps_per_second)
        SELECT uuid()::VARCHAR, to_timestamp({t0} + t * 10 + 9.7 + random() * 0.4)::TIMESTAMP,
            'n' || n, 'job-' || (n // 4), 'r1', n % 4, 10.0, 100, 3200, 0.1, 0.01, 10
        FROM range({nodes}) a(n), range({ticks}) b(t)""")
    con.close()


def timed(con, sql: str, params: list | None = None) -> tuple[float, tuple]:
    t = time.perf_counter()
    row = con.execute(sql, params or []).fetchone()
    return time.perf_counter() - t, row


def measure(con) -> dict[str, tuple[float, object]]:
    out = {}
    out["whole view"] = timed(
        con, "SELECT count(*), count(gpu_util_ratio), avg(gpu_util_ratio) FROM step_hardware"
    )
    out["one node"] = timed(
        con, "SELECT count(*), avg(host_cpu_util_ratio) FROM step_hardware WHERE node = 'n1'"
    )
    t = time.perf_counter()
    cols, rows = queries.steps(con, "job-0")
    pick = [cols.index("gpu_util_pct"), cols.index("cpu_pct")]
    out["analyze steps (1 job)"] = (time.perf_counter() - t, [tuple(r[i] for i in pick) for r in rows])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--skip-old", action="store_true", help="time only the current form")
    a = ap.parse_args()
    ticks = int(a.hours * 360)
    with tempfile.TemporaryDirectory(prefix="cmdare-bench-sh-") as d:
        db = Path(d) / "fleet.duckdb"
        t = time.perf_counter()
        build(db, a.nodes, ticks, a.gpus)
        n = a.nodes * ticks
        print(
            f"{a.nodes} nodes x {a.hours:g} h at 10 s: {n:,} step rows, {n * a.gpus:,} GPU samples, "
            f"{n:,} host samples ({time.perf_counter() - t:.1f} s to build, "
            f"{db.stat().st_size / 2**20:.0f} MiB)",
            flush=True,
        )
        con = connect(db)
        new = measure(con)
        for k, (s, _) in new.items():
            print(f"  current        {k:<24} {s:8.3f} s", flush=True)
        if a.skip_old:
            return
        con.execute("BEGIN")
        con.execute(OLD.replace("CREATE VIEW", "CREATE OR REPLACE VIEW"))
        print("  the first form (slow: a correlated range subquery per metric) ...", flush=True)
        old = measure(con)
        con.execute("ROLLBACK")
        con.close()
        for k, (s, _) in old.items():
            print(f"  first form     {k:<24} {s:8.3f} s   old/new {s / new[k][0]:6.1f}x")
        no, nn = old["whole view"][1][1], new["whole view"][1][1]
        same = old["analyze steps (1 job)"][1] == new["analyze steps (1 job)"][1]
        print(f"  rows with GPU utilisation: first form {no:,}, current {nn:,}")
        print(f"  analyze steps' GPU and CPU % per rank the same in both: {same}")


if __name__ == "__main__":
    main()
