"""A finding rule's alert does not flap (issue 66): ``GpuThrottled`` fired, resolved, and went
pending again 27 s later while its finding stayed open. With the collector's detector
schedule on (finding rules read the stored findings), the alert is the finding: it stays
firing while the finding is open (its job between two records, its node quiet a moment, the
round late), keeps one identity while the severity moves (the highest kept), resolves once
with the finding; and a pending alert keeps its start across a restart."""

from __future__ import annotations

from pathlib import Path

import duckdb

from .conftest import at, engine, insert, step

RULE = """
groups:
  - name: g
    interval: 10s
    rules:
      - alert: GpuThrottled
        finding: gpu_throttled
        for: 30s
"""


def finding(con: duckdb.DuckDBPyConnection, t: float, severity: str = "warning") -> None:
    con.execute("""INSERT INTO findings (kind, job, node, subject, severity, confidence, summary, first_detected,
                                         detected_at, window_start, window_end)
                   VALUES ('gpu_throttled', 'j', 'n1', '0', ?, 0.9, 'hot', ?, ?, ?, ?)""",
                [severity, at(t), at(t), at(t - 300), at(t)])


def seen(con: duckdb.DuckDBPyConnection, t: float) -> None:
    """The schedule found it again at ``t``; the job stepped and the node was heard then."""
    con.execute("UPDATE findings SET detected_at = ?, window_end = ? WHERE resolved_at IS NULL", [at(t), at(t)])
    insert(con, "steps", ts=at(t), node="n1", job="j", run="r", rank=0, steps=10, interval_seconds=10.0)
    con.execute("INSERT OR REPLACE INTO nodes (node, last_seen) VALUES ('n1', ?)", [at(t)])


def pending(con: duckdb.DuckDBPyConnection, tmp_path: Path):
    """An engine whose finding rule went pending at 10 s (its finding open, its node seen to 40 s)."""
    e = engine(con, tmp_path, RULE)
    e.findings_fresh = 150.0
    finding(con, 0)
    for t in (0, 10, 20, 30, 40):
        seen(con, t)
    assert step(e, con, at(10))["GpuThrottled"].state == "pending"
    return e


def test_a_finding_alert_stays_firing_while_its_finding_is_open_and_resolves_once(
        con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    e = pending(con, tmp_path)
    a = step(e, con, at(40))["GpuThrottled"]
    assert (a.state, a.fired_at) == ("firing", at(40))
    # the job sends nothing for 4 minutes and the round is late: the finding is still open
    for t in (100, 160, 220, 280):
        got = step(e, con, at(t))
        assert list(got) == ["GpuThrottled"] and got["GpuThrottled"].state == "firing", t
        assert got["GpuThrottled"].fired_at == at(40)  # the same episode: no resolve, no new pending
    # the severity moves each round: one alert, the highest severity kept
    for t, sev in ((290, "critical"), (300, "warning"), (310, "critical"), (320, "warning")):
        con.execute("UPDATE findings SET severity = ?", [sev])
        seen(con, t)
        got = step(e, con, at(t))
        assert len(got) == 1 and got["GpuThrottled"].fired_at == at(40)
        assert got["GpuThrottled"].labels["severity"] == "critical" or t < 290
    # the schedule resolves the finding: the alert resolves, once
    con.execute("UPDATE findings SET resolved_at = ?", [at(330)])
    for t in (340, 350, 400):
        seen(con, t)
        a = step(e, con, at(t))["GpuThrottled"]
        assert (a.state, a.resolved_at) == ("resolved", at(340)), t


def test_a_new_finding_that_does_not_stand_starts_no_alert(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    e = engine(con, tmp_path, RULE)
    e.findings_fresh = 150.0
    finding(con, 0)  # open, but its job never stepped and its node was never heard
    assert step(e, con, at(10)) == {} and step(e, con, at(60)) == {}


def test_a_pending_alert_keeps_its_start_across_a_restart(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    e = pending(con, tmp_path)
    for g in e.groups:
        e.save(con, g, at(10))
    e2 = engine(con, tmp_path, RULE)  # a new collector process, three minutes later
    e2.findings_fresh = 150.0
    assert e2.restore(con) == 1
    # its first rounds run before the detector schedule's: the stored finding is stale then
    for t in (200, 210):
        a = step(e2, con, at(t))["GpuThrottled"]
        assert (a.state, a.active_at) == ("pending", at(10)), t
    seen(con, 220)
    a = step(e2, con, at(220))["GpuThrottled"]
    assert (a.state, a.active_at, a.fired_at) == ("firing", at(10), at(220))
