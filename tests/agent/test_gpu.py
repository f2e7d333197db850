"""GPU source against the fake NVML's named failure scenarios (tests/fakes/nvml.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cmdare.agent.runtime import SourceRunner
from cmdare.agent.sources.gpu import GpuSource, throttle_names
from tests.conftest import examples
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


def test_every_sample_row_is_the_encoding_of_its_dict_for_each_generation() -> None:
    """One sample path builds the dict and its row together: the row must be the row
    encoder's output for the dict, on every generation's answers, first tick and after."""
    from cmdare.wire.events import Encoded, encode_row_data

    for model in ("a100", "h100", "v100", "t4"):
        src = make(FakeNvml(gpus=2, model=model, nvlinks=2 if model == "h100" else 0))
        for _ in range(3):
            events, _ = tick(src)
            gpus = [d for t, d in events if t == "gpu"]
            assert len(gpus) == 2 and all(type(d) is Encoded for d in gpus)
            for d in gpus:
                assert d.row == encode_row_data("gpu", dict(d)), model


def test_a_field_the_gpu_does_not_answer_is_left_out_and_not_asked_again() -> None:
    nvml = FakeNvml(gpus=1, scenario="field_not_supported")
    calls = []
    real = nvml.nvmlDeviceGetPowerUsage
    nvml.nvmlDeviceGetPowerUsage = lambda h: (calls.append(h), real(h))[1]
    src = make(nvml)
    events, _ = tick(src)
    assert "power_watts" not in events[0][1] and "power_limit_watts" not in events[0][1]
    events, _ = tick(src)
    assert events[0][0] == "gpu" and events[0][1]["temp_celsius"] > 0 and "power_watts" not in events[0][1]
    assert len(calls) == 1  # asked once


def test_an_error_that_is_not_the_gpus_nature_costs_that_tick_only_and_is_said_once(caplog) -> None:
    import pynvml

    nvml = FakeNvml(gpus=2)
    real, fail = nvml.nvmlDeviceGetTemperature, [True]

    def flaky(h, sensor):
        if fail[0] and h.index == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real(h, sensor)

    nvml.nvmlDeviceGetTemperature = flaky
    src = make(nvml)
    caplog.set_level("WARNING", logger="cmdare.agent.gpu")
    for _ in range(2):
        events, statuses = tick(src)
        g0, g1 = (d for t, d in events if t == "gpu")
        assert "temp_celsius" not in g0 and "power_watts" in g0 and "temp_celsius" in g1
        assert statuses[-1][:2] == ("gpu", "ok")  # the other GPU and the other fields report on
    assert len([r for r in caplog.records if "nvmlDeviceGetTemperature" in r.getMessage()]) == 1
    fail[0] = False
    events, _ = tick(src)
    assert "temp_celsius" in [d for t, d in events if t == "gpu"][0]  # asked again: back


@settings(max_examples=examples(200), deadline=None)
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
    assert type(d) is Encoded
    assert d.row == encode_row_data("gpu", dict(d))
    rows, js = EventFactory("n", "worker", rows=True), EventFactory("n", "worker")
    assert rows.line("gpu", d, ts=1.5, id="x") == rows.line("gpu", dict(d), ts=1.5, id="x")
    assert js.line("gpu", d, ts=1.5, id="x") == encode(js.make("gpu", dict(d), ts=1.5, id="x"))
    assert decode_line(rows.line("gpu", d, ts=1.5, id="x")) == decode_line(js.line("gpu", d, ts=1.5, id="x"))


@settings(max_examples=examples(60), deadline=None)
@given(
    energy=st.integers(0, 1 << 50),
    remap=st.tuples(st.integers(0, 1 << 20), st.integers(0, 1 << 20), st.integers(0, 1), st.integers(0, 1)),
    metric=st.one_of(st.floats(allow_nan=False, allow_infinity=False, min_value=-5, max_value=1e6), st.just(float("nan"))),
    sm=st.integers(0, 100),
    errors=st.integers(0, 1 << 40),
    links=st.integers(0, 3),
    util_sampled=st.booleans(),
)
def test_gpu_depth_rows_are_the_encoding_of_their_dict_on_every_tick(
    energy, remap, metric, sm, errors, links, util_sampled
):
    """The fields after ``processes`` (GPM, energy, row remapping, NVLink, per-process
    utilisation) are formatted on the hot path too: each tick's row (the checked first tick
    and the straight ones after it) is the row encoder's output for the same dict."""
    from types import SimpleNamespace

    import pynvml

    from cmdare.wire.events import Encoded, encode_row_data

    nvml = FakeNvml(gpus=1, model="h100", nvlinks=links)
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda h: energy
    nvml.nvmlDeviceGetRemappedRows = lambda h: remap
    nvml.nvmlDeviceGetNvLinkErrorCounter = lambda h, link, c: errors if c == 2 else 0
    real_get = nvml.nvmlGpmMetricsGet

    def metrics(m):
        real_get(m)
        m.metrics[3].value = metric  # the tensor pipes: any double NVML could return
        return m

    nvml.nvmlGpmMetricsGet = metrics

    def proc_util(h, ts):
        if not util_sampled:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=4000, timeStamp=ts + 1, smUtil=sm, memUtil=100 - sm)]

    nvml.nvmlDeviceGetProcessUtilization = proc_util
    src = GpuSource(GpuSource.parse_config("sources.gpu", {}), nvml=nvml)
    for k in range(3):
        got: list = []
        src.collect(lambda t, d, _got=got, **_: _got.append(d) if t == "gpu" else None)
        (d,) = got
        assert type(d) is Encoded and d.row == encode_row_data("gpu", dict(d)), k
        assert d["energy_joules_total"] == energy * 1e-3 and d["row_remap_failed"] is bool(remap[3])
        assert ("sm_ratio" in d["processes"][0]) is util_sampled
        if k and metric == metric and metric >= 0:
            assert d["tensor_active_ratio"] == min(metric * 0.01, 1.0)
        else:
            assert "tensor_active_ratio" not in d  # no interval yet, or NaN / negative: absent
        assert d.get("nvlink_errors_total") == (errors * links if links else None)


def test_a_gpu_without_profiling_metrics_says_so_once_and_sends_the_rest(caplog) -> None:
    caplog.set_level("INFO", logger="cmdare.agent.gpu")
    src = make(FakeNvml(gpus=2, model="a100"))
    for _ in range(3):
        events, statuses = tick(src)
    assert statuses[-1][:2] == ("gpu", "ok")
    lines = [r.getMessage() for r in caplog.records if "profiling metrics" in r.getMessage()]
    assert lines == ["GPU 0 (NVIDIA A100-SXM4-40GB), 1 (NVIDIA A100-SXM4-40GB): no profiling metrics "
                     "(SM / tensor / DRAM activity): NVML's GPM API needs a Hopper or later GPU"]
    g = [d for t, d in events if t == "gpu"][0]
    assert "gr_engine_active_ratio" not in g and g["energy_joules_total"] > 0 and g["row_remap_pending"] is False
    assert "nvlink" not in g and "parent_index" not in g


def test_gpm_is_the_interval_between_two_ticks_and_each_call_not_supported_is_not_asked_again() -> None:
    nvml = FakeNvml(gpus=1, model="h100", nvlinks=2)
    calls: dict[str, int] = {}
    unsupported: set[str] = set()  # calls that answer NOT_SUPPORTED from now on
    for name in ("nvmlGpmSampleGet", "nvmlDeviceGetRemappedRows"):
        real = getattr(nvml, name)

        def counted(*a, _real=real, _name=name):
            calls[_name] = calls.get(_name, 0) + 1
            if _name in unsupported:
                import pynvml

                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return _real(*a)

        setattr(nvml, name, counted)
    src = make(nvml)
    first, _ = tick(src)
    g1 = [d for t, d in first if t == "gpu"][0]
    assert "sm_active_ratio" not in g1  # one GPM sample: no interval yet
    second, _ = tick(src)
    g2 = [d for t, d in second if t == "gpu"][0]
    assert 0.8 <= g2["sm_active_ratio"] <= 0.9 and g2["nvlink_total_rx_bytes_per_second"] == 2 * 1000 * 1048576.0
    assert [x["link"] for x in g2["nvlink"]] == [0, 1] and g2["nvlink"][0]["rx_bytes_per_second"] == 1000 * 1048576.0
    assert calls == {"nvmlGpmSampleGet": 2, "nvmlDeviceGetRemappedRows": 2}
    unsupported.add("nvmlDeviceGetRemappedRows")
    third, st3 = tick(src)
    fourth, st4 = tick(src)
    assert st3[0][:2] == st4[0][:2] == ("gpu", "ok")
    assert all("remapped_rows_correctable" not in d for t, d in third + fourth if t == "gpu")
    assert calls["nvmlDeviceGetRemappedRows"] == 3  # asked once more, then not again


def test_mig_instances_are_gpus_of_their_own_and_go_with_a_lost_parent() -> None:
    nvml = FakeNvml(gpus=2, model="a100", mig=2, scenario="gpu_lost", lost_after=2)
    src = make(nvml)
    events, statuses = tick(src)
    gpus = {d["index"]: d for t, d in events if t == "gpu"}
    assert sorted(gpus) == [0, 1, 1000, 1001, 2000, 2001]
    m = gpus[2001]
    assert m["parent_index"] == 1 and m["mig_profile"] == "1g.5gb" and m["gpu_instance_id"] == 8
    assert m["uuid"].startswith("MIG-") and m["mem_total_bytes"] == 42949672960 // 8
    assert m["processes"] == [{"pid": 4201, "used_bytes": 42949672960 // 16}]
    assert "util_gpu_ratio" not in gpus[0] and "power_watts" in gpus[0]  # MIG mode: no GPU_UTIL
    every = []
    for _ in range(3):
        events, statuses = tick(src)
        every += events
    lost = sorted(d["index"] for t, d in every if t == "gpu_event" and d["kind"] == "lost")
    seen = sorted(d["index"] for t, d in events if t == "gpu")
    assert lost == [1, 2000, 2001] and seen == [0, 1000, 1001]  # each lost once; the rest report on
    assert all(g.lost for g in src.gpus if g.index in (1, 2000, 2001))


def test_the_gpm_metrics_are_read_through_a_view_of_the_bindings_own_request() -> None:
    """The source reads nvmlGpmMetricsGet's answers through a plain ctypes view of the same
    memory (nvidia-ml-py's struct hooks each field read): the view must see what the
    binding's struct holds, and a request of another layout is read through its own struct."""
    import ctypes

    import pynvml

    from cmdare.agent.sources.gpu import _metrics_view

    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.metrics[3].metricId, req.metrics[3].nvmlReturn, req.metrics[3].value = 5, 3, 42.5
    view = _metrics_view(req)
    assert (view[3].metricId, view[3].nvmlReturn, view[3].value) == (5, 3, 42.5)
    view[4].value = 7.0  # the same memory
    assert req.metrics[4].value == 7.0 and len(view) == len(req.metrics)

    class Other(ctypes.Structure):
        _fields_ = [("value", ctypes.c_double), ("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint)]

    class OtherGet(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint), ("metrics", Other * 4)]

    other = OtherGet()
    assert _metrics_view(other) is not None and type(_metrics_view(other)) is type(other.metrics)


def test_each_field_is_its_nvml_answer_in_base_units_at_its_place() -> None:
    """Distinct NVML answers, each field checked exactly: percent to ratio, MHz to Hz, KB/s
    to B/s, mW to W, mJ to J, the remapped-rows tuple and retired pages in their order (and
    the row built in place is the encoding of all of it)."""
    from types import SimpleNamespace

    import pynvml

    from cmdare.wire.events import encode_row_data

    for model in ("h100", "v100"):  # the H100's NVLinks sit after the remap fields in the row
        nvml = FakeNvml(gpus=1, model=model, nvlinks=2 if model == "h100" else 0)
        nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=37, memory=59)
        nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=7, total=11, free=4)
        nvml.nvmlDeviceGetPowerUsage = lambda h: 250123
        nvml.nvmlDeviceGetEnforcedPowerLimit = lambda h: 400500
        nvml.nvmlDeviceGetTemperature = lambda h, s: 61
        nvml.nvmlDeviceGetClockInfo = lambda h, c: 1410 if c == pynvml.NVML_CLOCK_SM else 1215
        nvml.nvmlDeviceGetPcieThroughput = lambda h, c: 1234 if c == pynvml.NVML_PCIE_UTIL_TX_BYTES else 5678
        nvml.nvmlDeviceGetTotalEccErrors = lambda h, t, c: 3 if t == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 2
        nvml.nvmlDeviceGetTotalEnergyConsumption = lambda h: 987654
        if model == "h100":
            nvml.nvmlDeviceGetRemappedRows = lambda h: (3, 5, 0, 1)
        else:
            nvml.nvmlDeviceGetRetiredPages = lambda h, cause: [1, 2, 3] if cause == 0 else [4]
            nvml.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: 1
        src = make(nvml)
        (g,) = [d for t, d in tick(src)[0] if t == "gpu"]
        assert (g["util_gpu_ratio"], g["util_mem_ratio"], g["mem_used_bytes"], g["mem_total_bytes"]) == (0.37, 0.59, 7, 11)
        assert (g["power_watts"], g["power_limit_watts"], g["temp_celsius"]) == (250123 * 1e-3, 400.5, 61.0)
        assert (g["sm_clock_hz"], g["mem_clock_hz"]) == (1410e6, 1215e6)
        assert (g["pcie_tx_bytes_per_second"], g["pcie_rx_bytes_per_second"]) == (1234e3, 5678e3)
        assert (g["ecc_corrected_total"], g["ecc_uncorrected_total"], g["energy_joules_total"]) == (3, 2, 987.654)
        if model == "h100":
            assert (g["remapped_rows_correctable"], g["remapped_rows_uncorrectable"], g["row_remap_pending"],
                    g["row_remap_failed"]) == (3, 5, False, True) and len(g["nvlink"]) == 2
        else:
            assert (g["retired_pages_sbe"], g["retired_pages_dbe"], g["retired_pages_pending"]) == (3, 1, True)
        assert g.row == encode_row_data("gpu", dict(g))
