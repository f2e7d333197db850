"""Goodput by the hour (cmdare.analytics.goodput.goodhours): the fleet's goodput read from the kept
hours and the raw sweep over the rest equals the raw sweep over everything, for ranges on
and off hour boundaries; a late record, checkpoint or declaration in a kept hour sends that
hour back to the raw sweep until the next refresh; a revoked job is never kept."""

from __future__ import annotations

import datetime as dt
import importlib.util
from pathlib import Path

import duckdb
import pytest

from cmdare.analytics.goodput import CATEGORIES, goodhours, goodput_many
from cmdare.collector import rollup
from cmdare.collector.db import connect

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_goodput", ROOT / "bench" / "goodput.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bench/goodput.py's fleet, small: 16 nodes (2 jobs of 8; job-0 revoked on day 2) for
    three days at a 60 s interval, its rollups built; goodput hours kept. It ends 20 min 34 s
    past an hour, so its first hour is partial whatever the clock says (the counts below
    depend on where the hours fall)."""
    path = tmp_path_factory.mktemp("gh") / "f.duckdb"
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, minute=0, second=0, microsecond=0)
    _bench().generate(path, 16, 3, 60, end=now - dt.timedelta(hours=1) + dt.timedelta(seconds=1234))
    con = connect(path)
    assert goodhours.refresh(con) > 0
    con.close()
    return path


def same(con: duckdb.DuckDBPyConnection, since: float | None, until: float | None) -> dict:
    got, want = goodhours.fleet(con, since, until), goodput_many(con, None, since, until)
    want = {j: g for j, g in want.items() if g.wall > 0}
    assert set(got) == set(want)
    for j, w in want.items():
        g = got[j]
        assert (g.start, g.end) == pytest.approx((w.start, w.end), abs=1e-6), j
        assert g.seconds == pytest.approx(w.seconds, rel=1e-9, abs=1e-6), j
    return got


def edges(con: duckdb.DuckDBPyConnection) -> tuple[float, float]:
    lo, hi = con.execute("SELECT epoch(min(ts)), epoch(max(ts)) FROM steps").fetchone()
    return float(lo), float(hi)


def whole_hours(con: duckdb.DuckDBPyConnection, job: str) -> int:
    """The whole hours inside the job's span (what refresh keeps for a job it can keep)."""
    g = goodput_many(con, [job])[job]
    return int(g.end // 3600 - -(-g.start // 3600))


def test_kept_hours_and_the_raw_rest_equal_the_raw_sweep(fleet: Path) -> None:
    con = duckdb.connect(str(fleet), read_only=True)
    kept = dict(con.execute("SELECT job, count(*) FROM goodput_hours WHERE whole GROUP BY job").fetchall())
    assert kept == {"job-1": whole_hours(con, "job-1")} and kept["job-1"] > 60  # job-0, revoked: read raw, always
    stats: dict[str, int] = {}
    goodhours.fleet(con, None, None, stats)
    assert stats == {"kept": kept["job-1"], "raw": 3}  # job-0 whole; job-1's two edges
    lo, hi = edges(con)
    h = 3600.0
    # job-1 waits on gradient communication for a quarter of each step (bench/goodput.py):
    # kept by the hour too (a little over a quarter of what the checkpoint saves leave)
    c = same(con, None, None)["job-1"].seconds
    assert 0.25 <= c["communication"] / (c["productive"] + c["input_wait"] + c["communication"]) < 0.26
    for since, until in [(None, None), (lo, hi), (lo + 1234.5, hi - 777.25), (lo + 10 * h - lo % h, lo + 40 * h - lo % h),
                         (lo + 5 * h + 17, lo + 5 * h + 1800), (hi - 2 * h, None), (None, lo + 26 * h + 60)]:
        same(con, since, until)
    con.close()


def test_a_late_record_checkpoint_or_declaration_is_read_raw_until_the_next_refresh(fleet: Path, tmp_path: Path) -> None:
    path = tmp_path / "late.duckdb"
    path.write_bytes(fleet.read_bytes())
    con = connect(path)
    lo, _hi = edges(con)
    at = dt.datetime.fromtimestamp(lo + 20 * 3600 + 1234, dt.timezone.utc).replace(tzinfo=None)
    before = goodhours.fleet(con, None, None)["job-1"].seconds
    n = whole_hours(con, "job-1")
    # a checkpoint save of 10 minutes, late, in a kept hour of job-1
    con.execute("""INSERT INTO checkpoints (id, ts, node, job, run, rank, action, seconds, bytes, step, ok)
                   VALUES ('late-c', $t, 'node-8', 'job-1', 'run-1', 0, 'save', 600.0, 1, 5, true)""", {"t": at})
    got = same(con, None, None)["job-1"].seconds
    assert got["checkpoint_save"] == pytest.approx(before["checkpoint_save"] + 600.0)
    stats: dict[str, int] = {}
    goodhours.fleet(con, None, None, stats)
    assert stats["kept"] == n - 2  # its hour, and the hour before (a record of an hour may start in the one before)
    # one that started in the hour before its own: that hour changed too
    h = (lo // 3600 + 12) * 3600
    con.execute("""INSERT INTO checkpoints (id, ts, node, job, run, rank, action, seconds, bytes, step, ok)
                   VALUES ('late-c2', $t, 'node-8', 'job-1', 'run-1', 0, 'save', 900.0, 1, 6, true)""",
                {"t": dt.datetime.fromtimestamp(h + 300, dt.timezone.utc).replace(tzinfo=None)})
    same(con, None, None)
    same(con, h - 3600, h)
    # a step record of rank 0, late, in another kept hour (rolled up as the collector would)
    at2 = at + dt.timedelta(hours=7)
    con.execute("""INSERT INTO steps (id, ts, node, job, run, rank, interval_seconds, steps, first_step, last_step,
                       examples, step_mean_seconds, wait_mean_seconds, steps_per_second, examples_per_second)
                   VALUES ('late-s', $t, 'node-8', 'job-1', 'run-1', 0, 60, 300, 1, 300, 19200, 0.2, 0.19, 5.0, 320)""",
                {"t": at2})
    con.execute("INSERT INTO rollup_dirty (node, lo, hi, src) VALUES ('node-8', $t, $t, 'steps')", {"t": at2})
    rollup.run(con)
    same(con, None, None)
    same(con, lo + 3600 * 19.5, lo + 3600 * 30)
    # a declaration of a new run, late: every hour of the job is read raw
    con.execute("""INSERT INTO jobs (id, ts, node, job, run, rank, world_size, role, model, accelerator)
                   VALUES ('late-j', $t, 'node-8', 'job-1', 'run-1', 0, 64, 'worker', 'resnet50', 'a100-40gb')""",
                {"t": at - dt.timedelta(days=2)})
    same(con, None, None)
    # every hour of the job computed again (its declarations changed), and the first hour with
    # steps is now whole: the job's span starts at the earlier declaration
    assert goodhours.refresh(con) == n + 1
    goodhours.fleet(con, None, None, stats)
    assert stats["kept"] == n + 1
    assert goodhours.refresh(con) == 0  # nothing changed since
    same(con, None, None)
    same(con, lo + 3600 * 19.5, lo + 3600 * 30)
    con.close()


def test_without_kept_hours_the_fleet_is_the_raw_sweep(tmp_path: Path) -> None:
    path = tmp_path / "raw.duckdb"
    _bench().generate(path, 8, 1, 120)
    con = connect(path)
    assert con.execute("SELECT count(*) FROM goodput_hours").fetchone()[0] == 0
    lo, hi = edges(con)
    same(con, lo + 100, hi)
    stats: dict[str, int] = {}
    goodhours.fleet(con, None, None, stats)
    assert stats == {"kept": 0, "raw": 1}
    assert set(CATEGORIES) == set(goodhours.fleet(con, None, None)["job-0"].seconds)
    con.close()


def test_the_collectors_writer_keeps_the_hours_with_its_rollups(tmp_path: Path) -> None:
    from cmdare.collector.writer import GOODPUT_EVERY, Writer

    path = tmp_path / "w.duckdb"
    _bench().generate(path, 8, 1, 120)
    con = connect(path)
    w = Writer(con, max_skew=None, rollup_every=None)
    w.rollup()
    assert con.execute("SELECT count(*) FROM goodput_hours").fetchone()[0] == 0  # no derived table set
    w.derive = goodhours.refresh  # as the collector's root sets it
    w._goodput_at -= GOODPUT_EVERY
    w.rollup()
    n = con.execute("SELECT count(*) FROM goodput_hours").fetchone()[0]
    assert n > 10
    con.execute("DELETE FROM goodput_hours")
    w.rollup()  # not again before GOODPUT_EVERY
    assert con.execute("SELECT count(*) FROM goodput_hours").fetchone()[0] == 0
    w._goodput_at -= GOODPUT_EVERY
    w.rollup()
    assert con.execute("SELECT count(*) FROM goodput_hours").fetchone()[0] == n
    con.close()


def test_a_collector_load_keeps_the_hours_it_stored(tmp_path: Path) -> None:
    """``cmdare-collector spool``: the collector's root gives its writer goodput by the hour,
    so a load of two and a half hours of steps leaves its whole hours kept."""
    from click.testing import CliRunner

    from cmdare.collector.cli import cli as collector
    from cmdare.wire.spool import seg_name
    from tests.collector.test_rollups_wide import steps

    d = tmp_path / "spool"
    d.mkdir()
    t = 1.75e9 - 1.75e9 % 3600 + 600
    (d / seg_name(1)).write_bytes(steps("n1", 0, t, 900) + steps("n2", 1, t, 900))
    db = tmp_path / "c.duckdb"
    r = CliRunner().invoke(collector, ["spool", str(d), "--db", str(db)])
    assert r.exit_code == 0, r.output
    con = duckdb.connect(str(db), read_only=True)
    hours = con.execute("SELECT job, count(*) FROM goodput_hours WHERE whole GROUP BY job").fetchall()
    assert hours == [("job-1", 1)]  # 10:10 to 12:40: one whole hour inside the span (11:00-12:00)
    same(con, None, None)
    con.close()


def test_a_job_that_cannot_be_kept_has_its_hours_dropped(fleet: Path, tmp_path: Path) -> None:
    """A notice that may have hit job-1, or a step that took longer than its reporting
    interval: refresh drops the job's hours (and keeps none), the fleet reads it raw."""
    for case in ("notice", "stretched"):
        path = tmp_path / f"{case}.duckdb"
        path.write_bytes(fleet.read_bytes())
        con = connect(path)
        lo, _hi = edges(con)
        at = dt.datetime.fromtimestamp(lo + 30 * 3600 + 5, dt.timezone.utc).replace(tzinfo=None)
        if case == "notice":
            con.execute("""INSERT INTO revocations (id, ts, node, job, cloud, kind, revokes)
                           VALUES ('late-v', $t, 'node-8', 'job-1', 'gce', 'preemption', true)""", {"t": at})
        else:  # 300 steps at 5 a second: 60 s of stepping reported in a 30 s interval
            con.execute("""INSERT INTO steps (id, ts, node, job, run, rank, interval_seconds, steps, step_mean_seconds,
                               steps_per_second) VALUES ('long', $t, 'node-9', 'job-1', 'run-1', 1, 30, 300, 0.2, 5.0)""",
                        {"t": at})
            con.execute("INSERT INTO rollup_dirty (node, lo, hi, src) VALUES ('node-9', $t, $t, 'steps')", {"t": at})
            rollup.run(con)
        assert goodhours.refresh(con) == 0
        assert con.execute("SELECT count(*) FROM goodput_hours WHERE job = 'job-1'").fetchone()[0] == 0, case
        stats: dict[str, int] = {}
        same(con, None, None)
        goodhours.fleet(con, None, None, stats)
        assert stats["kept"] == 0, case
        con.close()


def test_a_range_on_hour_boundaries_reads_each_whole_hour_inside_it_from_the_kept_hours(fleet: Path) -> None:
    """An hour that starts exactly at ``since`` or ends exactly at ``until`` is inside the
    range: read from the kept hours, not swept raw (the answer is the same either way; the
    cost is not). Both boundaries were surviving SQL mutants (scripts/mutation-sql)."""
    con = duckdb.connect(str(fleet), read_only=True)
    first = con.execute("SELECT epoch(min(hour)) FROM goodput_hours WHERE whole AND job = 'job-1'").fetchone()[0]
    since = float(first) + 5 * 3600.0
    until = since + 20 * 3600.0
    stats: dict[str, int] = {}
    goodhours.fleet(con, since, until, stats)
    assert stats["kept"] == 20
    same(con, since, until)
    con.close()


def test_a_step_longer_than_its_interval_by_more_than_a_second_stretches_its_job(tmp_path: Path) -> None:
    """``_stretched``: a record whose steps took more than its interval plus one second; one
    second exactly is not (the boundary was a surviving SQL mutant)."""
    con = connect(tmp_path / "s.duckdb")
    hour = dt.datetime(2026, 1, 1, 3)
    for job, steps in (("exact", 11), ("over", 12), ("under", 10)):
        con.execute("INSERT INTO steps (id, ts, node, job, run, rank, interval_seconds, steps, steps_per_second) "
                    "VALUES (?, ?, 'n', ?, 'r', 0, 10, ?, 1.0)", [job, hour + dt.timedelta(minutes=5), job, steps])
    assert goodhours._stretched(con, [("exact", hour), ("over", hour), ("under", hour)]) == {"over"}
    con.close()


def test_which_jobs_can_be_kept_by_the_hour(tmp_path: Path) -> None:
    """``fingerprints``' second field, record by record: a job can be kept by the hour when
    every step record and checkpoint of it reaches at most one hour back before its own hour
    (one hour exactly is near), and no node it stepped on was revoked; a notice that does not
    revoke does not count, and a record without a job name is no job. (Each clause was a
    surviving SQL mutant of the fingerprint query: scripts/mutation-sql goodhours.)"""
    from cmdare.collector import rollup
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import encode_many

    h = dt.datetime(2026, 1, 1, 3, tzinfo=dt.timezone.utc).timestamp()
    evs: list[dict] = []

    def ev(kind: str, job: str, node: str, ts: float, data: dict) -> None:
        evs.append({"v": 1, "id": f"e{len(evs)}", "ts": ts, "node": node, "role": "worker", "job": job, "labels": {},
                    "type": kind, "data": {"run": f"{job}-r", "rank": 0, **data}})

    def steps(job: str, interval: float, node: str = "n") -> None:  # a record 10 minutes into the hour
        ev("train_steps", job, node, h + 600, {"interval_seconds": interval, "steps": 10, "steps_per_second": 1.0,
                                               "step_mean_seconds": 1.0})

    steps("near", 60)
    steps("far", 3600 + 600 + 1)  # reaches a second past the hour before
    steps("edge", 3600 + 600)  # reaches the hour before's start exactly
    steps("", 60, node="m")
    for job, took in (("ck-far", 3600 + 601), ("ck-edge", 3600 + 600)):
        steps(job, 60, node=job)
        ev("train_checkpoint", job, job, h + 600, {"action": "save", "seconds": float(took), "ok": True})
    for job, revokes in (("notice-only", False), ("revoked", True)):
        steps(job, 60, node=job)
        ev("revocation", job, job, h + 900, {"cloud": "gce", "kind": "preemption", "action": "stop",
                                             "revokes": revokes, "deadline": h + 930, "lead_seconds": 30.0})
    con = connect(tmp_path / "k.duckdb")
    Writer(con).write([("t", encode_many(evs))])
    rollup.run(con)
    ok = {job: keep for (job, _), (_, keep) in goodhours.fingerprints(con).items()}
    assert ok == {"near": True, "far": False, "edge": True, "ck-far": False, "ck-edge": True, "notice-only": True,
                  "revoked": False}
    con.close()
    # a job's fingerprint follows its own runs only: a new run of one job changes its hour's
    # fingerprint, not the other job's
    evs.clear()
    steps("a", 60)
    steps("b", 60, node="n2")
    con = connect(tmp_path / "r.duckdb")
    Writer(con).write([("t", encode_many(evs))])
    rollup.run(con)
    before = {job: fp for (job, _), (fp, _) in goodhours.fingerprints(con).items()}
    evs.clear()
    ev("train_steps", "b", "n3", h + 700, {"run": "b-r2", "interval_seconds": 60.0, "steps": 10, "steps_per_second": 1.0})
    Writer(con).write([("t", encode_many(evs))])
    rollup.run(con)
    after = {job: fp for (job, _), (fp, _) in goodhours.fingerprints(con).items()}
    assert sorted(before) == ["a", "b"] and [j for j in before if after[j] != before[j]] == ["b"]
    con.close()
