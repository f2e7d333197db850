from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from tests.analytics.conftest import DATA

from .conftest import found


def test_a_saturating_ps_is_found_from_scaling_marginal_gain_and_the_ps_host(fleet) -> None:
    def build(s):
        s.ps_family(saturating=True, ps_agent=True)  # jobs 1 (one worker), 2..5: 2, 4, 6, 8 workers
        s.ps_family(saturating=False, ps_agent=True)  # jobs 6..10

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
