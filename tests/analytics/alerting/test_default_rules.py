"""The shipped rule pack (analytics/rules/cmdare.yml), one test per rule (docs/alerts.md has
a heading per rule): each fires on the situation it names and stays quiet on its look-alike."""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb

from tests.analytics.alerting.conftest import at, default_engine, insert
from tests.analytics.detectors.conftest import fleet  # noqa: F401  (the simulated fleet fixture)

BOOT = at(0).replace(tzinfo=dt.timezone.utc).timestamp()


def fired(con: duckdb.DuckDBPyConnection, when: list[dt.datetime], inhibit_window: float = 1800) -> dict[str, list[Any]]:
    """alertname -> the firing (or inhibited) alerts after evaluating every group at each time."""
    e = default_engine(con, inhibit_window)
    for t in when:
        for g in e.groups:
            e.eval_group(con, g, t)
    bad = {r: h.last_error for r, h in e.health.items() if h.health == "error"}
    assert not bad, bad
    out: dict[str, list[Any]] = {}
    for a in e.snapshot():
        if a.state in ("firing", "inhibited"):
            out.setdefault(a.labels["alertname"], []).append(a)
    return out


def node_life(con: duckdb.DuckDBPyConnection, node: str, until: float, job: str = "j", stop: bool = False,
              notice: float | None = None) -> None:
    insert(con, "nodes", node=node, role="worker", job=job, first_seen=at(0), last_seen=at(until))
    insert(con, "lifecycle_events", ts=at(1), node=node, job=job, event="agent_start", boot_time=BOOT,
           interval_seconds=10.0, instance="i")
    for t in range(10, int(until) + 1, 10):
        insert(con, "heartbeats", ts=at(t), node=node, job=job, seq=t // 10, spooled_total=t, shipped_total=t,
               dropped_total=0, spool_pending=0)
    if stop:
        insert(con, "lifecycle_events", ts=at(until + 1), node=node, job=job, event="agent_stop", boot_time=BOOT,
               stop_reason="SIGTERM", instance="i")
    if notice is not None:
        insert(con, "revocations", ts=at(notice), node=node, job=job, cloud="gce", kind="preemption",
               revokes=True, boot_time=BOOT, lead_seconds=30.0)


def test_node_lost(con: duckdb.DuckDBPyConnection) -> None:
    node_life(con, "lost-1", 300)  # heartbeats stop, no notice, no clean stop
    node_life(con, "revoked-1", 300, notice=280)  # the cloud said so: not "lost"
    node_life(con, "stopped-1", 300, stop=True)  # stopped cleanly
    node_life(con, "alive-1", 400)
    f = fired(con, [at(400)])
    assert [a.labels["node"] for a in f["NodeLost"]] == ["lost-1"]
    a = f["NodeLost"][0]
    assert a.labels["severity"] == "critical" and a.value == 100
    assert "lost-1 stopped reporting 100 s ago" in a.annotations["summary"]


def test_revocation_notice(con: duckdb.DuckDBPyConnection) -> None:
    node_life(con, "spot-1", 100, notice=95)
    insert(con, "revocations", ts=at(90), node="maint-1", cloud="gce", kind="maintenance", revokes=False)
    f = fired(con, [at(100)])
    [a] = f["RevocationNotice"]
    assert (a.labels["node"], a.labels["kind"], a.labels["cloud"], a.value) == ("spot-1", "preemption", "gce", 30)
    assert fired(con, [at(95 + 700)]).get("RevocationNotice") is None  # 10 minutes later: over


def test_spool_dropping(con: duckdb.DuckDBPyConnection) -> None:
    for t, dropped in ((100, 0), (110, 0), (120, 40)):
        insert(con, "heartbeats", ts=at(t), node="full-1", seq=t, dropped_total=dropped, spool_pending=10)
        insert(con, "heartbeats", ts=at(t), node="fine-1", seq=t, dropped_total=7, spool_pending=10)
    [a] = fired(con, [at(125)])["SpoolDropping"]
    assert a.labels["node"] == "full-1" and a.value == 40


def test_spool_backlog(con: duckdb.DuckDBPyConnection) -> None:
    for t in range(0, 400, 10):
        insert(con, "heartbeats", ts=at(t), node="cut-off-1", seq=t, shipped_total=500, spool_pending=t * 3)
        insert(con, "heartbeats", ts=at(t), node="shipping-1", seq=t, shipped_total=500 + t, spool_pending=5)
        insert(con, "heartbeats", ts=at(t), node="embedded-1", seq=t, shipped_total=0, spool_pending=t)  # no Kafka
    f = fired(con, [at(320), at(390)])  # held for 1 minute
    [a] = f["SpoolBacklog"]
    assert a.labels["node"] == "cut-off-1" and a.value == 390 * 3


def test_gpu_xid_error(con: duckdb.DuckDBPyConnection) -> None:
    insert(con, "gpu_events", ts=at(50), node="g-1", job="j", **{"index": 3}, uuid="GPU-3", kind="xid", xid=79, count=1)
    insert(con, "gpu_events", ts=at(60), node="g-1", job="j", **{"index": 3}, uuid="GPU-3", kind="xid", xid=79, count=1)
    insert(con, "gpu_events", ts=at(60), node="g-1", **{"index": 0}, uuid="GPU-0", kind="ecc_corrected", count=5)
    [a] = fired(con, [at(70)])["GpuXidError"]
    assert (a.labels["gpu"], a.labels["xid"], a.value) == ("3", "79", 2)
    assert a.annotations["summary"] == "GPU 3 on g-1: Xid 79 (2 in 15 minutes)"


def test_dead_letters_rising(con: duckdb.DuckDBPyConnection) -> None:
    assert "DeadLettersRising" not in fired(con, [at(10)])
    for t in (5, 6, 7):
        insert(con, "dead_letters", received_at=at(t), origin="kafka:t/0@1", line=1, reason="not JSON")
    [a] = fired(con, [at(10)])["DeadLettersRising"]
    assert a.value == 3


def steps(con: duckdb.DuckDBPyConnection, job: str, node: str, until: float) -> None:
    for t in range(0, int(until) + 1, 10):
        insert(con, "steps", ts=at(t), node=node, job=job, run="r", rank=0, interval_seconds=10.0, steps=50)


def run_end(con: duckdb.DuckDBPyConnection, job: str, node: str, t: float, state: str, **kw: Any) -> None:
    insert(con, "run_ends", ts=at(t), node=node, job=job, run="r", rank=0, state=state, **kw)


def test_job_stalled(con: duckdb.DuckDBPyConnection) -> None:
    steps(con, "stuck", "s-1", 600)  # steps stop at 600, no end: a stall
    node_life(con, "s-1", 1000, job="stuck")  # its node lives
    steps(con, "running", "r-1", 1000)
    steps(con, "done", "d-1", 600)
    run_end(con, "done", "d-1", 601, "finished")  # ended: not a stall
    steps(con, "old-agent", "o-1", 600)  # no end (an agent before run ends), its node stopped cleanly
    node_life(con, "o-1", 600, job="old-agent", stop=True)
    steps(con, "again", "a-1", 300)
    run_end(con, "again", "a-1", 301, "finished")
    steps(con, "again", "a-1", 650)  # restarted under the same run and rank after its end: stalls again
    f = fired(con, [at(1000)])
    assert sorted((a.labels["job"], a.value) for a in f["JobStalled"]) == [("again", 350), ("stuck", 400)]
    # the collector holds data only up to 920 s (a backlog): "again" stepped within 5 minutes of
    # that and may have stepped since; "stuck" had not
    e = default_engine(con, 1800)
    for g in e.groups:
        e.eval_group(con, g, at(1000), at(920))
    assert [a.labels["job"] for a in e.snapshot() if a.labels["alertname"] == "JobStalled"] == ["stuck"]


def test_job_stalled_leaves_lost_and_revoked_nodes_to_their_own_alerts(con: duckdb.DuckDBPyConnection) -> None:
    steps(con, "on-revoked", "v-1", 600)
    node_life(con, "v-1", 600, job="on-revoked", notice=590)
    steps(con, "on-lost", "l-1", 600)
    node_life(con, "l-1", 600, job="on-lost")
    f = fired(con, [at(1000)])
    assert "JobStalled" not in f and [a.labels["node"] for a in f["NodeLost"]] == ["l-1"]
    # before the node's silence ends its life, the stall is inhibited by the notice
    steps(con, "early", "e-1", 300)
    node_life(con, "e-1", 700, job="early", notice=690)
    [a] = fired(con, [at(700)])["JobStalled"]
    assert a.state == "inhibited" and "revocation of e-1" in (a.inhibited_by or "")


def test_job_crashed(con: duckdb.DuckDBPyConnection) -> None:
    steps(con, "oom", "c-1", 600)
    run_end(con, "oom", "c-1", 610, "crashed", steps=3000, pid=4242)
    steps(con, "fine", "c-2", 600)
    run_end(con, "fine", "c-2", 610, "finished")
    f = fired(con, [at(700)])
    [a] = f["JobCrashed"]
    assert (a.labels["job"], a.labels["run"], a.value, a.labels["severity"]) == ("oom", "r", 1, "critical")
    assert "JobStalled" not in f and "JobFailed" not in f
    assert "JobCrashed" not in fired(con, [at(610 + 901)])  # 15 minutes later: over
    # the same process's own end at the same time wins over the agent's verdict
    run_end(con, "oom", "c-1", 610, "finished", pid=4242)
    assert "JobCrashed" not in fired(con, [at(700)])


def test_job_failed(con: duckdb.DuckDBPyConnection) -> None:
    steps(con, "nan", "f-1", 600)
    run_end(con, "nan", "f-1", 605, "failed", error="FloatingPointError: loss is nan")
    steps(con, "exit3", "f-2", 600)
    run_end(con, "exit3", "f-2", 605, "failed", exit_code=3)
    steps(con, "stopped", "f-3", 600)
    run_end(con, "stopped", "f-3", 605, "interrupted", signal="SIGINT")  # someone stopped it: no page
    f = fired(con, [at(700)])
    got = sorted((a.labels["job"], a.labels["reason"], a.value) for a in f["JobFailed"])
    assert got == [("exit3", "exit code 3", 1), ("nan", "FloatingPointError: loss is nan", 1)]
    assert "loss is nan" in [a for a in f["JobFailed"] if a.labels["job"] == "nan"][0].annotations["summary"]
    assert not {"JobStalled", "JobCrashed"} & set(f)


def last_step(con: duckdb.DuckDBPyConnection, job: str) -> dt.datetime:
    return con.execute("SELECT max(ts) FROM steps WHERE job = ?", [job]).fetchone()[0]


def test_gpu_throttled(fleet) -> None:  # noqa: F811
    con, _ = fleet(lambda s: (s.sim_job(kind="hot", nodes=2, gpus=2, throttled_node=0, throttle_share=1.0),
                              s.sim_job(kind="cool", nodes=2, gpus=2)))
    end = max(last_step(con, "sim-hot-1"), last_step(con, "sim-cool-2"))
    f = fired(con, [end - dt.timedelta(minutes=5), end])
    assert {a.labels["job"] for a in f["GpuThrottled"]} == {"sim-hot-1"}
    assert f["GpuThrottled"][0].annotations["summary"]  # the finding's summary


def test_gpu_idle_while_job_runs(fleet) -> None:  # noqa: F811
    con, _ = fleet(lambda s: (s.sim_job(kind="idle", nodes=2, gpus=4, idle=((1, 2), (1, 3))),
                              s.sim_job(kind="busy", nodes=2, gpus=2)))
    end = last_step(con, "sim-idle-1")
    f = fired(con, [end - dt.timedelta(minutes=5), end])
    [a] = f["GpuIdleWhileJobRuns"]
    assert (a.labels["job"], a.labels["node"], a.labels["subject"]) == ("sim-idle-1", "sim-idle-1-n1", "2,3")


def test_input_bound(fleet) -> None:  # noqa: F811
    con, _ = fleet(lambda s: (s.sim_job(kind="starved", wait=0.45, util=0.3, cpu=0.95), s.sim_job(kind="fed")))
    end = last_step(con, "sim-starved-1")
    f = fired(con, [end - dt.timedelta(minutes=5), end])
    assert {a.labels["job"] for a in f["InputBound"]} == {"sim-starved-1"}
    # the job stops stepping: the window still holds its telemetry, but the cause has ended
    f = fired(con, [end - dt.timedelta(minutes=5), end, end + dt.timedelta(minutes=3)])
    assert "InputBound" not in f
    # the job said it finished at its last step: at once, nothing more about it
    ranks = con.execute("SELECT DISTINCT rank, node FROM steps WHERE job = 'sim-starved-1'").fetchall()
    for rank, node in ranks[1:]:
        insert(con, "run_ends", ts=end, node=node, job="sim-starved-1", run="r1", rank=rank, state="finished")
    assert "InputBound" in fired(con, [end - dt.timedelta(minutes=5), end])  # one rank still runs
    rank, node = ranks[0]
    insert(con, "run_ends", ts=end, node=node, job="sim-starved-1", run="r1", rank=rank, state="finished")
    assert "InputBound" not in fired(con, [end - dt.timedelta(minutes=5), end])


def test_ps_bound(fleet) -> None:  # noqa: F811
    con, s = fleet(lambda s: s.ps_family(saturating=True, ps_agent=True))
    expected = {j for j, lab in s.labels.items() if "ps_bound" in lab}
    end = con.execute("SELECT max(ts) FROM steps").fetchone()[0]
    f = fired(con, [end - dt.timedelta(minutes=5), end])
    got = {a.labels["job"] for a in f.get("PsBound", [])}
    assert got and got <= expected


def test_comm_bound(con: duckdb.DuckDBPyConnection) -> None:
    """A DDP job whose steps wait 40 % on the all-reduce fires; one whose communication
    hides (5 %) does not; once the job stops stepping, the alert ends."""
    for job, comm in (("ddp-slow-link", 0.4), ("ddp-hidden", 0.05)):
        for rank in range(2):
            for t in range(10, 901, 10):
                insert(con, "steps", ts=at(t), node=f"{job}-n{rank}", job=job, run="r", rank=rank,
                       interval_seconds=10.0, steps=10, step_mean_seconds=1.0, comm_mean_seconds=comm,
                       comm_share_ratio=comm)
    f = fired(con, [at(600), at(900)])
    assert [a.labels["job"] for a in f["CommBound"]] == ["ddp-slow-link"]
    assert "40 % of each step waits on communication" in f["CommBound"][0].annotations["summary"]
    assert "CommBound" not in fired(con, [at(600), at(900), at(900 + 20 * 60)])


def test_straggler(fleet) -> None:  # noqa: F811
    con, _ = fleet(lambda s: (s.sim_job(kind="persistent", nodes=5, gpus=1, slow_rank=3, slow=1.8, slow_cpu=True),
                              s.sim_job(kind="even", nodes=6, gpus=1, rank_spread=0.03)))
    end = last_step(con, "sim-persistent-1")
    f = fired(con, [end - dt.timedelta(minutes=5), end])
    [a] = f["Straggler"]
    assert a.labels["job"] == "sim-persistent-1" and a.labels["rank"] == "3"


def _fired_with_horizon(con: duckdb.DuckDBPyConnection, t: dt.datetime, horizon: dt.datetime | None) -> dict:
    e = default_engine(con, 1800)
    for g in e.groups:
        e.eval_group(con, g, t, horizon)
    return {a.labels["alertname"]: a for a in e.snapshot() if a.state == "firing"}


def _fired_lagging(con: duckdb.DuckDBPyConnection, t: dt.datetime, horizon: dt.datetime | None,
                   lag: float) -> dict:
    e = default_engine(con, 1800)
    for g in e.groups:
        e.eval_group(con, g, t, horizon, lag)
    return {a.labels["alertname"]: a for a in e.snapshot() if a.state == "firing"}


def test_collector_behind(con: duckdb.DuckDBPyConnection) -> None:
    # every node sent until 300 s; the collector has had unread input for 100 s (a Kafka
    # outage or a restart) and holds data only up to 300 s: at 400 s no node is judged lost,
    # one alert says the collector is behind
    for i in range(20):
        node_life(con, f"n{i}", 300)
    f = _fired_lagging(con, at(400), at(300), 100)
    assert "NodeLost" not in f
    a = f["CollectorBehind"]
    assert a.value == 100 and a.labels["subject"] == "ingest" and "100 s" in a.annotations["summary"]
    assert "CollectorBehind" not in _fired_lagging(con, at(400), at(300), 30)  # within 30 s
    # caught up (nothing unread) and the nodes really went silent: they are lost, and the
    # collector is not behind
    f = _fired_lagging(con, at(400), at(400), 0)
    assert "CollectorBehind" not in f and "NodeLost" in f


def test_collector_behind_is_unread_input_not_old_events(con: duckdb.DuckDBPyConnection) -> None:
    # a spool read to its end whose newest event is 25 minutes old (the agent stopped): the
    # horizon still waits at the newest heartbeat (a restart's grace), nothing is unread
    node_life(con, "gone", 300, stop=True)
    f = _fired_lagging(con, at(1800), at(300), 1.0)
    assert "CollectorBehind" not in f and "NodeLost" not in f




def test_gpu_idle_while_a_kubernetes_pod_holds_them_with_no_track(tmp_path) -> None:
    """Issue 55: the rule pack works on pods that never call track: the idle pod's GPUs page
    as its job's (its namespace/pod), the busy pod beside it does not."""
    from cmdare.collector.db import connect
    from tests.analytics.detectors.conftest import T0
    from tests.analytics.test_kubernetes_jobs import EVERY, TICKS, node

    con = connect(node(tmp_path))
    end = dt.datetime.fromtimestamp(T0 + (TICKS - 1) * EVERY, dt.timezone.utc).replace(tzinfo=None)
    f = fired(con, [end - dt.timedelta(minutes=5), end])
    [a] = f["GpuIdleWhileJobRuns"]
    assert (a.labels["job"], a.labels["node"], a.labels["subject"]) == ("nlp/bert-0", "k8s-n0", "2,3")
    later = [end + dt.timedelta(minutes=10), end + dt.timedelta(minutes=15)]  # the pod gone: its GPUs report no more
    assert "GpuIdleWhileJobRuns" not in fired(con, later)
    con.close()
