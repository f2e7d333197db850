"""The speed and cluster fits on real measurements: CM-DARE's TensorBoard exports in the
checkout's sibling ``../shared/data/cmdare`` (``$CMDARE_REAL_DATA`` elsewhere), imported
with ``analyze import tensorboard`` as a user would, held out one model architecture at a
time."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner

from cmdare.analytics import models
from cmdare.analytics.cli import cli
from tests.analytics.conftest import DATA

pytestmark = pytest.mark.skipif(
    not (DATA / "jobs.csv").is_file(), reason=f"CM-DARE's measurements are not at {DATA} (set CMDARE_REAL_DATA)"
)


@pytest.fixture()
def real(real_db: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(real_db), read_only=True)
    yield con
    con.close()


def test_every_run_has_a_steady_state(real) -> None:
    """14 points per single-GPU run (the first a warm-up), late worker-join ramps in the
    cluster runs: the steady-state rule keeps every run."""
    jobs, skipped = models.job_speeds(real)
    assert skipped == []
    assert len(jobs) == sum(1 for _ in csv.DictReader(open(DATA / "jobs.csv")))
    # a late worker-join ramp (below 60 % of the run's later speed past step 1,000): the
    # steady state is the later speed, not dragged down by the ramp
    speeds = {j.job: j.speed for j in jobs}
    late = 0
    for r in csv.DictReader(open(DATA / "jobs.csv")):
        pts = [(int(x["Step"]), float(x["Value"])) for x in csv.DictReader(open(DATA / r["file"]))]
        later = sorted(v for _, v in pts[len(pts) // 2 :])
        median = later[len(later) // 2]
        if any(s > 1000 and v < 0.6 * median for s, v in pts):
            late += 1
            assert speeds[r["job"]] == pytest.approx(median, rel=0.05), r["job"]
    assert late >= 1  # the data has such runs (the README says so)


def test_single_gpu_step_time_holds_out_across_architectures(real) -> None:
    jobs, _ = models.job_speeds(real)
    fit = models.fit_speed(jobs)
    fams = {k: v["cv_mape"] for k, v in fit.cv["families"].items()}
    assert fit.cv["mape"] == min(fams.values())  # held-out error chose the family
    assert fit.cv["mape"] <= 0.10, fams
    # folds are architecture-disjoint
    for f in fit.cv["folds"]:
        assert f["test_group"] not in f["train_groups"]
    assert {f["test_group"] for f in fit.cv["folds"]} == {j.model for j in jobs if j.workers == 1}
    assert len(fit.cv["worst"]) == 3 and fit.cv["worst"][0]["ape"] >= fit.cv["worst"][-1]["ape"]


def _cluster_mape(jobs: list[models.JobSpeed], from_job: bool) -> tuple[float, float]:
    """Cluster steps/s of every 2-8 worker run, its architecture held out of both fits;
    the single-worker time from the same series' 1-worker run (``from_job``) or from the
    speed fit (the declaration alone). Returns the MAPE and the share of runs inside the
    held-out prediction's 95 % interval."""
    series: dict[tuple[str, str, int], dict[int, models.JobSpeed]] = {}
    for j in jobs:
        if j.job.startswith("cmdare-cluster_size"):
            series.setdefault((j.model, j.accelerator, j.ps), {})[j.workers] = j
    apes, inside = [], []
    for arch in sorted({k[0] for k in series}):
        train = [j for j in jobs if j.model != arch]
        cl = {"model": models.fit_cluster(train, None).model}
        sp = models.fit_speed(train)
        speed_fit = {"model": sp.model, "family": sp.family}
        for (m, _, ps), runs in series.items():
            if m != arch:
                continue
            one = runs[1]
            t1 = 1 / (one.speed if from_job else models.predict_speed(speed_fit, one.acc, one.flops_per_step, one.params, one.tensors)[0])
            for w, j in runs.items():
                if w >= 2:
                    r = models.predict_cluster(cl, [t1] * w, ps, j.params)
                    apes.append(abs(r["steps_per_second"] - j.speed) / j.speed)
                    inside.append(r["lower"] <= j.speed <= r["upper"])
    assert len(apes) == 42
    return float(np.mean(apes)), float(np.mean(inside))


def test_cluster_speed_from_a_measured_run_and_from_the_declaration(real) -> None:
    jobs, _ = models.job_speeds(real)
    # the targets: 10 % from a measured run, 13 % from the declaration (measured 8.5 %, 9.5 %)
    # and 95 % intervals that hold for an architecture the fit did not see (measured 41 and
    # 42 of 42 runs inside; with the in-sample residual scale 20 and 18: issue 51)
    for from_job, target in ((True, 0.10), (False, 0.13)):
        mape, covered = _cluster_mape(jobs, from_job)
        assert mape <= target and covered >= 0.9, (from_job, mape, covered)


def test_the_cluster_law_is_chosen_by_nested_error_and_says_so(fitted: Path, real) -> None:
    """Issue 65: the k-norm was chosen by looking at the shared half's two multi-worker
    architectures and did worse than the linear sum on the ones kept for acceptance (17.2 %
    against 13.9 %). Chosen by held-out error with its spread, on two architectures it
    cannot beat the simpler law by enough: the linear sum serves, and the fit says so, with
    the nested error (the choice made inside each fold) beside the in-sample one."""
    r = CliRunner().invoke(cli, ["fit", "cluster", "--db", str(fitted), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["cv_law"] == "linear-sum"
    assert s["cv_nested_mape"] <= 0.10
    choice = s["cv_law_choice"]
    assert choice["architectures"] == 2 and choice["improvement_lower_bound"] <= 0
    assert set(choice["compared"]) == {"linear-sum", "ps-knorm"}
    assert set(s["cv_nested"]["by_architecture"]) == {"resnet15", "shakeshake_w32_d26"}
    # each fold, seeing one multi-worker architecture, falls back to the simpler law
    assert {v["law"] for v in s["cv_nested"]["by_architecture"].values()} == {"linear-sum"}
    text = CliRunner().invoke(cli, ["fit", "cluster", "--db", str(fitted)]).stdout
    assert "law: linear-sum (the k-norm is not better by more than the spread" in text
    assert "nested held-out error (the law chosen inside each fold, on the others only): MAPE" in text
    # P100 resnet15, 1 PS: the 8-worker run (106 steps/s) inside the interval predicted from
    # the 1-worker run (the linear sum over-predicts it: 117; its knee and PS limit lie past
    # anything measured, which is why advice stays with the measured runs)
    speeds = {j.job: j.speed for j in models.job_speeds(real)[0]}
    best = max(v for k, v in speeds.items() if k.startswith("cmdare-cluster_size-p100-ps1-") and k.endswith("-resnet15"))
    out = _predict(fitted, "cluster", "--from-job", P100_1, "--workers", "8", "--ps", "1")
    lo, hi = out["interval"]
    assert lo <= best <= hi and abs(out["prediction"] / best - 1) <= 0.15


def test_the_fits_knee_is_within_one_worker_of_every_measured_knee(real) -> None:
    """Issue 51, for the k-norm (which serves where held-out error prefers it): every
    shared-half series measured at three or more worker counts (1 and 2 PS, K80 and P100)
    has the fit's knee (Cachew's 7 % rule over the fit's speeds from the
    series' measured single-worker time) within one worker of the measured one."""
    from cmdare.analytics.recommend.cluster import knee

    jobs, _ = models.job_speeds(real)
    fit = {"model": models.fit_cluster(jobs, None, law="ps-knorm").model}  # (the law that can knee; not the one served)
    single = {(j.model, j.accelerator): 1 / j.speed for j in jobs if j.workers == 1}
    series: dict[tuple[str, str, int], dict[int, list[float]]] = {}
    for j in jobs:
        if j.job.startswith("cmdare-cluster_size"):
            series.setdefault((j.model, j.accelerator, j.ps), {}).setdefault(j.workers, []).append(j.speed)
    params = {j.model: j.params for j in jobs}
    got = {}
    for (m, acc, ps), ws in series.items():
        meas = {w: float(np.median(v)) for w, v in ws.items()}
        pred = {w: models.predict_cluster(fit, [single[(m, acc)]] * w, ps, params[m])["steps_per_second"] for w in meas}
        got[(m, acc, ps)] = (knee(meas, 0.07)[0], knee(pred, 0.07)[0])
    assert len(got) == 6 and {k[1] for k in got} == {"k80", "p100"}
    assert all(abs(a - b) <= 1 for a, b in got.values()), got
    assert sum(a == 5 for a, _ in got.values()) == 3  # the three P100 series that plateau


def test_analyze_fit_says_where_the_fit_is_weak(real_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.duckdb"
    shutil.copy(real_db, db)
    res = CliRunner().invoke(cli, ["fit", "speed", "--db", str(db)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("fit ") and "(compute+tensors)" in lines[0]
    fams = next(x for x in lines if x.startswith("families tried (held-out MAPE): "))
    assert fams.split(": ")[1].split(", ")[0].startswith("compute+tensors ")  # the best first
    worst = next(x for x in lines if x.startswith("predicted worst (held out): "))
    assert len(worst.split(": ")[1].split(", ")) == 3


@pytest.fixture(scope="module")
def fitted(real_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the real data with a speed and a cluster fit stored (through the CLI)."""
    db = tmp_path_factory.mktemp("fitted") / "fitted.duckdb"
    shutil.copy(real_db, db)
    for kind in ("speed", "cluster"):
        res = CliRunner().invoke(cli, ["fit", kind, "--db", str(db)])
        assert res.exit_code == 0, res.output
    return db


def _predict(db: Path, *args: str) -> dict:
    res = CliRunner().invoke(cli, ["predict", *args, "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


K80_1 = "cmdare-single_gpu_0latency-k80-ps1-w1-resnet15"
P100_1 = "cmdare-cluster_size-p100-ps1-w1-resnet15"
P100_4 = "cmdare-cluster_size-p100-ps1-w4-resnet15"


def test_predict_speed_from_a_job(fitted: Path, real) -> None:
    speeds = {j.job: j.speed for j in models.job_speeds(real)[0]}
    same = _predict(fitted, "speed", "--from-job", K80_1, "--gpu-type", "k80")
    assert same["prediction"] == pytest.approx(speeds[K80_1])  # measured, not the fit's
    assert same["from_job"] == K80_1 and same["single_worker_from"] == "measured"
    other = _predict(fitted, "speed", "--from-job", K80_1, "--gpu-type", "p100")
    fit_k80 = _predict(fitted, "speed", "--gpu-type", "k80", "--flops-per-step", "630989589", "--params", "693818", "--tensors", "50")
    fit_p100 = _predict(fitted, "speed", "--gpu-type", "p100", "--flops-per-step", "630989589", "--params", "693818", "--tensors", "50")
    # the measured speed times the fit's ratio between the two accelerators
    assert other["prediction"] == pytest.approx(speeds[K80_1] * fit_p100["prediction"] / fit_k80["prediction"])
    lo, hi = other["interval"]
    assert lo < other["prediction"] < hi
    assert set(other) >= {"prediction", "interval", "fit_id", "from_job", "measured_steps_per_second"}
    assert other["examples_per_second"] == pytest.approx(other["prediction"] * 128)  # the job's batch size


def test_predict_cluster_from_single_and_multi_worker_jobs(fitted: Path, real) -> None:
    speeds = {j.job: j.speed for j in models.job_speeds(real)[0]}
    # a 4-worker job asked about its own shape gives back what it measured
    back = _predict(fitted, "cluster", "--from-job", P100_4, "--workers", "4", "--ps", "1")
    assert back["prediction"] == pytest.approx(speeds[P100_4], rel=1e-6)
    assert back["single_worker_from"] == "cluster fit" and back["measured_workers"] == 4
    eight = _predict(fitted, "cluster", "--from-job", P100_1, "--workers", "8", "--ps", "2")
    assert eight["workers"] == 8 and eight["from_job"] == P100_1 and eight["single_worker_from"] == "measured"
    assert eight["single_worker_step_seconds"] == pytest.approx(1 / speeds[P100_1])
    # heterogeneous: the job's own accelerator at its measured time, the other scaled
    homo = _predict(fitted, "cluster", "--from-job", P100_1, "--gpus", "p100:4", "--ps", "1")
    same = _predict(fitted, "cluster", "--from-job", P100_1, "--workers", "4", "--ps", "1")
    assert homo["prediction"] == pytest.approx(same["prediction"])
    mixed = _predict(fitted, "cluster", "--from-job", P100_1, "--gpus", "k80:2,p100:2", "--ps", "1")
    assert mixed["workers"] == 4 and mixed["prediction"] < same["prediction"]


def test_from_job_bad_input(fitted: Path, tmp_path: Path) -> None:
    def err(*args: str) -> str:
        res = CliRunner().invoke(cli, ["predict", *args])
        assert res.exit_code != 0 and "Traceback" not in res.output
        return res.output.strip().splitlines()[-1]

    db = str(fitted)
    assert "no such job" in err("speed", "--from-job", "nope", "--gpu-type", "k80", "--db", db)
    assert "either --from-job" in err("speed", "--from-job", K80_1, "--params", "5", "--gpu-type", "k80", "--db", db)
    assert "--from-job JOB" in err("cluster", "--workers", "2", "--ps", "1", "--db", db)
    # a job without a declaration, and one too short for a steady state
    short = tmp_path / "short.csv"
    short.write_text("Wall time,Step,Value\n1600000000,100,5\n1600000020,200,5\n1600000040,300,5\n")
    copy = tmp_path / "c.duckdb"
    shutil.copy(fitted, copy)
    for job, flags in (("bare", []), ("short", ["--gpu-type", "k80", "--flops-per-step", "1e9", "--params", "1000000"])):
        res = CliRunner().invoke(cli, ["import", "tensorboard", str(short if job == "short" else DATA / "runs" / "cluster_size-k80-ps1-w1-resnet15.csv"), "--job", job, "--db", str(copy), *flags])
        assert res.exit_code == 0, res.output
    assert "bare: no accelerator, flops_per_step, params declared" in err("speed", "--from-job", "bare", "--gpu-type", "k80", "--db", str(copy))
    assert "short: too few step intervals" in err("cluster", "--from-job", "short", "--workers", "2", "--ps", "1", "--db", str(copy))


def test_a_prediction_past_what_the_fit_saw_says_so_and_widens_its_interval(fitted: Path) -> None:
    """The README's example asks a fit of K80 / P100 CNNs (6.3e8..1.0e10 FLOPs per step)
    about 3.1e12 FLOPs on a V100: 304x past the work fitted, on an accelerator it never saw.
    No interval holds that far (issue 51: it used to give 0.0095 .. 0.061 steps/s as 95 %):
    a rough point estimate, and why. A few times past the fit the interval grows with the
    distance; inside the ranges nothing is said and nothing widened."""
    far = _predict(fitted, "speed", "--gpu-type", "v100", "--flops-per-step", "3.1e12", "--params", "25.6e6")
    assert far["extrapolated"] is True and far["interval"] is None and far["prediction"] > 0
    why = " ".join(far["extrapolation"])
    assert "flops_per_step 3.1e+12 is 30" in why and "x the largest fitted" in why
    assert "accelerator v100 not in the fit (fitted on k80, p100)" in why
    assert "flops_per_step is 304x the largest fitted" in far["rough"] and "v100 was never fitted" in far["rough"]
    mid = _predict(fitted, "speed", "--gpu-type", "p100", "--flops-per-step", "3e10", "--params", "25.6e6")
    assert mid["extrapolated"] is True and mid["interval_widened"] > 1 and "rough" not in mid
    lo, hi = mid["interval"]
    assert lo < mid["prediction"] < hi
    near = _predict(fitted, "speed", "--gpu-type", "p100", "--flops-per-step", "630989589", "--params", "693818",
                    "--tensors", "50")
    assert near["extrapolated"] is False and "extrapolation" not in near and "interval_widened" not in near
    res = CliRunner().invoke(cli, ["predict", "speed", "--gpu-type", "v100", "--flops-per-step", "3.1e12",
                                   "--params", "25.6e6", "--db", str(fitted)])
    lines = res.stdout.splitlines()
    assert "a rough guide, no 95% interval" in lines[0] and "95% interval" not in lines[0].replace("no 95% i", "")
    assert lines[1].startswith("  why: ") and any(x.startswith("  extrapolates: ") for x in lines[2:])
    assert max(len(x) for x in lines[:3]) <= 120 or lines[2].startswith("  extrapolates")
    # the cluster fit: 16 workers on 1 PS is twice the most it saw
    wide = _predict(fitted, "cluster", "--from-job", P100_1, "--workers", "16", "--ps", "1")
    assert wide["extrapolated"] is True and any(r.startswith("workers 16 is 2x") for r in wide["extrapolation"])
    assert _predict(fitted, "cluster", "--from-job", P100_1, "--workers", "4", "--ps", "1")["extrapolated"] is False


def test_a_narrow_layered_model_is_an_extrapolation_and_the_fit_reports_its_error_apart(real) -> None:
    """shakeshake_w16_d26 has 3.8x less work per tensor than any other architecture (its
    kernels are launch-bound): held out, it is the fit's worst prediction, and it is one the
    fit says it extrapolates. The held-out error is reported apart for rows inside and
    outside the ranges the fit without them saw."""
    jobs, _ = models.job_speeds(real)
    fit = models.fit_speed([j for j in jobs if j.model != "shakeshake_w16_d26"])
    w16 = next(j for j in jobs if j.model == "shakeshake_w16_d26" and j.workers == 1)
    from cmdare.analytics.models.ranges import check

    ex, why, decades = check({"model": fit.model}, **models.range_inputs(w16.flops_per_step, w16.params, w16.tensors),
                             accelerator=w16.acc.name)
    assert ex is True and why == ["flops_per_tensor 3.16e+06 is 1/3.79 of the smallest fitted (1.2e+07)"]
    assert decades == pytest.approx(0.58, abs=0.01)
    full = models.fit_speed(jobs)
    inside, outside = full.cv["in_range"], full.cv["extrapolated"]
    assert inside["rows"] + outside["rows"] == full.rows and inside["rows"] >= 10
    assert inside["mape"] < full.cv["mape"] < outside["mape"]  # where it extrapolates, it errs most
    assert full.summary()["cv_in_range"] == inside


def test_a_fit_stored_before_ranges_were_kept_says_it_cannot_tell(fitted: Path, tmp_path: Path) -> None:
    import duckdb

    db = tmp_path / "old.duckdb"
    shutil.copy(fitted, db)
    con = duckdb.connect(str(db))
    con.execute("UPDATE model_fits SET model = json_remove(model, '$.input_ranges')")
    con.close()
    out = _predict(db, "speed", "--gpu-type", "p100", "--flops-per-step", "630989589", "--params", "693818")
    assert out["extrapolated"] is None and "refit to check extrapolation" in out["extrapolation"][0]


def test_a_cluster_recommendation_past_the_fitted_workers_names_it_as_the_experiment(fitted: Path) -> None:
    """Issue 65: resnet15 on K80 still scales at its 8 measured workers (1 PS); the fit's
    knee lies past them (13 workers x 3 PS), its interval above the best measured, but the
    fit extrapolates there (1.6x the workers, 1.5x the PS it saw): no run like it backs the
    interval. The answer is the measured 8 x 1 (still scaling); 13 x 3 is the experiment to
    run next, with its gain, its interval and why it is past the fit."""
    k80 = "cmdare-cluster_size-k80-ps1-w4-resnet15"
    res = CliRunner().invoke(cli, ["recommend", "cluster", "--from-job", k80, "--db", str(fitted), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    a = out["assumptions"]
    assert out["action"] == {"workers": 8, "ps": 1} and a["stays_with_measured"] is True and out["interval"] == {}
    assert a["knee_from"] == "measured" and a["knee_settled"] is False  # (still scaling where the runs end)
    num = r"[0-9.]+"
    assert re.match(rf"measure (1[0-9]) workers with [2-4] PS next: the fit predicts \+\d+% \({num} vs {num} steps/s "
                    rf"measured; interval {num} \.\. {num}\), past what it was fitted on \(workers \d+ is [0-9.]+x the "
                    r"largest fitted \(8\)", a["experiment"]), a["experiment"]
    text = CliRunner().invoke(cli, ["recommend", "cluster", "--from-job", k80, "--db", str(fitted)]).stdout
    assert "the best measured configuration, 8 workers x 1 PS; to settle the rest, measure" in text


def test_the_scaling_curve_puts_the_measured_runs_beside_the_cluster_fit(fitted: Path) -> None:
    """The job page's scaling plot for a measured CM-DARE P100 1-PS series: every run of the
    series measured, the fit from 1 to 16 workers with its interval, extrapolation said past
    the 8 workers it saw."""
    from cmdare.analytics import api
    from cmdare.analytics.db import Database

    c = api.scaling_curve(Database(fitted), P100_4)
    assert (c["model"], c["accelerator"], c["ps"]) == ("resnet15", "p100", 1)
    assert sorted({m["workers"] for m in c["measured"]}) == list(range(1, 9))
    assert [p["workers"] for p in c["predicted"]] == list(range(1, 17)) and c["fit_id"].startswith("cluster-")
    for p in c["predicted"]:
        lo, hi = p["interval"]
        assert 0 < lo < p["steps_per_second"] < hi
        assert p["extrapolated"] == (p["workers"] > 8)
    # within the measured range the curve follows the runs (held-in: a sanity bound, not the held-out figure)
    by_w = {p["workers"]: p["steps_per_second"] for p in c["predicted"]}
    for m in c["measured"]:
        assert abs(by_w[m["workers"]] / m["steps_per_second"] - 1) < 0.35, m


def test_a_cluster_answer_on_real_runs_stays_with_the_best_measured(fitted: Path) -> None:
    """Issue 51 on the shared half: P100 ResNet-15 was measured up to 8 workers on 1 and 2 PS;
    the fit's knee, 12 workers x 3 PS, was never measured and its interval (widened for
    going 1.5x past the fit) does not lie wholly above the best measured 8 x 2. The answer is
    8 x 2 at its measured speed, and the experiment that would settle the rest."""
    r = CliRunner().invoke(cli, ["recommend", "cluster", "--from-job", P100_1, "--db", str(fitted), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.splitlines()[0])
    assert out["action"] == {"workers": 8, "ps": 2} and out["assumptions"]["stays_with_measured"] is True
    assert out["interval"] == {} and out["assumptions"]["knee_from"] == "measured"
    assert re.match(r"measure \d+ workers with [3-9] PS next: the fit predicts \+\d+% \(\d+ vs 176 steps/s measured; "
                    r"interval \d+ \.\. \d+\)", out["assumptions"]["experiment"]), out["assumptions"]


def test_a_cluster_prediction_from_a_declaration_follows_the_speed_fits_rule(fitted: Path) -> None:
    """Issue 66: 3.1e12 FLOPs a step is 304x the largest the speed fit saw; predict speed
    gives no interval there, and predict cluster, whose single-worker time comes from the
    same speed fit, now gives none either (it gave a 95 % interval)."""
    argv = ["--gpus", "k80:4", "--ps", "1", "--flops-per-step", "3.1e12", "--params", "25.6e6"]
    out = _predict(fitted, "cluster", *argv)
    assert out["interval"] is None and "flops_per_step is 304x the largest fitted" in out["rough"]
    assert out["extrapolated"] is True and any("flops_per_step" in r for r in out["extrapolation"])
    speed = _predict(fitted, "speed", "--gpu-type", "k80", "--flops-per-step", "3.1e12", "--params", "25.6e6")
    assert speed["interval"] is None
    # inside the speed fit's ranges the cluster keeps its interval
    ok = _predict(fitted, "cluster", "--gpus", "k80:4", "--ps", "1", "--flops-per-step", "5e9", "--params", "5e6")
    assert ok["interval"] is not None and ok["interval"][0] < ok["prediction"] < ok["interval"][1]
