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


T0 = 1.75e9 - (1.75e9 % 300)


def _job(s, job: str, wall: int, saves: dict[int, list[float]], interval: float = 60.0) -> None:
    """``job`` steps for ``wall`` seconds on one node; ``saves``: rank -> save durations
    (spread over the run), plus a failed save, an empty one and a restore that never count."""
    from cmdare.wire.events import EventFactory

    f = EventFactory(f"{job}-n0", "worker", job)
    for ts in range(int(T0) + 60, int(T0) + wall + 1, 60):
        s.events.append(f.make("train_steps", {"run": "r", "steps": 60, "steps_per_second": 1.0,
                                               "interval_seconds": interval}, float(ts)))
    for rank, secs in saves.items():
        for i, sec in enumerate(secs):
            s.events.append(f.make("train_checkpoint", {"run": "r", "rank": rank, "action": "save", "seconds": sec,
                                                        "ok": True}, T0 + 30 + i * 60 + rank))
    for data in ({"action": "save", "seconds": 500.0, "ok": False}, {"action": "save", "seconds": 0.0},
                 {"action": "restore", "seconds": 500.0, "ok": True}):
        s.events.append(f.make("train_checkpoint", {"run": "r", "rank": 0, **data}, T0 + 45))


def test_the_finding_states_its_numbers_exactly(fleet) -> None:
    def build(s):
        _job(s, "at-share", 3600, {0: [45.0] * 4, 1: [50.0] * 3})  # rank 0: 180 s of 3600, exactly max_share
        _job(s, "a-under", 3600, {0: [44.0] * 4})  # judged first (by name)
        _job(s, "critical", 3600, {0: [300.0] * 3})  # exactly critical_share
        _job(s, "digits", 600, {0: [13.3456] * 7})
        _job(s, "a-once", 600, {0: [400.0]})  # fewer than min_saves (judged first, by name)
        _job(s, "a-instant", 60, {0: [5.0, 5.0]}, interval=0.0)  # one step record, no interval: no wall time
        _job(s, "brief", 60, {0: [0.1, 0.1]}, interval=1.0)  # one record of one second: 20 % of it saving

    con, _ = fleet(build)
    f = found(con, "checkpoint_overhead")
    assert set(f) == {"at-share", "critical", "digits", "brief"}
    (a,) = f["at-share"]
    best = math.sqrt(2 * 45 * 86400)
    assert a.evidence == {
        "save_share": 0.05, "saves": 4, "mean_save_seconds": 45.0, "interval_seconds": 900.0, "mtbf_seconds": 86400.0,
        "mtbf_from": "assumed (default_mtbf)", "young_daly_interval_seconds": round(best, 1),
        "share_at_young_daly": round(45 / best, 4), "young_daly_save_seconds_from": "measured",
    }
    assert a.summary == ("checkpoint saves take 5% of wall time (4 saves of 45.0 s, every 15 min); with 24.0 h "
                         "between revocations (assumed (default_mtbf)) save every 46 min")
    assert (a.severity, a.confidence, a.fit_ids) == ("warning", 0.75, ())
    assert (a.window_start, a.window_end) == (_utc(T0), _utc(T0 + 3600))
    assert f["critical"][0].severity == "critical" and f["critical"][0].evidence["save_share"] == 0.25
    d = f["digits"][0].evidence
    assert (d["save_share"], d["mean_save_seconds"], d["interval_seconds"]) == (0.1557, 13.346, 85.7)  # 600 s / 7
    assert "every 86 s" in f["digits"][0].summary
    assert "a-once" in found(con, "checkpoint_overhead", min_saves="1")
    (m,) = found(con, "checkpoint_overhead", default_mtbf="1000.25s")["at-share"]
    assert m.evidence["mtbf_seconds"] == 1000.2  # to one place
    # durations as the summary writes them: seconds under 90 s, minutes under 1.5 h, then hours
    for mtbf, said in (("60s", "60 s"), ("89s", "89 s"), ("90s", "2 min"), ("5399s", "90 min"), ("5400s", "1.5 h"),
                       ("9000s", "2.5 h")):
        (x,) = found(con, "checkpoint_overhead", default_mtbf=mtbf)["at-share"]
        assert f"with {said} between revocations" in x.summary, (mtbf, x.summary)


def _utc(ts: float):
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).replace(tzinfo=None)


def test_mtbf_of_a_curve_exactly() -> None:
    # area under the steps: 1 h at 1.0, 1 h at 0.5; 75 % gone by then: 1.5 / 0.75
    assert mtbf_hours({"times": [1.0, 2.0], "surv": [0.5, 0.25]}) == 2.0
    assert mtbf_hours({"times": [1.0, 2.0], "surv": [1.0, 1.0]}) is None  # nobody revoked: unknown
    assert mtbf_hours({}) is None


def test_a_job_with_few_saves_takes_its_save_time_from_the_overhead_fit(fleet) -> None:
    """Young/Daly with the fitted save time: three saves of a 48 MB checkpoint said little; the
    fit over CM-DARE's imported saves (about 5 s at that size) sets the interval, and says so."""
    from cmdare.analytics import models
    from cmdare.analytics.imports import overheads
    from cmdare.wire.events import EventFactory
    from tests.analytics.conftest import DATA

    def build(s):
        f = EventFactory("slow-n0", "worker", "slow")
        for ts in range(int(T0) + 60, int(T0) + 1200 + 1, 60):
            s.events.append(f.make("train_steps", {"run": "r", "steps": 60, "steps_per_second": 1.0,
                                                   "interval_seconds": 60.0}, float(ts)))
        for i in range(3):
            s.events.append(f.make("train_checkpoint", {"run": "r", "rank": 0, "action": "save", "seconds": 40.0,
                                                        "bytes": 48_000_000, "ok": True}, T0 + 300 + i * 300))

    con, _ = fleet(build)
    rows = overheads.parse("checkpoints", (DATA / "overheads" / "checkpoints.csv").read_text(), "c.csv")
    cols = [c.name for c in overheads.FORMATS["checkpoints"]] + ["id", "source", "line"]
    con.executemany(f"INSERT INTO checkpoint_records ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [[r[c] for c in cols] for r in rows])
    over = models.fit_overhead(con)
    models.save(con, over)
    (x,) = found(con, "checkpoint_overhead")["slow"]
    fitted = x.evidence["fitted_save_seconds"]
    assert 4.0 < fitted < 6.5  # CM-DARE's 48 MB checkpoints save in 4.8-5.2 s
    assert x.evidence["young_daly_save_seconds_from"] == f"overhead fit {over.fit_id}"
    assert x.evidence["young_daly_interval_seconds"] == pytest.approx(math.sqrt(2 * fitted * 86400), abs=0.2)
    assert x.evidence["mean_save_seconds"] == 40.0 and over.fit_id in x.fit_ids
