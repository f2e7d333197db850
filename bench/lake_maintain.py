"""Lake maintenance on one host, DuckDB against Spark (``cmdare-collector maintain
--engine duckdb|spark``): the same fleet copied into two lakes (an hour of each table per
commit, as collectors' rounds leave it), each behind its own PostgreSQL catalog, then one
``maintain`` each with compaction, rollups, goodput by the hour and the fleet's findings.

    python bench/lake_maintain.py [--nodes 100] [--gpus 8] [--hours 24] [--every 10] [--master local[2]]

Prints the wall time of each engine's run (Spark's session start apart), what each did,
and whether the rollup tables and findings they wrote hold the same rows. Needs Debian's
PostgreSQL (started here on a loopback port, as the tests do), a JDK and the jars of
scripts/sparkjars. The fleet is bench/findings.py's (its problems give the detectors work).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _findings_bench():
    spec = importlib.util.spec_from_file_location("bench_findings", ROOT / "bench" / "findings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def copy(db: Path, where: Path, catalog: str) -> object:
    from cmdare.collector.lake import Lake

    lk = Lake(str(where), catalog)
    lk.ensure()
    _findings_bench().copy_hourly(db, lk)
    return lk


def rows(lk: object) -> dict[str, int]:
    from cmdare.analytics.lakedb import LakeDatabase
    from cmdare.collector import rollup

    with LakeDatabase(str(lk.location.local), lk.location.catalog).read() as con:  # type: ignore[attr-defined]
        out = {r.table: con.execute(f"SELECT count(*) FROM {r.table}").fetchall()[0][0] for r in rollup.ROLLUPS}
        out["findings"] = con.execute("SELECT count(*) FROM findings").fetchall()[0][0]
        out["goodput_hours"] = con.execute("SELECT count(*) FROM goodput_hours").fetchall()[0][0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--master", default="local[2]")
    a = ap.parse_args()

    from cmdare.collector import lakespark
    from cmdare.collector.cli.root import lake_findings, lake_goodput
    from cmdare.collector.lakemaint import maintain
    from tests.conftest import Postgres, _pg_bindir

    d = Path(tempfile.mkdtemp(prefix="cmdare-bench-maint-"))
    d.chmod(0o755)  # (the server runs as postgres when this runs as root)
    bindir = _pg_bindir()
    if bindir is None:
        sys.exit("bench/lake_maintain.py needs Debian's PostgreSQL (apt-get install postgresql)")
    pg = Postgres(bindir, d / "pg")
    (d / "pg").mkdir()
    pg.start()
    try:
        t = time.perf_counter()
        n = _findings_bench().build(d / "f.duckdb", a.nodes, a.gpus, a.hours, a.every)
        print(f"fleet: {a.nodes} nodes x {a.gpus} GPUs x {a.hours:g} h at {a.every} s ({n:,} GPU samples) "
              f"built in {time.perf_counter() - t:.0f} s", flush=True)
        lakes = {}
        for engine in ("duckdb", "spark"):
            pg._run(str(pg.bin / "createdb"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "cmdare", engine)
            t = time.perf_counter()
            lakes[engine] = copy(d / "f.duckdb", d / engine, pg.url.rsplit("/", 1)[0] + "/" + engine)
            print(f"{engine}: lake copied (an hour a commit) in {time.perf_counter() - t:.0f} s", flush=True)
        window = (a.hours + 24) * 3600
        t = time.perf_counter()
        rep = maintain(lakes["duckdb"], retain_raw=None, compact_files=8, expire_after=None,
                       derive=lake_goodput(), findings=lake_findings(window))
        took_d = time.perf_counter() - t
        print(f"duckdb: maintain {took_d:.1f} s", flush=True)
        for line in rep.lines():
            print(f"  {line}")
        t = time.perf_counter()
        spark = lakespark.session(lakes["spark"], a.master)
        start = time.perf_counter() - t
        t = time.perf_counter()
        rep = lakespark.maintain(lakes["spark"], spark, retain_raw=None, compact_files=8, expire_after=None,
                                 derive=lake_goodput(spark), findings=lake_findings(window, spark))
        took_s = time.perf_counter() - t
        print(f"spark ({a.master}): session {start:.1f} s, maintain {took_s:.1f} s", flush=True)
        for line in rep.lines():
            print(f"  {line}")
        got = {e: rows(lk) for e, lk in lakes.items()}
        print(f"rows written, duckdb: {got['duckdb']}")
        print(f"rows written, spark:  {got['spark']}")
        print("same row counts" if got["duckdb"] == got["spark"] else "ROW COUNTS DIFFER")
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
