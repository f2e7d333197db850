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
