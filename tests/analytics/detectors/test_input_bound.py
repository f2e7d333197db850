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
