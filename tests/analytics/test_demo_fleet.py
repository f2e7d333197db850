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
    tf, knee = (json.loads(x) for x in r.stdout.splitlines())
    assert tf["action"]["workers"] in (5, 6) and tf["assumptions"]["current_workers"] == 2
    assert knee["action"] == {"workers": 4} and knee["assumptions"]["settled"] is False
    r = CliRunner().invoke(cli, ["recommend", "placement", "--job", "sim-input-6", "--db", str(db),
                                 "--host-price", "2.48", "--worker-price", "0.19", "--json"])
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["assumptions"]["next_remote"] == 4 and out["assumptions"]["next_local"] == 0
    r = CliRunner().invoke(cli, ["recommend", "cluster", "--from-job", "sim-ps-2", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["action"]["ps"] >= 1


def test_bottlenecks_text_ends_with_the_commands_that_answer_the_findings(demo_db: Path) -> None:
    r = CliRunner().invoke(cli, ["bottlenecks", "--db", str(demo_db), "--no-store"])
    assert r.exit_code == 0, r.stderr
    tail = r.stdout.split("what to do about them:\n", 1)[1].splitlines()
    assert "  analyze recommend data-workers --job sim-input-6" in tail
    assert "  analyze recommend placement --job sim-input-6 --host-price C --worker-price W" in tail
    assert "  analyze recommend cluster --from-job sim-ps-5" in tail
    assert len(tail) == len(set(tail))  # each command once
