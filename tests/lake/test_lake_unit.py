"""The lake's own rules: exactly-once appends by event id whatever the positions say,
positions merged across collectors, a lost optimistic commit retried, maintenance that
keeps every row it should, and the lake's inputs refused in one line."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli as analyze
from cmdare.analytics.lakedb import LakeDatabase
from cmdare.collector.cli import cli as collector
from cmdare.collector.lake import Lake, LakeError, Location, schema
from cmdare.collector.lakeingest import Stager
from cmdare.collector.lakemaint import maintain
from cmdare.wire.events import encode_many

DAY0 = dt.datetime(2026, 9, 1)


def samples(first: int, n: int, day: int = 0, node: str = "n1") -> pa.Table:
    s = schema("gpu_samples")
    con = duckdb.connect()
    t = con.sql(f"""SELECT 'ev-' || i AS id, TIMESTAMP '{DAY0 + dt.timedelta(days=day)}' + INTERVAL (i) SECOND AS ts,
                     '{node}' AS node, 0 AS "index", 0.5 AS util_gpu_ratio FROM range({first}, {first + n}) t(i)""").to_arrow_table()
    return pa.table({f.name: t[f.name].cast(f.type) if f.name in t.column_names else pa.nulls(n, f.type) for f in s},
                    schema=s)


def count(lake: Lake, table: str = "gpu_samples") -> tuple[int, int]:
    with LakeDatabase(str(lake.location.local)).read() as con:
        return con.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchall()[0]


def test_a_record_read_twice_is_stored_once_and_positions_merge(lake: Lake) -> None:
    assert lake.append("gpu_samples", samples(0, 100), {"t/0": ([0], [10])}, "a") == 100
    # another collector re-reads part of partition 0 (a rebalance) and goes on: only new ids land
    assert lake.append("gpu_samples", samples(50, 100), {"t/0": ([5], [20]), "t/1": ([0], [3])}, "b") == 50
    assert count(lake) == (150, 150)
    assert lake.positions("gpu_samples") == {"t/0": [20], "t/1": [3]}
    # a late commit of an older range never moves a position back
    lake.append("gpu_samples", samples(150, 5), {"t/0": ([0], [12])}, "zombie")
    assert lake.positions("gpu_samples")["t/0"] == [20]


def test_spool_positions_compare_segment_first(lake: Lake) -> None:
    """A spool position is [segment, offset]: a later segment at a small offset is ahead of
    an earlier segment at a large one, both ways (the exactly-once position of a spool)."""
    lake.append("gpu_samples", samples(0, 10), {"spool:x": ([2, 0], [2, 100])}, "a")
    lake.append("gpu_samples", samples(10, 10), {"spool:x": ([1, 0], [1, 500])}, "zombie")  # older segment
    assert lake.positions("gpu_samples") == {"spool:x": [2, 100]}
    lake.append("gpu_samples", samples(20, 10), {"spool:x": ([2, 100], [3, 10])}, "a")  # the next segment
    assert lake.positions("gpu_samples") == {"spool:x": [3, 10]}


def concurrent_rounds(lakes: list[Lake]) -> int:
    """Three writers (one Lake each, as three processes) committing four overlapping rounds
    each at once; the distinct ids they sent."""
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for j in range(4):  # each round overlaps the neighbour's ids
                lakes[k].append("gpu_samples", samples(k * 300 + j * 50, 100), {f"t/{k}": ([j], [j + 1])}, f"w{k}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(len(lakes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    return len({i for k in range(len(lakes)) for j in range(4) for i in range(k * 300 + j * 50, k * 300 + j * 50 + 100)})


def test_concurrent_commits_lose_nothing_and_store_nothing_twice(lake: Lake) -> None:
    n = concurrent_rounds([lake, Lake(str(lake.location.local)), Lake(str(lake.location.local))])
    assert count(lake) == (n, n)
    assert lake.positions("gpu_samples") == {"t/0": [4], "t/1": [4], "t/2": [4]}


def test_a_staged_round_reaches_the_lake_once(lake: Lake, tmp_path: Path) -> None:
    ev = [{"v": 1, "id": f"hb-{i}", "ts": 1.79e9 + i, "node": "n1", "role": "worker", "job": "j", "labels": {},
           "type": "heartbeat", "data": {"seq": i + 1}} for i in range(30)]
    st = Stager(lake, max_skew=None, commit_every=3600)
    st.write([("spool:x/1@0", encode_many(ev[:20]))], position=("spool:x", 1, 100))
    st.write([("spool:x/1@100", encode_many(ev[10:]))], position=("spool:x", 1, 200))  # 10 repeated
    assert st.flush() >= 30
    assert lake.positions() == {"spool:x": [1, 200]}
    st.write([("spool:x/1@0", encode_many(ev))], position=("spool:x", 1, 200))  # all again
    st.flush()
    assert count(lake, "heartbeats") == (30, 30)
    with LakeDatabase(str(lake.location.local)).read() as con:
        assert con.execute("SELECT node, job FROM nodes").fetchall() == [("n1", "j")]


def test_maintenance_drops_old_raw_days_compacts_and_keeps_every_other_row(lake: Lake) -> None:
    for j in range(10):  # day 0: ten small files; day 9: two
        lake.append("gpu_samples", samples(j * 10, 10, day=0), {"t/0": ([j], [j + 1])}, "a")
    for j in range(2):
        lake.append("gpu_samples", samples(1000 + j * 10, 10, day=9), {"t/0": ([10 + j], [11 + j])}, "a")
    rep = maintain(lake, retain_raw=None, compact_files=4, expire_after=None)
    assert rep.compacted["gpu_samples"] == (10, 1)
    assert count(lake) == (120, 120)
    assert lake.positions("gpu_samples") == {"t/0": [12]}  # carried through the rewrite
    rep = maintain(lake, retain_raw=7 * 86400, compact_files=None, expire_after=0,
                   now=DAY0 + dt.timedelta(days=10))
    assert rep.deleted_partitions == {"gpu_samples": 1}
    assert count(lake) == (20, 20)
    assert rep.expired_snapshots > 0
    assert lake.positions("gpu_samples") == {"t/0": [12]}
    assert "retention: gpu_samples: 1 day partition(s) deleted" in rep.lines()


def test_expiry_deletes_only_old_files_no_snapshot_references(lake: Lake) -> None:
    """After compaction and snapshot expiry, the data files no kept snapshot references are
    deleted when older than an hour (ORPHAN_AGE); a newer unreferenced file (a commit in
    flight) and every referenced file stay: a wrong test here deletes live data."""
    import os
    import shutil
    import time

    from cmdare.collector.lake import NAMESPACE

    for j in range(6):
        lake.append("gpu_samples", samples(j * 10, 10, day=0), {"t/0": ([j], [j + 1])}, "a")
    maintain(lake, retain_raw=None, compact_files=2, expire_after=None)  # six files rewritten into one
    data = Path(lake.location.local) / NAMESPACE / "gpu_samples" / "data"
    files = [Path(d) / f for d, _, fs in os.walk(data) for f in fs if f.endswith(".parquet")]
    assert len(files) == 7
    old = time.time() - 2 * 3600
    for f in files:
        os.utime(f, (old, old))
    stray_old, stray_new = files[0].with_name("old-orphan.parquet"), files[0].with_name("in-flight.parquet")
    shutil.copy(files[0], stray_old)
    os.utime(stray_old, (old, old))
    shutil.copy(files[0], stray_new)  # written just now
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=0)
    assert rep.expired_snapshots > 0 and rep.orphans_deleted == 7  # the six rewritten away, and the old stray
    assert count(lake) == (60, 60)  # every referenced file kept
    assert stray_new.exists() and not stray_old.exists()
    left = [Path(d) / f for d, _, fs in os.walk(data) for f in fs if f.endswith(".parquet")]
    assert len(left) == 2  # the compacted file and the one in flight


@pytest.mark.parametrize("uri,catalog,words", [
    ("", None, "give a directory"),
    ("s3://bucket/x", None, "needs --catalog"),
    ("s3://key:secret@bucket/x", "postgresql://h/db", "credentials do not belong"),
    ("ftp://host/x", None, "unknown scheme"),
    ("/tmp/x", "mysql://u:hunter2@h/db", "--catalog"),
    ("x" * 2000, None, "give a directory"),
])
def test_bad_lake_locations_are_one_line_without_secrets(uri: str, catalog: str | None, words: str) -> None:
    with pytest.raises(LakeError) as e:
        Location.parse(uri, catalog)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert "secret" not in str(e.value) and "hunter2" not in str(e.value)


def test_cli_refuses_a_missing_lake_and_mixed_options(tmp_path: Path) -> None:
    r = CliRunner().invoke(analyze, ["--lake", str(tmp_path / "none"), "nodes"])
    assert r.exit_code == 1 and "no such lake" in r.output
    r = CliRunner().invoke(analyze, ["--lake", str(tmp_path), "--db", "x.duckdb", "nodes"])
    assert r.exit_code == 2 and "not both" in r.output
    (tmp_path / "spool").mkdir()
    r = CliRunner().invoke(collector, ["spool", str(tmp_path / "spool"), "--lake", str(tmp_path / "l"),
                                       "--rules", "default"])
    assert r.exit_code == 2 and "--rules" in r.output and "lake mode" in r.output


def test_user_sql_reads_the_lake_and_nothing_else(lake: Lake) -> None:
    lake.append("gpu_samples", samples(0, 10), {"t/0": ([0], [1])}, "a")
    d = str(lake.location.local)
    r = CliRunner().invoke(analyze, ["--lake", d, "sql", "SELECT count(*) AS n FROM gpu_samples", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == [{"n": 10}]
    r = CliRunner().invoke(analyze, ["--lake", d, "sql", "SELECT * FROM read_csv('/etc/passwd')"])
    assert r.exit_code == 1 and "root:" not in r.output
    r = CliRunner().invoke(analyze, ["--lake", d, "sql", "DELETE FROM gpu_samples"])
    assert r.exit_code == 1
    assert count(lake) == (10, 10)


def test_a_round_spanning_days_lands_in_each_days_partition(lake: Lake) -> None:
    import pyarrow as pa_

    rows = pa_.concat_tables([samples(0, 30, day=0), samples(100, 20, day=1), samples(200, 10, day=-400)])
    assert lake.append("gpu_samples", rows, {"t/0": ([0], [1])}, "a") == 60
    files = lake.files("gpu_samples")
    assert len(files) == 3 and {Path(f).parent.name for f in files} == {
        "ts_day=2026-09-01", "ts_day=2026-09-02", "ts_day=2025-07-28"}
    assert count(lake) == (60, 60)
    with LakeDatabase(str(lake.location.local)).read() as con:  # each file holds its day only
        assert con.execute("SELECT count(DISTINCT ts::DATE) FROM gpu_samples").fetchall()[0][0] == 3


def test_to_lake_copies_a_database_file_once(tmp_path: Path) -> None:
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer

    db = tmp_path / "f.duckdb"
    ev = [{"v": 1, "id": f"hb-{i}", "ts": 1.79e9 + i, "node": f"n{i % 3}", "role": "worker", "job": "j",
           "labels": {"team": "t"}, "type": "heartbeat", "data": {"seq": i + 1}} for i in range(40)]
    con = connect(db)
    Writer(con, max_skew=None).write([("x", encode_many(ev))])
    con.execute("INSERT INTO model_fits (fit_id, kind, family, model, rows, groups, fitted_at) "
                "VALUES ('f1', 'speed', 'ols', '{}', 10, 2, now())")
    con.close()
    lake = str(tmp_path / "lake")
    r = CliRunner().invoke(collector, ["to-lake", "--db", str(db), "--lake", lake])
    assert r.exit_code == 0, r.output
    assert "40 new event rows stored" in r.stdout and "model_fits (1 rows) replaced" in r.stdout
    r = CliRunner().invoke(collector, ["to-lake", "--db", str(db), "--lake", lake])
    assert r.exit_code == 0 and "0 new event rows stored" in r.stdout
    with LakeDatabase(lake).read() as con:
        assert con.execute("SELECT count(*), count(DISTINCT id) FROM heartbeats").fetchall() == [(40, 40)]
        assert con.execute("SELECT count(*) FROM nodes").fetchall() == [(3,)]
        assert con.execute("SELECT fit_id FROM model_fits").fetchall() == [("f1",)]
    r = CliRunner().invoke(collector, ["to-lake", "--db", str(tmp_path / "none.duckdb"), "--lake", lake])
    assert r.exit_code == 1 and "no such database" in r.output


def test_maintenance_defaults_are_the_documented_ones() -> None:
    """`cmdare-collector maintain`'s documented defaults (docs/lake.md, --help): raw samples
    kept 7 days, rollups 400, a day compacted past 8 files, snapshots expired after a day,
    unreferenced files deleted only after an hour (a commit may be in flight)."""
    import inspect

    from cmdare.collector import lakemaint

    d = {k: p.default for k, p in inspect.signature(maintain).parameters.items()}
    assert (d["retain_raw"], d["compact_files"], d["expire_after"], d["retain_rollups"]) == (
        7 * 86400, 8, 86400, 400 * 86400)
    assert lakemaint.ORPHAN_AGE == 3600.0


def test_nothing_to_do_reports_nothing_and_keeps_every_recent_snapshot(lake: Lake) -> None:
    """Exactly as many files as the limit is not compacted; a later day past it is (a day
    that needs nothing does not stop the loop); snapshots younger than a day are kept."""
    for j in range(4):  # day 0: four files, the limit
        lake.append("gpu_samples", samples(j * 10, 10, day=0), {"t/0": ([j], [j + 1])}, "a")
    for j in range(5):  # day 1: five
        lake.append("gpu_samples", samples(500 + j * 10, 10, day=1), {"t/0": ([4 + j], [5 + j])}, "a")
    snaps = {x.snapshot_id for x in lake.table("gpu_samples").snapshots()}
    rep = maintain(lake, retain_raw=None, compact_files=4, expire_after=86400)
    assert rep.compacted == {"gpu_samples": (5, 1)} and rep.expired_snapshots == 0 and rep.orphans_deleted == 0
    assert snaps < {x.snapshot_id for x in lake.table("gpu_samples").snapshots()}  # none expired, the rewrite's added
    assert count(lake) == (90, 90)
    empty = maintain(lake, retain_raw=None, compact_files=None, expire_after=None, retain_rollups=None)
    assert (empty.compacted, empty.deleted_partitions, empty.expired_snapshots, empty.orphans_deleted) == ({}, {}, 0, 0)
    assert empty.lines()[-1] == "snapshots expired: 0; unreferenced data files deleted: 0"


def test_a_collector_committing_during_compaction_costs_that_day_only_until_the_next_run(
        lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A collector appends to the first day while maintenance compacts it (between its read
    and its commit): that day's rewrite loses the race, is said and left for the next run,
    nothing is lost, and the next day is still compacted in the same run."""
    from pyiceberg.table import Table

    for day in (0, 1):
        for j in range(3):
            lake.append("gpu_samples", samples(day * 1000 + j * 10, 10, day=day),
                        {"t/0": ([day * 3 + j], [day * 3 + j + 1])}, "a")
    other = Lake(str(tmp_path / "lake"))
    real_scan, raced = Table.scan, []

    def scan(self, *a, **k):  # the collector's commit lands after maintenance read the day
        if not raced and self.name()[-1] == "gpu_samples":
            raced.append(0)  # once (the collector's append scans too)
            raced[0] = other.append("gpu_samples", samples(500, 5, day=0), {"t/0": ([6], [7])}, "b")
        return real_scan(self, *a, **k)

    monkeypatch.setattr(Table, "scan", scan)
    rep = maintain(lake, retain_raw=None, compact_files=2, expire_after=None, retain_rollups=None)
    monkeypatch.undo()
    assert raced == [5]
    assert rep.skipped == ["compaction of gpu_samples 2026-09-01"]
    assert rep.compacted == {"gpu_samples": (3, 1)}  # the second day, after the lost race
    assert "skipped (a collector committed meanwhile; the next run does it): compaction of gpu_samples 2026-09-01" \
        in rep.lines()
    assert count(lake) == (65, 65)
    again = maintain(lake, retain_raw=None, compact_files=2, expire_after=None, retain_rollups=None)
    assert again.skipped == [] and again.compacted == {"gpu_samples": (4, 1)} and count(lake) == (65, 65)


@pytest.mark.slow  # maintenance runs over a lake (3 s; scripts/mutation runs it for lakemaint)
def test_a_retention_commit_lost_to_a_collector_is_said_and_done_by_the_next_run(
        lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A collector appends while retention deletes old days (between its read and its
    commit): the delete loses the race, is said, nothing is lost, the next run deletes."""
    from pyiceberg.table import Table

    for day in (0, 1, 9):
        lake.append("gpu_samples", samples(day * 100, 10, day=day), {"t/0": ([day], [day + 1])}, "a")
    maintain(lake, retain_raw=None, compact_files=None, expire_after=None)  # the rollups hold every day
    other = Lake(str(tmp_path / "lake"))
    real, raced = Table.delete, []

    def delete(self, *a, **k):
        if not raced and self.name()[-1] == "gpu_samples":
            raced.append(other.append("gpu_samples", samples(950, 5, day=9), {"t/0": ([20], [21])}, "b"))
        return real(self, *a, **k)

    monkeypatch.setattr(Table, "delete", delete)
    now = DAY0 + dt.timedelta(days=9, hours=12)
    rep = maintain(lake, retain_raw=86400, compact_files=None, expire_after=None, now=now)
    monkeypatch.undo()
    assert raced == [5] and rep.skipped == ["retention of gpu_samples"] and rep.deleted_partitions == {}
    assert count(lake) == (35, 35)
    again = maintain(lake, retain_raw=86400, compact_files=None, expire_after=None, now=now)
    assert again.skipped == [] and again.deleted_partitions == {"gpu_samples": 2} and count(lake) == (15, 15)


@pytest.mark.slow  # maintenance runs over a lake (3 s; scripts/mutation runs it for lakemaint)
def test_a_day_not_rolled_up_at_the_cut_itself_holds_nothing_back(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention deletes the days before the cut's day; a pending day that is the cut's own
    day keeps nothing back and is not reported as kept."""
    from cmdare.collector import lakerollup

    for day in (1, 2):
        lake.append("gpu_samples", samples(day * 100, 10, day=day), {"t/0": ([day], [day + 1])}, "a")
    monkeypatch.setattr(lakerollup, "build", lambda lake, skipped: {})  # nothing rolled: every day pending
    rep = maintain(lake, retain_raw=86400, compact_files=None, expire_after=None,
                   now=DAY0 + dt.timedelta(days=2, hours=12))  # the cut: day 1
    assert rep.kept_unrolled == {} and rep.deleted_partitions == {} and count(lake) == (20, 20)
    assert not any("kept" in line for line in rep.lines())
    rep = maintain(lake, retain_raw=86400, compact_files=None, expire_after=None,
                   now=DAY0 + dt.timedelta(days=3, hours=12))  # the cut: day 2; day 1 pending before it
    assert rep.kept_unrolled == {"gpu_samples": 1} and rep.deleted_partitions == {} and count(lake) == (20, 20)


@pytest.mark.slow  # maintenance runs over a lake (3 s; scripts/mutation runs it for lakemaint)
def test_a_snapshot_expiry_lost_to_another_commit_is_said_and_counts_nothing(
        lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.update.snapshot import ExpireSnapshots

    for j in range(3):
        lake.append("gpu_samples", samples(j * 10, 10), {"t/0": ([j], [j + 1])}, "a")

    def lost(self, *a, **k):
        raise CommitFailedException("another commit landed first")

    monkeypatch.setattr(ExpireSnapshots, "commit", lost)
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=0, retain_rollups=None)
    monkeypatch.undo()
    assert "snapshot expiry of gpu_samples" in rep.skipped
    assert rep.expired_snapshots == 0 and rep.orphans_deleted == 0 and count(lake) == (30, 30)
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=0, retain_rollups=None)
    assert rep.expired_snapshots >= 2 and rep.skipped == []


def test_compacting_a_day_rewrites_that_day_only(lake: Lake) -> None:
    from cmdare.collector.lake import day_partitions

    for j in range(3):  # day 0: three files, over the limit of 2
        lake.append("gpu_samples", samples(j * 10, 10, day=0), {"t/0": ([j], [j + 1])}, "a")
    for j in range(2):  # day 1: two, at the limit: left as they are
        lake.append("gpu_samples", samples(500 + j * 10, 10, day=1), {"t/0": ([3 + j], [4 + j])}, "a")
    rep = maintain(lake, retain_raw=None, compact_files=2, expire_after=None, retain_rollups=None)
    assert rep.compacted == {"gpu_samples": (3, 1)}
    parts = {str(d): len(f) for d, f in day_partitions(lake.table("gpu_samples")).items()}
    assert parts == {"2026-09-01": 1, "2026-09-02": 2} and count(lake) == (50, 50)


def test_rounds_of_two_days_and_before_1970_land_in_their_days(lake: Lake) -> None:
    """Exactly two days in a round (each day's rows filtered) and times before 1970 (the day
    floored, not truncated towards zero)."""
    import pyarrow as pa_

    lake.append("gpu_samples", pa_.concat_tables([samples(0, 4, day=0), samples(10, 3, day=1)]), {"t/0": ([0], [1])},
                "a")
    assert count(lake) == (7, 7)
    before = (dt.datetime(1969, 12, 31) - DAY0).days
    lake.append("gpu_samples", samples(20, 2, day=before), {"t/0": ([1], [2])}, "a")
    assert {Path(f).parent.name for f in lake.files("gpu_samples")} == {
        "ts_day=2026-09-01", "ts_day=2026-09-02", "ts_day=1969-12-31"}
    assert count(lake) == (9, 9)
    # one microsecond before 1970 is the last day before it
    t = samples(30, 1).set_column(1, "ts", pa.array([dt.datetime(1969, 12, 31, 23, 59, 59, 999999)],
                                                    pa.timestamp("us")))
    lake.append("gpu_samples", t, {"t/0": ([2], [3])}, "a")
    assert [f for f in lake.files("gpu_samples") if "1970-01-01" in f] == []


def test_unseen_rows_are_looked_for_in_their_time_range_and_said(lake: Lake, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    import logging

    lake.append("gpu_samples", samples(0, 10), {"t/0": ([0], [1])}, "a")
    filters: list[Any] = []
    real = Lake.files
    monkeypatch.setattr(Lake, "files", lambda self, name, row_filter=None, tbl=None: (
        filters.append(row_filter), real(self, name, row_filter, tbl))[1])
    with caplog.at_level(logging.INFO, logger="cmdare.collector"):
        assert lake.append("gpu_samples", samples(20, 5), {"t/0": ([1], [2])}, "a") == 5
        # the same times and ids from another node: files in range, nothing stored already
        assert lake.append("gpu_samples", samples(0, 5, node="n2"), {"t/0": ([1], [2])}, "a") == 5
        assert not [r for r in caplog.records if "were stored already" in r.getMessage()]
        assert lake.append("gpu_samples", samples(5, 10), {"t/0": ([2], [3])}, "a") == 5
    said = [r.getMessage() for r in caplog.records if "were stored already" in r.getMessage()]
    assert said == ["gpu_samples: 5 of 10 rows were stored already"]
    assert filters and all(f is not None and "ts" in repr(f) for f in filters if f is not None)
    assert any(f is not None for f in filters)


def test_to_lake_marks_its_source_and_says_each_table(tmp_path: Path) -> None:
    from cmdare.collector.db import connect
    from cmdare.collector.lake import load_database
    from cmdare.collector.writer import Writer

    db = tmp_path / ("f" * 230 + ".duckdb")
    ev = [{"v": 1, "id": f"hb-{i}", "ts": 1.79e9 + i, "node": "n0", "role": "worker", "job": "j",
           "labels": {}, "type": "heartbeat", "data": {"seq": i + 1}} for i in range(5)]
    con = connect(db)
    Writer(con, max_skew=None).write([("x", encode_many(ev))])
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    said: list[str] = []
    out, _ = load_database(lk, con, str(db), progress=said.append)
    con.close()
    assert out["heartbeats"] == 5 and "heartbeats: 5 rows" in said
    source = f"db:{db.name}"[:200]
    assert len(source) == 200 and lk.positions() == {source: [1]}
    assert {len(m) for m in (r["writer"] for r in lk.table("lake_commits").scan().to_arrow().to_pylist())} == {200}
    from cmdare.collector.lake import MARKER

    marks = lk.table(MARKER).scan().to_arrow().to_pylist()
    assert {(m["source"], tuple(m["start"]), tuple(m["end"])) for m in marks} == {(source, (0,), (1,))}


def test_ensure_partitions_a_table_a_collector_left_unpartitioned(lake: Lake) -> None:
    from cmdare.collector.lake import NAMESPACE

    lake.catalog.drop_table(f"{NAMESPACE}.gpu_samples")
    lake.catalog.create_table(f"{NAMESPACE}.gpu_samples", schema=schema("gpu_samples"))  # died before partitioning
    assert lake.partition_missing("gpu_samples", "ts")
    lake.ensure()
    assert not lake.partition_missing("gpu_samples", "ts")
    assert lake.append("gpu_samples", samples(0, 3), {"t/0": ([0], [1])}, "a") == 3


def test_a_catalog_without_cmdares_namespace_is_not_a_lake(tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    from cmdare.collector.lake import sqlite_url

    d = tmp_path / "other"
    d.mkdir()
    SqlCatalog("x", uri=sqlite_url(d / "catalog.db"), warehouse=str(d), init_catalog_tables="true")
    with pytest.raises(LakeError, match=r": not a cmdare lake \(no namespace 'cmdare' in its catalog\)$"):
        Lake(str(d), create=False)


def test_settling_gives_up_after_its_tries_unless_another_did_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from cmdare.collector import lake as lake_mod

    monkeypatch.setattr(lake_mod.time, "sleep", lambda s: None)
    calls: list[int] = []

    def fail() -> None:
        calls.append(1)
        raise RuntimeError("taken")

    with pytest.raises(RuntimeError, match="taken"):
        lake_mod._settle(fail, lambda: False, tries=3)
    assert len(calls) == 3
    calls.clear()
    lake_mod._settle(fail, lambda: len(calls) == 2, tries=5)  # another process made it meanwhile
    assert len(calls) == 2
