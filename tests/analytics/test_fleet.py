"""The fleet page's library (cmdare.analytics.fleet): GPU states and the utilisation heatmap
read the same figures from the 5-minute rollups (long windows) as from the samples."""

from __future__ import annotations

import datetime as dt
import time

import duckdb
import pytest

from cmdare.analytics import fleet
from cmdare.analytics.db import AnalyticsError
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import DemoFleet


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory):
    f = DemoFleet(seed=3, t0=time.time() - 40 * 60)
    f.build()
    db = tmp_path_factory.mktemp("fleet") / "f.duckdb"
    c = connect(db)
    w = Writer(c, rollup_every=None)
    half = len(f.events) // 2
    w.write([("sim", encode_many(f.events[:half]))])
    w.rollup()  # half rolled up, half pending: the view must join both
    w.write([("sim", encode_many(f.events[half:]))])
    c.close()
    r = duckdb.connect(str(db), read_only=True)
    yield r
    r.close()


def test_gpu_states_from_the_rollups_are_those_from_the_samples(con, monkeypatch) -> None:
    assert fleet.use_rollup(con, None, None)
    from_rollup = {(r["node"], r["gpu"]): fleet.gpu_state(r) for r in fleet.gpu_rows(con, None, None)}
    monkeypatch.setattr(fleet, "use_rollup", lambda *a: False)
    from_samples = {(r["node"], r["gpu"]): fleet.gpu_state(r) for r in fleet.gpu_rows(con, None, None)}
    assert from_rollup == from_samples
    states = sorted(from_rollup.values())
    assert {"busy", "idle", "throttled", "failing"} <= set(states)  # the demo has each


def test_the_heatmap_reads_the_same_cells_from_rollups_and_samples(con, monkeypatch) -> None:
    lo = con.execute("SELECT min(ts) FROM gpu_samples").fetchone()[0]
    since = lo - dt.timedelta(seconds=(lo - fleet.EPOCH).total_seconds() % 300)  # a 5-minute boundary
    until = since + dt.timedelta(hours=10)  # 120 columns of 5 minutes: a long window
    rolled = fleet.heatmap(con, since, until, 120)
    assert rolled["rollup"] and rolled["step_seconds"] == 300 and len(rolled["times"]) == 120
    monkeypatch.setattr(fleet, "use_rollup", lambda *a: False)
    raw = fleet.heatmap(con, since, until, 120)
    assert not raw["rollup"] and raw["step_seconds"] == 300
    assert rolled["rows"] == raw["rows"] and len(raw["rows"]) == con.execute(
        'SELECT count(*) FROM (SELECT DISTINCT node, "index" FROM gpu_samples)').fetchone()[0]
    assert rolled["util_pct"] == raw["util_pct"]
    cells = [u for line in raw["util_pct"] for u in line if u is not None]
    assert cells and all(isinstance(u, int) and 0 <= u <= 100 for u in cells)
    # rows grouped by job, then node, then GPU
    keys = [(r["job"] or "~", r["node"], r["gpu"]) for r in raw["rows"]]
    assert keys == sorted(keys)


def test_heatmap_bounds(con) -> None:
    with pytest.raises(AnalyticsError, match="columns: from 1 to 1440, got 0"):
        fleet.heatmap(con, None, None, 0)
    with pytest.raises(AnalyticsError, match="columns: from 1 to 1440"):
        fleet.heatmap(con, None, None, 100_000)
    empty = fleet.heatmap(con, dt.datetime(2001, 1, 1), dt.datetime(2001, 1, 2), 10)
    assert empty["rows"] == [] and empty["util_pct"] == []


def test_a_window_under_six_hours_reads_the_samples(con) -> None:
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    assert not fleet.use_rollup(con, now - dt.timedelta(hours=1), None)
    assert fleet.use_rollup(con, now - dt.timedelta(hours=6), None)
    h = fleet.heatmap(con, now - dt.timedelta(hours=1), None, 120)
    assert not h["rollup"] and h["step_seconds"] == 30 and len(h["rows"]) > 10
