from __future__ import annotations

import pytest

from cmdare.analytics.db import AnalyticsError

from .conftest import found


def test_input_wait_and_hardware_agree_wait_alone_or_hardware_alone(fleet) -> None:
    def build(s):
        s.sim_job(kind="both", wait=0.45, util=0.3, cpu=0.95)
        s.sim_job(kind="hwonly", wait=0.45, wait_known=False, util=0.3, cpu=0.95)
        s.sim_job(kind="moderate", wait=0.1, util=0.85, cpu=0.4)
        s.sim_job(kind="healthy", wait=0.02, util=0.9, cpu=0.4)
        s.sim_job(kind="lowutil", wait=0.02, wait_known=False, util=0.3, cpu=0.3)  # slow GPU work, idle CPU

    con, _ = fleet(build)
    f = found(con, "input_bound")
    assert set(f) == {"sim-both-1", "sim-hwonly-2", "sim-moderate-3"}
    both, hw, mod = f["sim-both-1"][0], f["sim-hwonly-2"][0], f["sim-moderate-3"][0]
    assert both.confidence == 0.95 and both.evidence["profiler_class"] == "highly input-bound"
    assert both.evidence["input_wait_share"] == pytest.approx(0.45, abs=0.03)
    assert both.evidence["host_cpu_util_ratio"] > 0.9 and both.evidence["gpu_util_ratio"] < 0.4
    assert both.suggests == ("data-workers", "placement") and both.severity == "warning"
    assert hw.confidence == 0.6 and hw.evidence["evidence"] == "hardware only" and hw.evidence["input_wait_share"] is None
    assert mod.severity == "info" and mod.evidence["profiler_class"] == "moderately input-bound"
    assert mod.confidence == 0.7  # the hardware does not back it
    assert both.window_start < both.window_end


def test_thresholds_are_options(fleet) -> None:
    con, _ = fleet(lambda s: s.sim_job(kind="hwonly", wait_known=False, util=0.3, cpu=0.8))
    assert found(con, "input_bound") == {}
    assert set(found(con, "input_bound", busy_cpu="0.75")) == {"sim-hwonly-1"}
    with pytest.raises(AnalyticsError, match=r"input_bound.busy_cpu: must be a number from 0 to 1, got '2'"):
        found(con, "input_bound", busy_cpu="2")


def _job(s, job: str, steps: int, wait: float | None, util: float | None = None, cpu: float | None = None) -> None:
    """``steps`` steps of 1 s over ten 10 s intervals, ``wait`` of each waiting for input;
    the node's GPU at ``util`` and host CPU at ``cpu`` meanwhile."""
    from cmdare.wire.events import EventFactory

    f = EventFactory(f"{job}-n0", "worker", job)
    t0 = 1.75e9
    for k in range(10):
        n = steps // 10 + (1 if k < steps % 10 else 0)
        d = {"run": "r", "rank": 0, "steps": n, "interval_seconds": 10.0, "step_mean_seconds": 1.0}
        if wait is not None:
            d["wait_mean_seconds"] = wait
        s.events.append(f.make("train_steps", d, t0 + 10 * k))
        if util is not None:
            s.events.append(f.make("gpu", {"index": 0, "uuid": f"G-{job}", "util_gpu_ratio": util}, t0 + 10 * k))
        if cpu is not None:
            s.events.append(f.make("host", {"cpu_util_ratio": cpu}, t0 + 10 * k))


def test_min_steps_and_the_hardware_thresholds_are_inclusive_where_documented(fleet) -> None:
    """Judged from exactly ``min_steps`` (20) steps; the hardware points at input when the
    accelerators are below ``max_gpu_util`` (0.5) and the host CPU at ``busy_cpu`` (0.85)
    or more."""
    def build(s):
        _job(s, "few", 19, 0.5)
        _job(s, "enough", 20, 0.5)
        _job(s, "edge", 40, None, util=0.25, cpu=0.75)  # hardware only: the CPU at its edge
        _job(s, "busy", 40, None, util=0.5, cpu=0.99)  # accelerators not below 0.5: no finding

    con, _ = fleet(build)
    f = found(con, "input_bound")
    assert set(f) == {"enough"}
    f = found(con, "input_bound", busy_cpu="0.75")  # binary-exact values: the edge itself
    assert set(f) == {"enough", "edge"} and f["edge"][0].evidence["evidence"] == "hardware only"


def test_the_finding_states_its_numbers_exactly(fleet) -> None:
    def build(s):
        _job(s, "waits", 30, 0.12345)  # no hardware samples
        _job(s, "backed", 30, 0.3, util=0.4321, cpu=0.8766)
        _job(s, "unbacked", 30, 0.3, util=0.9, cpu=0.2)

    con, _ = fleet(build)
    f = {j: v[0] for j, v in found(con, "input_bound").items()}
    w, b, u = f["waits"], f["backed"], f["unbacked"]
    assert w.evidence == {"input_wait_share": 0.1235, "gpu_util_ratio": None, "host_cpu_util_ratio": None,
                          "steps": 30, "profiler_class": "moderately input-bound", "evidence": "input wait"}
    assert (w.confidence, w.severity) == (0.8, "info")
    assert w.summary == "input-bound: 12% of step time waiting for input (moderately input-bound)"
    assert b.evidence["gpu_util_ratio"] == 0.432 and b.evidence["host_cpu_util_ratio"] == 0.877
    assert (b.confidence, b.severity, b.evidence["evidence"]) == (0.95, "warning", "input wait + hardware")
    assert b.summary == ("input-bound: 30% of step time waiting for input (highly input-bound); "
                         "accelerators 43% busy, host CPU 88% (saturated)")
    assert u.confidence == 0.7 and u.summary.endswith("accelerators 90% busy, host CPU 20%")


def test_one_job_judged_healthy_or_with_half_its_hardware_costs_no_other_job(fleet) -> None:
    """Jobs are judged in name order, each on its own: a healthy one before, and one whose
    node sent GPU samples but no host samples (the hardware then backs nothing)."""
    def build(s):
        _job(s, "a-healthy", 30, 0.01, util=0.9, cpu=0.2)
        _job(s, "b-gpu-only", 30, 0.3, util=0.2)
        _job(s, "c-waits", 30, 0.3)

    con, _ = fleet(build)
    f = {j: v[0] for j, v in found(con, "input_bound").items()}
    assert set(f) == {"b-gpu-only", "c-waits"}
    g = f["b-gpu-only"]
    assert (g.confidence, g.evidence["evidence"], g.evidence["gpu_util_ratio"], g.evidence["host_cpu_util_ratio"]) == (
        0.8, "input wait", 0.2, None)
