"""Goodput's sweep with each run's first and last instant read from the steps rollup
(``start_min``, migration 023) and only the intervals that overlap a window read: the same
goodput as the sweep over every interval, for intervals that reach back across buckets, runs
of several ranks and nodes, rows the rollup has not covered yet, rollup rows from before the
column (a lake's older files), and a database migrated from before it."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import duckdb
import pytest

from cmdare.analytics import goodput
from cmdare.collector import rollup
from cmdare.collector.db import connect

T0 = dt.datetime(2026, 3, 1, 10, 0, 0)


def _epoch(t: dt.datetime) -> float:
    return (t - dt.datetime(1970, 1, 1)).total_seconds()


def _fill(con: duckdb.DuckDBPyConnection) -> None:
    """Three jobs whose intervals do what the rollup's reach must survive."""
    rows = []
    n = 0

    def step(job, run, rank, node, at, steps, sps=None, mean=None, wait=None, interval=10.0):
        nonlocal n
        n += 1
        rows.append((f"s{n}", T0 + dt.timedelta(seconds=at), node, job, run, rank, interval, steps, mean, wait, sps))

    for i in range(300):  # job a: 2 ranks on 2 nodes, 10 s intervals, input wait
        for rank in (0, 1):
            step("a", "a1", rank, f"na{rank}", 60 + i * 10, 50, sps=5.0, mean=0.2, wait=0.05)
    # job b: rank 0 starts late on its node and one interval's steps took 40 minutes (its
    # start lies 8 buckets before its own); a rank with no rate (the mean only); zero steps
    for i in range(120):
        step("b", "b1", 0, "nb0", 900 + i * 30, 30, mean=1.0, wait=0.25, interval=30.0)
    step("b", "b1", 0, "nb0", 900 + 120 * 30 + 5, 2400, sps=1.0, interval=30.0)
    for i in range(40):
        step("b", "b1", 1, "nb1", 600 + i * 30, 0, interval=30.0)
    for i in range(200):  # job c: two runs, the second on another node after a gap
        step("c", "c1", 0, "nc0", 30 + i * 10, 10, sps=2.0, mean=0.5)
        step("c", "c2", 0, "nc1", 3000 + i * 10, 10, sps=1.0, mean=1.0, wait=0.9)
    con.executemany("""INSERT INTO steps (id, ts, node, job, run, rank, interval_seconds, steps, step_mean_seconds,
                                          wait_mean_seconds, steps_per_second) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    rows)
    con.execute("""INSERT INTO jobs (id, ts, node, job, run, rank, world_size, role)
                   VALUES ('ja', ?, 'na0', 'a', 'a1', 0, 2, 'worker'), ('jc', ?, 'nc1', 'c', 'c2', 0, 1, 'worker')""",
                [T0, T0 + dt.timedelta(seconds=2900)])
    con.execute("""INSERT INTO checkpoints (id, ts, node, job, run, rank, action, seconds, step, ok)
                   VALUES ('k1', ?, 'na0', 'a', 'a1', 0, 'save', 30.0, 100, true),
                          ('k2', ?, 'nc1', 'c', 'c2', 0, 'restore', 45.0, NULL, true)""",
                [T0 + dt.timedelta(seconds=1500), T0 + dt.timedelta(seconds=2990)])
    con.execute("INSERT INTO rollup_dirty (node, lo, hi, src) SELECT node, min(ts), max(ts), 'steps' FROM steps GROUP BY node")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rolled") / "g.duckdb"
    con = connect(path)
    _fill(con)
    rollup.run(con)
    con.close()
    return path


@pytest.fixture()
def db(built: Path, tmp_path: Path) -> duckdb.DuckDBPyConnection:
    shutil.copy(built, tmp_path / "g.duckdb")
    con = connect(tmp_path / "g.duckdb")
    yield con
    con.close()


WINDOWS = [
    [(None, 0, None, None)],
    [(None, 0, _epoch(T0) + 1234.5, _epoch(T0) + 4321.0)],
    # one job's narrow windows (a kept fleet's edges and gaps), every other job whole
    [(None, 0, None, None), ("b", 1, _epoch(T0) + 3000.0, _epoch(T0) + 3600.0),
     ("b", 2, _epoch(T0) + 4200.0, None), ("c", 3, None, _epoch(T0) + 700.0)],
    [("a", 0, _epoch(T0) + 600.0, _epoch(T0) + 1200.0), ("b", 1, _epoch(T0) + 4400.0, _epoch(T0) + 4500.0)],
    # one job's windows overlapping, one inside another, one touching the next
    [("a", 0, _epoch(T0) + 600.0, _epoch(T0) + 1200.0), ("a", 1, _epoch(T0) + 1000.0, _epoch(T0) + 2000.0),
     ("a", 2, _epoch(T0) + 1100.0, _epoch(T0) + 1150.0), ("a", 3, _epoch(T0) + 2000.0, _epoch(T0) + 2500.0)],
]


def both(con: duckdb.DuckDBPyConnection, windows, monkeypatch: pytest.MonkeyPatch, restrict: bool) -> tuple[dict, dict]:
    rolled = goodput.sweep(con, None, windows, restrict=restrict)
    with monkeypatch.context() as m:
        m.setattr(goodput, "has_column", lambda *a: False)  # every interval, as before migration 023
        raw = goodput.sweep(con, None, windows, restrict=restrict)
    return rolled, raw


def assert_same(rolled: dict, raw: dict) -> None:
    assert set(rolled) == set(raw) and raw
    for k, w in raw.items():
        g = rolled[k]
        assert (g.start, g.end) == pytest.approx((w.start, w.end), abs=1e-9), k
        assert g.seconds == pytest.approx(w.seconds, rel=1e-12, abs=1e-9), k


@pytest.mark.parametrize("windows", WINDOWS)
@pytest.mark.parametrize("restrict", [False, True])
def test_the_rolled_sweep_is_the_sweep_over_every_interval(db, windows, restrict, monkeypatch) -> None:
    assert_same(*both(db, windows, monkeypatch, restrict))


def test_a_run_reaching_back_eight_buckets_starts_where_its_interval_does(db) -> None:
    (first,) = db.execute("SELECT min(start_min) FROM steps_5m WHERE job = 'b' AND rank = 0").fetchone()
    assert first == pytest.approx(_epoch(T0) + 900 + 120 * 30 + 5 - 2400)  # the long interval, not the first record
    g = goodput.goodput_many(db, ["b"])["b"]
    assert g.start == pytest.approx(first)


def test_rows_not_rolled_yet_and_rollup_rows_without_the_column(db, monkeypatch) -> None:
    # late rows of job a, pending (read raw through the view), and job c's rollup rows as a
    # lake's files from before migration 023 hold them (null): read from its intervals
    db.execute("""INSERT INTO steps (id, ts, node, job, run, rank, interval_seconds, steps, steps_per_second)
                  VALUES ('late', ?, 'na0', 'a', 'a1', 0, 10, 5000, 2.0)""", [T0 + dt.timedelta(seconds=3100)])
    db.execute("INSERT INTO rollup_dirty VALUES ('na0', ?, ?, 'steps')", [T0 + dt.timedelta(seconds=3100)] * 2)
    db.execute("UPDATE step_rollup_5m SET start_min = NULL WHERE job = 'c' AND bucket < ?",  # some files older
               [T0 + dt.timedelta(minutes=30)])
    assert db.execute("SELECT count(*) FROM steps_5m WHERE job = 'c' AND start_min IS NULL").fetchone()[0] > 0
    for windows in WINDOWS:
        assert_same(*both(db, windows, monkeypatch, True))
    g = goodput.goodput_many(db, ["c"])["c"]
    assert g.start == pytest.approx(_epoch(T0) + 30 - 5)  # c1's first interval: 10 steps at 2/s


def test_a_database_from_before_the_column_is_migrated_and_rebuilt(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "old.duckdb"
    con = connect(path)
    _fill(con)
    rollup.run(con)
    want = goodput.goodput_many(con, None)
    for t in ("step_rollup_1m", "step_rollup_5m"):  # as migration 022 left it
        con.execute(f"ALTER TABLE {t} DROP COLUMN start_min")
    con.execute("DELETE FROM schema_migrations WHERE version = 23")
    con.close()
    con = connect(path)  # migrates: the column back, every node's steps pending
    try:
        assert con.execute("SELECT count(*) FROM rollup_dirty WHERE src = 'steps'").fetchone()[0] == 6
        assert_same(goodput.goodput_many(con, None), want)  # exact meanwhile, from the raw rows
        rollup.run(con)
        assert con.execute("SELECT count(*) FROM step_rollup_5m WHERE start_min IS NULL").fetchone()[0] == 0
        assert_same(goodput.goodput_many(con, None), want)
    finally:
        con.close()
