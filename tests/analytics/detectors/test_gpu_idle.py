from __future__ import annotations

from .conftest import found


def test_idle_gpus_of_a_running_job_and_memory_held_with_no_work(fleet) -> None:
    def build(s):
        s.sim_job(kind="idle", nodes=2, gpus=4, idle=((1, 2), (1, 3)))
        s.sim_job(kind="held", nodes=1, gpus=2, held_after=0.5)
        s.sim_job(kind="warmup", nodes=1, gpus=2, warmup=4)  # loading data for 4 minutes: not idle
        s.sim_job(kind="busy", nodes=2, gpus=2)

    con, _ = fleet(build)
    f = found(con, "gpu_idle")
    assert set(f) == {"sim-idle-1", "sim-held-2"}
    idle = f["sim-idle-1"][0]
    assert (idle.node, idle.subject, idle.severity) == ("sim-idle-1-n1", "2,3", "warning")
    assert idle.evidence["idle_gpus"] == 2 and idle.evidence["gpus"] == 4
    assert 0.9 <= idle.evidence["gpu_hours_wasted"] <= 1.1  # 2 GPUs x 30 minutes
    held = f["sim-held-2"][0]
    assert held.evidence["in_job"] is False and held.evidence["mem_used_bytes"] > 10 * 2**30
    assert held.subject == "0,1" and "hold 12.0 GiB" in held.summary


def test_every_gpu_idle_is_a_stalled_job_and_options_apply(fleet) -> None:
    con, _ = fleet(lambda s: s.sim_job(kind="stalled", nodes=1, gpus=2, idle=((0, 0), (0, 1))))
    f = found(con, "gpu_idle")["sim-stalled-1"][0]
    assert f.severity == "critical" and f.evidence["job_stalled"] is True
    assert found(con, "gpu_idle", min_idle="2h") == {}
