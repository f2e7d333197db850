"""Scale of analyze bottlenecks: a simulated day of a large fleet, every detector over all of
it, against one plain DuckDB ``GROUP BY node, gpu`` scan of ``gpu_samples`` in the same run.

    python bench/findings.py [--nodes 1000] [--gpus 8] [--hours 24] [--every 10] [--db PATH] [--runs 3] [--lake]

The fleet: ``nodes`` nodes with ``gpus`` GPUs each, sampled every ``every`` seconds for
``hours`` (1,000 x 8 x 24 h / 10 s = 69 million GPU samples), one host sample and one step
aggregate per node and interval (one rank per node, 8 nodes per job), job declarations,
and a few problems (idle GPUs, a throttled node, a straggler rank, Xid errors, an
input-bound job, frequent checkpoints) so every detector has work.  The rows are written
with SQL straight into the collector's tables (the ingest path has its own benchmark),
then the rollups are built once, as a collector keeps them while data arrives.  With
``--lake`` the same rows are also copied into an Iceberg lake next to the database (an
hour of each table per commit), ``maintain`` builds its rollups, and every measurement is
repeated through ``analyze --lake``'s ``LakeDatabase``, then over a lake server's replica
(``serve --lake``: what its ruler's scheduled detector rounds read).

Each measurement runs in a fresh child process (cold process, warm OS page cache),
alternating scan, bound and detectors, ``runs`` times each; prints the medians, the ratio
and each child's peak RSS.  Target (issue 37): the detectors at most 1x the scan.  The bound: a
``GROUP BY node, gpu, 5-minute bucket`` with nothing but ``count(*)``, the least a pass
that keeps the time resolution the detectors need (idle for 10 minutes, throttled in which
windows) costs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT  # noqa: F401  (puts the checkout on sys.path)

SCAN = 'SELECT node, "index", avg(util_gpu_ratio), count(*) FROM gpu_samples GROUP BY node, "index"'
# the least a pass that keeps 5-minute time resolution per GPU costs: the bound on the ratio
BOUND = 'SELECT count(*) FROM (SELECT node, "index", epoch_us(ts) // 300000000, count(*) FROM gpu_samples GROUP BY ALL)'


def build(db: Path, nodes: int, gpus: int, hours: float, every: int) -> int:
    from cmdare.collector.db import connect

    con = connect(db)
    ticks = int(hours * 3600 / every)
    per = max(1, int(3600 / every))  # one hour per statement
    start = "now()::TIMESTAMP - INTERVAL 1 DAY"
    con.execute(f"CREATE TEMP TABLE t0 AS SELECT {start} AS t")
    # jobs: 8 nodes each; job 3's GPUs 6-7 idle; node 17 throttled half the time; job 5's
    # rank 2 a straggler; node 40 Xid 79s; job 9 input-bound; job 7 checkpoints every 2 min
    con.execute(
        f"""INSERT INTO jobs (id, ts, node, job, run, rank, world_size, ps, model, params, tensors,
                             flops_per_step, batch_size, accelerator)
            SELECT 'j' || n, (SELECT t FROM t0), 'node-' || n, 'job-' || (n // 8), 'r1', n % 8, 8,
                   CASE WHEN n // 8 < 10 THEN 1 ELSE 0 END, 'model-' || (n // 80), 25000000, 160, 3e12, 64, 'a100'
            FROM range({nodes}) r(n)"""
    )
    for h in range(0, ticks, per):
        hi = min(ticks, h + per)
        print(f"  building: hour {h // per + 1} of {-(-ticks // per)}", file=sys.stderr, flush=True)
        con.execute(
            f"""INSERT INTO gpu_samples_packed (id, ts, node, job, "index", uuid, name, util_gpu_ratio, util_mem_ratio,
                                         mem_used_bytes, mem_total_bytes, power_watts, temp_celsius, sm_clock_hz,
                                         throttle_mask)
                SELECT 'g' || k || '-' || n || '-' || g, (SELECT t FROM t0) + to_seconds(k * {every}), 'node-' || n,
                       '', g, 'GPU-' || n || '-' || g, 'A100',
                       CASE WHEN n // 8 = 3 AND g >= 6 THEN 0.01
                            WHEN n // 8 = 9 THEN 0.35
                            ELSE 0.8 + (hash(k, n, g) % 150) / 1000.0 END,
                       0.4, 60000000000, 80000000000, 300.0, 65.0,
                       CASE WHEN n = 17 AND k % 2 = 0 THEN 1.0e9 ELSE 1.4e9 END,
                       CASE WHEN n = 17 AND k % 2 = 0 THEN 68 WHEN hash(k, n, g) % 50 = 0 THEN 4 ELSE 0 END
                FROM range({h}, {hi}) a(k), range({nodes}) b(n), range({gpus}) c(g)"""
        )
        con.execute(
            f"""INSERT INTO host_samples (id, ts, node, job, cpu_util_ratio)
                SELECT 'h' || k || '-' || n, (SELECT t FROM t0) + to_seconds(k * {every}), 'node-' || n, '',
                       CASE WHEN n // 8 = 9 THEN 0.95 ELSE 0.3 + (hash(k, n) % 200) / 1000.0 END
                FROM range({h}, {hi}) a(k), range({nodes}) b(n)"""
        )
        con.execute(
            f"""INSERT INTO steps (id, ts, node, job, run, rank, interval_seconds, steps, step_mean_seconds,
                                   wait_mean_seconds, wait_share_ratio, steps_per_second)
                SELECT 's' || k || '-' || n, (SELECT t FROM t0) + to_seconds(k * {every} + 1), 'node-' || n,
                       'job-' || (n // 8), 'r1', n % 8, {every}, s, {every} / s,
                       w * {every} / s, w, s / {every}
                FROM (SELECT k, n,
                             CAST(CASE WHEN n = 42 THEN 25 ELSE 40 END * (0.95 + (hash(k, n) % 100) / 1000.0) AS BIGINT) AS s,
                             CASE WHEN n // 8 = 9 THEN 0.4 ELSE 0.02 END AS w
                      FROM range({h}, {hi}) a(k), range({nodes}) b(n))"""
        )
    con.execute(
        """INSERT INTO gpu_events (id, ts, node, job, "index", uuid, kind, count, xid)
            SELECT 'x' || k, (SELECT t FROM t0) + to_seconds(k * 600), 'node-40', '', 1, 'GPU-40-1', 'xid', 1, 79
            FROM range(3) r(k)"""
    )
    con.execute(
        f"""INSERT INTO checkpoints (id, ts, node, job, run, rank, action, seconds, bytes, step, ok)
            SELECT 'c' || k, (SELECT t FROM t0) + to_seconds(k * 120), 'node-56', 'job-7', 'r1', 0, 'save', 15.0,
                   400000000, k * 100, true
            FROM range({int(hours * 30)}) r(k)"""
    )
    # the rollups a collector keeps as data arrives (these rows bypassed its writer): main()
    from cmdare.collector import rollup

    for src in rollup.SOURCES:
        con.execute(f"INSERT INTO rollup_dirty (node, lo, hi, src) SELECT node, min(ts), max(ts), '{src}' FROM {src} GROUP BY node")
    con.execute("CHECKPOINT")
    n = con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0]
    con.close()
    return n


def rolled(db: Path) -> None:
    """Bring the database up to this version's schema and its rollups up to date, as a
    collector keeps them while data arrives (a database kept from an older run included)."""
    from cmdare.collector import rollup
    from cmdare.collector.db import connect

    con = connect(db)
    t = time.perf_counter()
    n = rollup.run(con)
    con.execute("CHECKPOINT")
    con.close()
    if n:
        print(f"rollups built in {time.perf_counter() - t:.1f} s: "
              + ", ".join(f"{t} {k:,} rows" for t, k in n.items()), flush=True)


def copy_hourly(db: Path, lk: object) -> None:
    """Copy the database file's appended tables into lake ``lk``, an hour of each table per
    commit (as collectors' rounds would, without their de-duplication: the rows are unique)."""
    from cmdare.collector.db import connect
    from cmdare.collector.lake import APPENDED, _append, schema, time_column

    con = connect(db, read_only=True)
    for name in APPENDED:
        col = time_column(name)
        cols = ", ".join(f'"{c}"' for c in schema(name).names)
        lo, hi = con.execute(f"SELECT min({col}), max({col}) FROM {name}").fetchall()[0] if col else (None, None)
        hours = [None] if lo is None else range(int((hi - lo).total_seconds() // 3600) + 1)
        for h in hours:
            where = "" if h is None else (f"WHERE {col} >= TIMESTAMP '{lo}' + INTERVAL {h} HOUR "
                                          f"AND {col} < TIMESTAMP '{lo}' + INTERVAL {h + 1} HOUR")
            rows = con.sql(f"SELECT {cols} FROM {name} {where}").to_arrow_table().cast(schema(name))
            if rows.num_rows:
                _append(lk.table(name), rows, {"cmdare.writer": "bench"})  # type: ignore[attr-defined]
    con.close()


def to_lake(db: Path, lake_dir: Path) -> None:
    """Copy the database file into an Iceberg lake (``copy_hourly``), then run
    ``cmdare-collector maintain``'s rollups."""
    from cmdare.collector.lake import Lake
    from cmdare.collector.lakemaint import maintain

    lk = Lake(str(lake_dir))
    lk.ensure()
    t = time.perf_counter()
    copy_hourly(db, lk)
    print(f"lake: copied in {time.perf_counter() - t:.0f} s", flush=True)
    t = time.perf_counter()
    rep = maintain(lk, retain_raw=None, compact_files=None, expire_after=None)
    print(f"lake: rollups built in {time.perf_counter() - t:.0f} s ({rep.rolled})", flush=True)


def child(what: str, db: str, lake: str | None = None) -> None:
    import contextlib

    import duckdb

    from cmdare.analytics import findings
    from cmdare.analytics.units import Scope

    if what == "roll":
        rolled(Path(db))
        return
    if what == "to-lake":
        assert lake
        to_lake(Path(db), Path(lake))
        return
    opened = 0.0
    if lake and lake.startswith("replica:"):  # a lake server's replica (what its ruler's detectors read)
        from cmdare.analytics.server.lakeserve import LakeReplica
        from cmdare.collector.lake import Lake

        t = time.perf_counter()
        rep = LakeReplica(Lake(lake.removeprefix("replica:"), create=False))
        rep.refresh()
        con = rep.con.cursor()
        con.execute(f"USE {rep.catalog}")
        opened = time.perf_counter() - t
        ctx = contextlib.nullcontext()
    elif lake:
        from cmdare.analytics.lakedb import LakeDatabase

        t = time.perf_counter()
        ctx: Any = LakeDatabase(lake).read()
        con = ctx.__enter__()
        opened = time.perf_counter() - t
    else:
        ctx = contextlib.nullcontext()
        con = duckdb.connect(db, read_only=True)
    t = time.perf_counter()
    if what == "scan":
        rows = len(con.execute(SCAN).fetchall())
    elif what == "bound":
        rows = con.execute(BOUND).fetchall()[0][0]
    else:
        out = findings.run(con, Scope())
        rows = len(out.findings)
        kinds = sorted({f.kind for f in out.findings})
    secs = time.perf_counter() - t
    ctx.__exit__(None, None, None)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": secs, "rows": rows, "rss_mb": rss, "opened": opened,
                      **({"kinds": kinds} if what == "find" else {})}))


def measure(what: str, db: Path, lake: Path | None = None) -> dict:
    r = subprocess.run(
        [sys.executable, __file__, "--child", what, "--db", str(db), *(["--lake-dir", str(lake)] if lake else [])],
        capture_output=True, text=True, check=True
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def runs(xs: list[dict]) -> str:
    return ", ".join(f"{x['seconds']:.2f}" for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--db", help="keep the database here (built when absent)")
    ap.add_argument("--lake", action="store_true",
                    help="also in lake mode: the same rows in an Iceberg lake next to --db, its rollups built by maintain")
    ap.add_argument("--lake-dir", help=argparse.SUPPRESS)
    ap.add_argument("--child", choices=("scan", "bound", "find", "roll", "to-lake"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.db, a.lake_dir)
        return
    tmp = None
    if a.db:
        db = Path(a.db)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="cmdare-bench-findings-", dir=os.environ.get("TMPDIR"))
        db = Path(tmp.name) / "fleet.duckdb"
    if not db.exists():
        t = time.perf_counter()
        n = build(db, a.nodes, a.gpus, a.hours, a.every)
        print(f"built {n:,} GPU samples in {time.perf_counter() - t:.0f} s ({db.stat().st_size / 2**30:.1f} GiB)")
    subprocess.run([sys.executable, __file__, "--child", "roll", "--db", str(db)], check=True)  # its RSS apart
    lake = db.with_suffix(".lake") if a.lake else None
    if lake is not None and not lake.exists():
        subprocess.run([sys.executable, __file__, "--child", "to-lake", "--db", str(db), "--lake-dir", str(lake)],
                       check=True)
    for where in ([None, lake, Path(f"replica:{lake}")] if lake else [None]):
        scans, bounds, finds = [], [], []
        for _ in range(a.runs):
            scans.append(measure("scan", db, where))
            bounds.append(measure("bound", db, where))
            finds.append(measure("find", db, where))
        b = statistics.median(x["seconds"] for x in bounds)
        s = statistics.median(x["seconds"] for x in scans)
        f = statistics.median(x["seconds"] for x in finds)
        if where is not None and str(where).startswith("replica:"):
            print(f"-- a lake server's replica (serve --lake: its ruler's detector rounds; reading the lake into "
                  f"it: {statistics.median(x['opened'] for x in finds):.2f} s before each, not counted)")
        elif where is not None:
            print(f"-- lake mode (analyze --lake; planning the lake and opening: "
                  f"{statistics.median(x['opened'] for x in finds):.2f} s before each, not counted)")
        print(f"GROUP BY node, gpu scan of gpu_samples: {s:.2f} s (runs: {runs(scans)}), "
              f"peak RSS {max(x['rss_mb'] for x in scans):.0f} MB")
        from cmdare.analytics.detectors import DETECTORS

        print(f"analyze bottlenecks, all {len(DETECTORS)} detectors:   {f:.2f} s (runs: {runs(finds)}), "
              f"peak RSS {max(x['rss_mb'] for x in finds):.0f} MB, {finds[-1]['rows']} findings of "
              f"{', '.join(finds[-1]['kinds'])}")
        print(f"GROUP BY node, gpu, 5-minute bucket (count only): {b:.2f} s = {b / s:.2f}x the scan: the least any")
        print("  detector pass with 5-minute time resolution per GPU costs")
        print(f"ratio: {f / s:.2f}x the scan (target <= 1x)")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
