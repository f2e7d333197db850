"""The fleet page's library (cmdare.analytics.api.fleet): GPU states and the utilisation heatmap
read the same figures from the 5-minute rollups (long windows) as from the samples."""

from __future__ import annotations

import datetime as dt
import time

import duckdb
import pytest

from cmdare.analytics.api import fleet
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


def test_the_strip_counts_a_throttled_gpu_as_busy_or_idle_too(con) -> None:
    """Issue 66: two GPUs at 94 % with a throttle reason read "GPUs busy 0, idle 0"."""
    rows = fleet.gpu_rows(con, None, None)
    g = fleet.summary(con, None, None, with_nodes=False)["gpus"]
    assert g["busy"] + g["idle"] + g["failing"] == len(rows)
    hot = [r for r in rows if fleet.gpu_state(r) == "throttled"]
    assert hot and g["throttled"] == len(hot)
    busy = sum(1 for r in rows if fleet.gpu_state(r) != "failing" and (r["util_pct"] or 0) >= fleet.BUSY_PCT)
    assert g["busy"] == busy and busy > sum(1 for r in rows if fleet.gpu_state(r) == "busy")


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


def _expected(con, since, key: str, where: str = "", params: tuple = ()) -> dict:
    """Per row key and 5-minute bucket, the mean utilisation of the raw samples (whole
    percents, rounded as the heatmap rounds), computed here independently of fleet.py."""
    got: dict = {}
    for k, b, u in con.execute(
            f"""SELECT {key}, CAST(floor(epoch(ts - ?::TIMESTAMP) / 300) AS INTEGER) AS b,
                       CAST(round(avg(util_gpu_ratio) * 100) AS INTEGER)
                FROM gpu_samples WHERE ts >= ? {where} GROUP BY ALL""", [since, since, *params]).fetchall():
        got.setdefault(k, {})[b] = u
    return got


def _cells(h: dict, key) -> dict:
    return {key(r): {b: u for b, u in enumerate(line) if u is not None} for r, line in zip(h["rows"], h["util_pct"], strict=True)}


@pytest.mark.parametrize("rolled", [True, False])
def test_a_row_per_job_is_the_mean_of_the_samples_its_gpus_sent_for_it(con, monkeypatch, rolled) -> None:
    since = _start(con)
    if not rolled:
        monkeypatch.setattr(fleet, "use_rollup", lambda *a: False)
    h = fleet.heatmap(con, since, since + dt.timedelta(hours=10), 120, group="job")
    assert h["group"] == "job" and h["rollup"] is rolled and h["step_seconds"] == 300
    assert _cells(h, lambda r: r["job"]) == _expected(con, since, "job")
    gpus = dict(con.execute('SELECT job, count(DISTINCT (node, "index")) FROM gpu_samples GROUP BY job').fetchall())
    nodes = dict(con.execute("SELECT job, count(DISTINCT node) FROM gpu_samples GROUP BY job").fetchall())
    assert {r["job"]: (r["gpus"], r["nodes"]) for r in h["rows"]} == {j: (gpus[j], nodes[j]) for j in gpus}
    assert [r["job"] for r in h["rows"]] == sorted(gpus, key=lambda j: (j is None, j or ""))  # no job: last
    assert h["gpus"] == sum(gpus.values())


def test_a_row_per_node_is_the_mean_over_its_gpus(con) -> None:
    since = _start(con)
    h = fleet.heatmap(con, since, since + dt.timedelta(hours=10), 120, group="node")
    assert h["group"] == "node" and h["rollup"]
    assert _cells(h, lambda r: r["node"]) == _expected(con, since, "node")
    gpus = dict(con.execute('SELECT node, count(DISTINCT "index") FROM gpu_samples GROUP BY node').fetchall())
    assert {r["node"]: r["gpus"] for r in h["rows"]} == gpus


def test_drilling_into_a_job_or_a_node_gives_its_gpus_one_by_one(con) -> None:
    since = _start(con)
    until = since + dt.timedelta(hours=10)
    job = con.execute("SELECT job FROM gpu_samples WHERE job IS NOT NULL GROUP BY job ORDER BY count(*) DESC LIMIT 1").fetchone()[0]
    h = fleet.heatmap(con, since, until, 120, job=job)
    assert h["group"] == "gpu" and all(r["job"] == job for r in h["rows"])
    want = _expected(con, since, '(node, "index")', "AND job = ?", (job,))
    assert _cells(h, lambda r: (r["node"], r["gpu"])) == want
    node = h["rows"][0]["node"]
    n = fleet.heatmap(con, since, until, 120, node=node)
    assert {r["node"] for r in n["rows"]} == {node} and n["group"] == "gpu"
    assert len(n["rows"]) == con.execute('SELECT count(DISTINCT "index") FROM gpu_samples WHERE node = ?', [node]).fetchone()[0]


def test_auto_shows_gpus_until_the_fleet_is_too_large_then_jobs(con, monkeypatch) -> None:
    since = _start(con)
    until = since + dt.timedelta(hours=10)
    assert fleet.heatmap(con, since, until, 120)["group"] == "gpu"  # the demo fleet: a few dozen GPUs
    monkeypatch.setattr(fleet, "AUTO_GPU_ROWS", 5)
    big = fleet.heatmap(con, since, until, 120)
    assert big["group"] == "job" and big == fleet.heatmap(con, since, until, 120, group="job")
    job = big["rows"][0]["job"]
    assert fleet.heatmap(con, since, until, 120, job=job)["group"] == "gpu"  # a drill-down: always GPU by GPU


def test_a_heatmap_too_large_for_gpu_rows_is_refused_before_its_scan(con, monkeypatch) -> None:
    """A client asking a fleet's GPUs one by one (group=gpu at 10,000 nodes) is refused on
    the rough count, not after reading every cell; a row per job still answers."""
    since = _start(con)
    until = since + dt.timedelta(hours=10)
    monkeypatch.setattr(fleet, "MAX_CELLS", 120)
    # "about": the estimate's refusal (the exact one, after the scan, counts the rows it read)
    with pytest.raises(AnalyticsError, match=r"^heatmap: about \d+ GPUs x 120 buckets is over 120 cells: .*group=job"):
        fleet.heatmap(con, since, until, 120, group="gpu")
    jobs = fleet.heatmap(con, since, until, 1, group="job")
    assert jobs["group"] == "job" and 0 < len(jobs["rows"]) <= 120


def test_heatmap_hostile_options(con) -> None:
    with pytest.raises(AnalyticsError, match=r"^group: one of auto, gpu, node, job, got 'x\* FROM'$"):
        fleet.heatmap(con, None, None, 10, group="x* FROM")
    for bad in ("' OR 1=1 --", "job\"; DROP TABLE nodes; --", "\x00"):  # a value, never SQL
        assert fleet.heatmap(con, None, None, 10, job=bad)["rows"] == []
        assert fleet.heatmap(con, None, None, 10, node=bad)["rows"] == []
    assert con.execute("SELECT count(*) FROM nodes").fetchone()[0] > 0


def _start(con) -> dt.datetime:
    lo = con.execute("SELECT min(ts) FROM gpu_samples").fetchone()[0]
    return lo - dt.timedelta(seconds=(lo - fleet.EPOCH).total_seconds() % 300)
