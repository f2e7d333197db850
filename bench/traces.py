"""``analyze import trace`` + ``analyze trace`` against Holistic Trace Analysis on the same
PyTorch profiler traces (issue 68): the figures of both, and the time of both.

    python bench/traces.py [--data DIR] [--runs 3]

The data: ``../shared/data/hta`` (or ``$CMDARE_HTA_DATA``, or ``--data``), each folder one
job, a file per rank. cmdare's time: reading and reducing the files (DuckDB), storing them in
a fresh database file and the breakdown query. HTA's: ``TraceAnalysis(trace_dir)`` (its
parse) and ``get_temporal_breakdown`` + ``get_comm_comp_overlap``, in this process after
its import. Best of ``--runs`` each, alternating. Needs HTA (scripts/test installs it).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

from common import ROOT

FIELDS = ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct")


def ours(d: Path, tmp: Path) -> tuple[float, dict[int, tuple[float, ...]]]:
    from cmdare.analytics.imports import traces
    from cmdare.collector.db import connect

    db = tmp / f"bench-{time.monotonic_ns()}.duckdb"
    con = connect(db)
    t0 = time.perf_counter()
    traces.import_files(con, [d], d.name)
    b = traces.breakdown(con, d.name)
    t = time.perf_counter() - t0
    con.close()
    db.unlink()
    return t, {r["rank"]: tuple(r[f] for f in FIELDS) for r in b["ranks"]}


def theirs(d: Path) -> tuple[float, dict[int, tuple[float, ...]]]:
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    ta = TraceAnalysis(trace_dir=str(d))
    b = ta.get_temporal_breakdown(visualize=False).set_index("rank")
    o = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
    t = time.perf_counter() - t0
    return t, {int(r): (b.loc[r, "idle_time_pctg"], b.loc[r, "compute_time_pctg"], b.loc[r, "non_compute_time_pctg"],
                        o.loc[r, "comp_comm_overlap_pctg"]) for r in b.index}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("CMDARE_HTA_DATA") or str(ROOT.parent / "shared" / "data" / "hta"))
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    try:
        import hta.trace_analysis  # noqa: F401
    except ImportError:
        sys.exit("bench/traces.py: HolisticTraceAnalysis is not installed (scripts/test installs it)")
    logging.getLogger("hta").setLevel(logging.ERROR)
    data = Path(a.data)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        print(f"{'trace':18} {'ranks':>5} {'cmdare s':>9} {'HTA s':>8} {'x':>5}  figures (idle, compute, non-compute, overlap %)")
        for d in sorted(p for p in data.iterdir() if p.is_dir()):
            src = t / d.name  # HTA wants a folder of traces and nothing else
            shutil.copytree(d, src, ignore=shutil.ignore_patterns("*.md", "LICENSE"))
            best_o = best_h = float("inf")
            for _ in range(a.runs):
                to, fo = ours(src, t)
                th, fh = theirs(src)
                best_o, best_h = min(best_o, to), min(best_h, th)
            worst = max(abs(x - y) for r in fh for x, y in zip(fo[r], fh[r], strict=True))
            print(f"{d.name:18} {len(fo):>5} {best_o:>9.3f} {best_h:>8.3f} {best_h / best_o:>5.1f}  "
                  f"cmdare {fo}  HTA {fh}  largest difference {worst:.2f} points")


if __name__ == "__main__":
    main()
