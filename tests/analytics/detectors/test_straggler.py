from __future__ import annotations

from .conftest import found


def test_persistent_and_transient_stragglers_are_named_with_their_hardware(fleet) -> None:
    def build(s):
        s.sim_job(kind="persistent", nodes=5, gpus=1, slow_rank=3, slow=1.8, slow_cpu=True)
        s.sim_job(kind="transient", nodes=4, gpus=1, slow_rank=1, slow=1.8, slow_window=(0.3, 0.72))
        s.sim_job(kind="even", nodes=6, gpus=1, rank_spread=0.03)
        s.sim_job(kind="two", nodes=2, gpus=1, slow_rank=1, slow=2.0)  # two ranks: no peers to compare with

    con, _ = fleet(build)
    f = found(con, "straggler")
    assert set(f) == {"sim-persistent-1", "sim-transient-2"}
    p, t = f["sim-persistent-1"][0], f["sim-transient-2"][0]
    assert (p.rank, p.node, p.severity) == (3, "sim-persistent-1-n3", "warning")
    assert p.evidence["persistent"] is True and p.evidence["slowdown"] > 1.6
    assert p.evidence["host_cpu_util_ratio"] > 0.9 and p.evidence["peer_host_cpu_util_ratio"] < 0.5
    assert "host CPU" in p.summary and "vs peers'" in p.summary
    assert (t.rank, t.severity, t.evidence["persistent"]) == (1, "info", False)
    assert 2 <= t.evidence["slow_windows"] < t.evidence["windows"]


def test_the_noise_floor_is_an_option(fleet) -> None:
    con, _ = fleet(lambda s: s.sim_job(kind="mild", nodes=4, gpus=1, slow_rank=0, slow=1.15))
    assert found(con, "straggler") == {}
    got = found(con, "straggler", min_slowdown="1.1")["sim-mild-1"][0]
    assert got.rank == 0 and 1.1 <= got.evidence["slowdown"] < 1.25
