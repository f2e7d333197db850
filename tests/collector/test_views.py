"""The collector's views over real DuckDB files: what analyze reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import EventFactory, encode_many

A, B = EventFactory("node-a", "worker", None, {}), EventFactory("node-b", "worker", None, {})
T = 1_700_000_000.0


def gpu(f: EventFactory, ts: float, *utils: float | None) -> list[dict]:
    return [
        f.make("gpu", {"index": i, "uuid": f"GPU-{i}", "util_gpu_ratio": u, "util_mem_ratio": 0.5}, T + ts)
        for i, u in enumerate(utils)
    ]


def host(f: EventFactory, ts: float, cpu: float) -> dict:
    return f.make("host", {"cpu_util_ratio": cpu}, T + ts)


def steps(f: EventFactory, ts: float, interval: float | None, run: str) -> dict:
    d = {"run": run, "rank": 0, "steps": 10}
    if interval is not None:
        d["interval_seconds"] = interval
    return f.make("train_steps", d, T + ts, job="j")


def test_step_hardware_pairs_each_interval_with_its_nodes_samples(tmp_path: Path) -> None:
    con = connect(tmp_path / "c.duckdb")
    events = [
        *gpu(A, 0, 0.1, 0.3),  # node-a ticks every 10 s, two GPUs
        host(A, 0, 0.9),
        *gpu(A, 10, 0.2, 0.4),
        host(A, 10, 0.5),
        *gpu(A, 20, 0.6, None),  # GPU 1 reported no utilisation this tick
        host(A, 20, 0.1),
        *gpu(B, 15, 1.0, 1.0),  # another node's samples never leak in
        host(B, 15, 1.0),
        steps(A, 19.5, 10, "in-window"),  # (9.5, 19.5]: the tick at 10
        steps(A, 9.9, 3, "short"),  # (6.9, 9.9] has no tick: the next one, at 10, saw these steps
        steps(A, 20, 25, "long"),  # (-5, 20]: all three ticks
        steps(A, 25, 2, "after-last"),  # no tick in it, none after it
        steps(A, 21, 0.5, "next-too-far"),  # the next tick would be 9 s later: not this interval's
        steps(B, 30, 10, "other-node"),  # node-b's last sample came at 15
        steps(A, 20, None, "no-interval"),  # a TensorBoard run's first point: no window at all
    ]
    assert Writer(con).write([("t:1", encode_many(events))]).dead == 0
    got = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT run, gpu_util_ratio, gpu_mem_util_ratio, host_cpu_util_ratio, steps FROM step_hardware"
        ).fetchall()
    }
    con.close()
    # means come from running totals: equal to a plain average within float rounding
    assert got["in-window"] == pytest.approx((0.3, 0.5, 0.5, 10))
    assert got["short"] == pytest.approx((0.3, 0.5, 0.5, 10))
    assert got["long"] == pytest.approx((1.6 / 5, 0.5, 1.5 / 3, 10))
    assert got["after-last"] == (None, None, None, 10)
    assert got["next-too-far"] == (None, None, None, 10)
    assert got["other-node"] == (None, None, None, 10)
    assert got["no-interval"] == (None, None, None, 10)
