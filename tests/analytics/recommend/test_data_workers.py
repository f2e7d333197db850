"""data-workers against the published rules: the tf.data service auto-scaler (outlier
replacement, N = max(1, ceil(sum consumption / mean worker throughput)), the growth bound)
and Cachew's knee, through analyze recommend."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.analytics.recommend.data_workers import cachew_knee, replace_outliers, tfdata_workers


def rec(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["recommend", "data-workers", *args])
    return r.exit_code, r.stdout, r.stderr


def test_the_tfdata_rule_with_an_outlier_worker() -> None:
    # two consumers wanting an element every 10 ms (200/s); four workers at 40 ms, one of
    # them at 400 ms: mean 130 ms, sd 156 ms, so 400 is outside mean +/- sd and becomes the
    # median 40 ms: 25 elements/s each -> ceil(200 / 25) = 8
    code, out, err = rec("--consumer-ms", "10,10", "--worker-ms", "40,40,40,400", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["kind"] == "data-workers" and r["action"] == {"workers": 8}
    assert r["predicted"]["consumption_per_second"] == pytest.approx(200)
    assert r["predicted"]["worker_throughput_per_second"] == pytest.approx(25)
    assert r["assumptions"]["worker_outliers_replaced"] == 1 and r["assumptions"]["growth_bounded"] is False
    assert set(r) == {"kind", "action", "predicted", "interval", "cost", "fit_ids", "assumptions", "why"}
    # without the replacement the 400 ms worker would drag the mean throughput to 19.4/s: 11 workers
    assert tfdata_workers([0.01, 0.01], [0.04, 0.04, 0.04, 0.4])["wanted"] == 8


def test_growth_is_bounded_from_the_current_count_and_at_least_one_worker() -> None:
    assert tfdata_workers([0.001] * 10, [0.1], current=1)["workers"] == 4  # wants 1000: min(4 x 1, 1 + 500)
    assert tfdata_workers([0.001] * 10, [0.1], current=200)["workers"] == 700  # min(800, 700)
    assert tfdata_workers([0.001] * 10, [0.1], current=0)["workers"] == 1000
    assert tfdata_workers([1.0], [0.001])["workers"] == 1  # one worker is plenty: still one
    assert tfdata_workers([0.01], [0.04])["workers"] == 4  # exact ratios do not round up


def test_outlier_replacement_is_by_the_median_outside_one_standard_deviation() -> None:
    assert replace_outliers([1, 2, 3, 100]) == ([1, 2, 3, 2.5], 1)
    assert replace_outliers([5, 5, 5]) == ([5, 5, 5], 0)
    assert replace_outliers([1, 9]) == ([1, 9], 0)  # too few to tell


def test_cachews_knee_settles_where_one_more_worker_adds_less_than_7_percent() -> None:
    # an improvement of exactly the threshold does not earn the worker (0.5: exact in binary)
    assert cachew_knee({1: 1.0, 2: 0.5, 3: 0.1}, 0.5)[:2] == (1, True)
    n, settled, rs = cachew_knee({1: 0.120, 2: 0.070, 3: 0.062, 4: 0.060}, 0.07)
    assert (n, settled) == (3, True) and [k for k, _ in rs] == [2, 3, 4]
    assert rs[1][1] == pytest.approx(1 - 62 / 70) and rs[2][1] < 0.07
    code, out, _ = rec("--batch-ms", "1:120,2:70,3:62,4:60")
    assert code == 0 and out.startswith("data-workers: workers 3")
    # the series ends while still improving: try one more
    code, out, _ = rec("--batch-ms", "1:120,2:70", "--json")
    r = json.loads(out)
    assert r["action"] == {"workers": 3} and r["assumptions"]["settled"] is False and "try 3" in r["why"]
    # the threshold is an option
    assert cachew_knee({1: 0.1, 2: 0.09}, 0.05)[0:2] == (2, False)
    assert cachew_knee({1: 0.1, 2: 0.09}, 0.2)[0:2] == (1, True)


def test_the_cost_when_a_worker_price_is_given() -> None:
    code, out, _ = rec("--consumer-ms", "10,10", "--worker-ms", "40", "--worker-price", "0.19", "--json")
    r = json.loads(out)
    assert r["cost"] == {"dollars_per_hour": pytest.approx(8 * 0.19)} and r["assumptions"]["worker_price_per_hour"] == 0.19


@pytest.mark.parametrize(
    "args, error",
    [
        ([], "data-workers needs figures"),
        (["--worker-ms", "40"], "give both --consumer-ms and --worker-ms"),
        (["--consumer-ms", "10", "--worker-ms", "0"], "--worker-ms: times must be positive milliseconds, got '0'"),
        (["--consumer-ms", "ten", "--worker-ms", "4"], "--consumer-ms: expected numbers of milliseconds, got 'ten'"),
        (["--batch-ms", "1:120,3:60"], "worker counts must be consecutive"),
        (["--batch-ms", "1:120"], "needs batch times at two worker counts or more"),
        (["--batch-ms", "1:120,2"], "expected WORKERS:MS"),
        (["--batch-ms", "1:120,2:60", "--consumer-ms", "1", "--worker-ms", "1"], "not both"),
    ],
)
def test_bad_figures_are_one_line_errors(args, error) -> None:
    code, _, err = rec(*args)
    assert code == 1 and error in err and "Traceback" not in err


def test_from_a_jobs_telemetry_the_rule_and_the_knee(input_db) -> None:
    db, job = input_db
    code, out, err = rec("--job", job, "--db", str(db), "--worker-price", "0.19", "--json")
    assert code == 0, err
    (one,) = (json.loads(line) for line in out.splitlines())  # one answer per job
    # the knee settled at 5: it stands, and says what the tf.data rule said
    assert one["assumptions"]["rule"] == "Cachew knee" and one["action"] == {"workers": 5}
    assert one["assumptions"]["other_rule"] == "tf.data service auto-scaler"
    assert one["assumptions"]["rule_chosen_because"].startswith("measured batch times stop improving")
    assert "tf.data service auto-scaler" in one["why"]
    tf = one  # the measured rates the tf.data rule divided ride along
    # last 10 minutes: 2 ranks at 0.2 s compute per 64-example batch = 640 elements/s; 5
    # remote workers at 128/s and 2 local at ~107/s (outliers, replaced by the median):
    # ceil(640 / 128) = 5, or 6 with the noise pushing consumption a little above 640
    assert tf["assumptions"]["other_rule_workers"] in (5, 6)
    assert tf["predicted"]["consumption_per_second"] == pytest.approx(640, rel=0.03)
    assert tf["predicted"]["worker_throughput_per_second"] == pytest.approx(128, rel=0.03)
    assert one["assumptions"]["source"] == f"telemetry of {job}"
    # Cachew over the remote-only configurations it ran at (1..6 workers): the knee at 5
    assert one["assumptions"]["settled"] is True and one["assumptions"]["measured_counts"] == 6


def test_from_a_job_without_input_telemetry_says_what_it_needs(input_db, tmp_path) -> None:
    db, job = input_db
    code, _, err = rec("--job", "nope", "--db", str(db))
    assert code == 1 and f"--job nope: no such job with step telemetry (jobs: {job})" in err
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import encode_many
    from tests.fakes.fleet import Scenarios

    f = Scenarios(seed=1)
    plain = f.sim_job({}, minutes=5)
    con = connect(tmp_path / "p.duckdb")
    Writer(con).write([("sim", encode_many(f.events))])
    con.close()
    code, _, err = rec("--job", plain, "--db", str(tmp_path / "p.duckdb"))
    assert code == 1 and "no input-worker telemetry: input workers report it with track.init(job, role='data')" in err
    code, _, err = rec("--job", job, "--db", str(db), "--consumer-ms", "10")
    assert code == 1 and "give --job (figures from telemetry) or figures, not both" in err
