"""Rollups in a lake (collector/lakerollup.py): ``maintain`` builds the 1- and 5-minute
rollups of each changed day; ``analyze --lake`` reads a day from them only while the raw
files are the ones they were built from, so every rollup view equals the raw aggregation
before, between and after maintenance runs, with late appends, and after retention
deleted the raw days (which it does only once they are rolled up)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import pytest

from cmdare.analytics import findings
from cmdare.analytics.lakedb import LakeDatabase
from cmdare.analytics.units import Scope
from cmdare.collector import lakerollup, rollup
from cmdare.collector.db import connect
from cmdare.collector.lake import Lake, load_database
from cmdare.collector.lakemaint import maintain
from cmdare.collector.writer import Writer
from tests.collector.test_rollups_wide import cols, gpu, host, steps

START = dt.datetime(2026, 9, 1, 23, 40).replace(tzinfo=dt.timezone.utc).timestamp()  # 20 minutes before a day ends


def views(lake: Lake) -> dict[str, list[tuple]]:
    """Every rollup view as analyze --lake reads it, and the raw aggregation of the same rows."""
    with LakeDatabase(str(lake.location.local)).read() as con:
        return {r.view: (cols(con, r, r.view), cols(con, r, f"({r.from_raw()} GROUP BY ALL)")) for r in rollup.ROLLUPS}


def pending(lake: Lake) -> int:
    with LakeDatabase(str(lake.location.local)).read() as con:
        return con.execute("SELECT count(*) FROM rollup_dirty").fetchall()[0][0]


def exact(lake: Lake) -> dict[str, list[tuple]]:
    got = views(lake)
    for v, (rolled, raw) in got.items():
        assert rolled == raw and raw, v
    return {v: rolled for v, (rolled, _) in got.items()}


def _lake_of(tmp_path: Path, lines: bytes) -> Lake:
    db = tmp_path / "some.duckdb"
    con = connect(db)
    Writer(con, max_skew=None, rollup_every=None).write([("m", lines)])
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    load_database(lk, con, str(db))
    con.close()
    return lk


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return _lake_of(tmp_path, b"".join(gpu(n, START, 240) + host(n, START, 240) + steps(n, i, START, 240)
                                       for i, n in enumerate(("a", "b", "c"))))  # 40 minutes: two days


def test_maintenance_builds_rollups_that_read_exactly_at_any_lag(lake: Lake) -> None:
    before = exact(lake)  # nothing rolled: every day pending, aggregated from the raw files
    assert pending(lake) > 0
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=None)
    assert rep.rolled == {r.table: 2 for r in rollup.ROLLUPS}  # two days each
    assert "rollups: gpu_rollup_5m: 2 day(s) built" in rep.lines()
    assert pending(lake) == 0
    with LakeDatabase(str(lake.location.local)).read() as con:  # the views now read the rollup files
        assert con.execute("SELECT count(*) FROM gpu_rollup_5m").fetchall()[0][0] > 0
        assert "read_parquet" in con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'step_rollup_5m'"
                                             ).fetchall()[0][0]
    assert exact(lake) == before
    # a late append into the second day: that day pending (read raw) until the next run
    f = Path(lake.location.local).parent / "late.duckdb"
    late = connect(f)
    Writer(late, max_skew=None, rollup_every=None).write([("late", gpu("a", START + 1203, 3, every=61))])
    load_database(lake, late, str(f))
    late.close()
    assert pending(lake) > 0
    after_late = exact(lake)
    assert after_late != before
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=None)
    assert rep.rolled == {"gpu_rollup_1m": 1, "gpu_rollup_5m": 1}  # only the day that changed
    assert pending(lake) == 0 and exact(lake) == after_late
    assert maintain(lake, retain_raw=None, compact_files=None, expire_after=None).rolled == {}


def test_rebuilding_one_day_leaves_the_next_days_rollups_alone(lake: Lake) -> None:
    """A late append into the first day rebuilds that day only: its overwrite is bounded to
    the day, so the second day's rollup rows (held by the same files) are kept, and every
    view stays exact (a filter a day too wide would delete them: data lost)."""
    maintain(lake, retain_raw=None, compact_files=None, expire_after=None)
    f = Path(lake.location.local).parent / "late1.duckdb"
    late = connect(f)
    Writer(late, max_skew=None, rollup_every=None).write([("late", gpu("b", START + 7, 2, every=63))])  # day one
    load_database(lake, late, str(f))
    late.close()
    want = exact(lake)
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=None)
    assert rep.rolled == {"gpu_rollup_1m": 1, "gpu_rollup_5m": 1}
    assert pending(lake) == 0 and exact(lake) == want
    with LakeDatabase(str(lake.location.local)).read() as con:
        assert con.execute("SELECT count(*) FROM gpu_rollup_5m WHERE bucket >= TIMESTAMP '2026-09-02'"
                           ).fetchall()[0][0] > 0


def test_retention_deletes_raw_days_once_rolled_and_the_rollups_keep_them(lake: Lake) -> None:
    want = exact(lake)
    with LakeDatabase(str(lake.location.local)).read() as con:
        found = [dataclasses.asdict(f) for f in findings.run(con, Scope()).findings]
    rep = maintain(lake, retain_raw=86400, compact_files=None, expire_after=None,
                   now=dt.datetime(2026, 9, 3, 12))  # the first day is older than a day
    assert rep.deleted_partitions == {"gpu_samples": 1, "host_samples": 1}
    with LakeDatabase(str(lake.location.local)).read() as con:
        assert con.execute("SELECT min(ts) >= TIMESTAMP '2026-09-02' FROM gpu_samples").fetchall() == [(True,)]
        # steps are not raw samples: kept for the fits
        assert con.execute("SELECT min(ts) < TIMESTAMP '2026-09-02' FROM steps").fetchall() == [(True,)]
        for r in rollup.ROLLUPS:  # the first day's rollup rows still there, the same
            assert cols(con, r, r.view) == want[r.view], r.view
        assert [dataclasses.asdict(f) for f in findings.run(con, Scope()).findings] == found


def test_retention_keeps_a_raw_day_no_rollup_holds(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollup build that failed (here: skipped) must not let retention drop the raw day:
    those samples would be gone from every view."""
    monkeypatch.setattr(lakerollup, "build", lambda lake, skipped: {})
    rep = maintain(lake, retain_raw=86400, compact_files=None, expire_after=None, now=dt.datetime(2026, 9, 3, 12))
    assert rep.deleted_partitions == {} and rep.kept_unrolled == {"gpu_samples": 1, "host_samples": 1}
    assert "retention: gpu_samples: 1 old day(s) kept: not rolled up yet (the next run)" in rep.lines()
    exact(lake)


def test_rollup_retention_drops_whole_old_days(lake: Lake) -> None:
    maintain(lake, retain_raw=None, compact_files=None, expire_after=None)
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=None, retain_rollups=3600)
    assert rep.rollup_days_deleted == {r.table: 1 for r in rollup.ROLLUPS}
    with LakeDatabase(str(lake.location.local)).read() as con:
        assert con.execute("SELECT min(bucket) FROM gpu_rollup_5m").fetchall() == [(dt.datetime(2026, 9, 2),)]


def test_the_maintain_command_builds_the_rollups_and_refuses_bad_durations(lake: Lake) -> None:
    from click.testing import CliRunner

    from cmdare.collector.cli import cli as collector

    where = str(lake.location.local)
    r = CliRunner().invoke(collector, ["maintain", "--lake", where, "--retain-raw", "off", "--retain-rollups", "400d"])
    assert r.exit_code == 0, r.output
    assert "rollups: step_rollup_5m: 2 day(s) built" in r.output
    assert pending(lake) == 0
    for bad in (["--retain-rollups", "-1d"], ["--retain-rollups", "forever"]):
        r = CliRunner().invoke(collector, ["maintain", "--lake", where, *bad])
        assert r.exit_code == 2 and "--retain-rollups" in r.output and "Traceback" not in r.output, r.output



def test_rollup_retention_goes_on_past_tables_with_no_days_or_no_old_day(tmp_path: Path) -> None:
    """Three days of steps, host samples only on the last day, no GPU samples: the GPU
    rollups hold no day and the host rollups no old one, and still every steps rollup loses
    its two days before the newest (the cut counts from each table's newest day)."""
    day = 86400.0
    lines = b"".join(steps("a", 0, START + k * day, 6) for k in range(3)) + host("a", START + 2 * day, 6)
    lk = _lake_of(tmp_path, lines)
    maintain(lk, retain_raw=None, compact_files=None, expire_after=None)
    rep = maintain(lk, retain_raw=None, compact_files=None, expire_after=None, retain_rollups=3600)
    assert rep.rollup_days_deleted == {"step_rollup_1m": 2, "step_rollup_5m": 2}
    with LakeDatabase(str(lk.location.local)).read() as con:
        assert con.execute("SELECT min(bucket) FROM step_rollup_1m").fetchall() == [(dt.datetime(2026, 9, 3, 23, 40),)]
        assert con.execute("SELECT count(*) FROM host_rollup_1m").fetchall()[0][0] > 0


def test_rollups_are_built_for_the_sources_a_lake_has_when_an_earlier_one_is_missing(tmp_path: Path) -> None:
    """A lake without a GPU samples table (dropped, or made before it existed): the host and
    steps rollups are still built, and read exactly."""
    lk = _lake_of(tmp_path, host("a", START, 30) + steps("a", 0, START, 30))
    from cmdare.collector.lake import NAMESPACE

    lk.catalog.drop_table(f"{NAMESPACE}.gpu_samples")
    rep = maintain(lk, retain_raw=None, compact_files=None, expire_after=None)
    assert {t for t in rep.rolled if t.startswith(("host_", "step_"))} == {
        "host_rollup_1m", "host_rollup_5m", "step_rollup_1m", "step_rollup_5m"}
    assert not {t for t in rep.rolled if t.startswith("gpu_")}


def _empty(t) -> object:  # an empty Arrow table of an Iceberg table's schema
    return t.schema().as_arrow().empty_table()


def test_a_corrupt_rollup_state_rebuilds_its_days_instead_of_failing(lake: Lake) -> None:
    """A rollup table whose state property is not JSON (a hand edit, a foreign writer): its
    days are rebuilt from the raw files, the views stay exact, the run does not fail."""
    maintain(lake, retain_raw=None, compact_files=None, expire_after=None)
    t = lake.table("gpu_rollup_1m")
    t.append(_empty(t), snapshot_properties={lakerollup.ROLLED: "{not json"})
    assert lakerollup.rolled(lake.table("gpu_rollup_1m")) == {}
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=None)
    assert rep.rolled == {"gpu_rollup_1m": 2}
    assert pending(lake) == 0
    exact(lake)


def test_a_rollup_commit_lost_to_another_run_skips_that_day_and_builds_the_next(
        lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another maintenance run commits to a rollup table between this run's read and its
    overwrite of the first day: that day is skipped and said, the second day is still built
    in this run, the next run builds the skipped one, and the views are exact throughout."""
    from pyiceberg.table import Transaction

    other = Lake(str(lake.location.local))
    real, raced = Transaction.overwrite, []

    def overwrite(self, *a, **k):  # (the day's first chunk, in its transaction: the race comes before its commit)
        if not raced and self._table.name()[-1] == "gpu_rollup_1m":
            raced.append(1)
            o = other.table("gpu_rollup_1m")
            o.append(_empty(o), snapshot_properties={lakerollup.ROLLED: json.dumps(lakerollup.rolled(o))})
        return real(self, *a, **k)

    monkeypatch.setattr(Transaction, "overwrite", overwrite)
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=None, retain_rollups=None)
    monkeypatch.undo()
    assert rep.skipped == ["rollup gpu_rollup_1m 2026-09-01"]
    assert rep.rolled["gpu_rollup_1m"] == 1 and rep.rolled["gpu_rollup_5m"] == 2
    exact(lake)
    again = maintain(lake, retain_raw=None, compact_files=None, expire_after=None, retain_rollups=None)
    assert again.rolled == {"gpu_rollup_1m": 1} and again.skipped == [] and pending(lake) == 0
    exact(lake)


def test_a_day_rolled_up_in_chunks_is_one_commit_and_exact(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    """A day's rollup rows are written a chunk at a time (a 10,000-node fleet's day held whole
    took 24 GB) in one transaction: the views read exactly the raw rows' aggregates, and a
    reader never sees the day half written (one snapshot more a day, not one a chunk)."""
    monkeypatch.setattr(lakerollup, "CHUNK_ROWS", 7)
    lakerollup.ensure(lake)
    logged = len(lake.table("gpu_rollup_1m").metadata.metadata_log)
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=None, retain_rollups=None)
    assert rep.rolled["gpu_rollup_1m"] == 2 and pending(lake) == 0
    t = lake.table("gpu_rollup_1m")
    assert len(lake.files("gpu_rollup_1m")) > 2  # more than a file a day: the chunks
    assert len(t.metadata.metadata_log) - logged == 2  # a catalog commit a day, however many chunks
    exact(lake)


def test_rollups_built_before_their_columns_changed_are_pending_until_rebuilt(
        lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration 028 gave the GPU rollups three columns (pod, MIG profile, held job) and
    version 2: days an older cmdare rolled up (fingerprints of version 1, no such columns)
    are read from the raw files until the next maintenance rebuilds them, with the columns."""
    old = tuple(dataclasses.replace(r, version=1) for r in rollup.ROLLUPS)
    monkeypatch.setattr(rollup, "ROLLUPS", old)
    maintain(lake, retain_raw=None, compact_files=None, expire_after=None, retain_rollups=None)
    assert pending(lake) == 0  # (as the older version saw it)
    monkeypatch.undo()
    assert pending(lake) > 0  # the GPU days: built by version 1
    exact(lake)
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=None, retain_rollups=None)
    assert rep.rolled == {"gpu_rollup_1m": 2, "gpu_rollup_5m": 2}  # host and steps rollups stand
    assert pending(lake) == 0
    exact(lake)
