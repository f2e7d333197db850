"""The scheduler's own rules (analytics/server/schedule.py), each at its bound: when the
ingest horizon counts as a gap, how often a group runs and how soon a poke runs it, how a
save that meets a write conflict is retried, how receivers are built from the flags."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pytest

from cmdare.analytics import alerting
from cmdare.analytics.server.schedule import GAP, SAVE_TRIES, STOP_GRACE, Alerting, _utc
from cmdare.collector.db import connect

RULES = """
groups:
  - name: hourly
    interval: 1h
    rules:
      - alert: Always
        expr: SELECT 'x' AS k, 1 AS value
"""


@pytest.fixture
def con(tmp_path: Path):
    c = connect(str(tmp_path / "s.duckdb"))
    yield c
    c.close()


def _groups(tmp_path: Path, text: str = RULES):
    f = tmp_path / "rules.yml"
    f.write_text(text)
    return alerting.load_files([f])


def test_the_horizon_counts_a_gap_from_more_than_ten_seconds_behind(con) -> None:
    assert GAP == 10.0
    at_gap = Alerting(con, [], 1800)
    assert at_gap._horizon(1000.0, 990.0) == _utc(990.0)  # exactly 10 s behind: no gap
    assert at_gap._horizon(1001.0, 1000.5) == _utc(1000.5)  # nothing to wait out
    past = Alerting(con, [], 1800)
    assert past._horizon(1000.0, 989.5) == _utc(989.5)  # 10.5 s behind: a gap
    assert past._horizon(1001.0, 1000.5) == _utc(989.5)  # caught up: agents get the grace first (45 s)
    assert past._horizon(1045.9, 1045.5) == _utc(989.5)
    assert past._horizon(1046.0, 1045.5) == _utc(1045.5)  # the grace ends at exactly caught-up + 45 s
    assert past._horizon(1047.0, 1046.5) == _utc(1046.5)
    assert past._horizon(1060.0, 1049.5) == _utc(1049.5)  # a second gap ...
    assert past._horizon(1061.0, 1060.5) == _utc(1049.5)  # ... with a grace of its own
    assert past._horizon(1106.0, 1105.5) == _utc(1105.5)


def test_stop_gives_a_round_two_seconds_then_interrupts_its_query(con, tmp_path) -> None:
    slow = RULES.replace("SELECT 'x' AS k, 1 AS value",
                         "SELECT 'x' AS k, count(*)::DOUBLE AS value FROM range(10000000000000)")
    al = Alerting(con, _groups(tmp_path, slow), 1800)
    al.start()
    runner = al.runners["hourly"]
    deadline = time.monotonic() + 5
    while not runner.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner.busy and STOP_GRACE == 2.0
    t0 = time.monotonic()
    al.stop()
    took = time.monotonic() - t0
    assert not runner.thread.is_alive() and STOP_GRACE - 0.1 <= took < STOP_GRACE + 3, took
    with pytest.raises(duckdb.ConnectionException):  # its cursor closed once its thread ended
        runner.cur.execute("SELECT 1")


def test_a_group_runs_at_its_interval_and_a_poke_runs_it_at_most_every_min_gap(con, tmp_path) -> None:
    al = Alerting(con, _groups(tmp_path), 1800)  # min_gap: its default, 0.2 s
    times: list[float] = []
    real = al.round
    al.round = lambda g, c: (real(g, c), times.append(time.monotonic()))  # type: ignore[method-assign]
    al.start()
    runner = al.runners["hourly"]
    waits: list[float | None] = []
    real_wait = runner.wake.wait
    runner.wake.wait = lambda t=None: (waits.append(t), real_wait(t))[1]  # type: ignore[method-assign]
    try:
        time.sleep(1.5)
        assert runner.rounds == 1 and runner.busy is False  # at once, the next in an hour: none between
        assert len(waits) <= 3, waits  # idle, it wakes once a second to look, never spins
        runner.poke()
        deadline = time.monotonic() + 5
        while runner.rounds < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        n = len(waits)
        runner.poke()  # again at once: it waits out min_gap after the last round began
        while runner.rounds < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert runner.rounds == 3
        assert 0.15 <= times[2] - times[1] < 1.0, times
        assert len(waits) - n <= 4, waits[n:]  # it sleeps the rest of min_gap, it does not spin
        time.sleep(0.12)
        runner.poke()  # 0.12 s after a round: the rest of min_gap, not more
        while runner.rounds < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert runner.rounds == 4 and times[3] - times[2] < 0.45, times
    finally:
        al.stop()


def test_a_round_that_raises_is_logged_in_one_line_and_the_group_runs_on(con, tmp_path, caplog) -> None:
    al = Alerting(con, _groups(tmp_path), 1800)
    real, calls = al.round, []

    def round_(g, c):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom " + "x" * 500)
        real(g, c)

    al.round = round_  # type: ignore[method-assign]
    al.start()
    runner = al.runners["hourly"]
    try:
        deadline = time.monotonic() + 5
        while runner.rounds < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        runner.poke()
        while runner.rounds < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runner.rounds == 2 and runner.thread.is_alive()
    finally:
        al.stop()
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line == "alert group hourly: RuntimeError: " + ("boom " + "x" * 500)[:300]


@pytest.mark.parametrize("conflicts", [0, SAVE_TRIES - 1, SAVE_TRIES])
def test_a_save_meeting_a_write_conflict_is_tried_three_times(con, tmp_path, conflicts: int) -> None:
    (group,) = _groups(tmp_path)
    al = Alerting(con, [group], 1800)
    al.start(run=False)
    real, calls = al.engine.save, []

    def save(c, g, at, *state):
        calls.append(at)
        if len(calls) <= conflicts:
            raise duckdb.TransactionException("Conflict on tuple deletion!")
        return real(c, g, at, *state)

    al.engine.save = save  # type: ignore[method-assign]
    try:
        if conflicts < SAVE_TRIES:
            t0 = time.monotonic()
            al.round(group, al.runners["hourly"].cur)
            assert len(calls) == conflicts + 1 and time.monotonic() - t0 < 0.5 + 0.05 * conflicts  # 50 ms apart
            assert con.execute("SELECT count(*) FROM alerts").fetchone() == (1,)
        else:
            with pytest.raises(duckdb.TransactionException):
                al.round(group, al.runners["hourly"].cur)
            assert len(calls) == SAVE_TRIES == 3
    finally:
        al.stop()


def test_runner_threads_are_named_for_their_group_within_sixty_characters(con, tmp_path) -> None:
    name = "g" * 80
    al = Alerting(con, _groups(tmp_path, RULES.replace("hourly", name)), 1800)
    try:
        assert al.runners[name].thread.name == ("cmdare-alerts-" + name)[:60]
        assert (al.runners[name].busy, al.runners[name].rounds, al.runners[name].urgent) == (False, 0, False)
    finally:
        al.stop()


@pytest.mark.slow  # waits on purpose, or runs pytest itself, for seconds (fast tier: docs/testing.md)
def test_rounds_keep_their_interval_and_stop_wakes_the_runners_and_stops_the_receivers(con, tmp_path) -> None:
    from cmdare.analytics.alerting.notify.http import HttpReceiver

    al = Alerting(con, _groups(tmp_path, RULES.replace("interval: 1h", "interval: 1500ms")), 1800)
    times: list[float] = []
    real = al.round
    al.round = lambda g, c: (real(g, c), times.append(time.monotonic()))  # type: ignore[method-assign]
    r = HttpReceiver("webhook", "http://127.0.0.1:9/h")
    al.add(r)
    al.start()
    time.sleep(3.4)
    t0 = time.monotonic()
    al.stop()
    took = time.monotonic() - t0
    assert len(times) == 3 and all(1.4 < b - a < 1.8 for a, b in zip(times, times[1:], strict=False)), times
    assert took < 0.6, took  # idle runners are woken, not waited for
    assert not r.thread.is_alive()  # and the receivers are stopped
