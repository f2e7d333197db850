"""The server tier over a lake (``cmdare-collector serve --lake``) on a generated fleet: the
fleet page's data requests answered by a collector serving a database file and by a server
over a lake of the same rows, side by side; ``analyze --lake`` and ``analyze --server``
per command; and the server's resident memory under the user-SQL memory attack.

    python bench/lake_serve.py [--nodes 100] [--gpus 8] [--hours 6] [--interval 10] [--runs 5]

The issue's figure is ``--nodes 1000 --hours 24`` (69 million GPU samples; generating and
copying into the lake take tens of minutes on 2 cores). The data are generated as
bench/pages.py does, copied into a lake an hour per commit and rolled up as bench/findings.py
does. Targets: page data p50 < 1 s, every ``analyze --server`` command < 2 s, ``analyze
--lake`` < 5 s per command, the server's RSS flat under the attack.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
ATTACK = "SELECT string_agg(repeat('x', 100000000), '') FROM range(20)"


def server(lake: Path) -> tuple[str, threading.Event, threading.Thread, float]:
    from cmdare.analytics.server.service import HttpConfig
    from cmdare.collector.cli import serve

    lines: list[str] = []
    stop = threading.Event()
    t0 = time.perf_counter()
    th = threading.Thread(target=serve.run, args=(serve.ServeConfig(str(lake), None, HttpConfig("127.0.0.1", 0)),
                                                  lines.append, stop), daemon=True)
    th.start()
    while not any(" on http" in x for x in lines):
        if not th.is_alive():
            raise SystemExit(f"the server did not start: {lines}")
        time.sleep(0.05)
    url = re.search(r" on (http://\S+)", next(x for x in lines if " on http" in x)).group(1)
    return url, stop, th, time.perf_counter() - t0


def fetch(url: str, body: bytes | None = None) -> tuple[float, int]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            code = r.status
    except urllib.error.HTTPError as e:
        e.read()
        code = e.code
    return time.perf_counter() - t, code


def command(argv: list[str]) -> float:
    t = time.perf_counter()
    r = subprocess.run([str(BIN / "analyze"), *argv], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "CMDARE_LAKE": ""})
    took = time.perf_counter() - t
    if r.returncode != 0:
        print(f"  ({' '.join(argv[:3])}: exit {r.returncode}: {r.stderr.strip()[:200]})")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=int, default=6)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    import psutil

    from bench.findings import to_lake
    from bench.pages import build_rollups, generate
    from cmdare.analytics.server.service import HttpConfig, Service
    from cmdare.collector.db import connect

    work = Path(tempfile.mkdtemp(prefix="cmdare-bench-lake-serve-"))
    try:
        db, lake = work / "fleet.duckdb", work / "lake"
        t = time.perf_counter()
        generate(db, a.nodes, a.gpus, a.hours, a.interval)
        con = connect(db)
        build_rollups(con, a.nodes)
        con.close()
        samples = a.nodes * a.gpus * a.hours * 3600 // a.interval
        print(f"generated {samples:,} GPU samples ({a.nodes} nodes x {a.gpus} GPUs x {a.hours} h) in "
              f"{time.perf_counter() - t:.0f} s", flush=True)
        to_lake(db, lake)
        url, stop, th, started = server(lake)
        print(f"server: read the lake and serving in {started:.1f} s")
        con = connect(db)
        svc = Service(con, db, HttpConfig("127.0.0.1", 0))
        file_url = svc.start()
        svc.ready = True
        since = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=24)).strftime("%Y-%m-%dT%H:%M:%SZ")
        requests = {
            "fleet (stat strip)": f"/api/v1/fleet?since={since}&nodes=false",
            "fleet (node counts)": f"/api/v1/fleet?since={since}",
            "fleet/heatmap (120 columns)": f"/api/v1/fleet/heatmap?since={since}&columns=120",
            "nodes": "/api/v1/nodes",
            "revocations": f"/api/v1/revocations?since={since}",
            "findings": "/api/v1/findings",
        }
        print(f"\nthe fleet page's data, p50 of {a.runs} runs (target < 1 s): file mode | lake server")
        for name, path in requests.items():
            f = [fetch(file_url + path)[0] for _ in range(a.runs)]
            s = [fetch(url + path)[0] for _ in range(a.runs)]
            print(f"  {name:30s} {statistics.median(f):6.3f} s | {statistics.median(s):6.3f} s")
        print("\nper command, wall time of the analyze process (targets: --server < 2 s, --lake < 5 s)")
        for argv in (["nodes"], ["gpu"], ["jobs"], ["bottlenecks", "--since", "1h", "--no-store"]):
            srv = command(["--server", url, *argv])
            lk = command(["--lake", str(lake), *argv])
            print(f"  {' '.join(argv):32s} --server {srv:6.2f} s   --lake {lk:6.2f} s")
        me = psutil.Process()
        base = me.memory_info().rss
        peak, lat, done = [base], [], threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak.append(me.memory_info().rss)
                lat.append(fetch(url + "/api/v1/nodes")[0])

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        took, code = fetch(url + "/api/v1/sql", f'{{"query": "{ATTACK}"}}'.encode())
        done.set()
        w.join(30)
        lat.sort()
        print(f"\nthe memory attack through the server: HTTP {code} in {took:.1f} s; server RSS {base >> 20} MiB, "
              f"peak {max(peak) >> 20} MiB (+{(max(peak) - base) >> 20} MiB); /api/v1/nodes meanwhile: "
              f"{len(lat)} answers, p99 {lat[int(0.99 * (len(lat) - 1))]:.3f} s")
        stop.set()
        th.join(30)
        svc.stop()
        con.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
