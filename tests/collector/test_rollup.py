"""5-minute GPU rollups (collector/rollup.py): every path that stores GPU samples marks its
time range pending in the same transaction; a run rebuilds exactly the buckets touched;
the view ``gpu_5m`` is exact before, during and after (late samples, duplicates, a crash
between a write and its rollup)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from cmdare.collector import rollup
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.columns import encode
from cmdare.wire.events import EventFactory

T0 = 1.75e9  # 2025-06-15 15:06:40 UTC: not a 5-minute boundary

RAW = """SELECT time_bucket(INTERVAL 300 SECOND, ts) AS bucket, node, "index", count(*) AS samples,
                round(sum(util_gpu_ratio), 9) AS util, max(util_gpu_ratio) AS util_max,
                count(*) FILTER (WHERE throttle_mask & ~1 <> 0) AS throttled, max(temp_celsius) AS temp_max,
                round(sum(power_watts), 6) AS power
         FROM gpu_samples GROUP BY ALL ORDER BY ALL"""


def rolled(con: duckdb.DuckDBPyConnection, source: str) -> list[tuple]:
    return con.execute(f"""SELECT bucket, node, "index", sum(samples), round(sum(util_sum), 9), max(util_max),
                                  sum(throttled), max(temp_max), round(sum(power_sum), 6)
                           FROM {source} GROUP BY ALL ORDER BY ALL""").fetchall()


def lines(node: str, start: float, n: int, every: float = 10.0, util: float = 0.5, rows: bool = False,
          throttle: int = 0) -> bytes:
    f = EventFactory(node, "worker", "job-1", {}, rows=rows)
    return b"".join(
        f.line("gpu", {"index": g, "uuid": f"GPU-{node}-{g}", "name": "A100", "util_gpu_ratio": util + 0.01 * i,
                       "temp_celsius": 50.0 + i, "power_watts": 200.0 + g, "throttle_mask": throttle,
                       "mem_used_bytes": (1 << 30) + 4096 * i + g}, start + every * i)
        for i in range(n) for g in range(2))


@pytest.fixture()
def con(tmp_path: Path):
    c = connect(tmp_path / "r.duckdb")
    yield c
    c.close()


def test_json_rows_and_column_blocks_all_mark_their_range_and_the_rollup_equals_the_samples(con) -> None:
    w = Writer(con, rollup_every=None)
    w.write([("j", lines("a", T0, 40))])  # JSON lines (checked path)
    w.write([("r", lines("b", T0 + 5, 40, rows=True))])  # row lines
    w.write([("c", encode(lines("c", T0 + 7, 40, rows=True, throttle=4)))])  # column blocks (fast path)
    pending = dict(con.execute("SELECT node, count(*) FROM rollup_dirty GROUP BY node").fetchall())
    assert pending == {"a": 1, "b": 1, "c": 1}
    raw = con.execute(RAW).fetchall()
    assert rolled(con, "gpu_5m") == raw  # exact before any run: the samples stand in
    assert rollup.run(con)["gpu_rollup_5m"] == len(raw) == 3 * 2 * 2  # 3 nodes x 2 GPUs x 2 buckets (15:05, 15:10)
    assert rolled(con, "gpu_rollup_5m") == raw and rolled(con, "gpu_5m") == raw
    assert con.execute("SELECT count(*) FROM rollup_dirty").fetchone() == (0,)
    assert rollup.run(con) == {}  # nothing pending, nothing rewritten
    c = con.execute("SELECT sum(throttled), sum(throttle_samples) FROM gpu_rollup_5m WHERE node = 'c'").fetchone()
    assert c == (80, 80)


def test_a_late_sample_rebuilds_only_its_bucket_and_a_redelivery_changes_nothing(con) -> None:
    w = Writer(con, rollup_every=None)
    msg = lines("a", T0, 60)
    w.write([("m", msg)])
    w.rollup()
    before = {(b, n, i): s for b, n, i, s, *_ in rolled(con, "gpu_rollup_5m")}
    assert w.write([("m", msg)]).inserted == 0  # the same events again: stored once
    assert con.execute("SELECT count(*) FROM rollup_dirty").fetchone() == (0,)  # nothing new stored, nothing pending
    late = EventFactory("a", "worker", "job-1", {}).line(
        "gpu", {"index": 0, "uuid": "GPU-a-0", "name": "A100", "util_gpu_ratio": 1.0, "temp_celsius": 99.0}, T0 + 1)
    w.write([("late", late)])
    assert rolled(con, "gpu_5m") == con.execute(RAW).fetchall()  # exact before the run ...
    w.rollup()
    after = {(b, n, i): s for b, n, i, s, *_ in rolled(con, "gpu_rollup_5m")}
    assert rolled(con, "gpu_rollup_5m") == con.execute(RAW).fetchall()  # ... and after it
    changed = {k for k in after if after[k] != before.get(k)}
    assert len(changed) == 1 and next(iter(changed))[2] == 0  # one GPU's first bucket, one more sample
    (key,) = changed
    assert con.execute('SELECT temp_max FROM gpu_rollup_5m WHERE bucket = ? AND node = ? AND "index" = ?',
                       list(key)).fetchone() == (99.0,)  # the late sample's own figure


def test_the_writer_runs_the_rollup_at_its_interval_and_a_failed_run_is_retried(con, monkeypatch, caplog) -> None:
    w = Writer(con, rollup_every=0)  # after every batch
    w.write([("m", lines("a", T0, 10))])
    assert con.execute("SELECT count(*) FROM rollup_dirty").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM gpu_rollup_5m").fetchone()[0] > 0
    real = rollup.run

    def broken(c):
        raise duckdb.IOException("IO Error: disk full")

    monkeypatch.setattr(rollup, "run", broken)
    r = w.write([("m2", lines("b", T0, 10))])
    assert r.inserted == 20  # the samples are stored whatever the rollup does
    assert "rollup: IO Error: disk full (retried at the next run)" in caplog.text
    assert con.execute("SELECT count(*) FROM rollup_dirty").fetchone() == (1,)
    assert rolled(con, "gpu_5m") == con.execute(RAW).fetchall()  # reads stay exact meanwhile
    monkeypatch.setattr(rollup, "run", real)
    w.write([("m3", b"")])
    assert con.execute("SELECT count(*) FROM rollup_dirty").fetchone() == (0,)
    assert rolled(con, "gpu_rollup_5m") == con.execute(RAW).fetchall()


def test_pending_ranges_survive_a_crash_between_a_write_and_its_rollup(tmp_path: Path) -> None:
    db = tmp_path / "crash.duckdb"
    con = connect(db)
    Writer(con, rollup_every=None).write([("m", lines("a", T0, 30))])
    con.close()  # the process ends before any rollup ran
    con = connect(db)
    assert con.execute("SELECT count(*) FROM rollup_dirty").fetchone() == (1,)
    assert rollup.run(con)["gpu_rollup_5m"] > 0 and rolled(con, "gpu_rollup_5m") == con.execute(RAW).fetchall()
    con.close()


def test_a_database_from_before_the_rollups_is_rolled_up_from_its_samples(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    con = connect(db)
    Writer(con, rollup_every=None).write([("m", lines("a", T0, 30))])
    # as migration 012 left it: no rollup tables, no pending ranges (015, 016, 017, 024, 028 add to them)
    for r in rollup.ROLLUPS:
        con.execute(f"DROP VIEW {r.view}")
        con.execute(f"DROP TABLE {r.table}")
    con.execute("DROP TABLE rollup_dirty")
    con.execute("DROP TABLE rollup_horizon")
    # and GPU samples in a table of their own name, as before 018 packed them
    con.execute("CREATE TABLE gpu_samples_old AS SELECT * FROM gpu_samples")
    con.execute("DROP VIEW gpu_samples")
    con.execute("DROP TABLE gpu_samples_packed")
    con.execute("ALTER TABLE gpu_samples_old RENAME TO gpu_samples")
    con.execute("DELETE FROM schema_migrations WHERE version IN (13, 15, 16, 17, 18, 24, 28)")  # 024, 028 add to 013 and 018
    con.close()
    con = connect(db)  # migration 013 marks every node's samples pending
    assert rolled(con, "gpu_5m") == con.execute(RAW).fetchall()
    assert rollup.run(con)["gpu_rollup_5m"] == 2 * 2 and rolled(con, "gpu_rollup_5m") == con.execute(RAW).fetchall()  # 2 GPUs x 2 buckets
    con.close()


@pytest.mark.parametrize("since,until", [
    (None, None),
    (T0 + 95, None),  # starts inside a bucket
    (None, T0 + 1234),  # ends inside one
    (T0 + 95, T0 + 1234),
    (T0 + 20, T0 + 40),  # one bucket, partly
    (T0 - 6.6e3 + 300 * 23, T0 + 600 * 2),  # bucket-aligned start
])
def test_the_detectors_gpu_buckets_from_the_rollup_equal_those_from_the_samples(
        tmp_path: Path, since: float | None, until: float | None) -> None:
    """analytics.detectors.evidence reads whole buckets from the rollup and the edges from the samples:
    the same buckets, counts and means as a pass over every sample, at any scope edges."""
    import datetime as dt

    from cmdare.analytics.detectors import evidence
    from cmdare.analytics.units import Scope

    con = connect(tmp_path / "e.duckdb")
    w = Writer(con, max_skew=None, rollup_every=None)
    w.write([("m", lines("a", T0, 180, every=9.7, throttle=0x4) + lines("b", T0 + 3, 150, every=11.3, util=0.2))])
    w.write([("m", lines("a", T0 + 5, 20, every=31.0, throttle=0x1))])  # late samples into rolled buckets
    assert rollup.run(con)["gpu_rollup_5m"] > 0
    con.execute("INSERT INTO rollup_dirty VALUES ('b', to_timestamp(1.75e9 + 400)::TIMESTAMP, "
                "to_timestamp(1.75e9 + 500)::TIMESTAMP, 'gpu_samples')")  # a range pending again: read from samples

    def at(x: float | None) -> dt.datetime | None:
        return None if x is None else dt.datetime.fromtimestamp(x, dt.timezone.utc).replace(tzinfo=None)

    cols = 'node, "index", b, n, round(util, 9), round(mem, 3), mask_n, thr_n, thr_mask'
    got = con.execute(f"SELECT {cols} FROM {evidence.gpu_buckets(con, Scope(None, at(since), at(until)))} "
                      "ORDER BY ALL").fetchall()
    assert evidence.rolled(con)
    con.execute("ALTER TABLE gpu_rollup_5m DROP COLUMN thr_mask")  # as a database before migration 015
    assert not evidence.rolled(con)
    want = con.execute(f"SELECT {cols} FROM {evidence.gpu_buckets(con, Scope(None, at(since), at(until)))} "
                       "ORDER BY ALL").fetchall()
    con.close()
    assert got == want and want
