"""The TPU source against a real local gRPC server generated from the service's proto."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc_tools", reason="grpcio-tools builds the fake libtpu server")

from cmdare.agent.runtime import SourceRunner  # noqa: E402
from cmdare.agent.sources.base import SourceUnavailable  # noqa: E402
from cmdare.agent.sources.tpu import TpuSource  # noqa: E402
from tests.fakes.tpu import FakeTpu, serve  # noqa: E402


def source(addr: str, **kw) -> TpuSource:
    return TpuSource(TpuSource.parse_config("sources.tpu", {"address": addr, "timeout": "1s", **kw}))


def collect(src: TpuSource) -> list[dict]:
    out: list[dict] = []
    src.collect(lambda t, d, ts=None, **_: out.append({"type": t, **d}))
    return out


@pytest.mark.parametrize("device_as_string", [False, True], ids=["int-ordinal", "kvlist-string-ordinal"])
def test_one_sample_per_device_with_hbm_duty_cycle_and_bandwidth(device_as_string: bool) -> None:
    tpu = FakeTpu(cores=4, cores_per_chip=1, device_as_string=device_as_string)
    server, addr = serve(tpu)
    try:
        src = source(addr)
        src.start()
        got = collect(src)
        src.close()
    finally:
        server.stop(0)
    assert [g["device"] for g in got] == [0, 1, 2, 3]
    for g in got:
        d = g["device"]
        assert g["type"] == "tpu"
        assert g["hbm_used_bytes"] == tpu.used(d) and g["hbm_total_bytes"] == 32 << 30
        assert g["duty_cycle_ratio"] == pytest.approx(tpu.duty(d) / 100)
        assert g["hbm_bandwidth_ratio"] == pytest.approx(tpu.bandwidth(d) / 100)


def test_two_cores_per_chip_share_their_chips_duty_cycle_and_no_bandwidth_metric_is_fine() -> None:
    tpu = FakeTpu(cores=8, cores_per_chip=2, hbm_total=16 << 30, with_bandwidth=False)  # a v3-8
    server, addr = serve(tpu)
    try:
        src = source(addr)
        src.start()
        got = collect(src)
    finally:
        server.stop(0)
    assert len(got) == 8
    assert [g["duty_cycle_ratio"] for g in got] == pytest.approx([0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4])
    assert all("hbm_bandwidth_ratio" not in g for g in got)
    assert not any("bandwidth" in c for c in tpu.calls)  # not asked for what libtpu does not list


def test_no_tpu_program_is_a_normal_state_reported_once() -> None:
    server, addr = serve(FakeTpu())
    server.stop(0)  # nothing listens on the port now
    src = source(addr)
    with pytest.raises(SourceUnavailable, match="no TPU program serving runtime metrics on 127.0.0.1"):
        src.start()
    runner, statuses = SourceRunner(src), []
    for _ in range(3):
        runner.tick(lambda *a, **k: None, lambda *a: statuses.append(a))
    assert [s[1] for s in statuses] == ["unavailable"]  # said once, not every tick


def test_program_ending_mid_run_makes_the_source_unavailable_not_broken() -> None:
    tpu = FakeTpu()
    server, addr = serve(tpu)
    src = source(addr, retry_interval="0s")
    src.start()
    assert len(collect(src)) == 4
    server.stop(0)
    with pytest.raises(SourceUnavailable):
        collect(src)
    assert src.channel is None  # closed; the next tick's start() looks again


def test_garbage_responses_fail_the_tick_with_a_reason_and_the_source_keeps_trying() -> None:
    server, addr = serve(FakeTpu(), garbage=True)
    try:
        src = source(addr, retry_interval="0s")
        runner, statuses = SourceRunner(src), []
        for _ in range(2):
            runner.tick(lambda *a, **k: None, lambda *a: statuses.append(a))
    finally:
        server.stop(0)
    assert [s[1] for s in statuses] == ["error", "error"]
    assert "malformed response" in statuses[0][3]
