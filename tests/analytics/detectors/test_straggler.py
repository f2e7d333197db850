from __future__ import annotations

import pytest

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


def _ranks(s, job: str, times: list[list[float]], hw: dict[int, tuple[float, float | None, int]] | None = None) -> None:
    """Steps of ``job``: ``times[rank][window]`` seconds a step, three records a 300 s window;
    ``hw``: rank -> (GPU utilisation, host CPU, GPU samples of 8 throttled) on its node."""
    from cmdare.wire.events import EventFactory

    t0 = 1.75e9 - (1.75e9 % 300)
    for rank, per_window in enumerate(times):
        f = EventFactory(f"{job}-n{rank}", "worker", job)
        if hw and rank in hw:
            util, cpu, throttled = hw[rank]
            for k in range(8):
                s.events.append(f.make("gpu", {"index": 0, "uuid": f"G-{job}-{rank}", "util_gpu_ratio": util,
                                               "throttle_mask": 0x20 if k < throttled else 0},
                                       t0 + 5 + 10 * k))
                if cpu is not None:
                    s.events.append(f.make("host", {"cpu_util_ratio": cpu}, t0 + 5 + 10 * k))
        for w, t in enumerate(per_window):
            for k in range(3):
                s.events.append(f.make("train_steps", {"run": "r", "rank": rank, "steps": 10,
                                                       "steps_per_second": 1 / t, "interval_seconds": 10.0},
                                       t0 + w * 300 + 60 * k + 5))


def test_a_slow_rank_among_noisy_peers_is_not_a_straggler_until_its_z_score_says_so(fleet) -> None:
    """Past the 1.2 slowdown floor a rank must also stand out of its peers' spread (robust
    z >= 3.5): among ranks that differ by +-15 %, one 1.3x the median is noise; among ranks
    in near lock-step, the same 1.3x is a straggler."""
    noisy = [[x] * 4 for x in (1.0, 1.15, 0.85, 1.1, 0.9)] + [[1.3] * 4]
    steady = [[x] * 4 for x in (1.0, 1.01, 0.99, 1.02, 0.98)] + [[1.3] * 4]
    con, _ = fleet(lambda s: (_ranks(s, "noisy", noisy), _ranks(s, "steady", steady)))
    f = found(con, "straggler")
    assert set(f) == {"steady"} and f["steady"][0].rank == 5
    assert 3.5 <= f["steady"][0].evidence["max_z"]
    assert set(found(con, "straggler", z="1.0")) == {"noisy", "steady"}  # the gate is what kept it out


def test_one_slow_window_is_not_enough_and_persistence_is_a_share_of_windows(fleet) -> None:
    base = [[1.0, 1.01, 0.99, 1.0, 1.02] for _ in range(5)]
    once = [list(r) for r in base] + [[1.0, 1.6, 1.0, 1.0, 1.0]]  # slow in 1 of 5 windows
    half = [list(r) for r in base] + [[1.6, 1.6, 1.6, 1.0, 1.0]]  # 3 of 5: persistent
    some = [list(r) for r in base] + [[1.6, 1.6, 1.0, 1.0, 1.0]]  # 2 of 5: transient
    con, _ = fleet(lambda s: (_ranks(s, "once", once), _ranks(s, "half", half), _ranks(s, "some", some)))
    f = found(con, "straggler")
    assert set(f) == {"half", "some"}  # min_windows 2
    assert (f["half"][0].evidence["slow_windows"], f["half"][0].evidence["persistent"]) == (3, True)
    assert (f["some"][0].evidence["slow_windows"], f["some"][0].evidence["persistent"]) == (2, False)
    assert f["half"][0].severity == "warning" and f["some"][0].severity == "info"
    assert set(found(con, "straggler", min_windows="1")) == {"once", "half", "some"}
    assert found(con, "straggler", persistent_share="0.7")["half"][0].evidence["persistent"] is False


def test_the_finding_states_its_numbers_exactly(fleet) -> None:
    """One straggler with known step times: every evidence number, the summary, severity,
    confidence and window are what the documented rule gives."""
    import datetime as dt

    # ranks at 1.0, 1.01, 0.99, 1.02, 0.98 s a step; rank 5 at 1.7 s in 3 of 5 windows
    times = [[x] * 5 for x in (1.0, 1.01, 0.99, 1.02, 0.98)] + [[1.7, 1.7, 1.7, 1.0, 1.0]]
    con, _ = fleet(lambda s: _ranks(s, "exact", times))
    (f,) = found(con, "straggler")["exact"]
    med = (1.0 + 1.01) / 2  # the median of six step times
    mad = 1.4826 * ((0.015 + 0.015) / 2)  # deviations 0.005 0.005 0.015 0.015 0.025 0.695
    assert f.evidence == {
        "slowdown": 1.692, "slow_windows": 3, "windows": 5, "slow_share": 0.6,
        "max_z": round((1.7 - med) / mad, 2), "ratio_all_windows": 1.692, "ranks": 6,
        "persistent": True,
    } and round(1.7 / med, 4) == 1.6915  # kept to 3 places
    assert f.summary == "rank 5 on exact-n5: persistent straggler, steps 1.69x its 5 peers' median in 3 of 5 windows"
    assert (f.severity, f.rank, f.node) == ("warning", 5, "exact-n5")  # under the 2x of critical
    assert f.confidence == pytest.approx(0.6 + 0.35 * 0.6)
    t0 = dt.datetime.fromtimestamp(1.75e9 - (1.75e9 % 300), dt.timezone.utc).replace(tzinfo=None)
    assert (f.window_start, f.window_end) == (t0, t0 + dt.timedelta(seconds=900))
    # one-second windows (each holds one record per rank); a zero window is taken as one second
    (one,) = found(con, "straggler", window="1s")["exact"]
    assert (one.evidence["windows"], one.evidence["slow_windows"]) == (15, 9)
    assert found(con, "straggler", window="0s")["exact"][0].evidence == one.evidence


def test_severity_is_critical_from_twice_the_median_and_transients_are_info_at_half_confidence(fleet) -> None:
    twice = [[1.0] * 4 for _ in range(4)] + [[2.0] * 4]  # 2x in every window
    brief = [[1.0] * 7 for _ in range(4)] + [[3.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0]]  # 2 of 7
    con, _ = fleet(lambda s: (_ranks(s, "twice", twice), _ranks(s, "brief", brief)))
    f = found(con, "straggler")
    assert (f["twice"][0].severity, f["twice"][0].evidence["slowdown"]) == ("critical", 2.0)
    b = f["brief"][0]
    assert (b.severity, b.confidence, b.evidence["persistent"]) == ("info", 0.5, False)
    assert "transient straggler" in b.summary and b.evidence["slow_share"] == round(2 / 7, 3)


def test_the_nodes_hardware_is_stated_against_its_peers_in_the_same_job(fleet) -> None:
    """The straggler's node next to its job's other nodes (never another job's): GPU
    utilisation, throttled share and host CPU to three places, the peers' median CPU, and
    the notes the summary gives when they stand out."""
    times = [[1.0] * 4 for _ in range(4)] + [[1.5] * 4]
    hw = {r: (0.75, 0.3125, 0) for r in range(4)}
    hw[4] = (0.4375, 0.9375, 3)  # busy host, 3 of 8 samples throttled
    other = [[1.0] * 4 for _ in range(5)]  # five idle hosts in another job: never its peers
    con, _ = fleet(lambda s: (_ranks(s, "hot", times, hw),
                              _ranks(s, "other", other, {r: (0.1, 0.0625, 0) for r in range(5)})))
    (f,) = found(con, "straggler")["hot"]
    ev = f.evidence
    assert (ev["gpu_util_ratio"], ev["throttled_share"], ev["host_cpu_util_ratio"], ev["xids"]) == (0.438, 0.375, 0.938, 0)
    assert ev["peer_host_cpu_util_ratio"] == 0.312  # the median of its own job's other nodes
    assert f.summary.endswith("; its node showed GPU throttled 38% of the time, host CPU 94% vs peers' 31%")


def test_persistence_counts_from_exactly_the_share_and_max_z_is_capped(fleet) -> None:
    half = [[1.0] * 4 for _ in range(4)] + [[1.5, 1.5, 1.0, 1.0]]  # slow in 2 of 4: persistent
    lockstep = [[1.0] * 4 for _ in range(4)] + [[1.5] * 4]  # peers identical: no spread at all
    con, _ = fleet(lambda s: (_ranks(s, "half", half), _ranks(s, "lockstep", lockstep)))
    assert found(con, "straggler")["half"][0].evidence["persistent"] is True
    capped = found(con, "straggler", min_spread="0")["lockstep"][0]
    assert capped.evidence["max_z"] == 1e6  # an infinite z-score, shown as a million


def test_host_cpu_is_noted_only_when_it_stands_out_and_a_node_without_host_samples_is_fine(fleet) -> None:
    times = [[1.0] * 4 for _ in range(4)] + [[1.5] * 4]
    calm = {r: (0.75, 0.25, 0) for r in range(4)} | {4: (0.75, 0.375, 0)}  # 0.125 above its peers: no note
    nohost = {r: (0.75, 0.25, 0) for r in range(4)} | {4: (0.75, None, 0)}
    edge = {r: (0.75, 0.3, 0) for r in range(4)} | {4: (0.75, 0.5, 0)}  # exactly 0.2 above: noted
    con, _ = fleet(lambda s: (_ranks(s, "calm", times, calm), _ranks(s, "nohost", times, nohost),
                              _ranks(s, "edge", times, edge)))
    f = {j: v[0] for j, v in found(con, "straggler").items()}
    assert 0.5 - 0.3 == 0.2 and f["edge"].summary.endswith("; its node showed host CPU 50% vs peers' 30%")
    assert f["calm"].evidence["peer_host_cpu_util_ratio"] == 0.25 and "its node showed" not in f["calm"].summary
    n = f["nohost"]
    assert n.evidence["host_cpu_util_ratio"] is None and "peer_host_cpu_util_ratio" not in n.evidence
