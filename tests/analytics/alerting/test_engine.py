"""The evaluation's state machine as Prometheus defines it (pending, firing after ``for``,
``keep_firing_for``, resolved and kept for the receivers, a new pending when it comes back),
one instance per rule and label set, a rule failing at run time without stopping the others,
state saved to and restored from the database, and inhibition after a revocation."""

from __future__ import annotations

from pathlib import Path

import duckdb

from cmdare.analytics import alerting as alerts
from tests.analytics.alerting.conftest import at, engine, insert, step

HOT = """
groups:
  - name: g
    interval: 10s
    rules:
      - alert: Hot
        expr: SELECT node, max(temp_celsius) AS value FROM gpu_samples
              WHERE ts > eval_time() - INTERVAL 30 SECOND AND ts <= eval_time() GROUP BY node HAVING max(temp_celsius) > 85
        for: 30s
        keep_firing_for: 20s
        labels: {severity: critical, team: "gpu-{{ $labels.node }}"}
        annotations:
          summary: "{{ $labels.node }} at {{ $value }} C"
          detail: 'value {{ printf "%.1f" $value }}'
"""


def hot(con: duckdb.DuckDBPyConnection, node: str, t: float, temp: float = 90.0) -> None:
    insert(con, "gpu_samples", ts=at(t), node=node, **{"index": 0}, uuid=f"GPU-{node}", temp_celsius=temp)


def test_pending_then_firing_after_for_then_kept_then_resolved(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    e = engine(con, tmp_path, HOT)
    assert step(e, con, at(0)) == {}
    for t in range(0, 50, 10):
        hot(con, "n1", t)
    a = step(e, con, at(10))["Hot"]
    assert (a.state, a.active_at, a.fired_at) == ("pending", at(10), None)
    assert step(e, con, at(30))["Hot"].state == "pending"  # 20 s held: for is 30 s
    a = step(e, con, at(40))["Hot"]
    assert (a.state, a.active_at, a.fired_at) == ("firing", at(10), at(40))
    assert a.labels == {"node": "n1", "alertname": "Hot", "severity": "critical", "team": "gpu-n1"}
    assert a.annotations == {"summary": "n1 at 90 C", "detail": "value 90.0"}
    # no sample after t=40: the expression last finds it at 65 (its 30 s window reaches back
    # to 40); keep_firing_for holds it firing 20 s past that
    assert step(e, con, at(65))["Hot"].last_seen == at(65)
    a = step(e, con, at(75))["Hot"]
    assert a.state == "firing" and a.last_seen == at(65)
    a = step(e, con, at(85))["Hot"]
    assert (a.state, a.resolved_at, a.fired_at) == ("resolved", at(85), at(40))
    # resolved alerts stay 15 minutes for the receivers, then go
    assert step(e, con, at(85 + 800))["Hot"].state == "resolved"
    assert step(e, con, at(85 + 901)) == {}


def test_pending_that_clears_goes_and_a_return_starts_over(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    e = engine(con, tmp_path, HOT)
    hot(con, "n1", 0)
    assert step(e, con, at(10))["Hot"].state == "pending"
    assert step(e, con, at(40)) == {}  # cleared before `for`: gone, never fired
    hot(con, "n1", 50)
    a = step(e, con, at(60))["Hot"]
    assert (a.state, a.active_at) == ("pending", at(60))


def test_a_resolved_alert_that_comes_back_is_a_new_episode_pending_first(con: duckdb.DuckDBPyConnection,
                                                                         tmp_path: Path) -> None:
    """Within the 15 minutes a resolved alert is kept, the condition returns: the instance
    starts over as pending (its own ``active_at``), fires only after ``for`` again, and the
    new firing has its own ``fired_at`` (receivers tell episodes apart by it)."""
    e = engine(con, tmp_path, HOT)
    for t in range(0, 50, 10):
        hot(con, "n1", t)
    step(e, con, at(10))
    assert step(e, con, at(40))["Hot"].state == "firing"
    assert step(e, con, at(85))["Hot"].state == "resolved"
    for t in range(200, 260, 10):
        hot(con, "n1", t)
    a = step(e, con, at(200))["Hot"]
    assert (a.state, a.active_at, a.fired_at, a.resolved_at) == ("pending", at(200), None, None)
    assert step(e, con, at(220))["Hot"].state == "pending"  # 20 s held: for is 30 s
    a = step(e, con, at(230))["Hot"]
    assert (a.state, a.active_at, a.fired_at) == ("firing", at(200), at(230))
    assert not a.notified and not a.sent_resolved  # owed nothing of the first episode


def test_one_instance_per_label_set_however_often_evaluated(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    e = engine(con, tmp_path, """
        groups:
          - name: g
            rules:
              - alert: Seen
                expr: SELECT node FROM heartbeats WHERE ts <= eval_time()
    """)
    for t in (0, 1, 2):
        insert(con, "heartbeats", ts=at(t), node="n1", seq=t + 1)
    insert(con, "heartbeats", ts=at(0), node="n2", seq=1)
    first = step(e, con, at(5))
    assert len(first) == 2 and all(a.state == "firing" for a in first.values())  # for: 0 fires at once
    again = step(e, con, at(20))
    assert {a.fingerprint for a in again.values()} == {a.fingerprint for a in first.values()}
    assert all(a.fired_at == at(5) and a.value == 1 for a in again.values())


def test_a_rule_failing_at_run_time_is_unhealthy_and_the_others_go_on(con: duckdb.DuckDBPyConnection,
                                                                      tmp_path: Path) -> None:
    e = engine(con, tmp_path, HOT + """
      - alert: Seen
        expr: SELECT node FROM heartbeats WHERE ts <= eval_time()
""".replace("\n      -", "\n      -"))
    for t in range(0, 50, 10):
        hot(con, "n1", t)
    insert(con, "heartbeats", ts=at(0), node="n1", seq=1)
    step(e, con, at(10))
    assert step(e, con, at(40))["Hot"].state == "firing"
    # the rule's column goes (GPU samples are a view over their stored table)
    con.execute("CREATE OR REPLACE VIEW gpu_samples AS SELECT * EXCLUDE (temp_celsius) FROM gpu_samples_packed")
    insert(con, "heartbeats", ts=at(45), node="n2", seq=1)
    alerts_ = step(e, con, at(50))
    h = e.health["g/Hot"]
    assert h.health == "error" and "temp_celsius" in (h.last_error or "")
    assert alerts_["Hot"].state == "firing" and alerts_["Hot"].fired_at == at(40)  # left as it was
    assert e.health["g/Seen"].health == "ok"
    assert {a.labels["node"] for a in e.snapshot() if a.rule == "g/Seen"} == {"n1", "n2"}


def test_state_survives_a_restart_with_its_start_time(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    e = engine(con, tmp_path, HOT)
    for t in range(0, 120, 10):
        hot(con, "n1", t)
    step(e, con, at(10))
    step(e, con, at(40))
    for g in e.groups:
        e.save(con, g, at(40))
    stored = con.execute("SELECT state, fired_at FROM alerts").fetchall()
    assert stored == [("firing", at(40))]
    # a new process: rules loaded again, state read back
    e2 = engine(con, tmp_path, HOT)
    assert e2.restore(con) == 1
    a = step(e2, con, at(60))["Hot"]
    assert (a.state, a.active_at, a.fired_at) == ("firing", at(10), at(40))
    for g in e2.groups:
        e2.save(con, g, at(60))
    assert con.execute("SELECT rule, health, instances FROM alert_rules").fetchall() == [("g/Hot", "ok", 1)]


INHIBIT = """
groups:
  - name: g
    rules:
      - alert: Idle
        expr: SELECT node, coalesce(job, '') AS job FROM gpu_samples
              WHERE util_gpu_ratio < 0.05 AND ts > eval_time() - INTERVAL 1 MINUTE AND ts <= eval_time() GROUP BY ALL
        inhibit_on_revocation: true
      - alert: IdleNotInhibited
        expr: SELECT node FROM gpu_samples WHERE util_gpu_ratio < 0.05 AND ts > eval_time() - INTERVAL 1 MINUTE
              AND ts <= eval_time() GROUP BY ALL
"""


def test_revoked_node_and_its_job_are_inhibited_for_the_window(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    import datetime as dt

    e = engine(con, tmp_path, INHIBIT, inhibit_window=600)
    boot = at(0).replace(tzinfo=dt.timezone.utc).timestamp()
    for n in ("n1", "n2"):
        insert(con, "nodes", node=n, role="worker", job="j", first_seen=at(0), last_seen=at(100))
        insert(con, "lifecycle_events", ts=at(1), node=n, job="j", event="agent_start", boot_time=boot,
               interval_seconds=10.0, instance="i")
        insert(con, "heartbeats", ts=at(100), node=n, job="j", seq=10)
        insert(con, "gpu_samples", ts=at(100), node=n, job="j", **{"index": 0}, uuid=f"G-{n}", util_gpu_ratio=0.0)
    insert(con, "revocations", ts=at(90), node="n1", job="j", cloud="gce", kind="preemption", revokes=True,
           boot_time=boot)
    step(e, con, at(110))
    idle = {a.labels["node"]: a for a in e.snapshot() if a.rule == "g/Idle"}
    assert idle["n1"].state == "inhibited" and idle["n1"].inhibited_by.startswith("revocation of n1 at ")
    assert idle["n2"].state == "inhibited"  # the same job as the revoked node
    assert all(a.state == "firing" for a in e.snapshot() if a.rule == "g/IdleNotInhibited")
    # after the window the inhibition lifts
    for n in ("n1", "n2"):
        insert(con, "gpu_samples", ts=at(800), node=n, job="j", **{"index": 0}, uuid=f"G-{n}", util_gpu_ratio=0.0)
    step(e, con, at(810))
    assert {a.state for a in e.snapshot() if a.rule == "g/Idle"} == {"firing"}


def test_rendering_and_fingerprints() -> None:
    assert alerts.render('{{ $labels.a }}/{{$value}}/{{ printf "%.3f" $value }}', {"a": "x"}, 1.5) == "x/1.5/1.500"
    r = alerts.Rule("A", "g", "f")
    assert alerts.fingerprint(r, {"a": "1", "b": "2"}) == alerts.fingerprint(r, {"b": "2", "a": "1"})
    assert alerts.fingerprint(r, {"a": "1"}) != alerts.fingerprint(alerts.Rule("B", "g", "f"), {"a": "1"})


def test_a_restart_restores_every_field_of_every_alert_and_skips_rules_no_longer_loaded(
        con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    import dataclasses
    import datetime as dt

    e = engine(con, tmp_path, HOT)
    for t in range(0, 50, 10):
        hot(con, "n1", t)
        hot(con, "n2", t, temp=95.5)
    step(e, con, at(10))
    step(e, con, at(40))
    step(e, con, at(60))  # still seen (its window reaches back to 40): last_seen after fired_at
    a = e.alerts[next(k for k in e.alerts if "n2" in e.alerts[k].labels.values())]
    a.state, a.inhibited_by, a.last_sent, a.notified = "inhibited", "revocation of n2 at x", at(41), True
    step(e, con, at(85))  # n1 and n2 resolve (n2 from inhibited)
    for key in list(e.alerts)[:1]:
        e.alerts[key].sent_resolved = True
    for g in e.groups:
        e.save(con, g, at(85))
    # an alert of a rule no longer in the files, sorted before the others
    con.execute("INSERT INTO alerts SELECT 'a-gone/Old', fingerprint, labels, annotations, state, value, active_at, "
                "fired_at, last_seen, resolved_at, last_sent, sent_resolved, inhibited_by, updated_at, notified "
                "FROM alerts LIMIT 1")
    e2 = engine(con, tmp_path, HOT)
    assert e2.restore(con) == 2
    assert {k: dataclasses.asdict(v) for k, v in e2.alerts.items()} == {
        k: dataclasses.asdict(v) for k, v in e.alerts.items()}
    assert {a.value for a in e2.alerts.values()} == {90.0, 95.5}
    assert all(isinstance(a.resolved_at, dt.datetime) for a in e2.alerts.values())


def test_an_undelivered_resolution_is_kept_one_day_at_most(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    import datetime as dt

    e = engine(con, tmp_path, HOT)
    e.receivers.append(object())  # a receiver that never takes it
    for t in range(0, 50, 10):
        hot(con, "n1", t)
    step(e, con, at(10))
    step(e, con, at(40)).get("Hot").notified = True
    assert step(e, con, at(85))["Hot"].state == "resolved"
    day = 85 + 86400
    assert step(e, con, at(day))["Hot"].state == "resolved"  # a day exactly: still owed
    assert step(e, con, at(day) + dt.timedelta(seconds=0.5)) == {}


def test_retention_edges_timings_and_error_texts(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    e = engine(con, tmp_path, HOT + """
      - alert: Broken
        expr: SELECT node, 1 / 0 AS value, error('boom at ' || node) AS x FROM gpu_samples
""")
    for t in range(0, 50, 10):
        hot(con, "n1", t)
    step(e, con, at(10))
    step(e, con, at(40))
    assert step(e, con, at(85))["Hot"].state == "resolved"
    assert step(e, con, at(85 + 900))["Hot"].state == "resolved"  # 15 minutes exactly: still kept
    h = e.health["g/Broken"]
    assert (h.health, h.last_error) == ("error", "expr failed: Invalid Input Error: boom at n1")
    ok = e.health["g/Hot"]
    assert 0 <= ok.eval_seconds < 10 and 0 <= h.eval_seconds < 10


def test_a_late_delivery_of_an_earlier_episode_does_not_count_for_the_current_one(con: duckdb.DuckDBPyConnection,
                                                                                  tmp_path: Path) -> None:
    e = engine(con, tmp_path, HOT)
    r = type("R", (), {"resolved_sent": set()})()
    e.receivers.append(r)
    for t in list(range(0, 50, 10)) + list(range(200, 260, 10)):
        hot(con, "n1", t)
    step(e, con, at(10))
    first = step(e, con, at(40))["Hot"].fired_at
    step(e, con, at(85))
    step(e, con, at(200))
    a = step(e, con, at(230))["Hot"]
    key = (a.rule, a.fingerprint)
    assert a.fired_at != first
    r.resolved_sent.add((key, first))
    e.delivered([(key, first, True), (key, a.fired_at, False)], at(231))  # the old one's first
    assert a.last_sent == at(231) and not a.sent_resolved  # only the current episode's delivery counted


TWO = """
groups:
  - name: g
    interval: 10s
    rules:
      - alert: A
        expr: SELECT 'a' AS k, 1 AS value
      - alert: B
        expr: SELECT node, 1 AS value FROM heartbeats WHERE ts > eval_time() - INTERVAL 30 SECOND AND ts <= eval_time()
"""


def test_one_rule_clearing_resolves_its_alerts_whatever_the_others_hold(con: duckdb.DuckDBPyConnection,
                                                                        tmp_path: Path) -> None:
    e = engine(con, tmp_path, TWO)
    insert(con, "heartbeats", ts=at(0), node="n1", seq=1)
    assert {a.labels["alertname"]: a.state for a in e.snapshot() or []} == {}
    got = step(e, con, at(10))
    assert {k: v.state for k, v in got.items()} == {"A": "firing", "B": "firing"}
    got = step(e, con, at(60))  # B's heartbeat is older than 30 s now; A's alert comes first
    assert {k: v.state for k, v in got.items()} == {"A": "firing", "B": "resolved"}


def test_inhibition_follows_each_nodes_own_revocation(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    """Two revoked nodes: one revoked long ago (its inhibition lifts) while another's is
    recent (inhibited), and a window that ends exactly at the notice still counts."""
    import datetime as dt

    e = engine(con, tmp_path, INHIBIT, inhibit_window=600)
    boot = at(0).replace(tzinfo=dt.timezone.utc).timestamp()
    for n, job in (("n1", "j1"), ("n3", "j3")):
        insert(con, "nodes", node=n, role="worker", job=job, first_seen=at(0), last_seen=at(900))
        insert(con, "lifecycle_events", ts=at(1), node=n, job=job, event="agent_start", boot_time=boot,
               interval_seconds=10.0, instance=f"i-{n}")
        insert(con, "heartbeats", ts=at(100), node=n, job=job, seq=10)
    insert(con, "revocations", ts=at(90), node="n1", job="j1", cloud="gce", kind="preemption", revokes=True,
           boot_time=boot)
    for n, job in (("n1", "j1"), ("n3", "j3")):
        insert(con, "gpu_samples", ts=at(100), node=n, job=job, **{"index": 0}, uuid=f"G-{n}", util_gpu_ratio=0.0)
    step(e, con, at(110))
    assert {a.labels["node"]: a.state for a in e.snapshot() if a.rule == "g/Idle"} == {"n1": "inhibited",
                                                                                       "n3": "firing"}
    insert(con, "revocations", ts=at(650), node="n3", job="j3", cloud="gce", kind="preemption", revokes=True,
           boot_time=boot)
    for n, job in (("n1", "j1"), ("n3", "j3")):
        insert(con, "gpu_samples", ts=at(690), node=n, job=job, **{"index": 0}, uuid=f"G-{n}", util_gpu_ratio=0.0)
    step(e, con, at(690))  # n1's notice 600 s ago exactly: still inhibited
    assert {a.labels["node"]: a.state for a in e.snapshot() if a.rule == "g/Idle"} == {"n1": "inhibited",
                                                                                       "n3": "inhibited"}
    step(e, con, at(700))  # n1's notice is past the window; n3's is recent
    assert {a.labels["node"]: a.state for a in e.snapshot() if a.rule == "g/Idle"} == {"n1": "firing",
                                                                                       "n3": "inhibited"}


def test_documented_defaults_and_a_zero_value_survive(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    """docs/alerts.md: a rule's query may run 30 s; --inhibit-window defaults to 30 minutes.
    A rule whose value is 0 is restored as 0 (not as "no value")."""
    e = engine(con, tmp_path, ZERO)
    assert (e.rule_timeout, e.inhibit_window, alerts.Engine([]).inhibit_window) == (30.0, 1800.0, 1800.0)
    assert e.health["g/Zero"].instances == 0
    a = step(e, con, at(10))["Zero"]
    assert a.value == 0.0 and a.annotations == {}  # a SQL rule gets no summary of its own
    for g in e.groups:
        e.save(con, g, at(10))
    e2 = engine(con, tmp_path, ZERO)
    e2.restore(con)
    assert [x.value for x in e2.snapshot()] == [0.0]


ZERO = """
groups:
  - name: g
    rules:
      - alert: Zero
        expr: SELECT 'z' AS k, 0 AS value
"""
