"""Detector quality on the labelled scenario suite of the fleet simulator.

    python bench/findings_quality.py [--seeds 0,1,2] [--per-kind 20]

For each seed, tests/fakes/fleet.py ``Scenarios.suite()`` simulates jobs with and without
each problem (PS-bound families at 1-8 workers, input-bound jobs with and without
input-wait data, persistent and transient stragglers, idle GPUs and memory held with no
work, thermal throttling, Xid / ECC bursts, frequent checkpoints) beside healthy jobs with
realistic noise (per-interval noise, the odd slow interval, ranks a few per cent apart,
warm-up, power-cap samples, benign Xid 43); the collector's writer stores them, every
detector runs, and each (job, kind) is scored against the truth.  Prints precision and
recall per kind and seed, and the totals.  Target: both >= 0.95 per kind.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: F401  (puts the checkout on sys.path)

from cmdare.analytics import findings
from cmdare.analytics.units import Scope
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import KINDS, Scenarios, evaluate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--per-kind", type=int, default=20)
    a = ap.parse_args()
    total = {k: {"tp": 0, "fp": 0, "fn": 0} for k in KINDS}
    print(f"{'seed':>4}  {'kind':<20} {'tp':>3} {'fp':>3} {'fn':>3}  precision  recall")
    for seed in (int(x) for x in a.seeds.split(",")):
        s = Scenarios(seed=seed)
        s.suite(per_kind=a.per_kind)
        with tempfile.TemporaryDirectory() as tmp:
            con = connect(Path(tmp) / "suite.duckdb")
            Writer(con).write([("sim", encode_many(s.events))])
            t = time.perf_counter()
            out = findings.run(con, Scope())
            secs = time.perf_counter() - t
            con.close()
        scores = evaluate([f.to_json() for f in out.findings], s.labels)
        for k in KINDS:
            sc = scores[k]
            for x in ("tp", "fp", "fn"):
                total[k][x] += sc[x]
            print(f"{seed:>4}  {k:<20} {sc['tp']:>3} {sc['fp']:>3} {sc['fn']:>3}  {sc['precision']:9.3f}  {sc['recall']:6.3f}")
        print(f"      ({len(s.labels)} jobs, {len(s.events):,} events, detectors {secs:.2f} s)")
    print("all seeds:")
    for k, t in total.items():
        p = t["tp"] / (t["tp"] + t["fp"]) if t["tp"] + t["fp"] else 1.0
        r = t["tp"] / (t["tp"] + t["fn"]) if t["tp"] + t["fn"] else 1.0
        print(f"      {k:<20} {t['tp']:>3} {t['fp']:>3} {t['fn']:>3}  {p:9.3f}  {r:6.3f}")


if __name__ == "__main__":
    main()
