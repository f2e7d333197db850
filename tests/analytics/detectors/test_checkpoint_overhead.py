from __future__ import annotations

import math

import pytest

from cmdare.analytics.detectors.checkpoint_overhead import mtbf_hours, young_daly_seconds

from .conftest import found


def test_save_share_and_the_young_daly_interval(fleet) -> None:
    def build(s):
        s.sim_job(kind="often", ckpt_every=120.0, ckpt_seconds=15.0)
        s.sim_job(kind="rare", ckpt_every=1200.0, ckpt_seconds=15.0)

    con, _ = fleet(build)
    f = found(con, "checkpoint_overhead")
    assert set(f) == {"sim-often-1"}
    c = f["sim-often-1"][0]
    assert c.evidence["save_share"] == pytest.approx(15 / 120, rel=0.15)
    assert c.evidence["mtbf_from"] == "assumed (default_mtbf)" and c.evidence["mtbf_seconds"] == 86400
    want = math.sqrt(2 * c.evidence["mean_save_seconds"] * 86400)
    assert c.evidence["young_daly_interval_seconds"] == pytest.approx(want, rel=1e-3)
    assert c.severity == "warning" and c.fit_ids == ()
    short = found(con, "checkpoint_overhead", default_mtbf="1h")["sim-often-1"][0]
    assert short.evidence["young_daly_interval_seconds"] == pytest.approx(math.sqrt(2 * c.evidence["mean_save_seconds"] * 3600), rel=1e-3)


def test_mtbf_from_a_survival_curve() -> None:
    # an exponential life with a 5 h mean, as Kaplan-Meier steps at every hour up to 10 h
    times = [float(t) for t in range(1, 11)]
    surv = [math.exp(-t / 5) for t in times]
    assert mtbf_hours({"times": times, "surv": surv}) == pytest.approx(5.0, rel=0.12)
    assert mtbf_hours({"times": [], "surv": []}) is None
    assert young_daly_seconds(10, 7200) == pytest.approx(379.47, rel=1e-3)


def test_mtbf_comes_from_the_lifetime_fit_of_the_jobs_vms(fleet) -> None:
    from cmdare.analytics import models

    def build(s):
        s.vm_lives(per_group=60)
        job = s.sim_job(kind="often", ckpt_every=120.0, ckpt_seconds=15.0)
        s._ev(s.t0, f"{job}-n0", "instance", {"cloud": "gce", "region": "europe-west4", "zone": "europe-west4-a",
                                              "spot": True, "accelerator": "nvidia-tesla-v100", "accelerator_count": 1})

    con, _ = fleet(build)
    fit = models.fit_lifetime(con)
    models.save(con, fit)
    (c,) = found(con, "checkpoint_overhead")["sim-often-1"]
    assert c.fit_ids == (fit.fit_id,) and c.evidence["mtbf_from"].startswith("lifetime fit, europe-west4/")
    # the simulator's truth: 0.15 revocations per hour there (a 6.7 h mean), owner stops censoring some lives
    assert 3 * 3600 < c.evidence["mtbf_seconds"] < 14 * 3600
    assert c.confidence == 0.9
