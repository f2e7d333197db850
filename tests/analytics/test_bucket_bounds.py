"""Readers of the exact rollup views select whole buckets by their first sample's time
(a filter on ``bucket`` is pushed into the views' raw side): the same buckets as the
bounds on ``bucket`` they replace, for bounds on and off bucket starts."""

from __future__ import annotations

import datetime as dt
import random

import duckdb

from cmdare.analytics.goodput.accounting import BUCKETS_NEAR

BASE = dt.datetime(2026, 1, 1)


def test_goodputs_gpu_buckets_by_first_sample_equal_the_bucket_bounds() -> None:
    con = duckdb.connect()
    rnd = random.Random(54)
    cases = []
    for _ in range(3000):
        b = BASE + dt.timedelta(seconds=300 * rnd.randint(0, 100))
        first = b + dt.timedelta(microseconds=rnd.choice([0, 299_999_999, rnd.randint(0, 299_999_999)]))
        t0 = BASE + dt.timedelta(microseconds=rnd.choice([300_000_000 * rnd.randint(0, 100),
                                                            rnd.randint(0, 30_000_000_000)]))
        t1 = t0 + dt.timedelta(microseconds=rnd.choice([300_000_000 * rnd.randint(0, 20), rnd.randint(0, 6_000_000_000)]))
        cases.append((b, first, t0, t1))
    for b, first, t0, t1 in cases:
        want = b >= t0 - dt.timedelta(minutes=5) and b <= t1
        got = con.execute(f"SELECT {BUCKETS_NEAR.replace('first_ts', '$f::TIMESTAMP')}",
                          {"f": first, "t0": t0, "t1": t1}).fetchone()[0]
        assert got == want, (b, first, t0, t1)
    assert sum(b >= t0 - dt.timedelta(minutes=5) and b <= t1 for b, _, t0, t1 in cases) > 300  # both answers met
