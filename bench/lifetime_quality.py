"""Lifetime fit quality on CM-DARE's spot lives: what the acceptance check does against the
held-out half, done within the shared half (docs/models.md, "Spot VM lives").

    python bench/lifetime_quality.py [--file ../shared/data/cmdare/lifetimes/lives.csv] [--random 30]

Each (accelerator, region)'s lives are split in two: interleaved (sorted by lifetime, every
other VM: halves as alike as the data allow) and, ``--random`` times, at random. The
lifetime fit (analyze import lives + fit lifetime, the library's code) is made on one half
and P(revoked within H) for H = 1, 3, 6, 12, 23 h compared with the other half's own
fractions: the mean absolute error in percentage points, per accelerator and overall, and
whether recommend region's first region at 12 h is the other half's best.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HOURS = (1, 3, 6, 12, 23)
DEFAULT = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "cmdare" / "lifetimes" / "lives.csv"


def fractions(rows: list[dict[str, str]]) -> dict[tuple[str, str], dict[int, float]]:
    by: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        by[(r["accelerator"], r["region"])].append(r)
    return {k: {h: sum(1 for r in v if r["ended_by"] == "preempted" and float(r["lifetime_s"]) <= h * 3600) / len(v)
                for h in HOURS} for k, v in by.items()}


def fit(rows: list[dict[str, str]], header: list[str]) -> dict:
    from cmdare.analytics.db import Database
    from cmdare.analytics.imports import overheads
    from cmdare.analytics.models.lifetime import fit_lifetime
    from cmdare.collector.db import connect

    d = Path(tempfile.mkdtemp(prefix="cmdare-lq-"))
    f = d / "lives.csv"
    with f.open("w", newline="") as out:
        w = csv.DictWriter(out, header)
        w.writeheader()
        w.writerows(rows)
    connect(d / "l.duckdb").close()
    db = Database(d / "l.duckdb")
    overheads.store_batches(db, "lives", overheads.stream("lives", [f]))
    with db.read() as con:
        return {"model": fit_lifetime(con).model, "fit_id": "bench"}


def score(train: list[dict[str, str]], test: list[dict[str, str]], header: list[str]) -> tuple[dict, dict]:
    from cmdare.analytics.models.lifetime import predict_revocation

    f = fit(train, header)
    want = fractions(test)
    err: dict[str, list[float]] = defaultdict(list)
    for (acc, region), w in want.items():
        for h in HOURS:
            err[acc].append(abs(predict_revocation(f, region, acc, h)["probability"] - w[h]) * 100)
    best_ok = {}
    for acc in sorted({a for a, _ in want}):
        regions = [r for a, r in want if a == acc]
        pred = min(regions, key=lambda r: predict_revocation(f, r, acc, 12)["probability"])
        truth = min(want[(acc, r)][12] for r in regions)
        best_ok[acc] = want[(acc, pred)][12] == truth  # a tie at the top counts as right
    return err, best_ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, default=DEFAULT)
    ap.add_argument("--random", type=int, default=30)
    a = ap.parse_args()
    with a.file.open() as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    groups: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[(r["accelerator"], r["region"])].append(r)

    def split(shuffle: random.Random | None) -> tuple[list, list]:
        a_, b_ = [], []
        for v in groups.values():
            v = sorted(v, key=lambda r: (float(r["lifetime_s"]), r["ended_by"]))
            if shuffle:
                shuffle.shuffle(v)
            a_ += v[::2]
            b_ += v[1::2]
        return a_, b_

    print(f"{len(rows)} lives, {len(groups)} groups; P(revoked within H), H = {HOURS}: mean |error| in points")
    for name, rnd in (("interleaved halves", None), *((f"random halves x{a.random}", random.Random(0)),) * bool(a.random)):
        errs: dict[str, list[float]] = defaultdict(list)
        best: dict[str, list[bool]] = defaultdict(list)
        for _ in range(1 if rnd is None else a.random):
            h1, h2 = split(rnd)
            for train, test in ((h1, h2), (h2, h1)):
                e, b = score(train, test, header)
                for k, v in e.items():
                    errs[k] += v
                for k, v in b.items():
                    best[k].append(v)
        allv = [x for v in errs.values() for x in v]
        per = ", ".join(f"{k} {sum(v) / len(v):.1f} (best region first {sum(best[k])}/{len(best[k])})"
                        for k, v in sorted(errs.items()))
        print(f"{name:22s} all {sum(allv) / len(allv):.1f}; {per}")


if __name__ == "__main__":
    main()
