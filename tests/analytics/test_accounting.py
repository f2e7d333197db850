"""Accelerator time in closed buckets: exact shares on constructed jobs, dollars by hand,
roll-ups by label, windows that add up, and the simulated fleet's labelled jobs in the
buckets their problems belong to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.analytics.goodput import accounting
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.analytics.test_demo_fleet import demo_db  # noqa: F401  (the simulated fleet, a module fixture)

T0 = 1_790_000_000.0
_n = [0]


def ev(ts: float, node: str, type_: str, data: dict[str, Any], job: str, labels: dict[str, str]) -> dict[str, Any]:
    _n[0] += 1
    return {"v": 1, "id": f"a{_n[0]}", "ts": ts, "node": node, "role": "worker", "job": job, "labels": labels,
            "type": type_, "data": data}


def job(name: str, node: str, itype: str, spot: bool, acc: str, team: str, world: int, t0: float = T0,
        records: int = 36) -> list[dict[str, Any]]:
    """Declared at t0; 10 s step intervals from t0 + 20 to t0 + 20 + 10 * records, 20 % of
    each waiting on input; the node's cloud identity."""
    lab = {"team": team}
    out = [ev(t0 - 5, node, "instance", {"cloud": "gce", "region": "us-central1", "zone": "us-central1-a",
                                         "instance_id": f"id-{node}", "instance_type": itype, "spot": spot,
                                         "accelerator": acc, "accelerator_count": 1, "boot_time": t0 - 60},
              name, lab),
           ev(t0, node, "train_job", {"run": f"{name}-r", "rank": 0, "world_size": world, "model": "m"}, name, lab)]
    for i in range(records):
        out.append(ev(t0 + 30 + 10 * i, node, "train_steps", {
            "run": f"{name}-r", "rank": 0, "interval_seconds": 10.0, "steps": 100, "first_step": 1 + 100 * i,
            "last_step": 100 + 100 * i, "examples": 6400.0, "step_mean_seconds": 0.1, "wait_mean_seconds": 0.02,
            "steps_per_second": 10.0, "examples_per_second": 640.0}, name, lab))
    return out


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("acct") / "a.duckdb"
    events = (job("c1", "n1", "a2-highgpu-1g", True, "NVIDIA A100-SXM4-40GB", "vision", 4)
              + job("c2", "n2", "n1-standard-8", False, "Tesla V100-SXM2-16GB", "speech", 2)
              + job("c3", "n3", "x9-unknown", False, "Tesla V100-SXM2-16GB", "vision", 1))
    con = connect(p)
    Writer(con).write([("t", encode_many(events))])
    con.close()
    return p


def account(con: Any, job: str, found: list) -> accounting.JobAccount:
    return accounting.account_many(con, [job], None, None, {job: found})[job]


def account_of(tmp_path: Path, evs: list[dict[str, Any]], job_: str) -> accounting.JobAccount:
    """``job_``'s account, with no findings, in a database of ``evs`` written by the collector."""
    import duckdb

    p = tmp_path / f"{job_}.duckdb"
    con = connect(p)
    Writer(con).write([("t", encode_many(evs))])
    con.close()
    with duckdb.connect(str(p), read_only=True) as c:
        return account(c, job_, [])


EVIDENCE = [("gpu_idle", {"idle_gpus": 1, "idle_share": 1.0, "in_job": True}),
            ("straggler", {"slowdown": 1.5}), ("ps_bound", {"efficiency": 0.5})]


def test_every_accelerator_second_lands_in_one_bucket_with_exact_shares(db: Path) -> None:
    """4 GPUs x 380 s: start-up 20 s, input wait 20 % of 360 s of steps; the rest split by
    the evidence: a quarter idle, then a third to the straggler (slowdown 1.5), then half to
    the saturated PS: 288 GPU-seconds each."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        a = account(con, "c1", EVIDENCE)
    assert a.gpus == 4 and a.gpus_from == "declared world size"
    want = {"startup": 80.0, "input_wait": 288.0, "idle_accelerators": 288.0, "straggler": 288.0, "ps_wait": 288.0,
            "productive": 288.0}
    for k, v in want.items():
        assert a.seconds[k] == pytest.approx(v, abs=1e-6), k
    assert sum(a.seconds.values()) == pytest.approx(4 * 380.0)
    assert a.seconds["other"] == pytest.approx(0.0, abs=1e-6)
    with duckdb.connect(str(db), read_only=True) as con:
        none = account(con, "c1", [])
    assert none.seconds["productive"] == pytest.approx(1152.0) and none.seconds["ps_wait"] == 0


def test_goodput_in_dollars_matches_a_hand_computation(db: Path) -> None:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        c1 = account(con, "c1", EVIDENCE)
        c2 = account(con, "c2", [])
        c3 = account(con, "c3", [])
    # a2-highgpu-1g spot in us-central1: $1.1016 an hour for its one A100
    assert c1.usd_per_gpu_hour == pytest.approx(1.1016)
    assert c1.dollars() == pytest.approx(4 * 380 / 3600 * 1.1016)
    assert c1.dollars("productive") == pytest.approx(288 / 3600 * 1.1016)
    # n1-standard-8 with one V100 attached, on-demand: the catalogue's n1-standard-8+1xv100 row, $2.86
    assert c2.usd_per_gpu_hour == pytest.approx(2.86)
    assert c2.dollars() == pytest.approx(2 * 380 / 3600 * 2.86)
    assert c3.usd_per_gpu_hour is None and c3.dollars() is None  # never a made-up zero
    cols, rows = accounting.rollup([c1, c2, c3], "team")
    by = {r[0]: dict(zip(cols, r, strict=True)) for r in rows}
    assert by["vision"]["dollars"] == pytest.approx(round(4 * 380 / 3600 * 1.1016, 2))  # c3 unpriced: counted apart
    assert by["vision"]["unpriced_jobs"] == 1 and by["vision"]["jobs"] == 2
    assert by["vision"]["gpu_hours"] == pytest.approx((4 + 1) * 380 / 3600, abs=1e-4)
    bad = 2 * (380 - 288) / 3600 * 2.86  # start-up 20 s + input wait 72 s, on 2 GPUs
    assert by["speech"]["badput_dollars"] == pytest.approx(round(bad, 2))


def test_the_fleet_rolls_up_by_label_region_accelerator_and_job(db: Path) -> None:
    r = CliRunner().invoke(cli, ["goodput", "--fleet", "--by", "team", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    rows = {x["team"]: x for x in json.loads(r.stdout)}
    assert set(rows) == {"vision", "speech"}
    assert "never looked at" not in r.stderr and "price catalogue has no price" in r.stderr  # detected now
    fleet = json.loads(CliRunner().invoke(cli, ["goodput", "--fleet", "--db", str(db), "--json"]).stdout)
    assert len(fleet) == 1 and fleet[0]["jobs"] == 3
    assert fleet[0]["gpu_hours"] == pytest.approx(sum(x["gpu_hours"] for x in rows.values()), abs=1e-3)
    acc = {x["accelerator"] for x in json.loads(CliRunner().invoke(
        cli, ["goodput", "--fleet", "--by", "accelerator", "--db", str(db), "--json"]).stdout)}
    assert acc == {"a100-40gb", "v100"}
    text = CliRunner().invoke(cli, ["goodput", "--fleet", "--by", "job", "--db", str(db)]).stdout
    # the badput buckets that hold anything, in bucket order (start-up included: the range starts with the job)
    assert text.splitlines()[0].split()[:6] == ["job", "jobs", "gpu_hours", "goodput_pct", "startup_gpu_hours",
                                                 "input_wait_gpu_hours"]


def test_windows_add_up_to_the_whole(db: Path) -> None:
    whole = json.loads(CliRunner().invoke(cli, ["goodput", "--job", "c1", "--db", str(db), "--json"]).stdout)
    per = json.loads(CliRunner().invoke(cli, ["goodput", "--job", "c1", "--every", "1m", "--db", str(db),
                                              "--json"]).stdout)
    assert len({x["window"] for x in per}) == 7  # 380 s from T0 (:13:20) to :19:40: 7 windows of a minute
    for k in ("productive", "input_wait", "startup", "total"):
        w = next(x["seconds"] for x in whole if x["category"] == k)
        assert sum(x["seconds"] for x in per if x["category"] == k) == pytest.approx(w, abs=0.01), k


@pytest.mark.parametrize(("args", "message"), [
    (["goodput"], "give --job JOB, or --fleet"),
    (["goodput", "--job", "c1", "--fleet"], "give --job JOB, or --fleet"),
    (["goodput", "--job", "c1", "--by", "team"], "--by goes with --fleet"),
    (["goodput", "--fleet", "--by", "team'); DROP TABLE steps; --"], "a group (job, region, accelerator"),
    (["goodput", "--job", "c1", "--every", "10s"], "goodput windows are at least 1m"),
    (["goodput", "--fleet", "--every", "1m", "--since", "3650d"], "at most 1000"),
])
def test_bad_goodput_requests_get_one_line_errors(db: Path, args: list[str], message: str) -> None:
    r = CliRunner().invoke(cli, [*args, "--db", str(db)])
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output, r.output


def test_the_simulated_fleets_problems_land_in_their_buckets(demo_db: Path) -> None:  # noqa: F811
    def pct(job: str) -> dict[str, float]:
        r = CliRunner().invoke(cli, ["goodput", "--job", job, "--db", str(demo_db), "--json"])
        assert r.exit_code == 0, r.output
        return {x["category"]: x["pct"] for x in json.loads(r.stdout)}

    idle = pct("sim-idle-8")  # 2 of its 4 GPUs idle: half of its step time
    assert idle["idle_accelerators"] == pytest.approx(idle["productive"], abs=0.5) and idle["productive"] < 50
    ps = pct("sim-ps-5")  # at 32 % of linear scaling: two thirds of its step time waits on the PS
    assert 60 < ps["ps_wait"] < 72 and ps["productive"] < 35
    strag = pct("sim-straggler-7")
    assert strag["straggler"] > 10 and strag["ps_wait"] == 0 and strag["idle_accelerators"] == 0
    inp = pct("sim-input-6")
    assert inp["input_wait"] > 40 and inp["ps_wait"] == 0 and inp["idle_accelerators"] == 0
    healthy = pct("sim-healthy-1")
    assert healthy["productive"] > 95


def test_the_fleet_roll_up_through_the_collectors_api_is_the_local_one(db: Path, tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    from tests.analytics.conftest import serving

    served = tmp_path / "served.duckdb"
    with serving(db, served) as url:
        args = ["goodput", "--fleet", "--by", "team", "--db", str(served), "--json"]
        local = CliRunner().invoke(cli, args)
        remote = CliRunner().invoke(cli, args, obj={"server": url})
        assert remote.exit_code == 0 and remote.stdout == local.stdout
        assert "price catalogue has no price" in remote.stderr  # the notes travel too
        one = CliRunner().invoke(cli, ["goodput", "--job", "c1", "--every", "1m", "--db", str(served), "--json"],
                                 obj={"server": url})
        assert one.exit_code == 0 and len(json.loads(one.stdout)) == 7 * 12

        def get(q: str) -> int:
            try:
                with urllib.request.urlopen(f"{url}/api/v1/goodput?{q}", timeout=30) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        assert get("by=team") == 200
        assert get("by=team%27%29%3B%20DROP%20TABLE%20steps") == 422  # a label key is letters, digits, _ . -
        assert get("by=" + "x" * 100) == 422
        assert get("every=1") == 422 and get("every=nan") == 422
        assert get("since=not-a-time") == 422


@pytest.mark.parametrize(("found", "gpus", "want"), [
    ([], 4, {"idle_accelerators": 0.0, "straggler": 0.0, "ps_wait": 0.0}),
    ([("gpu_idle", {"idle_gpus": 2, "idle_share": 1.0, "in_job": False})], 4, {"idle_accelerators": 0.0}),  # not the job's
    ([("gpu_idle", {"idle_gpus": 1})], 4, {"idle_accelerators": 0.25}),  # no share given: idle all along
    ([("gpu_idle", {"idle_gpus": 3, "idle_share": 0.5}), ("gpu_idle", {"idle_gpus": 1, "idle_share": 1.0})], 4,
     {"idle_accelerators": 0.625}),  # two nodes' findings add up
    ([("gpu_idle", {"idle_gpus": 9, "idle_share": 1.0})], 4, {"idle_accelerators": 1.0}),  # never past all of it
    ([("straggler", {"slowdown": 2.0}), ("straggler", {"slowdown": 1.25})], 4, {"straggler": 0.5}),  # the slowest sets the pace
    ([("straggler", {"slowdown": 0.5})], 4, {"straggler": 0.0}),  # a fast rank costs nothing
    ([("straggler", {})], 4, {"straggler": 0.0}),
    ([("ps_bound", {"efficiency": 0.5}), ("ps_bound", {"efficiency": 0.25})], 4, {"ps_wait": 0.75}),
    ([("ps_bound", {"efficiency": 1.4})], 4, {"ps_wait": 0.0}),
    ([("ps_bound", {"efficiency": float("nan")})], 4, {"ps_wait": 0.0}),  # a broken figure costs nothing
    ([("ps_bound", {"efficiency": None})], 4, {"ps_wait": 0.0}),
    ([("gpu_idle", {"idle_gpus": 1, "idle_share": 1.0})], 0, {"idle_accelerators": 0.0}),
])
def test_evidence_shares_are_clamped_and_default_to_nothing(found: list, gpus: int, want: dict) -> None:
    got = accounting.shares(found, gpus)
    for k, v in want.items():
        assert got[k] == pytest.approx(v), k


def test_the_fleet_is_split_by_evidence_by_default_on_a_database_no_one_analysed(demo_db: Path) -> None:  # noqa: F811
    """Issue 51: on a fresh demo database (no analyze bottlenecks, no collector schedule)
    goodput --fleet used to call the idle and PS-bound jobs ~98 % productive; the detectors
    now run on first read for jobs no detector run looked at."""
    def rows(*extra: str) -> tuple[dict[str, dict], str]:
        r = CliRunner().invoke(cli, ["goodput", "--fleet", "--by", "job", "--db", str(demo_db), "--json", *extra])
        assert r.exit_code == 0, r.output
        return {x["job"]: x for x in json.loads(r.stdout)}, r.stderr

    got, said = rows()
    assert got["sim-idle-8"]["goodput_pct"] == pytest.approx(49.0, abs=1.5)
    assert got["sim-ps-5"]["goodput_pct"] == pytest.approx(31.1, abs=1.5) and got["sim-ps-5"]["ps_wait_gpu_hours"] > 0
    assert got["sim-healthy-1"]["goodput_pct"] > 95 and "never looked at" not in said
    plain, said = rows("--no-detect")  # stored findings only: the old answer, and a note that says why
    assert plain["sim-ps-5"]["ps_wait_gpu_hours"] == 0 and plain["sim-idle-8"]["goodput_pct"] > 97
    assert "were never looked at by the detectors" in said


def test_a_job_looked_at_and_found_healthy_is_not_detected_again(demo_db: Path, tmp_path: Path) -> None:  # noqa: F811
    """Coverage, not the absence of findings, says whether the detectors looked: a healthy
    job stores no finding, and is not run again; a job outside what they looked at is."""
    import datetime as dt
    import shutil

    from cmdare.analytics.goodput import accounting
    from cmdare.collector.db import connect

    db = tmp_path / "c.duckdb"
    shutil.copy(demo_db, db)
    con = connect(db)
    try:
        jobs = ["sim-healthy-1", "sim-ps-5"]
        t0, t1 = dt.datetime(2000, 1, 1), dt.datetime(2100, 1, 1)
        assert accounting._uncovered(con, jobs, t0, t1) == jobs
        con.execute("INSERT INTO finding_coverage VALUES ('sim-healthy-1', ['gpu_idle', 'ps_bound', 'straggler'], "
                    "'2000-01-01', '2100-01-01', now())")
        assert accounting._uncovered(con, jobs, t0, t1) == ["sim-ps-5"]
        # a run of some other detector does not cover these three
        con.execute("INSERT INTO finding_coverage VALUES (NULL, ['gpu_errors'], '2000-01-01', '2100-01-01', now())")
        assert accounting._uncovered(con, jobs, t0, t1) == ["sim-ps-5"]
        con.execute("INSERT INTO finding_coverage VALUES (NULL, ['gpu_idle', 'ps_bound', 'straggler', 'x'], "
                    "'2000-01-01', '2000-01-02', now())")  # every job, but long before
        assert accounting._uncovered(con, jobs, t0, t1) == ["sim-ps-5"]
    finally:
        con.close()


def test_a_mixed_job_is_priced_node_by_node_and_counted_by_what_it_stepped_on(tmp_path: Path) -> None:
    """Nodes of one job on different instance types (one without an identity, one in a region
    the catalogue does not list, one of 8 GPUs) average their per-GPU prices; a job that
    declared no world size and sent no GPU samples holds one accelerator per stepping node;
    a gap without telemetry on many GPUs is `other`, times the GPUs."""

    evs = job("m", "n-c", "a2-highgpu-1g", True, "NVIDIA A100-SXM4-40GB", "x", 0, records=10)
    for node, itype, spot, acc, region in (("n-a", None, False, None, None),  # no identity: not priced
                                           ("n-b", "a2-highgpu-1g", True, "NVIDIA A100-SXM4-40GB", "us-central1"),
                                           ("n-d", "a2-highgpu-8g", False, "NVIDIA A100-SXM4-40GB", "us-central1"),
                                           ("n-e", "a2-highgpu-1g", True, "NVIDIA A100-SXM4-40GB", "us-west4")):
        if itype:
            evs.append(ev(T0 - 5, node, "instance", {"cloud": "gce", "region": region, "zone": region + "-a",
                                                     "instance_id": f"id-{node}", "instance_type": itype, "spot": spot,
                                                     "accelerator": acc, "accelerator_count": 8 if "8g" in itype else 1,
                                                     "boot_time": T0 - 60}, "m", {}))
        evs.append(ev(T0 + 30, node, "train_steps", {"run": "m-r", "rank": 1, "interval_seconds": 10.0, "steps": 100,
                                                     "first_step": 1, "last_step": 100, "step_mean_seconds": 0.1,
                                                     "steps_per_second": 10.0}, "m", {}))
    gap = [e for e in evs if not (e["type"] == "train_steps" and e["node"] == "n-c" and 60 < e["ts"] - T0 < 90)]
    a = account_of(tmp_path, gap, "m")
    assert (a.gpus, a.gpus_from) == (5, "stepping nodes")
    assert a.usd_per_gpu_hour == pytest.approx((1.1016 + 1.1016 + 1.1016 + 29.3873 / 8) / 4)
    assert a.evidence["price_from"] == "price catalogue (4 of 4 nodes priced)"  # n-a: no identity, no agent
    # steps 20..120 s with the intervals ending at 70 and 80 missing: 20 s of gap, on 5 GPUs
    assert a.seconds["other"] == pytest.approx(5 * 20.0)
    assert sum(a.seconds.values()) == pytest.approx(5 * 120.0)


def test_stored_findings_split_the_fleet_without_running_a_detector(demo_db: Path, tmp_path: Path) -> None:  # noqa: F811
    import shutil

    db = tmp_path / "stored.duckdb"
    shutil.copy(demo_db, db)
    r = CliRunner().invoke(cli, ["bottlenecks", "--db", str(db)])  # stores the findings
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["goodput", "--fleet", "--by", "job", "--db", str(db), "--json"])
    rows = {x["job"]: x for x in json.loads(r.stdout)}
    assert rows["sim-ps-5"]["ps_wait_gpu_hours"] > 0 and rows["sim-idle-8"]["idle_accelerators_gpu_hours"] > 0
    assert rows["sim-healthy-1"]["ps_wait_gpu_hours"] == 0
    assert "no stored findings" not in r.stderr or "of 11 jobs" in r.stderr  # jobs with no problem store none


@pytest.mark.parametrize(("notice_after_last", "steps_after_notice", "hit"), [
    (59.5, 0, True),   # the run's last step on the node under a minute before the notice: hit
    (60.5, 0, False),  # longer: the notice came to an idle node
    (0, 599.5, True),  # it stepped on there until 10 minutes after the notice: the VM was taken then
    (0, 600.5, False),  # longer: the VM was not taken from it
])
def test_a_notice_counts_against_a_run_at_its_edges(tmp_path: Path, notice_after_last: float, steps_after_notice: float,
                                                     hit: bool) -> None:

    evs = job("v", "nv", "a2-highgpu-1g", True, "NVIDIA A100-SXM4-40GB", "x", 1, records=80)  # last step at T0 + 820
    last = T0 + 820
    # the steps going on past the notice: the notice moved back by as much
    tn = last + notice_after_last if steps_after_notice == 0 else last - steps_after_notice
    evs.append(ev(tn, "nv", "revocation", {"cloud": "gce", "kind": "preemption", "action": "stop", "revokes": True,
                                            "deadline": tn + 30, "lead_seconds": 30.0, "notice_id": "gce:p"}, "v", {}))
    a = account_of(tmp_path, evs, "v")
    assert (a.seconds["revocation"] > 0) == hit, a.seconds


def test_work_lost_to_a_revocation_counts_from_the_last_good_save_of_the_run(tmp_path: Path) -> None:
    """Run 1 steps 100 a 10 s interval to T0 + 620 (step 6000); a good save at step 2850 (half
    way through the interval ending T0 + 310), a failed save at 4800 and one after the run's
    end do not count; a notice at T0 + 610; run 2's first interval starts at T0 + 790. Lost:
    the half interval and everything after (T0 + 305 .. 620), then the notice until steps
    resume (.. 790): 485 s on one GPU."""

    evs = job("w", "nw", "a2-highgpu-1g", True, "NVIDIA A100-SXM4-40GB", "x", 1, records=60)
    for ts, step, ok, secs in ((T0 + 300, 2850, True, 1.0), (T0 + 500, 4800, False, 0.0), (T0 + 700, 6000, True, 0.0)):
        evs.append(ev(ts, "nw", "train_checkpoint", {"run": "w-r", "rank": 0, "action": "save", "seconds": secs,
                                                      "ok": ok, "step": step}, "w", {}))
    evs.append(ev(T0 + 610, "nw", "revocation", {"cloud": "gce", "kind": "preemption", "action": "stop",
                                                  "revokes": True, "deadline": T0 + 640, "lead_seconds": 30.0,
                                                  "notice_id": "gce:p"}, "w", {}))
    for i in range(5):
        evs.append(ev(T0 + 800 + 10 * i, "nw2", "train_steps", {
            "run": "w-r2", "rank": 0, "interval_seconds": 10.0, "steps": 100, "first_step": 2851 + 100 * i,
            "last_step": 2950 + 100 * i, "step_mean_seconds": 0.1, "wait_mean_seconds": 0.0, "steps_per_second": 10.0},
            "w", {}))
    a = account_of(tmp_path, evs, "w")
    assert a.seconds["revocation"] == pytest.approx(485.0)
    assert a.seconds["checkpoint_save"] == pytest.approx(1.0)
    assert sum(a.seconds.values()) == pytest.approx(840.0)  # declared at T0, the last step at T0 + 840


def test_gpus_are_counted_by_node_and_index(tmp_path: Path) -> None:
    """Two nodes of one job each have a GPU 0: two accelerators, not one (a GPU is its node
    and its index; counting indexes alone halves a multi-node job's cost)."""
    evs = job("mn", "n1", "a2-highgpu-1g", True, "NVIDIA A100-SXM4-40GB", "x", 0, records=6)
    evs += [e | {"node": "n2", "id": e["id"] + "-2"} for e in evs if e["type"] in ("instance", "train_steps")]
    for node in ("n1", "n2"):
        for i in range(6):
            evs.append(ev(T0 + 30 + 10 * i, node, "gpu", {"index": 0, "uuid": f"GPU-{node}", "name": "A100",
                                                          "util_gpu_ratio": 0.9}, "mn", {}))
    a = account_of(tmp_path, evs, "mn")
    assert (a.gpus, a.gpus_from) == (2, "GPU samples")
