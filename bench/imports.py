"""Imports at size: ``analyze import checkpoints`` of a large CSV file, timed with the CLI's
peak RSS, into a fresh database, then the same file again (everything a duplicate), then a
file whose last line is bad (nothing stored), then through a running collector.

    python bench/imports.py [--rows 1000000] [--skip-server] [--skip-local]

Each run is its own process (``analyze`` under a launcher that prints its children's peak
RSS), so the figures are the CLI's as a user sees them. Prints one line per run.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import served  # noqa: E402

LAUNCH = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
print(rc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, (rc.stderr or "").strip()[-300:].replace(chr(10), " | "))
"""


def write_file(path: Path, rows: int, bad_last: bool = False) -> None:
    rnd = random.Random(7)
    models = [f"model-{i}" for i in range(40)]
    last = ""
    with path.open("w") as f:
        f.write("model,size_mb,save_s,weight_mb,meta_mb,index_mb,graph_mb,tensors,params,local_write_s\n")
        for i in range(rows):
            size = rnd.uniform(10, 5000)
            if i % 50 == 0 and last:  # some saves identical to an earlier one: repeats stay records
                f.write(last)
                continue
            last = (f"{rnd.choice(models)},{size:.3f},{size / 400 + rnd.uniform(0, 2):.4f},{size * 0.98:.3f},"
                    f"{rnd.uniform(0.1, 5):.3f},{rnd.uniform(0.01, 0.5):.4f},{rnd.uniform(0.1, 9):.3f},"
                    f"{rnd.randint(10, 900)},{rnd.randint(10**6, 10**9)},{size / 900:.4f}\n")
            f.write(last)
        if bad_last:
            f.write("model-x,12.5,nan,,,,,,,\n")


def run(args: list[str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", LAUNCH, *args], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    rc, rss, err = out.stdout.strip().split(" ", 2) if out.stdout.strip().count(" ") >= 2 else (*out.stdout.split(), "")
    return wall, int(rss), f"rc {rc}" + (f": {err}" if err else "")


def stored(db: Path) -> int:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM checkpoint_records").fetchall()[0][0]
    finally:
        con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--skip-server", action="store_true")
    ap.add_argument("--skip-local", action="store_true")
    a = ap.parse_args()
    analyze = str(Path(sys.executable).parent / "analyze")
    tmp = Path(tempfile.mkdtemp(prefix="cmdare-bench-import-"))
    good, bad = tmp / "saves.csv", tmp / "saves-bad.csv"
    write_file(good, a.rows)
    write_file(bad, a.rows - 1, bad_last=True)
    print(f"file: {a.rows:,} rows, {good.stat().st_size / 2**20:.1f} MiB")
    db = tmp / "imp.duckdb"
    subprocess.run([sys.executable, "-m", "cmdare.collector.cli", "--help"], capture_output=True)
    from cmdare.collector.db import connect

    connect(db).close()  # an empty database of the current schema
    env_note = f"(machine load {os.getloadavg()[0]:.1f})"
    for name, path in () if a.skip_local else (("first import", good), ("same file again", good),
                                                ("bad last line", bad)):
        wall, rss, res = run([analyze, "import", "checkpoints", str(path), "--db", str(db)])
        print(f"{name:18s} {wall:6.1f} s  peak RSS {rss:5d} MiB  stored {stored(db):,}  {res[:160]}")
    if not a.skip_server:
        db2 = tmp / "served.duckdb"
        connect(db2).close()
        with served(str(db2)) as (svc, url):
            import psutil

            before = psutil.Process().memory_info().rss >> 20
            for name in ("through a collector", "again through it"):
                wall, rss, res = run([analyze, "--server", url, "import", "checkpoints", str(good), "--db", str(db2)])
                with svc.database.read() as con:
                    n = con.execute("SELECT count(*) FROM checkpoint_records").fetchall()[0][0]
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
                time.sleep(1.0)  # what the collector still holds once the import has answered
                kept = psutil.Process().memory_info().rss >> 20
                print(f"{name:18s} {wall:6.1f} s  CLI peak RSS {rss:5d} MiB  collector peak RSS {peak} MiB  "
                      f"kept after {kept} MiB (before {before} MiB)  stored {n:,}  {res[:160]}")
    print(env_note)


if __name__ == "__main__":
    main()
