"""cluster: the knee of a model's scaling (one more worker adds 7 % or less), whether a
second PS pays, and the cheapest counts for a deadline; on CM-DARE's real runs and on the
fleet simulator's PS-contention truth through the cluster fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics import models
from cmdare.analytics.cli import cli
from cmdare.analytics.recommend.cluster import knee, knee_next
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.analytics.conftest import DATA
from tests.fakes.fleet import MODELS, Fleet


def rec(db: Path, *args: str) -> tuple[int, dict | str, str]:
    r = CliRunner().invoke(cli, ["recommend", "cluster", "--db", str(db), *args])
    out = json.loads(r.stdout) if r.exit_code == 0 and "--json" in args else r.stdout
    return r.exit_code, out, r.stderr


def test_the_knee_rule() -> None:
    # exactly the threshold is "or less": the knee (0.5 and 1.5 are exact in binary)
    assert knee_next({1: 1.0, 2: 1.5, 3: 3.0}, 0.5) == (1, True, 0.5)
    assert knee({1: 10, 2: 19, 3: 27, 4: 28}, 0.07) == (3, True)
    assert knee({1: 10, 2: 20, 4: 40, 8: 80}, 0.07) == (8, False)  # linear: still scaling
    # a gap of two counts: the gain per added worker, compounded
    assert knee({1: 10, 4: 30, 6: 31}, 0.07) == (4, True)
    # the held-out P100 1-PS series: the 5th adds 9 %, the 6th loses 1 %, the 7th adds
    # 8 %, the 8th loses 9 %: Cachew's rule stops at the first worker adding less than 7 %
    s = {1: 30.0, 2: 55.0, 3: 75.0, 4: 88.0}
    s[5] = s[4] * 1.09
    s[6] = s[5] * 0.99
    s[7] = s[6] * 1.08
    s[8] = s[7] * 0.91
    assert knee(s, 0.07) == (5, True)
    assert knee_next(s, 0.07) == (5, True, pytest.approx(-0.01))


def test_the_answer_says_what_the_next_worker_would_add(tmp_path: Path) -> None:
    from cmdare.analytics.recommend.cluster import Cluster

    c = Cluster(Cluster.parse_options("cluster", {}))
    meas = {1: {1: 30.0, 2: 55.0, 3: 75.0, 4: 88.0, 5: 95.9, 6: 94.9, 7: 102.5, 8: 93.3}}
    rec = c._answer({"from_job": "j"}, meas, {}, [], {})
    assert rec.action == {"workers": 5, "ps": 1}
    assert "knee at 5 workers" in rec.why and "the next worker adds -1.0%" in rec.why
    assert rec.assumptions["next_worker_adds"] == pytest.approx(-0.0104, abs=1e-3)


@pytest.mark.skipif(not (DATA / "jobs.csv").is_file(), reason=f"CM-DARE's measurements are not at {DATA}")
def test_real_runs_p100_with_one_ps_knees_at_4_to_5_workers_k80_does_not(real_db) -> None:
    for model in ("resnet15", "shakeshake_w32_d26"):
        code, out, err = rec(real_db, "--from-job", f"cmdare-cluster_size-p100-ps1-w1-{model}", "--max-ps", "1", "--json")
        assert code == 0, err
        assert out["action"]["ps"] == 1 and 4 <= out["action"]["workers"] <= 5, out
        assert out["assumptions"]["knee_from"] == "measured" and out["assumptions"]["knee_settled"] is True
    code, out, _ = rec(real_db, "--from-job", "cmdare-cluster_size-k80-ps1-w1-resnet15", "--json")
    assert out["action"] == {"workers": 8, "ps": 1} and out["assumptions"]["knee_settled"] is False
    assert "still scaling" in out["why"]
    # P100 resnet15 with two PS scales on: the second PS pays
    code, out, _ = rec(real_db, "--from-job", "cmdare-cluster_size-p100-ps1-w1-resnet15", "--json")
    assert out["action"]["ps"] == 2 and "a second PS pays" in out["why"]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Single-worker runs only for resnet50 (no cluster runs of it) beside other models'
    clusters: its answer must come from the cluster fit."""
    f = Fleet(seed=5)
    for m in MODELS[:8]:
        for a in ("k80", "v100"):
            f.job(m, a)
            if m[0] != "resnet50":
                for w in (2, 4, 8):
                    f.job(m, a, workers=w, ps=1, intervals=15)
                f.job(m, a, workers=8, ps=2, intervals=15)
    db = tmp_path_factory.mktemp("cl") / "c.duckdb"
    con = connect(db)
    Writer(con).write([("sim", encode_many(f.events))])
    jobs, _ = models.job_speeds(con)
    models.save(con, models.fit_speed(jobs))
    models.save(con, models.fit_cluster(jobs, models.latest(con, "speed")))
    con.close()
    return db


def test_from_the_cluster_fit_with_a_deadline_and_prices(fitted: Path) -> None:
    import duckdb

    con = duckdb.connect(str(fitted), read_only=True)
    job = con.execute("SELECT job FROM jobs WHERE model = 'resnet50' AND accelerator = 'v100' LIMIT 1").fetchall()[0][0]
    cfit = con.execute("SELECT fit_id FROM model_fits WHERE kind = 'cluster'").fetchall()[0][0]
    con.close()
    code, out, err = rec(fitted, "--from-job", job, "--json")
    assert code == 0, err
    assert out["assumptions"]["knee_from"] == "cluster fit" and out["fit_ids"] == [cfit]
    lo, hi = out["interval"]["steps_per_second"]
    assert lo <= out["predicted"]["steps_per_second"] <= hi
    knee_speed = out["predicted"]["steps_per_second"]
    # a deadline the knee meets easily: fewer VMs do, and cost less
    steps = knee_speed * 3600 * 2  # 2 h at the knee
    code, out, _ = rec(fitted, "--from-job", job, "--steps", str(steps), "--deadline", "6h",
                       "--worker-price", "1.0", "--ps-price", "0.5", "--json")
    assert code == 0
    assert out["predicted"]["hours"] <= 6 and "cheapest counts" in out["why"]
    assert out["why"].endswith("(cluster fit)")  # resnet50 never ran a cluster: predicted, with intervals
    h_lo, h_hi = out["interval"]["hours"]
    assert h_lo <= out["predicted"]["hours"] <= h_hi
    d_lo, d_hi = out["interval"]["dollars"]
    assert d_lo <= out["predicted"]["dollars"] <= d_hi
    assert out["cost"]["dollars"] == pytest.approx(out["predicted"]["hours"] * (out["action"]["workers"] * 1.0 + out["action"]["ps"] * 0.5), rel=0.01)
    # an impossible deadline says so
    code, out, _ = rec(fitted, "--from-job", job, "--steps", str(steps * 1000), "--deadline", "1h", "--json")
    assert code == 0 and "no count up to 16 workers x 4 PS finishes" in out["why"]


def test_bad_input_is_one_line(fitted: Path, tmp_path: Path) -> None:
    code, _, err = rec(fitted, "--from-job", "nope")
    assert code == 1 and "--from-job nope: no such job in the database" in err
    code, _, err = rec(fitted, "--from-job", "x", "--deadline", "2h")
    assert code == 2 and "--deadline needs --steps" in err
    f = Fleet(seed=1)
    job = f.job(MODELS[0], "v100")
    db = tmp_path / "one.duckdb"
    con = connect(db)
    Writer(con).write([("sim", encode_many(f.events))])
    con.close()
    code, _, err = rec(db, "--from-job", job)
    assert code == 1 and "no parameter-server runs at several worker counts" in err and "analyze fit cluster" in err


def test_another_accelerator_and_a_declaration_go_through_the_speed_fit(fitted: Path) -> None:
    import duckdb

    con = duckdb.connect(str(fitted), read_only=True)
    (v100_job, flops, params, tensors), = con.execute(
        "SELECT job, flops_per_step, params, tensors FROM jobs WHERE model = 'resnet50' AND accelerator = 'v100' LIMIT 1"
    ).fetchall()
    k80_job = con.execute("SELECT job FROM jobs WHERE model = 'resnet50' AND accelerator = 'k80' LIMIT 1").fetchall()[0][0]
    fits = dict(con.execute("SELECT kind, fit_id FROM model_fits").fetchall())
    con.close()
    code, on_k80, err = rec(fitted, "--from-job", k80_job, "--json")
    assert code == 0, err
    # the V100 job sized on K80: its measured time carried by the speed fit
    code, carried, err = rec(fitted, "--from-job", v100_job, "--gpu-type", "k80", "--json")
    assert code == 0, err
    assert carried["assumptions"]["accelerator"] == "k80" and carried["assumptions"]["measured_accelerator"] == "v100"
    assert carried["fit_ids"] == [fits["cluster"], fits["speed"]]
    assert carried["predicted"]["steps_per_second"] == pytest.approx(on_k80["predicted"]["steps_per_second"], rel=0.3)
    assert abs(carried["action"]["workers"] - on_k80["action"]["workers"]) <= 2
    assert carried["assumptions"]["held_out_mape_speed"] > 0
    assert carried["assumptions"]["held_out_mape_cluster"] is not None
    # no job at all: the declaration on V100
    code, decl, err = rec(fitted, "--flops-per-step", str(flops), "--params", str(params), "--tensors", str(int(tensors)),
                          "--gpu-type", "v100", "--json")
    assert code == 0, err
    code, own, _ = rec(fitted, "--from-job", v100_job, "--json")
    assert decl["assumptions"]["from_job"] is None and decl["assumptions"]["knee_from"] == "cluster fit"
    assert decl["predicted"]["steps_per_second"] == pytest.approx(own["predicted"]["steps_per_second"], rel=0.3)
    code, _, err = rec(fitted, "--flops-per-step", "1e12", "--params", "1e6")
    assert code == 1 and "a declaration needs --flops-per-step, --params and --gpu-type" in err
    code, _, err = rec(fitted, "--from-job", v100_job, "--params", "1e6", "--gpu-type", "v100")
    assert code == 1 and "not both" in err
    code, _, err = rec(fitted)
    assert code == 1 and "give --from-job J" in err


def test_prices_from_the_catalogue_with_their_date(fitted: Path) -> None:
    import duckdb

    con = duckdb.connect(str(fitted), read_only=True)
    job = con.execute("SELECT job FROM jobs WHERE model = 'resnet50' AND accelerator = 'v100' LIMIT 1").fetchall()[0][0]
    con.close()
    code, out, err = rec(fitted, "--from-job", job, "--steps", "1e5", "--worker-type", "p3.2xlarge",
                         "--ps-type", "c5.2xlarge", "--json")
    assert code == 0, err
    a = out["assumptions"]
    assert a["worker_type"] == "p3.2xlarge" and a["worker_price_per_hour"] == 3.06 and a["ps_price_per_hour"] == 0.34
    assert out["cost"]["prices_as_of"] == "2025-01"
    assert out["cost"]["dollars_per_hour"] == pytest.approx(3.06 * out["action"]["workers"] + 0.34 * out["action"]["ps"])
    code, out, _ = rec(fitted, "--from-job", job, "--worker-type", "p3.2xlarge", "--purchase", "spot",
                       "--ps-price", "0.1", "--json")
    assert out["assumptions"]["worker_price_per_hour"] == 0.918
    # one price alone would make the other VMs free: refused, never priced at zero
    for args, missing in ((["--worker-price", "0.9"], "--ps-price"), (["--ps-price", "0.2"], "--worker-price"),
                          (["--worker-type", "p3.2xlarge"], "--ps-price")):
        code, _, err = rec(fitted, "--from-job", job, "--steps", "1e5", *args)
        assert code == 1 and f"without {missing}" in err and "is not free" in err, err
    code, out, err = rec(fitted, "--from-job", job, "--steps", "1e5", "--json")  # no prices: no cost at all
    assert code == 0 and out["cost"] == {} and "dollars" not in out["predicted"]
    code, _, err = rec(fitted, "--from-job", job, "--worker-type", "x9.huge")
    assert code == 1 and "x9.huge is not in the price catalogue (add it with $CMDARE_PRICES=prices.csv)" in err
    code, _, err = rec(fitted, "--from-job", job, "--worker-type", "p3.2xlarge", "--worker-price", "1")
    assert code == 1 and "give --worker-price or --worker-type, not both" in err


def _pred(lower: float) -> dict[int, dict[int, tuple[float, float, float]]]:
    """A cluster fit's predictions whose knee is 8 workers on 4 PS at 86.6 steps/s (each PS
    count capped lower), every interval from ``lower`` x to 1.5x the prediction."""
    seq = [20, 38, 52, 61, 68, 74, 80, 86.6, 88, 88.5, 89, 89, 89, 89, 89, 89]
    caps = {1: 62, 2: 72, 3: 80, 4: 1e9}
    return {p: {w: (min(v, c), min(v, c) * lower, min(v, c) * 1.5) for w, v in enumerate(seq, 1)}
            for p, c in caps.items()}


MEASURED = {1: {1: 20.0, 2: 38.0, 3: 52.0, 4: 61.0, 5: 63.0}, 2: {1: 20.0, 5: 68.0, 7: 80.0, 8: 81.0}}


def test_advice_stays_with_the_best_measured_unless_the_fit_is_surely_better() -> None:
    """Issue 51 (held-out ResNet-32 on P100): the fit's knee was 8 workers x 4 PS at 86.6
    steps/s (63.4 .. 130.7), never measured, its interval holding the measured 80 of 7 x 2.
    The answer is the best measured configuration and the experiment that would settle it."""
    from cmdare.analytics.recommend.cluster import Cluster

    c = Cluster(Cluster.parse_options("cluster", {}))
    rec = c._answer({"from_job": "j"}, MEASURED, _pred(0.73), ["cluster-1"], {})
    assert rec.action == {"workers": 7, "ps": 2}
    assert rec.predicted == {"steps_per_second": 80.0} and rec.interval == {}
    assert rec.assumptions["stays_with_measured"] is True
    assert rec.assumptions["experiment"] == ("measure 8 workers with 4 PS next: the fit predicts +8% (86.6 vs 80 steps/s "
                                             "measured; interval 63.2 .. 130)")
    assert rec.why.startswith("the best measured configuration, 7 workers x 2 PS; to settle the rest, measure 8 workers")
    # the fit's whole interval above the best measured: its configuration is worth recommending
    sure = c._answer({"from_job": "j"}, MEASURED, _pred(0.93), ["cluster-1"], {})
    assert sure.action == {"workers": 8, "ps": 4} and "stays_with_measured" not in sure.assumptions
    assert sure.interval["steps_per_second"][0] > 80
    # nothing measured at several sizes: the fit is all there is
    bare = c._answer({"from_job": "j"}, {}, _pred(0.73), ["cluster-1"], {})
    assert bare.action == {"workers": 8, "ps": 4} and "experiment" not in bare.assumptions
