"""Goodput by the hour in a lake: ``cmdare-collector maintain`` keeps the lake's
``goodput_hours`` (analytics/goodput/goodhours.py through a LakeDatabase), ``analyze --lake goodput
--fleet`` sums the kept hours and reads the rest raw, the same as the raw sweep; a late
append to a kept hour sends it back to the raw sweep until the next run; a run with
nothing changed computes nothing."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli as analyze
from cmdare.analytics.goodput import goodhours, goodput_many
from cmdare.analytics.lakedb import LakeDatabase
from cmdare.collector.cli import cli as collector
from cmdare.collector.cli.root import lake_goodput
from cmdare.collector.db import connect
from cmdare.collector.lake import Lake, load_database
from cmdare.collector.lakemaint import maintain
from tests.analytics.test_goodhours import _bench


def _same(lk: Lake) -> dict[str, int]:
    stats: dict[str, int] = {}
    with LakeDatabase(str(lk.location.local)).read() as con:
        got = goodhours.fleet(con, None, None, stats)
        want = {j: g for j, g in goodput_many(con, None).items() if g.wall > 0}
    assert set(got) == set(want) and want
    for j, w in want.items():
        assert got[j].seconds == pytest.approx(w.seconds, rel=1e-9, abs=1e-6), j
    return stats


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    """bench/goodput.py's fleet, small (16 nodes, 2 jobs, 2 days at 120 s), copied into a lake."""
    db = tmp_path / "f.duckdb"
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, minute=0, second=0, microsecond=0)
    _bench().generate(db, 16, 2, 120, end=now - dt.timedelta(hours=1) + dt.timedelta(seconds=1234))
    con = connect(db, read_only=True)
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    load_database(lk, con, str(db))
    con.close()
    return lk


def test_maintain_keeps_the_lakes_goodput_hours(lake: Lake, tmp_path: Path) -> None:
    lake.catalog.drop_table("cmdare.goodput_hours")  # a lake made before goodput was kept by the hour
    assert _same(lake) == {"kept": 0, "raw": 1}  # none kept yet: the raw sweep
    rep = maintain(lake, retain_raw=None, compact_files=None, expire_after=None, derive=lake_goodput())
    assert rep.goodput_hours and rep.goodput_hours > 30
    assert f"goodput hours: {rep.goodput_hours} whole hour(s) computed" in rep.lines()
    stats = _same(lake)
    assert stats["kept"] == rep.goodput_hours  # every whole hour written is read (job-0, revoked: raw)
    assert lake.table("goodput_hours").scan().to_arrow().num_rows >= rep.goodput_hours
    # a late step record in a kept hour of job-1: read raw (exact) until the next run
    with LakeDatabase(str(lake.location.local)).read() as con:
        lo = con.execute("SELECT min(hour) FROM goodput_hours WHERE whole AND job = 'job-1'").fetchall()[0][0]
    late = tmp_path / "late.duckdb"
    c = connect(late)
    c.execute("""INSERT INTO steps (id, ts, node, job, run, rank, interval_seconds, steps, first_step, last_step,
                     examples, step_mean_seconds, wait_mean_seconds, steps_per_second, examples_per_second)
                 VALUES ('late-s', $t, 'node-8', 'job-1', 'run-1', 0, 60, 300, 1, 300, 19200, 0.2, 0.19, 5.0, 320)""",
              {"t": lo + dt.timedelta(hours=3, minutes=7)})
    load_database(lake, c, str(late))
    c.close()
    after = _same(lake)
    assert after["kept"] < stats["kept"]
    again = maintain(lake, retain_raw=None, compact_files=None, expire_after=None, derive=lake_goodput())
    assert 1 <= again.goodput_hours <= 3  # the late record's hour (and its neighbours)
    assert _same(lake)["kept"] == stats["kept"]
    nothing = maintain(lake, retain_raw=None, compact_files=None, expire_after=None, derive=lake_goodput())
    assert nothing.goodput_hours == 0
    # the command: maintain says it, analyze --lake goodput --fleet answers from the kept hours
    r = CliRunner().invoke(collector, ["maintain", "--lake", str(lake.location.local), "--retain-raw", "off",
                                       "--expire-snapshots", "off"])
    assert r.exit_code == 0 and "goodput hours: 0 whole hour(s) computed" in r.output, r.output
    r = CliRunner().invoke(analyze, ["--lake", str(lake.location.local), "goodput", "--fleet", "--by", "job", "--json"])
    assert r.exit_code == 0, r.output
    assert {row["job"] for row in json.loads(r.stdout)} == {"job-0", "job-1"}
