"""placement: Pecan's AutoPlacement state machine through every transition (remote up
accepted / rejected, a noisy measurement, local up accepted / stopped by the -10 % rule or
the local limit, remote removal economical / not, the trace ending in each phase), the cost
per 1,000 steps, and bad traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.analytics.db import AnalyticsError
from cmdare.analytics.recommend.placement import auto_placement, cost_per_1000_steps
from tests.analytics.test_demo_fleet import demo_db  # noqa: F401  (the simulated fleet, a module fixture)

C, W = 2.48, 0.19  # accelerator host, remote worker: $/hour

FULL = {
    (1, 0): 0.200, (2, 0): 0.110, (3, 0): 0.080, (4, 0): 0.078,  # remote up: +45 %, +27 %, +2.5 % (stop)
    (3, 1): 0.072, (3, 2): 0.070, (3, 3): 0.080,  # local up: +10 %, +2.8 %, -14 % (stop)
    (2, 2): 0.074, (1, 2): 0.095,  # remote down: -5.7 % (economical), -28 % (not)
}


def write(tmp_path: Path, trace: dict[tuple[int, int], float], name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text("remote,local,batch_ms\n" + "".join(f"{r},{loc},{b * 1000:g}\n" for (r, loc), b in trace.items()))
    return p


def test_every_transition_of_the_policy(tmp_path: Path) -> None:
    rp = auto_placement(FULL, C, W)
    assert rp.done and rp.settled == (2, 2) and rp.next_to_try is None
    phases = [(ph, c) for ph, c, _, _ in rp.path]
    assert phases == [
        ("start", (1, 0)), ("remote up", (2, 0)), ("remote up", (3, 0)), ("remote up", (4, 0)),
        ("local up", (3, 1)), ("local up", (3, 2)), ("local up", (3, 3)),
        ("remote down", (2, 2)), ("remote down", (1, 2)),
    ]
    # removal economics: w > -r x (c + n_remote x w), n_remote before the removal
    r1 = 1 - 0.074 / 0.070
    assert W > -r1 * (C + 3 * W)
    r2 = 1 - 0.095 / 0.074
    assert not W > -r2 * (C + 2 * W)
    code = CliRunner().invoke(cli, ["recommend", "placement", "--trace", str(write(tmp_path, FULL)),
                                    "--host-price", str(C), "--worker-price", str(W), "--json"])
    out = json.loads(code.stdout)
    assert out["kind"] == "placement" and out["action"] == {"remote": 2, "local": 2}
    assert out["cost"]["dollars_per_1000_steps"] == pytest.approx(cost_per_1000_steps(0.074, 2, C, W), rel=1e-3)
    assert out["assumptions"]["cost_per_1000_steps_3r_0l"] == pytest.approx(1000 * 0.080 / 3600 * (C + 3 * W), rel=1e-3)
    assert "rejected" in out["why"] and out["assumptions"]["settled"] is True


def test_a_noisy_measurement_stops_scale_up_as_published() -> None:
    # 2 -> 3 remote improves by 2.9 % only through noise: r <= 3 % stops the scale-up there
    trace = {(1, 0): 0.2, (2, 0): 0.103, (3, 0): 0.100, (4, 0): 0.06, (2, 1): 0.101}
    rp = auto_placement(trace, C, W)
    assert [c for ph, c, _, _ in rp.path if ph == "local up"] == [(2, 1)]
    assert rp.settled[0] == 2 and not rp.done and rp.next_to_try == (2, 2)


def test_the_local_limit_and_an_expensive_host_keep_remote_workers() -> None:
    trace = {(1, 0): 0.1, (2, 0): 0.099, (1, 1): 0.09, (1, 2): 0.085, (0, 1): 0.2}
    rp = auto_placement(trace, 50.0, 0.1, local_limit=1)
    assert rp.settled == (1, 1) and rp.done  # the limit stops local up; removing the only remote worker costs too much
    assert [ph for ph, *_ in rp.path] == ["start", "remote up", "local up", "remote down"]


@pytest.mark.parametrize(
    "trace, settled, nxt",
    [
        ({(1, 0): 0.2, (2, 0): 0.1}, (2, 0), (3, 0)),  # ends while scaling remote up
        ({(1, 0): 0.2, (2, 0): 0.199}, (1, 0), (1, 1)),  # ends before local up
        ({(1, 0): 0.2, (2, 0): 0.199, (1, 1): 0.3}, (1, 0), (0, 0)),  # ends before removing
    ],
)
def test_a_trace_that_ends_first_names_the_next_configuration(trace, settled, nxt) -> None:
    rp = auto_placement(trace, C, W)
    assert (rp.settled, rp.done, rp.next_to_try) == (settled, False, nxt)


def test_bad_traces_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(AnalyticsError, match=r"no batch time for remote=2, local=0.*a gap"):
        auto_placement({(1, 0): 0.2, (3, 0): 0.1}, C, W)
    with pytest.raises(AnalyticsError, match="remote workers only"):
        auto_placement({(1, 1): 0.2}, C, W)
    bad = tmp_path / "bad.csv"
    for text, error in (
        ("remote,batch_ms\n1,20\n", "expected a header with columns remote,local,batch_ms"),
        ("remote,local,batch_ms\n1,0,-5\n", "line 2: counts must be >= 0 and batch_ms positive"),
        ("remote,local,batch_ms\none,0,5\n", "line 2: remote and local must be integers"),
    ):
        bad.write_text(text)
        r = CliRunner().invoke(cli, ["recommend", "placement", "--trace", str(bad), "--host-price", "1", "--worker-price", "0.1"])
        assert r.exit_code == 1 and error in r.stderr, (text, r.stderr)
    r = CliRunner().invoke(cli, ["recommend", "placement", "--trace", str(tmp_path / "none.csv"), "--host-price", "1",
                                 "--worker-price", "0.1"])
    assert r.exit_code == 1 and "cannot read" in r.stderr
    r = CliRunner().invoke(cli, ["recommend", "placement", "--trace", str(write(tmp_path, FULL)), "--host-price", "0",
                                 "--worker-price", "0.1"])
    assert r.exit_code == 1 and "needs --host-price and --worker-price" in r.stderr


def test_from_a_jobs_telemetry(input_db) -> None:
    db, job = input_db
    r = CliRunner().invoke(cli, ["recommend", "placement", "--job", job, "--db", str(db), "--host-price", "2.48",
                                 "--worker-price", "0.19", "--local-limit", "2", "--json"])
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    # the replay: remote up to 5 (6 adds nothing), 2 local workers (free, no slower), then
    # one remote worker removed (4 + 2 local still keep up) and not a second (3 + 2: -6 %,
    # not economical): 4 remote, 2 local
    assert out["assumptions"]["source"] == f"telemetry of {job}" and out["assumptions"]["configurations_measured"] == 10
    assert "remote down (3,2)" in out["why"] and "rejected" in out["why"]
    # issue 51, one answer per job: how many is recommend data-workers' (5 here), placement
    # keeps its 2 local workers and says what its replay alone would: 4 + 2
    dw = CliRunner().invoke(cli, ["recommend", "data-workers", "--job", job, "--db", str(db), "--json"])
    n = json.loads(dw.stdout)["action"]["workers"]
    assert out["action"] == {"remote": n - 2, "local": 2} and out["assumptions"]["placement_would_say"] == "4 remote, 2 local"
    assert f"{n} input workers as recommend data-workers decides" in out["why"]
    assert out["predicted"]["batch_seconds"] == pytest.approx(0.21, rel=0.05)  # (3,2): a configuration the job ran at
    r = CliRunner().invoke(cli, ["recommend", "placement", "--job", job, "--trace", "x.csv", "--db", str(db),
                                 "--host-price", "1", "--worker-price", "1"])
    assert r.exit_code == 1 and "or --job J, one of them" in r.stderr


def test_a_jobs_own_instance_types_price_it_when_no_price_is_given(input_db, demo_db) -> None:  # noqa: F811
    """Issue 51: placement answered "needs --host-price and --worker-price" for jobs whose
    nodes run catalogued instance types. Their catalogue prices stand in for a price not
    given (said in prices_from); a job whose nodes the catalogue does not price is refused,
    naming what it lacks."""
    r = CliRunner().invoke(cli, ["recommend", "placement", "--job", "sim-input-6", "--db", str(demo_db), "--json"])
    assert r.exit_code == 0, r.stderr
    a = json.loads(r.stdout)["assumptions"]
    assert a["host_price_per_hour"] == pytest.approx(2.86)  # n1-standard-8 with one V100, on demand
    assert a["worker_price_per_hour"] == pytest.approx(0.38)  # n1-standard-8, the input workers' VMs
    assert "from the price catalogue" in a["prices_from"]
    r = CliRunner().invoke(cli, ["recommend", "placement", "--job", "sim-input-6", "--db", str(demo_db),
                                 "--host-price", "5", "--json"])
    a = json.loads(r.stdout)["assumptions"]
    assert a["host_price_per_hour"] == 5 and a["worker_price_per_hour"] == pytest.approx(0.38)
    db, job = input_db  # simulated without cloud identities
    r = CliRunner().invoke(cli, ["recommend", "placement", "--job", job, "--db", str(db)])
    assert r.exit_code == 1 and "no catalogue price for the job's accelerator host" in r.stderr
