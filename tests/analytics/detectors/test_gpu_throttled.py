from __future__ import annotations

import pytest

from .conftest import found


def test_throttled_share_reasons_clock_and_the_cost_in_step_time(fleet) -> None:
    def build(s):
        s.sim_job(kind="hot", nodes=2, gpus=2, throttled_node=0, throttle_share=0.5)
        s.sim_job(kind="cool", nodes=2, gpus=2)  # the odd power-cap sample (3 %) is not throttling

    con, _ = fleet(build)
    f = found(con, "gpu_throttled")
    assert set(f) == {"sim-hot-1"}
    hot = f["sim-hot-1"][0]
    assert hot.node == "sim-hot-1-n0" and hot.subject == "0,1"
    assert hot.evidence["throttled_share"] == pytest.approx(0.5, abs=0.1)
    assert "hw_thermal_slowdown" in hot.evidence["reasons"] and "gpu_idle" not in hot.evidence["reasons"]
    assert hot.evidence["sm_clock_ratio"] == pytest.approx(0.7, abs=0.02)
    assert hot.evidence["step_slowdown"] == pytest.approx(1.25, abs=0.08)
    assert hot.evidence["slowdown_against"] == "while unthrottled"
    assert found(con, "gpu_throttled", min_share="0.9") == {}


def _node(s, job: str, node: str, buckets: list[tuple[int, float, float]]) -> None:
    """One GPU and its steps on ``node``: per 5-minute bucket (throttle mask, SM clock Hz,
    step seconds), ten GPU samples and one step record of ten steps."""
    from cmdare.wire.events import EventFactory

    f = EventFactory(node, "worker", job)
    t0 = 1.75e9 - (1.75e9 % 300)
    for b, (mask, clock, step) in enumerate(buckets):
        for k in range(10):
            s.events.append(f.make("gpu", {"index": 0, "uuid": f"G-{node}", "util_gpu_ratio": 0.9,
                                           "throttle_mask": mask, "sm_clock_hz": clock}, t0 + 300 * b + 10 + 20 * k))
        s.events.append(f.make("train_steps", {"run": "r", "rank": 0, "steps": 10, "step_mean_seconds": step,
                                               "interval_seconds": 10.0}, t0 + 300 * b + 150))


def test_the_finding_states_its_numbers_exactly(fleet) -> None:
    """Half its samples throttled (hardware thermal and software power cap; the idle bit
    is not a reason), the SM clock at 1.0 GHz then against 1.6 GHz, steps 1.25 s then
    against 1.0 s: each figure as the documented rule gives it."""
    import datetime as dt

    hot = 0x40 | 0x4 | 0x1
    con, _ = fleet(lambda s: (
        _node(s, "thr", "thr-n0", [(hot, 1.0e9, 1.25), (hot, 1.0e9, 1.25), (0, 1.6e9, 1.0), (0, 1.6e9, 1.0)]),
        _node(s, "thr", "thr-n1", [(0, 1.6e9, 1.0)] * 4),
    ))
    (f,) = found(con, "gpu_throttled")["thr"]
    assert f.evidence == {"throttled_share": 0.5, "gpus": 1, "reasons": "sw_power_cap,hw_thermal_slowdown",
                          "sm_clock_ratio": 0.625, "step_slowdown": 1.25, "slowdown_against": "while unthrottled"}
    assert f.summary == ("1 GPUs on thr-n0 throttled 50% of the time (sw_power_cap,hw_thermal_slowdown), "
                         "SM clock at 62%; steps 1.25x slower than while unthrottled")
    assert (f.severity, f.confidence, f.node, f.subject) == ("warning", 0.9, "thr-n0", "0")
    t0 = dt.datetime.fromtimestamp(1.75e9 - (1.75e9 % 300), dt.timezone.utc).replace(tzinfo=None)
    assert (f.window_start, f.window_end) == (t0, t0 + dt.timedelta(seconds=600))
    crit = found(con, "gpu_throttled", critical_slowdown="1.25")["thr"][0]
    assert crit.severity == "critical"  # from the slowdown itself


def test_without_unthrottled_time_the_cost_is_against_the_jobs_other_nodes(fleet) -> None:
    con, _ = fleet(lambda s: (
        _node(s, "all", "all-n0", [(0x20, 1.2e9, 1.5)] * 4),
        _node(s, "all", "all-n1", [(0, 1.5e9, 1.25)] * 4),
        _node(s, "alone", "alone-n0", [(0x20, 1.2e9, 1.5)] * 4),  # no peers, no unthrottled time
    ))
    f = found(con, "gpu_throttled")
    a = f["all"][0]
    assert (a.evidence["step_slowdown"], a.evidence["slowdown_against"], a.severity) == (
        1.2, "the job's other nodes", "warning")  # 1.5 s against 1.25 s
    lone = f["alone"][0]
    assert (lone.evidence["step_slowdown"], lone.evidence["slowdown_against"], lone.confidence) == (None, None, 0.75)
    # never unthrottled: no clock to compare with either
    assert lone.summary == "1 GPUs on alone-n0 throttled 100% of the time (sw_thermal_slowdown)"
    assert lone.evidence["sm_clock_ratio"] is None


def test_figures_are_kept_to_three_places_and_a_gpu_never_throttled_is_never_reported(fleet) -> None:
    """One bucket of three throttled (exactly min_samples samples with a mask): share 1/3,
    SM clock 1.0 against 1.7 GHz, steps 1.23456 s against 1.0 s."""
    con, _ = fleet(lambda s: (
        _node(s, "digits", "digits-n0", [(0x4, 1.0e9, 1.23456), (0, 1.7e9, 1.0), (0, 1.7e9, 1.0)]),
        _node(s, "digits", "digits-n1", [(0, 1.7e9, 1.0)] * 3),
    ))
    (f,) = found(con, "gpu_throttled")["digits"]
    assert (f.evidence["throttled_share"], f.evidence["sm_clock_ratio"], f.evidence["step_slowdown"]) == (
        0.333, 0.588, 1.235)
    assert found(con, "gpu_throttled", min_samples="31") == {}
    # min_share 0: every throttled GPU, however briefly; one never throttled is not (it crashed)
    assert [x.node for x in found(con, "gpu_throttled", min_share="0")["digits"]] == ["digits-n0"]


def test_a_reason_bit_with_the_clock_where_it_was_is_no_finding(fleet) -> None:
    """Issue 66: ``sw_power_cap`` set while the SM clock stayed at 100 % was reported as
    throttling. A reason bit counts only with the clock at least ``min_clock_drop`` (5 %)
    below its unthrottled clock; 96 % is not throttled, 94 % is."""
    cap = 0x4 | 0x1

    def node(clock: float):
        return lambda s: (_node(s, "cap", "cap-n0", [(cap, clock, 1.0), (cap, clock, 1.0), (0, 1.6e9, 1.0),
                                                       (0, 1.6e9, 1.0)]))

    con, _ = fleet(node(1.6e9))
    assert found(con, "gpu_throttled").get("cap", []) == []
    con, _ = fleet(node(0.96 * 1.6e9))
    assert found(con, "gpu_throttled").get("cap", []) == []
    con, _ = fleet(node(0.94 * 1.6e9))
    (f,) = found(con, "gpu_throttled")["cap"]
    assert f.evidence["sm_clock_ratio"] == pytest.approx(0.94, abs=1e-3)
    con, _ = fleet(node(1.6e9))
    assert len(found(con, "gpu_throttled", min_clock_drop="0")["cap"]) == 1  # the option turns it off
