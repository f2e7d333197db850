"""GPU source against the fake NVML's named failure scenarios (tests/fakes/nvml.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cmdare.agent.runtime import SourceRunner
from cmdare.agent.sources.gpu import GpuSource, throttle_names
from tests.fakes.nvml import FakeNvml


def make(nvml: FakeNvml, **cfg) -> GpuSource:
    return GpuSource(GpuSource.parse_config("sources.gpu", cfg), nvml=nvml)


def tick(src: GpuSource) -> tuple[list[tuple[str, dict]], list[tuple]]:
    events, statuses = [], []
    runner = getattr(src, "_runner", None) or SourceRunner(src)
    src._runner = runner
    runner.tick(lambda t, d, ts=None: events.append((t, d)), lambda *a: statuses.append(a))
    return events, statuses


def test_healthy_gpus_report_every_field_in_base_units() -> None:
    src = make(FakeNvml(gpus=2, model="a100"))
    events, statuses = tick(src)
    gpus = [d for t, d in events if t == "gpu"]
    assert [g["index"] for g in gpus] == [0, 1]
    g = gpus[0]
    assert g["name"] == "NVIDIA A100-SXM4-40GB" and g["uuid"].startswith("GPU-")
    assert 0 <= g["util_gpu_ratio"] <= 1 and g["mem_total_bytes"] == 42949672960
    assert g["power_limit_watts"] == 400.0 and g["sm_clock_hz"] == 1410e6
    assert g["pcie_rx_bytes_per_second"] == 3.4e9
    assert g["processes"] == [{"pid": 4000, "used_bytes": 42949672960 // 2}]
    assert statuses[0][:2] == ("gpu", "ok")


def test_driver_missing_at_start_is_reported_once_and_retried() -> None:
    clock = [0.0]
    nvml = FakeNvml(scenario="driver_missing")
    src = GpuSource(
        GpuSource.parse_config("sources.gpu", {"retry_interval": "60s"}), nvml=nvml, clock=lambda: clock[0]
    )
    e1, s1 = tick(src)
    e2, s2 = tick(src)
    assert e1 == [] and e2 == []
    assert len(s1) == 1 and s1[0][1] == "unavailable" and "NVML Shared Library Not Found" in s1[0][3]
    assert s2 == []  # said once, not every tick
    nvml.scenario = "healthy"  # the driver gets installed
    e3, _ = tick(src)
    assert e3 == []  # not retried before retry_interval
    clock[0] = 61.0
    e4, s4 = tick(src)
    assert len([t for t, _ in e4 if t == "gpu"]) == 2 and s4[0][1] == "ok"


def test_no_gpus_is_unavailable_not_an_error() -> None:
    _, statuses = tick(make(FakeNvml(scenario="no_gpus")))
    assert statuses[0][1] == "unavailable" and "no NVIDIA GPU" in statuses[0][3]


def test_gpu_lost_emits_one_event_and_the_other_gpu_keeps_reporting() -> None:
    src = make(FakeNvml(gpus=2, scenario="gpu_lost", lost_after=2))
    seen = []
    for _ in range(5):
        events, statuses = tick(src)
        seen.append((events, statuses))
    lost = [d for evs, _ in seen for t, d in evs if t == "gpu_event" and d["kind"] == "lost"]
    assert lost == [{"index": 1, "uuid": lost[0]["uuid"], "kind": "lost", "count": 1}]
    gpu1_samples = [d for evs, _ in seen for t, d in evs if t == "gpu" and d["index"] == 1]
    gpu0_samples = [d for evs, _ in seen for t, d in evs if t == "gpu" and d["index"] == 0]
    assert len(gpu1_samples) == 2 and len(gpu0_samples) == 5
    states = [s[0][1] for _, s in seen]
    assert states[2] == "error" and "GPU 1" in seen[2][1][0][3]


def test_field_not_supported_leaves_the_field_out() -> None:
    events, statuses = tick(make(FakeNvml(gpus=1, scenario="field_not_supported")))
    g = events[0][1]
    for absent in (
        "power_watts",
        "power_limit_watts",
        "pcie_tx_bytes_per_second",
        "ecc_corrected_total",
        "processes",
    ):
        assert absent not in g
    assert g["temp_celsius"] > 0 and statuses[0][1] == "ok"


def test_xid_and_ecc_are_counted_as_events() -> None:
    src = make(FakeNvml(gpus=1, scenario="xid"))
    all_events = []
    for _ in range(4):
        events, _ = tick(src)
        all_events += events
    evs = [d for t, d in all_events if t == "gpu_event"]
    xids = [e for e in evs if e["kind"] == "xid"]
    assert xids == [{"index": 0, "uuid": xids[0]["uuid"], "kind": "xid", "count": 1, "xid": 79}]
    ecc = [e for e in evs if e["kind"] == "ecc_corrected"]
    assert len(ecc) == 1 and ecc[0]["count"] == 5  # the increase, not the running total


def test_throttle_reason_names() -> None:
    assert throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert throttle_names(0) == []


def test_straight_path_builds_the_same_sample_as_the_checked_path() -> None:
    """The per-GPU fast path (no per-call error mapping) must agree with ``sample``."""
    for model in ("a100", "h100", "v100", "t4"):
        fast, slow = make(FakeNvml(gpus=2, model=model)), make(FakeNvml(gpus=2, model=model))
        fast.start()
        slow.start()
        for gf, gs in zip(fast.gpus, slow.gpus, strict=True):
            assert fast._sample_fast(gf) == slow.sample(gs)
            assert gf.fast


def test_an_nvml_error_moves_that_gpu_to_the_checked_path_for_good() -> None:
    src = make(FakeNvml(gpus=1, scenario="field_not_supported"))
    events, _ = tick(src)
    assert not src.gpus[0].fast and "power_watts" not in events[0][1]
    events, _ = tick(src)
    assert events[0][0] == "gpu" and events[0][1]["temp_celsius"] > 0


@settings(max_examples=200, deadline=None)
@given(
    util=st.integers(0, 100),
    mem=st.integers(0, 1 << 40),
    power=st.integers(0, 10**6),
    temp=st.integers(0, 120),
    clock=st.integers(0, 5000),
    pcie=st.integers(0, 10**8),
    mask=st.integers(0, (1 << 12) - 1),
    ecc=st.integers(0, 10**9),
    procs=st.lists(
        st.tuples(st.integers(1, 1 << 22), st.one_of(st.none(), st.integers(0, 1 << 40))), max_size=3
    ),
    name=st.text(min_size=1, max_size=20),
)
def test_fast_path_row_is_the_encoding_of_its_dict(
    util, mem, power, temp, clock, pcie, mask, ecc, procs, name
):
    """The GPU sample's row is formatted from a template on the hot path: it must be the
    row encoder's output for the same dict, byte for byte, for any NVML values, and the
    line must decode to the same event as its JSON form."""
    from types import SimpleNamespace

    from cmdare.wire.events import Encoded, EventFactory, decode_line, encode, encode_row_data

    nvml = FakeNvml(gpus=1)
    nvml.nvmlDeviceGetName = lambda h: name
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=util, memory=100 - util)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=mem // 3, total=mem, free=mem - mem // 3)
    nvml.nvmlDeviceGetPowerUsage = lambda h: power
    nvml.nvmlDeviceGetEnforcedPowerLimit = lambda h: power + 1
    nvml.nvmlDeviceGetTemperature = lambda h, s: temp
    nvml.nvmlDeviceGetClockInfo = lambda h, c: clock
    nvml.nvmlDeviceGetPcieThroughput = lambda h, c: pcie
    nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: mask
    nvml.nvmlDeviceGetTotalEccErrors = lambda h, t, c: ecc
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in procs
    ]
    src = GpuSource(GpuSource.parse_config("sources.gpu", {}), nvml=nvml)
    got: list = []
    src.collect(lambda t, d, **_: got.append(d))
    (d,) = got
    assert type(d) is Encoded and src.gpus[0].fast
    assert d.row == encode_row_data("gpu", dict(d))
    rows, js = EventFactory("n", "worker", rows=True), EventFactory("n", "worker")
    assert rows.line("gpu", d, ts=1.5, id="x") == rows.line("gpu", dict(d), ts=1.5, id="x")
    assert js.line("gpu", d, ts=1.5, id="x") == encode(js.make("gpu", dict(d), ts=1.5, id="x"))
    assert decode_line(rows.line("gpu", d, ts=1.5, id="x")) == decode_line(js.line("gpu", d, ts=1.5, id="x"))
