"""VM lives, revocations and goodput from a scripted fleet loaded through the collector's
writer into a real database file: each life's end classified, notices with their lead
time and the progress lost since the last checkpoint, and a job's goodput adding up to
its wall time with every category at its scripted value."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many

T0 = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC
BOOT = T0 - 300
_n = [0]


def ev(ts: float, node: str, type_: str, data: dict[str, Any], job: str = "") -> dict[str, Any]:
    _n[0] += 1
    return {
        "v": 1,
        "id": f"e{_n[0]}",
        "ts": ts,
        "node": node,
        "role": "worker",
        "job": job,
        "labels": {},
        "type": type_,
        "data": data,
    }


def life(
    node: str,
    boot: float,
    start: float,
    end: float,
    stop: str | None = None,
    shutdown: bool = False,
    cloud: str = "gce",
    zone: str = "us-central1-a",
) -> list[dict[str, Any]]:
    """A node's agent from ``start`` with heartbeats every 10 s up to ``end``; ``stop``:
    the reason of a clean stop at ``end`` (None: it just goes silent)."""
    out = [
        ev(start, node, "lifecycle", {"event": "agent_start", "boot_time": boot, "interval_seconds": 10.0}),
        ev(
            start + 0.5,
            node,
            "instance",
            {
                "cloud": cloud,
                "region": zone.rsplit("-", 1)[0],
                "zone": zone,
                "instance_id": f"id-{node}",
                "instance_type": "a2-highgpu-1g",
                "spot": True,
                "accelerator": "NVIDIA A100-SXM4-40GB",
                "accelerator_count": 1,
                "boot_time": boot,
            },
        ),
    ]
    t, seq = start + 1, 0
    while t <= end:
        seq += 1
        out.append(ev(t, node, "heartbeat", {"seq": seq, "interval_seconds": 10.0}))
        t += 10
    if stop:
        out.append(
            ev(end + 0.5, node, "lifecycle", {"event": "agent_stop", "stop_reason": stop, "boot_time": boot})
        )
        if shutdown:
            out.append(ev(end + 0.6, node, "lifecycle", {"event": "shutdown", "boot_time": boot}))
    return out


def steps(node: str, run: str, t_from: float, n: int, first_step: int) -> list[dict[str, Any]]:
    """``n`` 10 s step intervals of 100 steps (0.1 s each, 0.02 s of it input wait)."""
    out = []
    for i in range(n):
        out.append(
            ev(
                t_from + 10 * (i + 1),
                node,
                "train_steps",
                {
                    "run": run,
                    "rank": 0,
                    "interval_seconds": 10.0,
                    "steps": 100,
                    "first_step": first_step + 100 * i,
                    "last_step": first_step + 100 * i + 99,
                    "examples": 6400.0,
                    "step_mean_seconds": 0.1,
                    "wait_mean_seconds": 0.02,
                    "steps_per_second": 10.0,
                    "examples_per_second": 640.0,
                },
                job="j1",
            )
        )
    return out


def decl(node: str, run: str, t: float) -> dict[str, Any]:
    return ev(t, node, "train_job", {"run": run, "rank": 0, "world_size": 1, "model": "resnet50"}, job="j1")


def ckpt(node: str, run: str, t: float, action: str, seconds: float, step: int) -> dict[str, Any]:
    return ev(
        t,
        node,
        "train_checkpoint",
        {
            "run": run,
            "rank": 0,
            "action": action,
            "seconds": seconds,
            "step": step,
            "bytes": 10 << 20,
            "ok": True,
        },
        job="j1",
    )


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    now = time.time()
    evs: list[dict[str, Any]] = []
    # revoked: a preemption notice at +600, the OS shuts the agent down at +625
    evs += life("rev-1", BOOT, T0 - 200, T0 + 620, stop="SIGTERM", shutdown=True)
    evs.append(
        ev(
            T0 + 600,
            "rev-1",
            "revocation",
            {
                "cloud": "gce",
                "kind": "preemption",
                "action": "stop",
                "deadline": T0 + 630,
                "lead_seconds": 30.0,
                "notice_id": "gce:preempted",
                "revokes": True,
                "boot_time": BOOT,
            },
        )
    )
    evs += life("stop-1", BOOT, T0 - 200, T0 + 300, stop="SIGTERM")  # stopped by its owner
    evs += life("kill-1", BOOT, T0 - 200, T0 + 200, zone="europe-west4-a")  # SIGKILL: goes silent
    # restarted in the same boot, still running now: one life, alive
    evs += life("restart-1", BOOT, T0 - 200, T0 + 100, stop="SIGTERM")
    evs += life("restart-1", BOOT, now - 60, now - 5)
    # crashed and rebooted: the first life lost, the second alive
    evs += life("reboot-1", BOOT, T0 - 200, T0 + 100)
    evs += life("reboot-1", T0 + 150, now - 60, now - 5)
    # job j1: run r1 on rev-1 (revoked), run r2 on spare-1 restores the step-3000 checkpoint
    evs.append(decl("rev-1", "r1", T0))
    evs += steps("rev-1", "r1", T0 + 20, 30, 1)  # steps 1-3000 in [+20, +320]
    evs.append(ckpt("rev-1", "r1", T0 + 325, "save", 5.0, 3000))
    evs += steps("rev-1", "r1", T0 + 325, 30, 3001)  # steps 3001-6000 in [+325, +625], lost
    evs.append(decl("spare-1", "r2", T0 + 700))
    evs.append(ckpt("spare-1", "r2", T0 + 718, "restore", 8.0, 3000))
    evs += steps("spare-1", "r2", T0 + 720, 15, 3001)  # [+720, +870]
    evs += steps("spare-1", "r2", T0 + 880, 15, 4501)  # an evaluation gap, then [+880, +1030]
    return _store(tmp_path / "fleet.duckdb", evs)


def _store(p: Path, evs: list[dict[str, Any]]) -> Path:
    """The events through the collector's writer into a new database file, none dead."""
    con = connect(p)
    res = Writer(con).write([("fixture", encode_many(evs))])
    assert res.dead == 0, con.execute("SELECT reason FROM dead_letters").fetchall()
    con.close()
    return p


def run(*args: str) -> list[dict[str, Any]]:
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_each_life_ends_with_the_right_classification(db: Path) -> None:
    lives = {(r["node"], r["booted"]): r for r in run("instances", "--db", str(db))}
    by_node: dict[str, list] = {}
    for (node, _), r in sorted(lives.items()):
        by_node.setdefault(node, []).append((r["state"], r["end_reason"]))
    assert by_node == {
        "kill-1": [("ended", "lost")],
        "reboot-1": [("ended", "lost"), ("alive", None)],
        "restart-1": [("alive", None)],
        "rev-1": [("ended", "revoked")],
        "stop-1": [("ended", "stopped")],
    }
    rev = next(r for r in lives.values() if r["node"] == "rev-1")
    assert rev["cloud"] == "gce" and rev["region"] == "us-central1" and rev["spot"] is True
    assert rev["notices"] == 1 and rev["lifetime_h"] == round((T0 + 620.6 - BOOT) / 3600, 3)
    # a life ends at its own last heartbeat (T0 + 91), not at one the next boot sent
    first, second = sorted((r for r in lives.values() if r["node"] == "reboot-1"), key=lambda r: r["booted"])
    assert first["lifetime_h"] == round((T0 + 91 - BOOT) / 3600, 3) and second["state"] == "alive"
    nodes = {r["node"]: r for r in run("nodes", "--db", str(db))}
    assert {n: (r["state"], r["lives"]) for n, r in nodes.items() if n != "spare-1"} == {
        "kill-1": ("lost", 1),
        "reboot-1": ("alive", 2),
        "restart-1": ("alive", 1),
        "rev-1": ("revoked", 1),
        "stop-1": ("stopped", 1),
    }
    assert nodes["rev-1"]["zone"] == "us-central1-a" and nodes["rev-1"]["instance_type"] == "a2-highgpu-1g"
    assert nodes["spare-1"]["state"] == "unknown"  # no agent lifecycle from that node


def test_a_node_silent_only_past_the_collectors_horizon_is_unknown_not_lost(db: Path) -> None:
    """A collector behind (Kafka away, a backlog) holds nothing of the last minutes: a node
    silent only since its horizon is "unknown (collector behind)" on the API and the fleet
    page, as NodeLost judges it; one silent before the horizon is lost all the same."""
    import datetime as dt

    from cmdare.analytics import api
    from cmdare.analytics.db import Database

    d = Database(db)
    state = lambda: {r[0]: r[d_cols.index("state")] for r in t.rows}  # noqa: E731
    t = api.nodes(d)
    d_cols = t.columns
    assert state()["kill-1"] == "lost" and state()["reboot-1"] == "alive"
    # the collector caught up last 30 minutes ago: reboot-1 and restart-1 (heard 5 s ago) are
    # alive as of then; kill-1 was silent long before
    d.horizon = lambda: dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(minutes=30)
    t = api.nodes(d, lost_after=3)
    assert state()["kill-1"] == "lost" and state()["reboot-1"] == "alive"
    # at its horizon the nodes still sent: a node silent after it cannot be judged lost
    t0 = dt.datetime.fromtimestamp(T0 + 150, dt.timezone.utc).replace(tzinfo=None)  # kill-1 sent until +200
    d.horizon = lambda: t0
    t = api.nodes(d)
    assert state()["kill-1"] == "unknown (collector behind)" and state()["stop-1"] == "stopped"
    fleet = api.fleet_summary(d)["nodes"]
    assert fleet["unknown (collector behind)"] == 1 and "lost" not in fleet
    d.horizon = lambda: None  # a file no collector fills: as of now
    t = api.nodes(d)
    assert state()["kill-1"] == "lost"


def test_instances_filters(db: Path) -> None:
    assert {r["node"] for r in run("instances", "--region", "europe", "--db", str(db))} == {"kill-1"}
    assert len(run("instances", "--gpu-type", "a100", "--db", str(db))) == 6  # every life
    assert run("instances", "--gpu-type", "v100", "--db", str(db)) == []


def test_lost_after_is_configurable(db: Path, monkeypatch) -> None:
    # reboot-1 and restart-1 last sent a heartbeat about 5 s ago: with a 10 s interval they
    # are lost only if 0.4 intervals of silence are enough
    r = CliRunner().invoke(cli, ["nodes", "--lost-after", "0.4", "--db", str(db)])
    assert r.exit_code != 0 and "--lost-after" in r.output  # at least one interval
    monkeypatch.setenv("CMDARE_LOST_AFTER", "1")
    assert {r["node"]: r["state"] for r in run("nodes", "--db", str(db))}["restart-1"] == "alive"


def test_revocations_with_lead_time_and_progress_lost(db: Path) -> None:
    (r,) = run("revocations", "--db", str(db))
    assert (r["node"], r["kind"], r["revokes"], r["lead_s"], r["end_reason"]) == (
        "rev-1",
        "preemption",
        True,
        30.0,
        "revoked",
    )
    assert r["seen_after_notice_s"] == 20.6 and r["region"] == "us-central1"
    assert (r["job"], r["last_step"], r["checkpoint_step"], r["steps_lost"], r["work_lost_s"]) == (
        "j1",
        6000,
        3000,
        3000,
        300.0,
    )
    assert run("revocations", "--gpu-type", "v100", "--db", str(db)) == []
    assert len(run("revocations", "--region", "us-central1", "--gpu-type", "A100", "--db", str(db))) == 1
    assert run("revocations", "--since", "1h", "--db", str(db)) == []


def test_goodput_adds_up_to_the_wall_time(db: Path) -> None:
    got = {r["category"]: r["seconds"] for r in run("goodput", "--job", "j1", "--db", str(db))}
    assert got == {
        "productive": 480.0,  # 60 step intervals x 10 s x 80 %, minus the 30 redone ones
        "input_wait": 120.0,
        "communication": 0.0,  # (a job that reports none)
        "startup": 20.0,  # r1: declared at +0, first step at +20
        "checkpoint_save": 5.0,
        "checkpoint_restore": 8.0,
        # r1's steps after the step-3000 save (+325..+625, redone by r2) and from the end of
        # r1 to r2's first step (+625..+720) less the restore: 300 + 95 - 8
        "revocation": 387.0,
        "other": 10.0,  # r2's evaluation gap
        # one accelerator (world size 1), no finding: nothing else
        "ps_wait": 0.0, "straggler": 0.0, "idle_accelerators": 0.0,
        "total": 1030.0,
    }
    parts = sum(v for k, v in got.items() if k != "total")
    assert parts == pytest.approx(got["total"], abs=1e-6)


def test_goodput_in_a_window_is_the_part_of_the_run_inside_it_and_windows_add_up(db: Path) -> None:
    """The fleet page's "goodput of the last 24 h": a window cuts the same pieces at its
    edges. Two windows split at any instant add up to the whole run, category by category."""
    import datetime as dt

    from cmdare.analytics import api
    from cmdare.analytics.db import Database

    whole = {r[0]: r[1] for r in api.goodput(Database(db), "j1").rows}

    def at(x: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(x, dt.timezone.utc).replace(tzinfo=None)

    for cut in (T0 + 10, T0 + 322.5, T0 + 650, T0 + 875):  # in start-up, a save, the lost work, the gap
        a = {r[0]: r[1] for r in api.goodput(Database(db), "j1", None, at(cut)).rows}
        b = {r[0]: r[1] for r in api.goodput(Database(db), "j1", at(cut), None).rows}
        assert a["total"] == pytest.approx(cut - T0) and b["total"] == pytest.approx(T0 + 1030 - cut)
        for k in whole:
            assert a[k] + b[k] == pytest.approx(whole[k], abs=2e-3), (cut, k)
    inside = {r["category"]: r["seconds"] for r in run("goodput", "--job", "j1", "--db", str(db), "--until",
                                                            at(T0 + 320).isoformat())}
    assert inside == {"productive": 240.0, "input_wait": 60.0, "communication": 0.0, "startup": 20.0, "checkpoint_save": 0.0,
                      "checkpoint_restore": 0.0, "revocation": 0.0, "other": 0.0, "ps_wait": 0.0, "straggler": 0.0,
                      "idle_accelerators": 0.0, "total": 320.0}
    nothing = api.goodput(Database(db), "j1", at(T0 + 5000), None)
    assert {r[0]: r[1] for r in nothing.rows}["total"] == 0 and all(r[3] is None for r in nothing.rows)


def test_a_restarted_jobs_throughput_is_not_summed_over_its_runs(db: Path, tmp_path: Path) -> None:
    (j,) = run("jobs", "--db", str(db))
    # r1 then r2 (after the revocation), one rank each at 640 examples/s: one at a time
    assert (j["runs"], j["ranks"], j["steps_per_s"], j["examples_per_s"]) == (2, 2, 10.0, 640.0)

    # two ranks stepping side by side (or two TensorBoard worker dirs imported as runs) add up
    other = tmp_path / "side.duckdb"
    con = connect(other)
    evs = steps("w-1", "r1", T0, 5, 1) + steps("w-2", "r1", T0, 5, 1)
    for e in evs[5:]:
        e["data"]["rank"] = 1
    Writer(con).write([("side", encode_many(evs))])
    con.close()
    (j,) = run("jobs", "--db", str(other))
    assert (j["runs"], j["ranks"], j["nodes"], j["examples_per_s"]) == (1, 2, 2, 1280.0)
    assert run("jobs", "--db", str(other), "--since", "100000d") == [j]


def test_goodput_of_an_unknown_job_is_a_one_line_error(db: Path) -> None:
    r = CliRunner().invoke(cli, ["goodput", "--job", "nope", "--db", str(db)])
    assert r.exit_code == 1 and r.output.strip() == "Error: no steps for job 'nope' (jobs with steps: j1)"


def test_overhead_fit_measures_resume_after_the_revocation_and_the_restart(db: Path) -> None:
    out = run("fit", "overhead", "--db", str(db))
    assert out["resume_after_revocation_seconds"]["mean"] == pytest.approx(120.0)  # notice +600 -> step +720
    assert out["resume_after_restart_seconds"]["mean"] == pytest.approx(95.0)  # r1 ends +625, r2 steps +720
    assert any("checkpoint save: needs at least 5 saves" in n and "analyze import checkpoints" in n for n in out["notes"])


def _three_runs(tmp_path: Path, saves: list[dict[str, Any]], notice: float = 295.0) -> Path:
    """Job j1 as three runs: ra on a-2 (steps 1-1000 in [+20, +120], not hit), rb on b-2
    (declared +150, steps numbered from 0 in [+200, +300]; the notice at +295) and rc on
    c-2, resuming at +300, the instant rb's last interval ended."""
    return _store(tmp_path / "runs.duckdb", _events_of_three_runs(saves, notice))


def _events_of_three_runs(saves: list[dict[str, Any]], notice: float = 295.0) -> list[dict[str, Any]]:
    evs = life("a-2", BOOT, T0 - 200, T0 + 400, stop="SIGTERM")
    evs += life("b-2", BOOT, T0 - 200, T0 + 300, stop="SIGTERM", shutdown=True)
    evs += life("c-2", BOOT, T0 + 250, T0 + 400, stop="SIGTERM")
    evs.append(ev(T0 + notice, "b-2", "revocation", {"cloud": "gce", "kind": "preemption", "action": "stop",
                                                     "deadline": T0 + notice + 30, "lead_seconds": 30.0,
                                                  "notice_id": "gce:preempted", "revokes": True, "boot_time": BOOT}))
    evs += [decl("a-2", "ra", T0), *steps("a-2", "ra", T0 + 20, 10, 1)]
    evs += [decl("b-2", "rb", T0 + 150), *steps("b-2", "rb", T0 + 200, 10, 0), *saves]
    evs += [decl("c-2", "rc", T0 + 300), *steps("c-2", "rc", T0 + 300, 5, 0)]
    return evs


def _goodput(p: Path) -> dict[str, float]:
    return {r["category"]: r["seconds"] for r in run("goodput", "--job", "j1", "--db", str(p))}


def test_a_revocation_of_the_second_of_three_runs_costs_that_runs_steps_and_nothing_after_the_resume(
        tmp_path: Path) -> None:
    """No good save: every step of the hit run is redone, its first (step 0) too; the
    resume is the next run's first instant even when it is the hit run's last; the run
    before it, on another node, loses nothing."""
    got = _goodput(_three_runs(tmp_path, []))
    assert got["revocation"] == pytest.approx(100.0, abs=1e-6)  # rb's [+200, +300]
    assert got["productive"] == pytest.approx(80.0 + 40.0, abs=1e-6)  # ra and rc, 80 % of their steps
    assert got["input_wait"] == pytest.approx(20.0 + 10.0, abs=1e-6)
    assert got["startup"] == pytest.approx(20.0 + 50.0, abs=1e-6)  # ra +0..+20, rb +150..+200
    assert got["total"] == pytest.approx(350.0, abs=1e-6)


def test_a_save_at_the_hit_runs_last_instant_counts_and_a_save_without_a_step_is_ignored(
        tmp_path: Path) -> None:
    """rb saved step 49 (2 s, ending at +300, its last instant): steps 50-999 are redone, half
    of its first interval is kept; a save that names no step says nothing of what is lost."""
    stepless = ckpt("b-2", "rb", T0 + 250, "save", 1.0, 0)
    del stepless["data"]["step"]
    got = _goodput(_three_runs(tmp_path, [stepless, ckpt("b-2", "rb", T0 + 300, "save", 2.0, 49)]))
    assert got["checkpoint_save"] == pytest.approx(3.0, abs=1e-6)
    # [+205, +300] redone, less the saves' 3 s
    assert got["revocation"] == pytest.approx(92.0, abs=1e-6)
    assert got["total"] == pytest.approx(350.0, abs=1e-6)


def test_a_steps_record_numbering_more_steps_than_it_counts_loses_no_more_than_its_own_interval(
        tmp_path: Path) -> None:
    """A broken client: rb's first record counts 50 steps (5 s of its 10 s interval) but
    numbers 0-99. What is redone of it is its own 5 s, never time before it."""
    p = tmp_path / "odd"
    p.mkdir()
    path = _three_runs(p, [])
    con = connect(path)
    con.execute("""UPDATE steps SET steps = 50 WHERE run = 'rb' AND first_step = 0""")
    con.close()
    got = _goodput(path)
    assert got["revocation"] == pytest.approx(95.0, abs=1e-6)  # [+205, +300]
    assert got["total"] == pytest.approx(350.0, abs=1e-6)


@pytest.mark.parametrize("notice", [200.0, 360.0])
def test_a_notice_at_either_edge_of_the_window_still_hits_the_run(tmp_path: Path, notice: float) -> None:
    """A notice at the instant the run began stepping on the node (+200), or NOTICE_WINDOW
    (60 s) after its last step there (+360, after the next run already resumed): the run
    was hit, and its steps are redone; a resume before the notice adds no time."""
    got = _goodput(_three_runs(tmp_path, [], notice=notice))
    assert got["revocation"] == pytest.approx(100.0, abs=1e-6)
    assert got["productive"] == pytest.approx(120.0, abs=1e-6) and got["total"] == pytest.approx(350.0, abs=1e-6)


def test_revoked_jobs_judged_together_lose_what_each_loses_alone(tmp_path: Path) -> None:
    """The fleet's goodput judges every revoked job in one pass: j1 (no save: rb's 100 s
    redone) and j2, the same runs on other nodes with a save at step 49 (93 s), each hit only
    by its own node's notice; together as alone."""
    import copy

    from cmdare.analytics.goodput import goodput, goodput_many

    j1 = _three_runs(tmp_path, [])
    evs2 = []
    for e in _events_of_three_runs([ckpt("b-2", "rb", T0 + 300, "save", 2.0, 49)]):
        e = copy.deepcopy(e)
        e["id"] += "-j2"
        e["node"] += "x"
        if e["job"] == "j1":
            e["job"] = "j2"
        evs2.append(e)
    con = connect(j1)
    assert Writer(con).write([("j2", encode_many(evs2))]).dead == 0
    together = goodput_many(con, None)
    alone = {j: goodput(con, j) for j in ("j1", "j2")}
    con.close()
    assert together["j1"].seconds["revocation"] == pytest.approx(100.0, abs=1e-6)
    assert together["j2"].seconds["revocation"] == pytest.approx(93.0, abs=1e-6)  # [+205, +300] less the 2 s save
    for j in ("j1", "j2"):
        assert together[j].seconds == pytest.approx(alone[j].seconds, abs=1e-9), j
