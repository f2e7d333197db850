"""analyze bottlenecks over the labelled scenario suite of the fleet simulator: precision and
recall per kind, the findings table (idempotent, first_detected kept), a read-only copy,
thresholds from a config file and per run, and detectors without their data."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.analytics.test_demo_fleet import demo_db  # noqa: F401  (the simulated fleet, a module fixture)
from tests.fakes.fleet import KINDS, Scenarios, evaluate

FIELDS = {
    "kind", "job", "node", "rank", "subject", "severity", "confidence", "window_start", "window_end",
    "summary", "evidence", "fit_ids", "suggests",
}


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Scenarios]:
    s = Scenarios(seed=11)
    s.suite()
    db = tmp_path_factory.mktemp("suite") / "suite.duckdb"
    con = connect(db)
    assert Writer(con).write([("sim", encode_many(s.events))]).dead == 0
    con.close()
    return db, s


def run(*args: str) -> tuple[int, Any, str]:
    r = CliRunner().invoke(cli, ["bottlenecks", *args])
    out = r.stdout
    try:
        out = json.loads(out) if "--json" in args and r.exit_code == 0 else out
    except json.JSONDecodeError:
        pass
    return r.exit_code, out, r.stderr


def test_precision_and_recall_per_kind_on_the_labelled_suite(suite) -> None:
    db, s = suite
    code, found, err = run("--db", str(db), "--json", "--no-store")
    assert code == 0, err
    scores = evaluate(found, s.labels)
    for kind in KINDS:
        sc = scores[kind]
        assert sc["tp"] >= 15, (kind, sc)
        assert sc["precision"] >= 0.95 and sc["recall"] >= 0.95, (kind, sc)
    assert all(set(f) == FIELDS for f in found)
    order = [{"critical": 0, "warning": 1, "info": 2}[f["severity"]] for f in found]
    assert order == sorted(order)  # sorted by severity


def test_findings_are_stored_once_and_keep_when_first_detected(suite, tmp_path: Path) -> None:
    db = tmp_path / "copy.duckdb"
    shutil.copy(suite[0], db)
    code, first, err = run("--db", str(db), "--json")
    assert code == 0 and f"stored {len(first)} findings in {db} (table findings)" in err
    con = duckdb.connect(str(db), read_only=True)
    rows1 = con.execute("SELECT kind, job, node, rank, subject, first_detected, detected_at FROM findings ORDER BY ALL").fetchall()
    con.close()
    assert len(rows1) == len(first)
    code, again, _ = run("--db", str(db), "--json")
    con = duckdb.connect(str(db), read_only=True)
    rows2 = con.execute("SELECT kind, job, node, rank, subject, first_detected, detected_at FROM findings ORDER BY ALL").fetchall()
    ev = con.execute("SELECT evidence, suggests FROM findings WHERE kind = 'input_bound' LIMIT 1").fetchall()[0]
    con.close()
    assert len(rows2) == len(rows1)  # nothing stored twice
    assert [r[:6] for r in rows2] == [r[:6] for r in rows1]  # first_detected kept
    assert all(b[6] >= a[6] for a, b in zip(rows1, rows2, strict=True))
    assert "input_wait_share" in json.loads(ev[0]) and json.loads(ev[1]) == ["data-workers", "placement"]
    # one job, one kind: only those rows are replaced
    job = next(f["job"] for f in first if f["kind"] == "straggler")
    code, one, _ = run("--db", str(db), "--json", "--job", job, "--kind", "straggler")
    assert code == 0 and {(f["job"], f["kind"]) for f in one} == {(job, "straggler")}
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM findings").fetchall()[0][0] == len(rows1)
    con.close()


def test_a_read_only_copy_is_analysed_without_storing(suite, tmp_path: Path) -> None:
    db = tmp_path / "ro.duckdb"
    shutil.copy(suite[0], db)
    os.chmod(db, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)  # marked read-only (root too: see the CLI)
    code, out, err = run("--db", str(db), "--kind", "gpu_errors")
    assert code == 0, err
    assert f"{db} is read-only: findings computed, not stored" in err
    assert "gpu_errors" in out and "critical" in out
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM findings").fetchall()[0][0] == 0  # nothing written
    con.close()


def test_thresholds_from_a_config_file_and_per_run(suite, tmp_path: Path) -> None:
    db = str(suite[0])
    base = {f["job"] for f in run("--db", db, "--json", "--no-store", "--kind", "checkpoint_overhead")[1]}
    cfg = tmp_path / "t.toml"
    cfg.write_text("[detectors.checkpoint_overhead]\nmax_share = 0.5\n")
    code, none, _ = run("--db", db, "--json", "--no-store", "--kind", "checkpoint_overhead", "--config", str(cfg))
    assert code == 0 and none == [] and base
    # --set wins over the file
    code, back, _ = run("--db", db, "--json", "--no-store", "--kind", "checkpoint_overhead", "--config", str(cfg),
                        "--set", "checkpoint_overhead.max_share=0.05")
    assert {f["job"] for f in back} == base


@pytest.mark.parametrize(
    "args, error",
    [
        (["--set", "ps_bound.min_efficiency=2"], "ps_bound.min_efficiency: must be a number from 0 to 1, got '2'"),
        (["--set", "ps_bound.nope=1"], "unknown key 'ps_bound.nope'"),
        (["--set", "nope.x=1"], "unknown detector 'nope'"),
        (["--set", "min_efficiency"], "expected DETECTOR.OPTION=VALUE"),
        (["--since", "yesterday"], "expected a duration like 30s"),
        (["--kind", "nope"], "'nope' is not one of"),
        (["--job", "nope"], "--job nope: no such job in the database (analyze jobs lists them)"),
    ],
)
def test_bad_thresholds_and_arguments_are_one_line_errors(suite, args, error) -> None:
    code, out, err = run("--db", str(suite[0]), "--no-store", *args)
    assert code == 2 if "--kind" in args or "--since" in args else code == 1
    assert error in err and "Traceback" not in err


def test_bad_config_files(suite, tmp_path: Path) -> None:
    for text, error in (
        ("[detectors.nope]\nx = 1\n", "unknown detector [detectors.nope]"),
        ("[detector.ps_bound]\n", "unknown table [detector]"),
        ("[detectors.ps_bound\n", "not valid TOML"),
        ("[detectors.gpu_idle]\nmin_idle = 'soon'\n", "gpu_idle.min_idle"),
    ):
        cfg = tmp_path / "bad.toml"
        cfg.write_text(text)
        code, _, err = run("--db", str(suite[0]), "--no-store", "--config", str(cfg))
        assert code == 1 and error in err, (text, err)


def test_a_detector_without_its_data_says_what_it_needed_once(tmp_path: Path) -> None:
    s = Scenarios(seed=1)
    s.sim_job({}, kind="a", nodes=3, gpus=1)
    s.events = [e for e in s.events if e["type"] in ("train_job", "train_steps")]  # no GPU, host, events
    db = tmp_path / "steps.duckdb"
    con = connect(db)
    Writer(con).write([("sim", encode_many(s.events))])
    con.close()
    code, out, err = run("--db", str(db))
    assert code == 0
    assert err.count("note: detector gpu_idle cannot run: no rows in gpu_samples or tpu_samples yet") == 1
    assert err.count("note: detector gpu_errors cannot run: no rows in gpu_events yet") == 1
    assert "no findings (4 detectors ran: ps_bound, input_bound, straggler, comm_bound)" in out
    assert err.count("note: detector checkpoint_overhead cannot run: no rows in checkpoints yet") == 1


def test_the_since_window_applies(suite) -> None:
    # the suite's telemetry is from 2026-05; nothing of it is in the last day
    code, out, _ = run("--db", str(suite[0]), "--no-store", "--since", "1d")
    assert code == 0 and out.startswith("no findings (12 detectors ran")


def test_the_demo_fleet_shows_every_kind_of_finding(tmp_path: Path) -> None:
    """scripts/demo adds this simulated fleet: analyze bottlenecks then shows each kind."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    db = tmp_path / "demo.duckdb"
    r = subprocess.run([sys.executable, "-m", "tests.fakes.fleet", "demo", "--db", str(db)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "simulated fleet (nodes sim-*, label simulated=true)" in r.stdout
    code, found, err = run("--db", str(db), "--json")
    assert code == 0, err
    assert {f["kind"] for f in found} == set(KINDS)
    assert all(f["job"].startswith("sim-") for f in found)
    # and the demo's answer for its PS-bound model: the knee of its measured runs
    r = CliRunner().invoke(cli, ["recommend", "cluster", "--from-job", "sim-ps-2", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["action"] == {"workers": 4, "ps": 1}
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM instances WHERE end_reason = 'revoked'").fetchall()[0][0] == 1
    assert con.execute("SELECT count(*) FROM nodes WHERE labels->>'simulated' = 'true'").fetchall()[0][0] == con.execute("SELECT count(*) FROM nodes").fetchall()[0][0]
    con.close()


def test_every_detector_says_what_to_do_and_fills_in_its_evidence() -> None:
    """Issue 51: the recommendations page said "no recommendation" for jobs whose findings
    carry an action; each detector has one (ACTION), its numbers from the finding's evidence."""
    from cmdare.analytics.detectors import DETECTORS
    from cmdare.analytics.units import Finding

    for name in DETECTORS:
        assert DETECTORS.get(name).ACTION, name
    ck = DETECTORS.get("checkpoint_overhead")
    f = Finding("checkpoint_overhead", "j", "s", evidence={"young_daly_interval_seconds": 1619.2, "interval_seconds": 120.0})
    assert ck.action(f).startswith("checkpoint every 1619.2 s") and "instead of every 120.0 s" in ck.action(f)
    assert "every ? s" in ck.action(Finding("checkpoint_overhead", "j", "s"))  # evidence missing: no KeyError


def test_the_advice_of_a_job_no_recommender_answers_is_its_findings_action(demo_db) -> None:  # noqa: F811
    from cmdare.analytics import api
    from cmdare.analytics.db import Database

    a = api.job_advice(Database(demo_db), "sim-idle-8")
    assert [x["kind"] for x in a["actions"]] == ["gpu_idle"] and "release the idle GPUs" in a["actions"][0]["action"]
    ps = api.job_advice(Database(demo_db), "sim-ps-5")  # answered by recommend cluster: no own action
    assert ps["actions"] == [] and ps["recommendations"]
