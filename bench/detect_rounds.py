"""Cost of keeping findings current: the collector's scheduled detector rounds
(``--detect-every 1m --detect-window 15m``, cmdare.analytics.findings.current) on a large fleet.

    python bench/detect_rounds.py --db PATH [--rounds 10] [--every 60] [--window 900]

``--db``: a database built by ``bench/findings.py --db PATH`` (1,000 nodes x 8 GPUs, a day
at 10 s, rollups built); it is copied, so the rounds' stored findings do not touch it.
Each round runs every detector over the last ``window`` seconds and stores the findings as
intervals (``track``), its clock stepping ``every`` seconds through the last hour of the
data, as a collector's thread would while the data arrived. Prints each round's wall and
CPU seconds (all threads of this process), the raw GPU samples it read (its window's
start moves a 5-minute bucket at a time: the bucket in progress only) and the rollup rows and the share of one core the schedule costs
(CPU per round / ``every``). Target (issue 54): <= 10 % of one core at steady state. A
finding is stored by the first round after its detector's condition holds: at most
``every`` plus one round's wall time later.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: F401  (puts the checkout on sys.path)


def _reads(con, now: dt.datetime, window: float) -> tuple[int, int]:
    """What a round's GPU reads cover (not timed): the raw samples of its window's partial
    buckets and the rollup rows of its whole ones (the same split every detector uses)."""
    from cmdare.analytics.detectors.evidence import split
    from cmdare.analytics.findings.current import window_start
    from cmdare.analytics.units import Scope

    whole, edge, p = split(Scope(None, window_start(now, window), now))
    (raw,) = con.execute(f"SELECT count(*) FROM gpu_samples WHERE {edge}", p).fetchone()
    (rows,) = con.execute(f"SELECT count(*) FROM gpu_5m WHERE {whole}", {k: p[k] for k in ("lo", "hi", "job")}).fetchone()
    return raw, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True, help="a database built by bench/findings.py --db")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--every", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=900.0)
    a = ap.parse_args()
    from cmdare.analytics.findings.current import DetectorSchedule
    from cmdare.collector.db import connect

    with tempfile.TemporaryDirectory(prefix="cmdare-bench-rounds-") as tmp:
        db = Path(tmp) / "fleet.duckdb"
        shutil.copy(a.db, db)
        con = connect(db)
        (end,) = con.execute("SELECT max(ts) FROM steps").fetchone()
        clock = [end - dt.timedelta(seconds=a.every * a.rounds)]
        sched = DetectorSchedule(con, a.every, a.window, clock=lambda: clock[0])
        walls, cpus = [], []
        for i in range(a.rounds):
            clock[0] += dt.timedelta(seconds=a.every)
            w, c = time.perf_counter(), time.process_time()
            kept, opened, resolved = sched.round()
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
            raw, whole = _reads(con, clock[0], a.window)
            print(f"round {i + 1}: {walls[-1]:.2f} s wall, {cpus[-1]:.2f} CPU-s "
                  f"(findings new {opened}, kept {kept}, resolved {resolved}); GPU samples read raw {raw:,}, "
                  f"5-minute rollup rows {whole:,}", flush=True)
        sched.cur.close()
        con.close()
    steady = cpus[1:] or cpus  # the first round opens every finding
    cpu = statistics.median(steady)
    print(f"median round after the first: {statistics.median(walls[1:] or walls):.2f} s wall, {cpu:.2f} CPU-s "
          f"= {100 * cpu / a.every:.1f} % of one core at one round every {a.every:g} s (target <= 10 %)")
    print(f"a finding is stored at most {a.every:g} s + {max(walls):.1f} s after its condition holds")


if __name__ == "__main__":
    main()
