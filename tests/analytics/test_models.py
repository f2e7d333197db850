"""Performance models on a simulated fleet with known ground truth (tests/fakes/fleet.py),
through the real database file and the ``analyze fit`` / ``analyze predict`` CLI: each
model recovers its parameters within tolerance, cross-validation folds never share a
model architecture, too little data is said plainly, and an unknown accelerator names
what the catalogue has."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cmdare.analytics import catalog, models
from cmdare.analytics.cli import cli
from cmdare.analytics.db import AnalyticsError
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import MODELS, Fleet, Truth

TRUTH = Truth()


@pytest.fixture(scope="module")
def fleet_db(tmp_path_factory) -> Path:
    f = Fleet(TRUTH, seed=7)
    for m in MODELS:
        for a in ("k80", "p100", "v100", "t4"):
            f.job(m, a, checkpoints=2)
        for a in ("k80", "v100"):
            for w, p in ((2, 1), (4, 1), (8, 1), (8, 2)):
                f.job(m, a, workers=w, ps=p, intervals=15)
    f.vm_lives(per_group=60)
    p = tmp_path_factory.mktemp("fleet") / "fleet.duckdb"
    con = connect(p)
    assert Writer(con).write([("sim", encode_many(f.events))]).dead == 0
    con.close()
    return p


def cli_json(*args: str) -> dict[str, Any]:
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_steady_state_skips_the_ramp_the_tail_and_outliers(tmp_path: Path) -> None:
    con = connect(tmp_path / "s.duckdb")
    try:
        for job, counts in (
            ("long", [30, 60, 85, 100, 101, 99, 30, 100, 102, 40]),
            ("short", [30, 60, 85, 100, 101]),
        ):
            for i, n in enumerate(counts):
                con.execute(
                    "INSERT INTO steps (id, ts, node, job, run, rank, steps, steps_per_second) "
                    "VALUES (?, make_timestamp(?::BIGINT), 'n', ?, 'r', 0, ?, ?)",
                    [f"{job}{i}", int((1.7e9 + 10 * (i + 1)) * 1e6), job, n, n / 10.0],
                )
        rates = models.steady_rates(con)
    finally:
        con.close()
    assert rates["long"][0] == pytest.approx(10.0)  # ramp, a slow interval and the tail ignored
    assert "short" not in rates  # too short for a steady state


def test_speed_fit_recovers_the_roofline_and_predicts_held_out_models(fleet_db: Path) -> None:
    out = cli_json("fit", "speed", "--db", str(fleet_db))
    assert out["family"] == "roofline" and out["groups"] == len(MODELS) and out["rows"] == 4 * len(MODELS)
    c = out["coefficients"]
    assert c["compute_s"] == pytest.approx(TRUTH.a, rel=0.05)
    assert c["tensors"] == pytest.approx(TRUTH.c, rel=0.2)
    assert c["weights_s"] == pytest.approx(TRUTH.b, rel=0.25)  # the smallest term: least identifiable
    assert out["cv_mape"] < 0.05 and out["cv_r2"] > 0.99
    # predict an architecture with the fit: within its interval and a few percent of truth
    name, params, tensors, gflops = MODELS[2]
    flops = 3 * gflops * 1e9 * 32
    acc = catalog.load()["v100"]
    truth = 1 / TRUTH.t1(flops, params, tensors, acc)
    p = cli_json(
        "predict",
        "speed",
        "--gpu-type",
        "Tesla V100-SXM2-16GB",
        "--flops-per-step",
        str(flops),
        "--params",
        str(params),
        "--tensors",
        str(tensors),
        "--batch-size",
        "32",
        "--db",
        str(fleet_db),
    )
    assert p["fit_id"] == out["fit_id"] and p["accelerator"] == "v100"
    lo, hi = p["interval"]
    assert lo < truth < hi and p["prediction"] == pytest.approx(truth, rel=0.05)
    assert p["examples_per_second"] == pytest.approx(32 * p["prediction"])


def test_cv_folds_never_share_a_model_architecture(fleet_db: Path) -> None:
    con = connect(fleet_db)
    try:
        jobs, _ = models.job_speeds(con)
    finally:
        con.close()
    fit = models.fit_speed(jobs)
    folds = fit.cv["folds"]
    assert sorted(f["test_group"] for f in folds) == sorted(m[0] for m in MODELS)
    for f in folds:
        assert f["test_group"] not in f["train_groups"]
        assert len(f["train_groups"]) == len(MODELS) - 1 and f["test_rows"] == 4


def test_cluster_fit_recovers_the_ps_contention_term(fleet_db: Path) -> None:
    cli_json("fit", "speed", "--db", str(fleet_db))
    out = cli_json("fit", "cluster", "--db", str(fleet_db))
    c = out["coefficients"]
    assert c["t1_s"] == pytest.approx(1.0, rel=0.05)
    assert c["weights_gb_x_workers_per_ps"] == pytest.approx(TRUTH.f, rel=0.15)
    assert out["cv_mape"] < 0.05
    name, params, tensors, gflops = MODELS[6]  # vgg16: a big model, the PS saturates
    flops = 3 * gflops * 1e9 * 32
    args = [
        "--ps",
        "1",
        "--flops-per-step",
        str(flops),
        "--params",
        str(params),
        "--tensors",
        str(tensors),
        "--db",
        str(fleet_db),
    ]
    cat = catalog.load()
    t_k80, t_p100 = (TRUTH.t1(flops, params, tensors, cat[a]) for a in ("k80", "p100"))
    het = cli_json("predict", "cluster", "--gpus", "k80:2,p100:2", *args)
    truth = sum(1 / TRUTH.tw(t, params, 4, 1) for t in (t_k80, t_k80, t_p100, t_p100))  # spotDNN: sum 1/T_i
    assert het["prediction"] == pytest.approx(truth, rel=0.08) and het["workers"] == 4
    assert het["fit_id"] == out["fit_id"] and het["speed_fit_id"].startswith("speed-")
    hom = cli_json("predict", "cluster", "--gpu-type", "v100", "--workers", "8", *args)
    s = 4 * params / 1e9
    assert hom["ps_limit_steps_per_second"] == pytest.approx(1 / (TRUTH.f * s), rel=0.15)
    more = cli_json("predict", "cluster", "--gpu-type", "v100", "--workers", "16", *args)
    assert more["prediction"] < 1.5 * hom["prediction"]  # saturating: doubling workers gains little


def test_overhead_fit_recovers_checkpoint_costs(fleet_db: Path) -> None:
    out = cli_json("fit", "overhead", "--db", str(fleet_db))
    c = out["coefficients"]
    assert c["save_seconds_per_gb"] == pytest.approx(TRUTH.save_per_gb, rel=0.1)
    assert c["save_fixed_seconds"] == pytest.approx(TRUTH.save_fixed, rel=0.15)
    assert c["restore_seconds_per_gb"] == pytest.approx(TRUTH.restore_per_gb, rel=0.1)
    assert out["cv_mape"] < 0.06


def test_lifetime_fit_and_revocation_probability(fleet_db: Path) -> None:
    out = cli_json("fit", "lifetime", "--db", str(fleet_db))
    assert out["groups"] == 3 and out["family"] == "kaplan-meier"
    hr = out["coefficients"]
    # truth 0.08 / 0.03 = 2.67; with 60 lives a group the Cox estimate's standard error on
    # the log scale is ~0.22 (this seed gives 4.05, 1.9 standard errors off): the bound is
    # the fit's own 99 % interval; the large-sample test below holds it to 15 %
    assert abs(math.log(hr["hazard_ratio[acc_v100]"] / (0.08 / 0.03))) < 2.58 * 0.22
    for region, gpu, hours in (("europe-west4", "v100", 4), ("us-central1", "k80", 10)):
        rate = TRUTH.hazard_per_hour[(region, gpu)]
        p = cli_json(
            "predict",
            "revocation",
            "--region",
            region,
            "--gpu-type",
            gpu,
            "--hours",
            str(hours),
            "--db",
            str(fleet_db),
        )
        truth = 1 - math.exp(-rate * hours)
        lo, hi = p["interval"]
        assert lo <= truth <= hi and hi - lo < 0.35, (p, truth)
        assert p["fit_id"] == out["fit_id"]
    r = CliRunner().invoke(
        cli,
        [
            "predict",
            "revocation",
            "--region",
            "asia-east1",
            "--gpu-type",
            "v100",
            "--hours",
            "1",
            "--db",
            str(fleet_db),
        ],
    )
    assert r.exit_code == 1 and "no lifetime curve for region 'asia-east1'" in r.output
    assert "europe-west4/v100" in r.output


def test_unknown_accelerator_names_the_catalogue(fleet_db: Path) -> None:
    cli_json("fit", "speed", "--db", str(fleet_db))
    r = CliRunner().invoke(
        cli,
        [
            "predict",
            "speed",
            "--gpu-type",
            "gtx1080",
            "--flops-per-step",
            "1e12",
            "--params",
            "1e7",
            "--db",
            str(fleet_db),
        ],
    )
    assert r.exit_code == 1
    line = r.output.strip()
    assert line.startswith("Error: unknown accelerator 'gtx1080': the catalogue has a100-40gb,")
    assert "v100" in line and "tpu-v4" in line and len(line.splitlines()) == 1


def test_too_little_data_is_said_plainly(tmp_path: Path) -> None:
    f = Fleet(TRUTH, seed=1)
    for m in MODELS[:2]:
        f.job(m, "v100")
    p = tmp_path / "small.duckdb"
    con = connect(p)
    Writer(con).write([("sim", encode_many(f.events))])
    con.close()
    for kind, words in (
        ("speed", "the speed fit needs at least 5 configurations from 3 model architectures"),
        ("cluster", "the cluster fit needs at least 6 configurations"),
        ("lifetime", "the lifetime fit needs at least 10 spot VM lives with 3 revocations"),
    ):
        r = CliRunner().invoke(cli, ["fit", kind, "--db", str(p)])
        assert r.exit_code == 1 and words in r.output, r.output
    r = CliRunner().invoke(
        cli,
        [
            "predict",
            "speed",
            "--gpu-type",
            "v100",
            "--flops-per-step",
            "1e12",
            "--params",
            "1e7",
            "--db",
            str(p),
        ],
    )
    assert r.exit_code == 1 and "no speed fit stored yet: run analyze fit speed first" in r.output


def test_catalogue_extension_and_bad_rows(tmp_path: Path, monkeypatch) -> None:
    extra = tmp_path / "extra.csv"
    extra.write_text(
        "name,aliases,fp32_tflops,fp16_tflops,tf32_tflops,memory_gb,memory_bandwidth_gbs\n"
        "rtx4090,geforce rtx 4090,82.6,165.2,82.6,24,1008\n"
    )
    monkeypatch.setenv("CMDARE_ACCELERATORS", str(extra))
    assert catalog.lookup("NVIDIA GeForce RTX 4090").name == "rtx4090"
    assert catalog.lookup("v100").fp32_tflops == 15.7  # built-ins stay
    extra.write_text(
        "name,aliases,fp32_tflops,fp16_tflops,tf32_tflops,memory_gb,memory_bandwidth_gbs\nx,,fast,,,,\n"
    )
    with pytest.raises(AnalyticsError, match=r"extra.csv: row 2: fp32_tflops must be a number, got 'fast'"):
        catalog.load()


def test_lifetime_fit_reports_a_held_out_error_by_vm(fleet_db: Path) -> None:
    out = cli_json("fit", "lifetime", "--db", str(fleet_db))
    con = connect(fleet_db)
    try:
        cv = json.loads(
            con.execute("SELECT cv FROM model_fits WHERE fit_id = ?", [out["fit_id"]]).fetchone()[0]
        )
    finally:
        con.close()
    assert cv["folds"] == 5 and cv["scored_lives"] > 100
    assert 0 < cv["brier"] < cv["brier_pooled"]  # the per-group curves beat one pooled curve


def test_tensorboard_exports_feed_the_speed_fit(tmp_path: Path) -> None:
    """The acceptance path: global_step/sec CSV exports of runs, imported with analyze
    import tensorboard and the job declared by flags, are what the speed fit uses."""
    db = tmp_path / "tb.duckdb"
    cat = catalog.load()
    n = 0
    for name, params, tensors, gflops in MODELS[:6]:
        for acc in ("k80", "p100", "v100"):
            flops = 3 * gflops * 1e9 * 32
            rate = 1 / TRUTH.t1(flops, params, tensors, cat[acc])
            d = tmp_path / f"{name}-{acc}"
            d.mkdir()
            lines, step = ["Wall time,Step,Value"], 0
            for i in range(25):
                step += max(1, round(rate * 10))
                lines.append(f"{1.7e9 + 10 * (i + 1)},{step},{rate * (1 + 0.01 * ((i * 7) % 5 - 2))}")
            (d / "run-.-tag-global_step_sec.csv").write_text("\n".join(lines) + "\n")
            r = CliRunner().invoke(
                cli,
                [
                    "import",
                    "tensorboard",
                    str(d),
                    "--job",
                    f"{name}-{acc}",
                    "--gpu-type",
                    acc,
                    "--workers",
                    "1",
                    "--model",
                    name,
                    "--params",
                    str(int(params)),
                    "--tensors",
                    str(tensors),
                    "--flops-per-step",
                    str(flops),
                    "--batch-size",
                    "32",
                    "--tag",
                    "global_step/sec",
                    "--db",
                    str(db),
                ],
            )
            assert r.exit_code == 0, r.output
            n += 1
    out = cli_json("fit", "speed", "--db", str(db))
    assert out["rows"] == n and out["groups"] == 6
    assert out["cv_mape"] < 0.1


@pytest.mark.parametrize("seed", [3, 7])
def test_hazard_ratios_converge_to_the_truth_with_many_lives(tmp_path: Path, seed: int) -> None:
    """600 lives a group: the Cox fit's hazard ratios land within 15 % of the simulator's
    (accelerator 0.08 / 0.03, region 0.08 / 0.15) and inside their own 95 % intervals."""
    from cmdare.analytics.models.lifetime import fit_lifetime

    f = Fleet(TRUTH, seed=seed)
    f.vm_lives(per_group=600)
    con = connect(tmp_path / "lives.duckdb")
    assert Writer(con).write([("sim", encode_many(f.events))]).dead == 0
    fit = fit_lifetime(con)
    con.close()
    truth = {"acc_v100": 0.08 / 0.03, "region_us-central1": 0.08 / 0.15}
    ph = fit.model["phreg"]
    assert sorted(ph["columns"]) == sorted(truth)
    for col, b, se in zip(ph["columns"], ph["params"], ph["bse"], strict=True):
        assert fit.model["coefficients"][f"hazard_ratio[{col}]"] == pytest.approx(truth[col], rel=0.15), col
        assert abs(b - math.log(truth[col])) < 1.96 * se and se < 0.08, col


def _knorm_fit(a: float, b: float, c: float, d: float, k: float, g: float) -> dict[str, Any]:
    from cmdare.analytics.models.cluster import LAW, LAW_COLS

    theta = [math.log(a), math.log(b), math.log(c), math.log(d), math.log(k), g]
    zero = [[0.0] * 6 for _ in range(6)]
    return {"model": {"nonlinear": {"law": LAW, "columns": LAW_COLS, "params": theta, "cov": zero, "scale": 0.0,
                                    "df_resid": 10.0}}}


def test_a_cluster_fit_stored_in_the_linear_form_predicts_as_the_knorm_with_k_and_g_one() -> None:
    """Databases keep cluster fits of the linear form (before the k-norm): they still predict,
    and the same coefficients as a k-norm with k = g = 1 predict the same."""
    from cmdare.analytics.models.cluster import knee_workers, ps_limit, single_worker_seconds

    old = {"model": {"linear": {"columns": models.cluster.CLUSTER_COLS, "params": [1.0, 0.02, 0.06, 1e-9],
                                "cov": [[0.0] * 4 for _ in range(4)], "scale": 0.0, "df_resid": 10.0,
                                "relative": True}}}
    new = _knorm_fit(1.0, 0.02, 0.06, 1e-9, 1.0, 1.0)
    params, t1 = 25e6, 0.25  # S = 0.1 GB a step
    for w, ps in ((1, 1), (4, 1), (8, 2), (16, 3)):
        want = w / (t1 + 0.02 * 0.1 + 0.06 * 0.1 * w / ps + 1e-9)
        for fit in (old, new):
            r = models.predict_cluster(fit, [t1] * w, ps, params)
            assert r["steps_per_second"] == pytest.approx(want, rel=1e-6)
            assert single_worker_seconds(fit, want, w, ps, params) == pytest.approx(t1, rel=1e-6)
    for ps in (1, 2):
        assert ps_limit(old, ps, params) == pytest.approx(ps_limit(new, ps, params)) == pytest.approx(ps / 0.006)
        assert knee_workers(old, t1, ps, params) == knee_workers(new, t1, ps, params)
    r = models.predict_cluster(old, [t1] * 4, 1, params)
    assert r["workers_at_90pct_of_limit"] == pytest.approx(9 * (t1 + 0.002) / 0.006, rel=1e-6)


def test_the_knorm_bends_to_the_ps_limit_and_solves_back_for_the_single_worker_time() -> None:
    """k = 4: speed is within a few per cent of min(compute, PS limit) away from the corner;
    g = 0.5: two PS serve sqrt(2) what one does; the 90 %-of-limit count and T1 from a
    measured speed follow the same law."""
    from cmdare.analytics.models.cluster import ps_limit, single_worker_seconds

    fit = _knorm_fit(1.0, 1e-9, 0.3, 1e-9, 4.0, 0.5)
    params, t1 = 25e6, 0.1  # S = 0.1 GB: PS limit 1 / 0.03 = 33.3 steps/s on one PS
    assert ps_limit(fit, 1, params) == pytest.approx(1 / 0.03)
    assert ps_limit(fit, 2, params) == pytest.approx(math.sqrt(2) / 0.03)
    two = models.predict_cluster(fit, [t1] * 2, 1, params)["steps_per_second"]
    assert two == pytest.approx(20 / (1 + (20 * 0.03) ** 4) ** 0.25, rel=1e-6) and 19 < two < 20
    many = models.predict_cluster(fit, [t1] * 32, 1, params)
    assert 0.97 * (1 / 0.03) < many["steps_per_second"] < 1 / 0.03
    assert many["knee_workers"] in (3, 4)
    # speed = L / (1 + (t1 L / W)^k)^(1/k) = 0.9 L
    w90 = many["workers_at_90pct_of_limit"]
    assert w90 / (t1 * (1 / 0.03)) == pytest.approx(1 / ((1 / 0.9) ** 4 - 1) ** 0.25, rel=1e-6)
    for w in (2, 3, 5):
        v = models.predict_cluster(fit, [t1] * w, 1, params)["steps_per_second"]
        assert single_worker_seconds(fit, v, w, 1, params) == pytest.approx(t1, rel=1e-6)
    assert single_worker_seconds(fit, 40.0, 8, 1, params) is None  # past the PS limit: no T1 gives it


@pytest.mark.parametrize("ps", [2, 4])
def test_from_job_on_a_multi_ps_job_derives_the_single_worker_time_through_g(monkeypatch, ps: int) -> None:
    """Issue 65's defect: a job with 2 or 4 PS, on a fit with g = 0.5 (two PS serve sqrt(2)
    what one does). --from-job's anchor solves the fit for the single-worker time the job's
    measured speed implies, with P^g (0.100 s; with P^1 it came out 0.164 s at 2 PS and 8
    workers), and a prediction from that anchor at another size follows the law."""
    import datetime as dt

    from cmdare.analytics.models import fromjob
    from cmdare.analytics.models.steady import JobSpeed

    fit = _knorm_fit(1.0, 1e-9, 0.3, 1e-9, 4.0, 0.5)
    params, t1, w = 25e6, 0.1, 8
    speed = models.predict_cluster(fit, [t1] * w, ps, params)["steps_per_second"]
    now = dt.datetime(2026, 11, 29)
    job = JobSpeed("j", "m", "k80", w, ps, 1e12, params, 100.0, 32, speed, now, now)
    monkeypatch.setattr(fromjob, "measured", lambda con, name: job)
    a = fromjob.anchor(None, "j", fit)  # type: ignore[arg-type]
    assert a.derived and a.t1 == pytest.approx(t1, rel=1e-6)
    for w2 in (2, 16):
        want = models.predict_cluster(fit, [t1] * w2, ps, params)["steps_per_second"]
        assert models.predict_cluster(fit, [a.t1] * w2, ps, params)["steps_per_second"] == pytest.approx(want, rel=1e-6)
