"""Findings kept current (issue 51): the collector's detector schedule stores findings as
intervals that grow while they hold and are resolved when they stop, records what it looked
at, and never stops the collector when a round fails."""

from __future__ import annotations

import datetime as dt
import logging

import duckdb
import pytest

from cmdare.analytics import findings
from cmdare.analytics.findings import current
from tests.analytics.detectors.conftest import fleet  # noqa: F401  (the simulated fleet fixture)


def stored(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], tuple]:
    rows = con.execute("SELECT kind, job, window_start, window_end, resolved_at, first_detected FROM findings").fetchall()
    return {(k, j): (a, b, r, f) for k, j, a, b, r, f in rows}


def build(s) -> None:
    s.sim_job({}, kind="idle", nodes=1, gpus=4, idle=((0, 2), (0, 3)))
    s.sim_job({}, kind="fine", nodes=1, gpus=1)


def test_a_schedule_extends_what_still_holds_and_resolves_what_stopped(fleet) -> None:  # noqa: F811
    con, _ = fleet(build)
    end = con.execute("SELECT max(ts) FROM steps").fetchone()[0]
    clock = [end - dt.timedelta(minutes=10)]
    sched = current.DetectorSchedule(con, 60, 900, clock=lambda: clock[0])
    try:
        ext, new, gone = sched.round()
        assert new >= 1 and ext == 0 and gone == 0
        first = stored(con)
        idle = first[("gpu_idle", "sim-idle-1")]
        assert idle[2] is None  # not resolved
        assert not [k for k in first if k[1] == "sim-fine-2"]  # a healthy job stores nothing...
        cov = con.execute("SELECT job, window_start, window_end FROM finding_coverage").fetchall()
        assert cov == [(None, current.window_start(clock[0], 900), clock[0])]  # ...but was looked at
        # a minute later: the same finding, its window extended, first seen kept; coverage grows in place
        clock[0] += dt.timedelta(minutes=1)
        ext, new, gone = sched.round()
        assert ext >= 1 and new == 0 and gone == 0
        later = stored(con)[("gpu_idle", "sim-idle-1")]
        assert later[0] == idle[0] and later[1] >= idle[1] and later[3] == idle[3]
        assert con.execute("SELECT count(*), max(window_end) FROM finding_coverage").fetchone() == (1, clock[0])
        # the job ended 20 minutes ago: the window holds none of it, the finding is resolved
        # where it was last found, and stays (goodput reads the two hours it held)
        clock[0] = end + dt.timedelta(minutes=20)
        ext, new, gone = sched.round()
        assert gone >= 1
        after = stored(con)[("gpu_idle", "sim-idle-1")]
        assert after[2] == clock[0] and after[1] == later[1]
        # resolved findings are not reopened by a round that finds the same again later
        ext, new, gone = sched.round()
        assert (ext, gone) == (0, 0)
    finally:
        sched.stop()


@pytest.mark.parametrize(("now", "start"), [
    (dt.datetime(2026, 1, 1, 12, 7, 31), dt.datetime(2026, 1, 1, 11, 50)),
    (dt.datetime(2026, 1, 1, 12, 5), dt.datetime(2026, 1, 1, 11, 50)),  # on a boundary: 15 minutes exactly
    (dt.datetime(2026, 1, 1, 12, 4, 59, 999999), dt.datetime(2026, 1, 1, 11, 45)),
])
def test_a_rounds_window_starts_on_the_bucket_at_or_before_its_length(now, start) -> None:
    assert current.window_start(now, 900) == start


def test_a_round_reads_raw_samples_only_of_the_bucket_in_progress(fleet) -> None:  # noqa: F811
    """Incremental rounds: the settled 5-minute buckets of the window come from the rollups;
    a round finds the same with every raw GPU and host sample before the bucket in progress
    deleted (raw retention at its sharpest) as with all of them."""
    from cmdare.collector import rollup

    def build_mid(s) -> None:  # the idle job of ``build``, its data ending mid-bucket
        s.sim_job({}, kind="idle", nodes=1, gpus=4, idle=((0, 2), (0, 3)))

    got = []
    for cut in (False, True):
        con, _ = fleet(build_mid)
        rollup.run(con)
        end = con.execute("SELECT max(ts) FROM gpu_samples").fetchone()[0]
        clock = end - dt.timedelta(seconds=40)  # mid-bucket: some samples after the round, as in a replay
        if cut:
            # raw samples kept: from the start of the round's own bucket (retention is relative
            # to the newest sample)
            deleted = rollup.retain(con, (end - current.window_start(clock, 0)).total_seconds(), None)
            assert deleted.get("gpu_samples", 0) > 0 and deleted.get("host_samples", 0) > 0
            left = con.execute("SELECT min(ts) FROM gpu_samples").fetchone()[0]
            assert current.window_start(clock, 0) <= left <= clock
        sched = current.DetectorSchedule(con, 60, 900, clock=lambda clock=clock: clock)
        sched.round()
        sched.stop()
        got.append(con.execute("""SELECT kind, job, node, subject, severity, window_start, window_end, evidence
                                  FROM findings ORDER BY ALL""").fetchall())
    assert got[0] and got[0] == got[1]


def test_manual_and_scheduled_runs_record_what_they_looked_at(fleet) -> None:  # noqa: F811
    con, _ = fleet(build)
    from cmdare.analytics.units import Scope

    out = findings.run(con, Scope("sim-fine-2", None, None), ["gpu_idle"])
    findings.store(con, out, Scope("sim-fine-2", None, None), now=dt.datetime(2026, 1, 1))
    job, kinds, a, b, ran = con.execute("SELECT * FROM finding_coverage").fetchone()
    assert (job, kinds, a, b, ran) == ("sim-fine-2", ["gpu_idle"], findings.EPOCH, dt.datetime(2026, 1, 1),
                                        dt.datetime(2026, 1, 1))


def test_a_failing_round_is_logged_once_and_the_next_runs(fleet, monkeypatch, caplog) -> None:  # noqa: F811
    con, _ = fleet(build)
    calls = {"n": 0}
    real = findings.run

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] <= 3:
            raise duckdb.IOException("disk full\nsecond line")
        return real(*a, **k)

    monkeypatch.setattr(findings, "run", flaky)
    sched = current.DetectorSchedule(con, 0.05, 900)
    with caplog.at_level(logging.WARNING, logger="cmdare.findings"):
        sched.start()
        deadline = dt.datetime.now() + dt.timedelta(seconds=20)
        while sched.rounds == 0 and dt.datetime.now() < deadline:
            sched.stop_event.wait(0.05)
        sched.stop()
    assert sched.failures == 3 and sched.rounds >= 1
    lines = [r.getMessage() for r in caplog.records if "detector round failed" in r.getMessage()]
    assert len(lines) == 1 and "IOException: disk full" in lines[0] and "second line" not in lines[0]


@pytest.mark.parametrize("window", [59.0, 86401.0])
def test_the_window_is_bounded(window: float) -> None:
    from cmdare.collector.cli.config import BY_KEY, parse_value
    from cmdare.wire.units import ConfigError

    with pytest.raises(ConfigError, match="must be from 1m to 1d"):
        parse_value(BY_KEY["detect_window"], "--detect-window", f"{window}s")


def test_finding_rules_read_what_the_schedule_stored(fleet, monkeypatch) -> None:  # noqa: F811
    """With the schedule on, a finding rule reads its stored, unresolved, fresh findings
    instead of running its detector a second time; resolved or stale ones do not fire."""
    from cmdare.analytics import units
    from tests.analytics.alerting.conftest import default_engine

    con, _ = fleet(lambda s: (s.sim_job(kind="starved", wait=0.45, util=0.3, cpu=0.95), s.sim_job(kind="fed")))
    end = con.execute("SELECT max(ts) FROM steps").fetchone()[0]
    sched = current.DetectorSchedule(con, 60, 900, clock=lambda: end)
    sched.round()
    sched.stop()

    def firing(at: dt.datetime) -> set[str]:
        e = default_engine(con, 1800)
        e.findings_fresh = 150.0
        for g in e.groups:
            e.eval_group(con, g, at)
        bad = {r: h.last_error for r, h in e.health.items() if h.health == "error"}
        assert not bad, bad
        return {a.labels["job"] for a in e.snapshot() if a.labels["alertname"] == "InputBound"}

    def no_detector(*a, **k):
        raise AssertionError("the detector ran again")

    monkeypatch.setattr(units, "run_unit", no_detector)
    assert firing(end) == {"sim-starved-1"}
    assert firing(end + dt.timedelta(minutes=5)) == set()  # the schedule has not confirmed it since: stale
    con.execute("UPDATE findings SET resolved_at = ?", [end])
    assert firing(end) == set()  # resolved


def test_a_write_conflict_is_tried_again_then_raised() -> None:
    from cmdare.analytics.db import retry_conflicts

    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 3:
            raise duckdb.TransactionException("Conflict on tuple deletion")
        return "saved"

    assert retry_conflicts(flaky, 3, pause=0) == "saved" and calls["n"] == 3
    calls["n"] = -10
    with pytest.raises(duckdb.TransactionException):
        retry_conflicts(flaky, 3, pause=0)
    assert calls["n"] == -7  # tried three times, no more


def test_a_multi_node_jobs_findings_are_kept_one_per_node(tmp_path) -> None:
    """Issue 67: a finding's key without its node kept one of a multi-node job's two node
    findings (the second was taken for a repeat). Both are stored, both extended by the next
    round, and one resolved when only the other holds."""
    from cmdare.analytics.units import Finding, Scope
    from cmdare.collector.db import connect

    con = connect(tmp_path / "c.duckdb")
    t = dt.datetime(2026, 1, 1, 12)
    scope = Scope(None, t - dt.timedelta(minutes=15), t)

    def on(*nodes: str) -> list[Finding]:
        return [Finding("gpu_idle", "job-1", f"idle GPUs on {n}", node=n, subject="0",
                        window_start=t - dt.timedelta(minutes=10), window_end=t) for n in nodes]

    assert current.track(con, ["gpu_idle"], on("n0", "n1"), scope, t) == (0, 2, 0)
    assert current.track(con, ["gpu_idle"], on("n0", "n1"), scope, t + dt.timedelta(minutes=1)) == (2, 0, 0)
    assert current.track(con, ["gpu_idle"], on("n1"), scope, t + dt.timedelta(minutes=2)) == (1, 0, 1)
    rows = con.execute("SELECT node, resolved_at IS NULL FROM findings ORDER BY node").fetchall()
    assert rows == [("n0", False), ("n1", True)]
    con.close()


def test_a_jobs_time_is_covered_only_by_a_run_of_every_kind_over_all_of_it(tmp_path) -> None:
    """``uncovered``, edge by edge (goodput runs the detectors again for a job no stored run
    covered): a run covers a job when it looked at every kind asked, at that job or at every
    job, from at most a minute after the job's first step record to at most a minute before
    its last; a second short at either end, another job's run or a kind missing leaves it
    uncovered. (Each clause here was a surviving SQL mutant: scripts/mutation-sql current.)"""
    from cmdare.collector.db import connect

    con = connect(tmp_path / "c.duckdb")
    at = dt.datetime(2026, 1, 1)
    for job, first, last in (("a", 60, 180), ("b", 60, 180)):
        for i, s in enumerate((first, last)):
            con.execute("INSERT INTO steps (id, ts, node, job, run, rank, interval_seconds, steps) "
                        "VALUES (?, ?, 'n1', ?, 'r', 0, 10, 5)", [f"{job}{i}", at + dt.timedelta(seconds=s), job])
    t0, t1 = at + dt.timedelta(seconds=10), at + dt.timedelta(seconds=290)
    kinds = ["gpu_idle", "ps_bound"]
    minute = dt.timedelta(minutes=1)
    a, b = at + dt.timedelta(seconds=60), at + dt.timedelta(seconds=180)  # each job's first and last record

    def uncovered_with(*runs: tuple) -> list[str]:
        con.execute("DELETE FROM finding_coverage")
        for job, ks, start, end in runs:
            con.execute("INSERT INTO finding_coverage VALUES (?, ?, ?, ?, now())", [job, ks, start, end])
        return current.uncovered(con, ["a", "b"], t0, t1, kinds)

    second = dt.timedelta(seconds=1)
    try:
        assert uncovered_with() == ["a", "b"]
        assert uncovered_with((None, kinds, a + minute, b - minute)) == []  # every job, a minute's slack each end
        assert uncovered_with((None, kinds, a + minute + second, b - minute)) == ["a", "b"]  # starts too late
        assert uncovered_with((None, kinds, a + minute, b - minute - second)) == ["a", "b"]  # ends too early
        assert uncovered_with(("a", kinds, a, b)) == ["b"]  # a run of job a covers a only
        assert uncovered_with(("a", [*kinds, "straggler"], a, b)) == ["b"]  # more kinds than asked: covers
        assert uncovered_with((None, ["gpu_idle"], a, b)) == ["a", "b"]  # a kind missing: not covered
        assert uncovered_with(("c", kinds, a, b)) == ["a", "b"]  # another job's run
        assert current.uncovered(con, ["a"], t0, t1, kinds) == ["a"]  # the jobs asked about only
    finally:
        con.close()


def test_an_extended_finding_updates_its_own_row_only_and_one_ending_at_the_window_is_extended(tmp_path) -> None:
    """A round that finds two held findings again writes each one's new summary and window
    into its own row, never into the other's; and a finding whose window ends exactly where
    the next round's starts still reaches into it: extended, not stored anew and resolved.
    (Both were surviving SQL mutants: ``rowid <> $r``, ``>= $since`` as ``>``.)"""
    from cmdare.analytics.units import Finding, Scope
    from cmdare.collector.db import connect

    con = connect(tmp_path / "c.duckdb")
    t = dt.datetime(2026, 1, 1, 12)

    def on(end: dt.datetime, *nodes: str) -> list[Finding]:
        return [Finding("gpu_idle", "job-1", f"idle GPUs on {n} until {end:%H:%M}", node=n, subject="0",
                        window_start=t - dt.timedelta(minutes=10), window_end=end) for n in nodes]

    assert current.track(con, ["gpu_idle"], on(t, "n0", "n1"), Scope(None, t - dt.timedelta(minutes=15), t), t) == (
        0, 2, 0)
    later = t + dt.timedelta(minutes=1)
    assert current.track(con, ["gpu_idle"], on(later, "n0", "n1"), Scope(None, t, later), later) == (2, 0, 0)
    rows = con.execute("SELECT node, summary, window_end, resolved_at FROM findings ORDER BY node").fetchall()
    assert rows == [("n0", "idle GPUs on n0 until 12:01", later, None), ("n1", "idle GPUs on n1 until 12:01", later, None)]
    con.close()
