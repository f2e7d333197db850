"""Spot provisioning (analyze recommend provision): the exact search against spotDNN's own
sliding window, and the search's speed.

    python bench/provision.py [--big-quota 15]

1. spotDNN's ResNet-110 profile (its released code's instance types, quotas, prices and
   fitted constants): for a grid of loss targets and deadlines, the cheapest plan of the
   exact search and of the sliding window (both under the same model): how often the
   window misses the optimum, by how much, and where it finds no plan at all.
2. Speed: a 6-type profile with quota ``--big-quota`` each ((q + 1)^6 plans), searched
   once; plans per second.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: F401  (puts the checkout on sys.path)

from cmdare.analytics.db import AnalyticsError
from cmdare.analytics.recommend import recommend
from cmdare.analytics.units import Scope
from tests.analytics.recommend.test_provision import SPOTDNN


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--big-quota", type=int, default=15)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="prov-"))
    prof = d / "spotdnn.toml"
    prof.write_text(SPOTDNN)
    both = cheaper = sw_none = none = 0
    savings = []
    for loss in (0.6, 0.65, 0.7, 0.75, 0.8, 0.9, 1.0, 1.2, 1.5):
        for minutes in (20, 25, 30, 35, 40, 45, 50, 60, 75, 90, 120, 180, 240, 0):
            try:
                r = recommend("provision", None, Scope(), profile=str(prof), loss=loss, deadline=f"{minutes}m" if minutes else 0)[0]
            except AnalyticsError:
                none += 1
                continue
            sw = r.assumptions.get("sliding_window_dollars_without_revocations")
            if sw is None:
                sw_none += 1
                continue
            both += 1
            c = r.cost["dollars"]
            assert c <= sw + 1e-9, (loss, minutes, c, sw)
            if c < sw - 0.005:
                cheaper += 1
                savings.append(1 - c / sw)
    print(f"spotDNN profile, {both + sw_none + none} (loss, deadline) cases: no plan exists in {none}; "
          f"the window finds none though one exists in {sw_none}; both find one in {both}, "
          f"the exact search cheaper in {cheaper}"
          + (f" (saving median {statistics.median(savings):.1%}, max {max(savings):.1%})" if savings else "")
          + "; never dearer")
    q = a.big_quota
    text = SPOTDNN.split("[[instance]]")[0] + "".join(
        f'[[instance]]\ntype = "t{i}"\ngpus = {g}\nbatch_per_gpu = 512\nimages_per_second = {ips}\nspot_price = {p}\nquota = {q}\n'
        for i, (g, ips, p) in enumerate([(1, 900, 0.3), (1, 1800, 0.9), (2, 1100, 0.7), (4, 2000, 1.6), (8, 2100, 2.2), (2, 1500, 1.0)])
    )
    big = d / "big.toml"
    big.write_text(text)
    t = time.perf_counter()
    r = recommend("provision", None, Scope(), profile=str(big), loss=0.8, deadline="1h", max_plans=10**9)[0]
    dt = time.perf_counter() - t
    n = r.assumptions["plans_searched"]
    print(f"6 types x quota {q}: {n:,} plans in {dt:.2f} s = {n / dt / 1e6:.2f} M plans/s "
          f"(incl. the sliding window's {6 * q * 6 * q:,} windows); answer {r.action['instances']} ${r.cost['dollars']}")


if __name__ == "__main__":
    main()
