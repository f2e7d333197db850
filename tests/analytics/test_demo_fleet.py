"""scripts/demo's simulated fleet: every detector finds its job, and the recommenders the
demo ends with answer its PS-bound and input-bound jobs (what a new user sees first)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import DemoFleet


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = DemoFleet(seed=1, t0=time.time() - 40 * 60)
    f.build()
    db = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    con = connect(db)
    Writer(con).write([("sim", encode_many(f.events))])
    con.close()
    return db


def test_the_demo_fleet_shows_each_problem_and_its_recommendations(demo_db: Path) -> None:
    db = demo_db
    r = CliRunner().invoke(cli, ["bottlenecks", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.stderr
    found = {(x["kind"], x["job"]) for x in json.loads(r.stdout)}
    for kind, job in [("input_bound", "sim-input-6"), ("straggler", "sim-straggler-7"), ("gpu_idle", "sim-idle-8"),
                      ("gpu_throttled", "sim-throttled-9"), ("gpu_errors", "sim-xid-10"),
                      ("checkpoint_overhead", "sim-ckpt-11"), ("ps_bound", "sim-ps-5")]:
        assert (kind, job) in found, (kind, job, sorted(found))
    r = CliRunner().invoke(cli, ["recommend", "data-workers", "--job", "sim-input-6", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.stderr
    (tf,) = (json.loads(x) for x in r.stdout.splitlines())  # one answer, naming both rules
    assert tf["action"]["workers"] in (5, 6) and tf["assumptions"]["current_workers"] == 2
    assert tf["assumptions"]["other_rule"] == "Cachew knee" and tf["assumptions"]["other_rule_workers"] == 4
    assert "capacity_per_second" not in tf["interval"]  # two workers measured alike: no zero-width interval
    r = CliRunner().invoke(cli, ["recommend", "placement", "--job", "sim-input-6", "--db", str(db),
                                 "--host-price", "2.48", "--worker-price", "0.19", "--json"])
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["assumptions"]["next_remote"] == 4 and out["assumptions"]["next_local"] == 0
    # one answer per job (issue 51): data-workers decides how many, placement says where and
    # what its replay alone would say
    assert out["action"] == {"remote": tf["action"]["workers"], "local": 0}
    assert out["assumptions"]["placement_would_say"] == "3 remote, 0 local"
    r = CliRunner().invoke(cli, ["recommend", "cluster", "--from-job", "sim-ps-2", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["action"]["ps"] >= 1


def test_bottlenecks_text_ends_with_the_commands_that_answer_the_findings_and_each_one_runs(demo_db: Path) -> None:
    import shlex

    r = CliRunner().invoke(cli, ["bottlenecks", "--db", str(demo_db), "--no-store"])
    assert r.exit_code == 0, r.stderr
    tail = r.stdout.split("what to do about them:\n", 1)[1].splitlines()
    cmds = [line.split("  #")[0].strip() for line in tail]
    assert "analyze recommend data-workers --job sim-input-6" in cmds
    assert "analyze recommend cluster --from-job sim-ps-5" in cmds and "analyze recommend cluster --from-job sim-ps-4" in cmds
    assert len(cmds) == len(set(cmds))  # each command once
    # a straggler or an idle GPU is not answered by re-sizing the cluster: not suggested
    assert not any("sim-straggler-7" in c or "sim-idle-8" in c for c in cmds)
    for c in cmds:  # every command shown runs on this database and answers
        argv = shlex.split(c)[1:]
        run = CliRunner().invoke(cli, [*argv, "--db", str(demo_db)])
        assert run.exit_code == 0, (c, run.stderr)
    assert "# workers 4, ps 2" in tail[cmds.index("analyze recommend cluster --from-job sim-ps-4")]
    # placement prices the job's own nodes from the catalogue: it answers too (issue 51), the
    # same count as data-workers
    placement = tail[cmds.index("analyze recommend placement --job sim-input-6")]
    data = tail[cmds.index("analyze recommend data-workers --job sim-input-6")]
    n = int(data.split("# workers ")[1].split()[0])
    assert f"# remote {n}, local 0" in placement and "not suggested" not in r.stderr


def test_a_ps_bound_job_gets_the_ps_count_that_removes_its_bottleneck_not_what_it_runs(demo_db: Path) -> None:
    for job, workers, ps in (("sim-ps-4", 4, 2), ("sim-ps-5", 8, 4)):
        r = CliRunner().invoke(cli, ["recommend", "cluster", "--from-job", job, "--db", str(demo_db), "--json"])
        assert r.exit_code == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["action"] == {"workers": workers, "ps": ps}
        a = out["assumptions"]
        assert (a["ps_bound"], a["current_workers"], a["current_ps"], a["extrapolated"]) == (True, workers, 1, True)
        # the single-worker speed (6 steps/s) at linear scaling, carried by ps x the measured PS plateau
        assert out["predicted"]["steps_per_second"] == pytest.approx(6.0 * workers, rel=0.05)
        assert out["why"].startswith(f"PS-bound now ({workers} workers x 1 PS")
    r = CliRunner().invoke(cli, ["recommend", "cluster", "--from-job", "sim-ps-4", "--db", str(demo_db)])
    assert "  extrapolates: 2 PS never measured for this model and accelerator" in r.stdout


def _cli(db: Path, *args: str):
    return CliRunner().invoke(cli, [*args, "--db", str(db)])


def test_tables_fit_120_characters_by_default_and_say_what_they_leave_out(demo_db: Path) -> None:
    for args in (["nodes"], ["gpu"], ["host"], ["gpu", "--every", "10m"], ["host", "--every", "5m"]):
        r = _cli(demo_db, *args)
        assert r.exit_code == 0, r.stderr
        assert max(len(line) for line in r.stdout.splitlines()) <= 120, args
        assert "more columns:" in r.stderr and "--wide" in r.stderr
    wide = _cli(demo_db, "nodes", "--wide")
    assert "spool_pending" in wide.stdout.splitlines()[0] and "more columns" not in wide.stderr
    some = _cli(demo_db, "nodes", "--columns", "state,node")
    assert some.stdout.splitlines()[0].split() == ["state", "node"]
    assert set(json.loads(_cli(demo_db, "nodes", "--json").stdout)[0]) >= {"spool_pending", "agent_version"}
    bad = _cli(demo_db, "nodes", "--columns", "node,nope")
    assert bad.exit_code == 2 and "unknown column 'nope'" in bad.stderr


def test_simulated_nodes_have_real_lives_and_gpus_their_power_and_temperature(demo_db: Path) -> None:
    nodes = json.loads(_cli(demo_db, "nodes", "--json").stdout)
    sim = [n for n in nodes if n["node"].startswith("sim-")]
    assert len(sim) > 30 and all(n["state"] != "unknown" and n["lives"] >= 1 for n in sim)
    assert {n["state"] for n in sim} <= {"stopped", "revoked", "alive"}
    gpus = json.loads(_cli(demo_db, "gpu", "--json").stdout)
    assert all(g["power_w"] and 40 <= g["power_w"] <= 300 and 30 <= g["temp_max_c"] <= 90 for g in gpus)


def test_label_until_and_every_select_and_bucket_the_time_series(demo_db: Path) -> None:
    host = json.loads(_cli(demo_db, "host", "--json").stdout)
    total = sum(h["samples"] for h in host)
    labelled = json.loads(_cli(demo_db, "host", "--label", "simulated=true", "--json").stdout)
    assert sum(h["samples"] for h in labelled) == total  # the demo fleet: every node is simulated
    assert _cli(demo_db, "host", "--label", "team=vision").stdout.strip() == "(no rows)"
    assert _cli(demo_db, "nodes", "--label", "team=vision").stdout.strip() == "(no rows)"
    # 30 minutes of samples touch 3 or 4 ten-minute buckets, as the clock falls (was >= 4: failed at :30)
    buckets = json.loads(_cli(demo_db, "host", "--every", "10m", "--json").stdout)
    assert sum(h["samples"] for h in buckets) == total and len({h["bucket"] for h in buckets}) >= 3
    assert list(buckets[0])[0] == "bucket"
    early = json.loads(_cli(demo_db, "host", "--until", "20m", "--json").stdout)
    late = json.loads(_cli(demo_db, "host", "--since", "20m", "--json").stdout)
    assert sum(h["samples"] for h in early) + sum(h["samples"] for h in late) == total
    assert 0 < sum(h["samples"] for h in early) < total
    gpus = json.loads(_cli(demo_db, "gpu", "--every", "10m", "--json").stdout)
    assert len({g["bucket"] for g in gpus}) >= 3 and all("xid_events" in g for g in gpus)


@pytest.mark.parametrize(("args", "error"), [
    (["nodes", "--label", 'a"]=1'], "--label: expected KEY=VALUE"),
    (["host", "--label", "novalue"], "--label: expected KEY=VALUE"),
    (["host", "--label", "k=" + "v" * 300], "--label: expected KEY=VALUE"),
    (["host", "--every", "0s"], "at least 1s"),
    (["gpu", "--every", "1s", "--since", "30d"], None),  # fine: the window holds ~40 min
    (["host", "--until", "yesterday"], "a duration ago (10m, 2h, 7d) or an ISO 8601 time"),
])
def test_hostile_table_arguments_are_one_line_errors(demo_db: Path, args: list[str], error: str | None) -> None:
    r = _cli(demo_db, *args)
    if error is None:
        assert r.exit_code == 0, r.stderr
        return
    assert r.exit_code != 0 and error in r.stderr and "Traceback" not in r.stderr
    assert len([x for x in r.stderr.splitlines() if x.startswith("Error")]) == 1


def test_too_many_buckets_are_refused_before_any_work(tmp_path: Path) -> None:
    from cmdare.analytics import queries
    from cmdare.analytics.db import AnalyticsError
    from cmdare.wire.events import EventFactory

    f = EventFactory("n", "worker", "j")
    con = connect(tmp_path / "b.duckdb")
    Writer(con).write([("a", b"".join(f.line("host", {"cpu_util_ratio": 0.5}, 1.75e9 + h * 3600) for h in range(4)))])
    with pytest.raises(AnalyticsError, match="more than 10,000 buckets over the window"):
        queries.host(con, every=1.0)  # 3 hours in 1 s buckets
    assert len(queries.host(con, every=60.0)[1]) == 4
