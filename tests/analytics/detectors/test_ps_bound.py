from __future__ import annotations

import csv
import datetime as dt

import pytest
from click.testing import CliRunner

from cmdare.analytics import catalog
from cmdare.analytics.cli import cli
from cmdare.analytics.detectors.ps_bound import PsBound
from cmdare.analytics.models.steady import JobSpeed
from cmdare.analytics.units import Scope
from tests.analytics.conftest import DATA

from .conftest import found


def test_a_saturating_ps_is_found_from_scaling_marginal_gain_and_the_ps_host(fleet) -> None:
    def build(s):
        s.ps_family(saturating=True, ps_agent=True)  # jobs 1 (one worker), 2..5: 2, 4, 6, 8 workers
        s.ps_family(saturating=False, ps_agent=True)  # jobs 6..10
        # data-parallel (no PS) at a quarter of linear: not ps_bound's to judge
        s.sim_job({}, kind="ar", nodes=1, gpus=1, rank_speed=4.0, model="ar-model", accelerator="v100")
        s.sim_job({}, kind="ar", nodes=6, gpus=1, rank_speed=1.0, model="ar-model", accelerator="v100")
        # one worker with a PS at a quarter of the single workers' speed: scaling is not in question
        s.sim_job({}, kind="ar", nodes=1, gpus=1, rank_speed=1.0, ps=1, model="ar-model", accelerator="v100")
        # a PS job on an accelerator the catalogue does not know, judged first (by name): skipped
        s.sim_job({}, kind="aaa", nodes=4, gpus=1, rank_speed=0.5, ps=1, model="odd", accelerator="abacus-9")

    con, s = fleet(build)
    f = found(con, "ps_bound")
    assert set(f) == {j for j, lab in s.labels.items() if "ps_bound" in lab} == {"sim-ps-3", "sim-ps-4", "sim-ps-5"}
    six = f["sim-ps-4"][0]
    ev = six.evidence
    assert ev["workers"] == 6 and ev["ps"] == 1 and ev["single_worker_from"] == "measured"
    assert ev["efficiency"] < 0.6 and ev["marginal_from_workers"] == 4 and ev["marginal_gain"] < 0.3
    assert ev["ps_cpu_util_ratio"] > 0.9 and ev["ps_nic_bytes_per_second"] > 1e9
    assert ev["evidence_available"] == ev["evidence_agreeing"] == 2 and six.confidence == 0.95
    assert six.subject == "sim-ps-4-ps0" and six.suggests == ("cluster",)
    assert "marginal gain" in six.summary and "PS host CPU" in six.summary
    # the NIC is judged when its capacity is given: 1.8 GB/s of a 10 Gbit/s link
    nic = found(con, "ps_bound", nic_gbps="10")["sim-ps-4"][0]
    assert nic.evidence["ps_nic_share"] > 0.8
    # only jobs stepping in the scope are judged
    assert found(con, "ps_bound", Scope(since=dt.datetime(2100, 1, 1))) == {}


def test_without_a_single_worker_reference_it_says_nothing(fleet) -> None:
    def build(s):
        s.sim_job({}, kind="ps", nodes=4, gpus=1, rank_speed=0.5, ps=1, model="lonely")

    con, _ = fleet(build)
    assert found(con, "ps_bound") == {}


@pytest.mark.skipif(not (DATA / "jobs.csv").is_file(), reason=f"CM-DARE's measurements are not at {DATA}")
def test_real_cluster_runs_p100_one_ps_stops_scaling_k80_does_not(real_db) -> None:
    """CM-DARE's scaling runs: P100 with one PS stops scaling at 4-5 workers (every run with
    6 or more is flagged); K80 scales almost linearly (none is)."""
    res = CliRunner().invoke(cli, ["bottlenecks", "--kind", "ps_bound", "--no-store", "--json", "--db", str(real_db)])
    assert res.exit_code == 0, res.output
    import json

    flagged = {f["job"]: f for f in json.loads(res.stdout)}
    runs = list(csv.DictReader(open(DATA / "jobs.csv")))
    p100_1ps = {r["job"] for r in runs if r["gpu_type"].lower() == "p100" and r["ps"] == "1" and int(r["workers"]) >= 6}
    k80 = {r["job"] for r in runs if r["gpu_type"].lower() == "k80" and int(r["workers"]) > 1}
    assert p100_1ps and k80
    assert p100_1ps <= set(flagged), sorted(p100_1ps - set(flagged))
    assert not k80 & set(flagged)
    for job in p100_1ps:
        ev = flagged[job]["evidence"]
        assert ev["efficiency"] < 0.8 and ev["marginal_gain"] < 0.5 and ev["single_worker_from"] == "measured"


def test_the_cluster_fits_ps_limit_is_evidence_and_named(tmp_path) -> None:
    """Parameter-server clusters from the fleet simulator's contention truth, speed and
    cluster fits stored: ps_bound names the fits it used and how close the job is to the
    PS limit."""
    from cmdare.analytics import models
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import encode_many
    from tests.fakes.fleet import MODELS, Fleet

    f = Fleet(seed=3)
    for m in MODELS[:8]:
        for a in ("k80", "v100"):
            f.job(m, a)
            for w in (2, 4, 8):
                f.job(m, a, workers=w, ps=1, intervals=15)
    con = connect(tmp_path / "c.duckdb")
    Writer(con).write([("sim", encode_many(f.events))])
    jobs, _ = models.job_speeds(con)
    sp = models.fit_speed(jobs)
    models.save(con, sp)
    cl = models.fit_cluster(jobs, models.latest(con, "speed"))
    models.save(con, cl)
    got = [x for fs in found(con, "ps_bound").values() for x in fs]
    con.close()
    assert got
    for x in got:
        assert cl.fit_id in x.fit_ids
        assert 0 < x.evidence["share_of_ps_limit"] < 1 and x.evidence["ps_limit_steps_per_second"] > 0
        assert x.evidence["evidence_available"] == 2  # the marginal gain and the cluster fit
        assert x.evidence["efficiency"] < 0.8 and "of the cluster fit's PS limit" in x.summary
    # the truth's contention grows with the weights moved: the big VGGs are flagged at fewer workers
    assert any(x.job.startswith("vgg") and x.evidence["workers"] == 2 for x in got)
    assert not any(x.job.startswith(("resnet18", "resnet34")) and x.evidence["workers"] < 8 for x in got)


# the decision rule itself (docs/detectors.md#ps_bound), on steady-state speeds given exactly

T0 = dt.datetime(2026, 1, 1)
T1 = T0 + dt.timedelta(hours=1)


def _js(job: str, workers: int, speed: float, ps: int = 1, acc: str = "nvidia-tesla-k80", model: str = "m") -> JobSpeed:
    return JobSpeed(job, model, acc, workers, ps, 3e12, 25e6, 160, None, speed, T0, T1, catalog.lookup(acc))


def _judge(target: JobSpeed, others: list[JobSpeed], ps_hw=(), speed_fit=None, cluster_fit=None, **options):
    d = PsBound(PsBound.parse_options("ps_bound", options))
    return d._judge(target, [target, *others], speed_fit, cluster_fit, list(ps_hw), ["t-ps0"] if ps_hw else [])


# single workers (no PS) at 1.0, 1.8, 2.0, 4.0 steps/s (the reference: the upper median, 2.0),
# two runs at 4 workers (their median, 6.0, is what 4 workers reach), one other at 6, one with two PS, and runs of
# another model and another accelerator (never compared)
REFS = [_js("s1", 1, 1.0, ps=0), _js("s2", 1, 4.0, ps=0), _js("s3", 1, 1.8, ps=0), _js("s4", 1, 2.0, ps=0),
        _js("w4a", 4, 6.2), _js("w4b", 4, 5.8), _js("w6", 6, 6.4), _js("w4ps2", 4, 7.9, ps=2),
        _js("w5ps2", 5, 9.0, ps=2), _js("o1", 1, 100.0, model="other"), _js("o2", 1, 100.0, acc="nvidia-tesla-v100"),
        _js("o4", 5, 1.0, model="other")]


def test_the_rule_states_its_numbers_exactly() -> None:
    f = _judge(_js("t", 6, 6.6), REFS, ps_hw=[(0.9, 1e8)])  # PS CPU at exactly ps_busy_cpu
    assert f.evidence == {
        "workers": 6, "ps": 1, "steps_per_second": 6.6, "single_worker_steps_per_second": 2.0,
        "single_worker_from": "measured", "efficiency": 0.55, "marginal_from_workers": 4, "marginal_gain": 0.15,
        "ps_cpu_util_ratio": 0.9, "ps_nic_bytes_per_second": 100_000_000, "evidence_available": 2,
        "evidence_agreeing": 2,
    }
    assert f.summary == ("6 workers x 1 PS on k80 run at 55% of linear scaling (6.6 vs 12 steps/s); marginal gain "
                         "0.15 per worker from 4 to 6 workers; PS host CPU 90% (saturated)")
    assert (f.job, f.severity, f.confidence, f.subject, f.suggests, f.fit_ids) == (
        "t", "warning", 0.95, "t-ps0", ("cluster",), ())
    assert (f.window_start, f.window_end) == (T0, T1)
    # one of two pieces of evidence agreeing
    half = _judge(_js("t", 6, 6.6), REFS, ps_hw=[(0.89, None)])
    assert half.evidence["evidence_agreeing"] == 1 and half.confidence == pytest.approx(0.55 + 0.4 / 2)
    assert half.summary.endswith("PS host CPU 89%") and "ps_nic_bytes_per_second" not in half.evidence


def test_efficiency_gates_and_severity_at_their_bounds() -> None:
    assert _judge(_js("t", 5, 8.0), REFS, ps_hw=[(1.0, None)]) is None  # 80 %: min_efficiency is "below"
    assert _judge(_js("t", 5, 8.0), REFS, ps_hw=[(1.0, None)], min_efficiency="0.81").evidence["efficiency"] == 0.8
    # critical under 50 % of linear (exactly 50 % is a warning), or when the last workers added nothing
    assert _judge(_js("t", 6, 6.1), REFS).severity == "warning"  # 51 %, gain 0.025
    assert _judge(_js("t", 6, 5.9), REFS).severity == "critical"
    flat = _judge(_js("t", 6, 6.6), [*REFS, _js("w5", 5, 6.6)])
    assert (flat.evidence["marginal_from_workers"], flat.evidence["marginal_gain"], flat.severity) == (5, 0.0, "critical")
    # a marginal gain at max_marginal_gain is not "too little"; nothing else points at the PS: no finding
    assert _judge(_js("t", 6, 8.0), REFS, ps_hw=[(0.5, None)]) is None  # gain (8.0 - 6.0) / 4 = 0.5
    assert _judge(_js("t", 6, 8.0), REFS, ps_hw=[(0.5, None)], max_marginal_gain="0.51").evidence[
        "evidence_agreeing"] == 1


def test_the_nic_is_judged_from_its_capacity_at_exactly_nic_busy() -> None:
    f = _judge(_js("t", 6, 6.6), REFS, ps_hw=[(0.5, 1e8), (0.2, 5e7)], nic_gbps="1")  # 0.8 Gbit/s of 1
    assert (f.evidence["ps_cpu_util_ratio"], f.evidence["ps_nic_share"], f.evidence["evidence_agreeing"]) == (0.5, 0.8, 2)
    assert f.summary.endswith("PS host CPU 50% (saturated)")
    g = _judge(_js("t", 6, 6.6), REFS, ps_hw=[(0.5, 1e8)], nic_gbps="1", nic_busy="0.8000000001")
    assert g.evidence["evidence_agreeing"] == 1 and g.summary.endswith("PS host CPU 50%")
    h = _judge(_js("t", 6, 6.6), REFS, ps_hw=[(0.5, 1.01637e8)], nic_gbps="1")
    assert h.evidence["ps_nic_share"] == 0.813  # 0.813096


def test_with_single_workers_only_the_marginal_gain_is_from_their_median() -> None:
    f = _judge(_js("t", 6, 6.6), REFS[:4])
    assert (f.evidence["marginal_from_workers"], f.evidence["marginal_gain"]) == (1, 0.47)  # (6.6 - 1.9) / 5 / 2.0
    assert _judge(_js("t", 6, 6.6), REFS[:4], max_marginal_gain="0.46") is None  # not below: nothing else points at it


def test_one_slow_run_at_the_next_smaller_count_does_not_hide_a_ps_bound_job() -> None:
    """The held-out CM-DARE case: a P100 1-PS series whose 7-worker run happened to be slow
    (a noisy neighbour); the 8-worker run at 39 % of linear must still be found."""
    s1 = 30.0
    series = [_js("w1", 1, s1, ps=0), _js("w2", 2, 55.0), _js("w4", 4, 88.0), _js("w5", 5, 95.0),
              _js("w6", 6, 94.0), _js("w7", 7, 70.0)]  # the 7-worker run: slowed by a neighbour
    f = _judge(_js("t", 8, 0.39 * 8 * s1), series)
    assert f is not None and f.evidence["marginal_from_workers"] == 5  # where the series was fastest
    assert f.evidence["marginal_gain"] < 0 and f.severity == "critical"


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    """Speed and cluster fits of the fleet simulator's PS runs (as stored)."""
    from cmdare.analytics import models
    from cmdare.analytics.detectors import evidence
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import encode_many
    from tests.fakes.fleet import MODELS, Fleet

    f = Fleet(seed=3)
    for m in MODELS[:6]:
        for a in ("k80", "v100"):
            f.job(m, a)
            for w in (2, 4):
                f.job(m, a, workers=w, ps=1, intervals=15)
    con = connect(tmp_path_factory.mktemp("fits") / "c.duckdb")
    Writer(con).write([("sim", encode_many(f.events))])
    jobs, _ = models.job_speeds(con)
    models.save(con, models.fit_speed(jobs))
    models.save(con, models.fit_cluster(jobs, models.latest(con, "speed")))
    out = evidence.latest_fit(con, "speed"), evidence.latest_fit(con, "cluster")
    con.close()
    return out


def test_without_measured_single_workers_the_speed_fit_is_the_reference(fits) -> None:
    from cmdare.analytics.models.speed import predict_speed

    speed_fit, _ = fits
    probe = _js("t", 6, 1.0)
    s1 = predict_speed(speed_fit, probe.acc, probe.flops_per_step, probe.params, probe.tensors)[0]
    t = _js("t", 6, round(3.6 * s1, 4))  # about 60 % of linear
    eff = t.speed / (6 * s1)
    f = _judge(t, [], speed_fit=speed_fit)
    assert f.evidence == {
        "workers": 6, "ps": 1, "steps_per_second": t.speed, "single_worker_steps_per_second": round(s1, 4),
        "single_worker_from": "speed fit", "efficiency": round(eff, 3), "evidence_available": 0,
        "evidence_agreeing": 0,
    } and f.fit_ids == (speed_fit["fit_id"],)
    # no runs at other counts, no cluster fit, no PS agent: info at confidence 0.5 (critical under 50 %)
    assert (f.severity, f.confidence) == ("info", 0.5) and 0.55 < eff < 0.65
    assert f.summary.endswith("no other evidence (no runs at other worker counts, no cluster fit, no PS agent)")
    assert _judge(t, [], speed_fit=speed_fit, min_efficiency=repr(eff)) is None
    # a fit it cannot read (another layout): no reference, no finding, no crash
    assert _judge(t, [], speed_fit={"fit_id": "odd", "model": {}}, min_efficiency="1") is None
    assert _judge(t, [], min_efficiency="1") is None


def test_the_cluster_fits_ps_limit_votes_from_near_limit(fits) -> None:
    from cmdare.analytics.models.cluster import ps_limit

    _, cluster_fit = fits
    t = _js("t", 6, 6.6)
    lim = ps_limit(cluster_fit, 1, t.params)
    assert lim and lim > 0
    share = 6.6 / lim
    f = _judge(t, REFS, cluster_fit=cluster_fit, near_limit=repr(share))
    assert (f.evidence["ps_limit_steps_per_second"], f.evidence["share_of_ps_limit"]) == (round(lim, 4), round(share, 3))
    assert f.evidence["evidence_available"] == 2 and f.evidence["evidence_agreeing"] == 2
    assert f.fit_ids == (cluster_fit["fit_id"],) and f"{share:.0%} of the cluster fit's PS limit" in f.summary
    g = _judge(t, REFS, cluster_fit=cluster_fit, near_limit=repr(min(1.0, share * 1.01)))
    assert g.evidence["evidence_agreeing"] == 1
    assert _judge(t, REFS, cluster_fit={"fit_id": "odd", "model": {}}).evidence["evidence_available"] == 1


def test_the_steady_speed_is_kept_to_four_places() -> None:
    f = _judge(_js("t", 6, 6.63334), REFS, ps_hw=[(0.91234, None)])
    assert (f.evidence["steps_per_second"], f.evidence["efficiency"], f.evidence["ps_cpu_util_ratio"]) == (
        6.6333, 0.553, 0.912)  # efficiency 0.55278
    assert f.evidence["marginal_gain"] == 0.158  # (6.63334 - 6.0) / 2 workers / 2.0


def test_ps_host_samples_whose_net_cannot_be_read_are_skipped_not_fatal(tmp_path) -> None:
    """A host sample whose stored ``net`` is not the expected JSON (written by another
    version, or edited) costs that sample's NIC reading only: the CPU still counts."""
    from cmdare.analytics.detectors.ps_bound import _nic_rates
    from cmdare.collector.db import connect

    con = connect(tmp_path / "n.duckdb")
    rows = [("ps0", 0, 0.5, '[{"rx_bytes_total": 0, "tx_bytes_total": 0}]'),
            ("ps0", 10, 0.7, '[{"rx_bytes_total": "lots"}]'),  # not a number: skipped
            ("ps0", 20, 0.9, '[{"rx_bytes_total": null}]'),
            ("ps0", 30, 0.3, '[{"rx_bytes_total": 3000}, {"tx_bytes_total": 1000}]'),  # two NICs
            ("ps0", 40, None, "[1, 2]"),
            ("ps1", 0, 0.2, None),
            ("ps2", 0, 0.4, '[{"rx_bytes_total": 5000, "tx_bytes_total": 0}]'),
            ("ps2", 10, 0.4, '[{"rx_bytes_total": 10, "tx_bytes_total": 0}]'),  # counters reset: no rate
            ("ps3", 0, 0.6, '[{"rx_bytes_total": 0, "tx_bytes_total": 0}]'),
            ("ps3", 0, 0.6, '[{"rx_bytes_total": 900, "tx_bytes_total": 0}]'),  # the same instant: no rate
            ("ps4", 0, 0.1, '[{"rx_bytes_total": 0}]'),
            ("ps4", 1, 0.1, '[{"rx_bytes_total": 500}]'),  # one second later: 500 B/s
            ("ps5", 0, 0.1, '[{"rx_bytes_total": 7}]'),
            ("ps5", 10, 0.1, '[{"rx_bytes_total": 7}]')]  # nothing moved: 0 B/s
    for node, t, cpu, net in rows:
        con.execute("INSERT INTO host_samples (id, ts, node, cpu_util_ratio, net) VALUES "
                    "(?, make_timestamp(CAST(? AS BIGINT) * 1000000), ?, ?, ?)",
                    [f"{node}-{t}", 1_750_000_000 + t, node, cpu, net])
    got = _nic_rates(con, Scope(), ["ps0", "ps1", "ps2", "ps3", "ps4", "ps5"])
    con.close()
    assert got == {"ps0": (pytest.approx((0.5 + 0.7 + 0.9 + 0.3) / 4), 4000 / 30), "ps1": (0.2, None),
                   "ps2": (0.4, None), "ps3": (0.6, None), "ps4": (0.1, 500.0), "ps5": (0.1, 0.0)}
