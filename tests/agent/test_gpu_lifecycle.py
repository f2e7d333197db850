"""The GPU source's start, stop and failure paths against the fake NVML: the binding or the
driver missing, a GPU that cannot be opened, Xid registration failures, close() giving
everything back, a lost GPU and its MIG instances, and health events sent once."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from cmdare.agent.sources.gpu import GpuSource
from cmdare.agent.sources.gpu import source as gpu_source
from cmdare.wire.units import ConfigError
from tests.agent.test_gpu import tick
from tests.fakes.nvml import FakeNvml


def make(nvml: FakeNvml, clock=None, **cfg) -> GpuSource:
    kw = {"clock": clock} if clock is not None else {}
    return GpuSource(GpuSource.parse_config("sources.gpu", cfg), nvml=nvml, **kw)


def gpus(events: list) -> dict[int, dict]:
    return {d["index"]: d for t, d in events if t == "gpu"}


def gpu_events(events: list) -> list[dict]:
    return [dict(d) for t, d in events if t == "gpu_event"]


class _Without(FakeNvml):
    """A binding that lacks some names (an older nvidia-ml-py)."""

    def __init__(self, missing: set[str], **kw) -> None:
        super().__init__(**kw)
        self._missing = missing

    def __getattribute__(self, k: str):
        if k != "_missing" and k in object.__getattribute__(self, "__dict__").get("_missing", ()):
            raise AttributeError(k)
        return super().__getattribute__(k)


@pytest.mark.parametrize(("backend", "ok"), [("pynvml", True), ("python:tests.fakes.nvml", True), ("python:x", True),
                                             ("python:", False), ("pynvml2", False), ("x:python:", False), ("", False)])
def test_the_backend_is_pynvml_or_a_named_python_module(backend: str, ok: bool) -> None:
    if ok:
        assert GpuSource.parse_config("s", {"backend": backend})["backend"] == backend
    else:
        with pytest.raises(ConfigError, match=r"^s\.backend: must be 'pynvml' or 'python:<module>', got "):
            GpuSource.parse_config("s", {"backend": backend})


def test_a_missing_driver_is_retried_every_minute_by_default() -> None:
    clock = [1000.0]
    nvml = FakeNvml(gpus=1, scenario="driver_missing")
    src = make(nvml, clock=lambda: clock[0])
    assert tick(src)[0] == []
    nvml.scenario = "healthy"
    clock[0] = 1059.9
    assert tick(src)[0] == []
    clock[0] = 1060.0
    assert list(gpus(tick(src)[0])) == [0]


def test_a_source_closed_and_started_again_at_once_is_not_a_retry() -> None:
    clock = [0.0]
    nvml = FakeNvml(gpus=1)
    src = make(nvml, clock=lambda: clock[0])
    assert list(gpus(tick(src)[0])) == [0]
    src.close()
    assert nvml.inited == 0 and nvml.event_sets == 0 and not nvml._gpm_buffers
    clock[0] = 0.5
    events, statuses = tick(src)  # started again: NVML is initialised once more
    assert list(gpus(events)) == [0] and nvml.inited == 1 and statuses[-1][1] == "ok"
    src.close()
    src.close()  # twice: NVML shut down once
    assert nvml.inited == 0 and nvml.unbalanced == 0


def test_close_gives_back_gpm_samples_and_the_event_set_even_when_nvml_fails() -> None:
    nvml = FakeNvml(gpus=2, model="h100", mig=1)
    src = make(nvml)
    for _ in range(2):
        tick(src)
    assert nvml._gpm_buffers and nvml.event_sets == 1
    src.close()
    assert not nvml._gpm_buffers and nvml.event_sets == 0 and nvml.inited == 0
    tick(src)
    nvml.nvmlEventSetFree = lambda es: (_ for _ in ()).throw(RuntimeError("driver gone"))
    nvml.nvmlShutdown = lambda: (_ for _ in ()).throw(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
    src.close()  # raises nothing: the agent stops either way
    assert src.event_set is None


def test_close_before_any_start_calls_nothing() -> None:
    nvml = FakeNvml(gpus=1)
    src = make(nvml)
    src.close()
    assert nvml.unbalanced == 0 and nvml.calls == 0
    nvml2 = FakeNvml(gpus=1, scenario="driver_missing")
    src2 = make(nvml2)
    tick(src2)
    src2.close()
    assert nvml2.unbalanced == 0


def test_a_binding_that_cannot_be_imported_says_which_and_what_to_install(monkeypatch) -> None:
    src = GpuSource(GpuSource.parse_config("s", {"backend": "python:no_such_nvml_module"}))
    _, statuses = tick(src)
    assert statuses[0][1] == "unavailable"
    assert statuses[0][3].startswith("cannot import NVML backend 'python:no_such_nvml_module': ")
    assert "install nvidia-ml-py" not in statuses[0][3]

    def no_pynvml(name: str):
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu_source, "load_backend", no_pynvml)
    _, statuses = tick(GpuSource(GpuSource.parse_config("s", {})))
    assert statuses[0][3] == "cannot import NVML backend 'pynvml': No module named 'pynvml'; install nvidia-ml-py"


def test_nvml_that_cannot_count_its_gpus_is_unavailable_and_shut_down() -> None:
    nvml = FakeNvml(gpus=2)

    def count():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    nvml.nvmlDeviceGetCount = count
    src = make(nvml)
    events, statuses = tick(src)
    assert events == [] and statuses[0][1] == "unavailable"
    assert statuses[0][3].startswith("NVML cannot count GPUs: ")
    assert nvml.inited == 0 and nvml.unbalanced == 0


def test_a_gpu_that_cannot_be_opened_is_left_out_and_the_rest_report() -> None:
    nvml = FakeNvml(gpus=3)
    real = nvml.nvmlDeviceGetHandleByIndex

    def handle(i: int):
        if i == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real(i)

    nvml.nvmlDeviceGetHandleByIndex = handle
    src = make(nvml)
    for _ in range(2):
        events, statuses = tick(src)
        assert sorted(gpus(events)) == [0, 2] and statuses[-1][1] == "ok"
    assert [g.uuid for g in src.gpus if g.lost] == ["index-1"]


def test_a_gpm_support_answer_without_its_flag_reads_as_unsupported() -> None:
    nvml = FakeNvml(gpus=1, model="h100")
    nvml.nvmlGpmQueryDeviceSupport = lambda h: SimpleNamespace(version=1)
    src = make(nvml)
    for _ in range(3):
        events, _ = tick(src)
    assert "sm_active_ratio" not in gpus(events)[0] and src.gpus[0].gpm is None


def test_mig_instances_of_a_profiling_gpu_send_their_own_activity() -> None:
    src = make(FakeNvml(gpus=1, model="h100", mig=2))
    for _ in range(3):
        events, _ = tick(src)
    g = gpus(events)
    assert sorted(g) == [0, 1000, 1001]
    assert all(0 < g[i]["sm_active_ratio"] <= 1 for i in (1000, 1001))


def test_xid_events_come_from_the_registered_gpus_only() -> None:
    nvml = FakeNvml(gpus=2, scenario="xid")
    real = nvml.nvmlDeviceRegisterEvents

    def register(h, types, es):
        if h.index == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # e.g. a vGPU
        real(h, types, es)

    nvml.nvmlDeviceRegisterEvents = register
    src = make(nvml)
    every = []
    for _ in range(4):
        events, statuses = tick(src)
        every += events
        assert sorted(gpus(events)) == [0, 1] and statuses[-1][1] == "ok"
    xids = [e for e in gpu_events(every) if e["kind"] == "xid"]
    assert [(e["index"], e["xid"]) for e in xids] == [(1, 79)]


def test_a_binding_without_xid_events_samples_on() -> None:
    src = make(_Without({"nvmlEventSetCreate"}, gpus=1, scenario="xid"))
    every = []
    for _ in range(4):
        events, statuses = tick(src)
        every += events
        assert list(gpus(events)) == [0] and statuses[-1][1] == "ok"
    assert src.event_set is None and not [e for e in gpu_events(every) if e["kind"] == "xid"]


def test_xid_events_are_off_when_configured_so() -> None:
    nvml = FakeNvml(gpus=1, scenario="xid")
    src = make(nvml, xid_events=False)
    every = []
    for _ in range(4):
        every += tick(src)[0]
    assert nvml.event_sets == 0 and not [e for e in gpu_events(every) if e["kind"] == "xid"]


def test_a_binding_without_a_calls_constant_leaves_that_field_out() -> None:
    src = make(_Without({"NVML_TEMPERATURE_GPU"}, gpus=1))
    g = gpus(tick(src)[0])[0]
    assert "temp_celsius" not in g and g["power_watts"] > 0 and g["sm_clock_hz"] > 0


def test_a_passing_failure_of_a_call_with_a_fallback_does_not_ask_the_fallback() -> None:
    nvml = FakeNvml(gpus=1)
    mode, older = [pynvml.NVML_ERROR_UNKNOWN], []
    new = nvml.nvmlDeviceGetCurrentClocksEventReasons

    def flaky(h):
        if mode[0]:
            raise pynvml.NVMLError(mode[0])
        return new(h)

    nvml.nvmlDeviceGetCurrentClocksEventReasons = flaky
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: (older.append(h), new(h))[1]
    src = make(nvml)
    g = gpus(tick(src)[0])[0]
    assert "throttle_mask" not in g and older == []  # this tick's value is absent; the older call not asked
    mode[0] = 0
    assert "throttle_mask" in gpus(tick(src)[0])[0] and older == []
    # a GPU that never answers the newer call: the older one answers from then on
    mode[0] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert "throttle_mask" in gpus(tick(src)[0])[0] and len(older) == 1
    assert "throttle_mask" in gpus(tick(src)[0])[0] and len(older) == 2


def test_a_mig_instances_row_is_the_encoding_of_its_dict() -> None:
    from cmdare.wire.events import encode_row_data

    src = make(FakeNvml(gpus=1, model="a100", mig=2))
    for _ in range(2):
        events = tick(src)[0]
        for t, d in events:
            if t == "gpu":
                assert d.row == encode_row_data("gpu", dict(d)), d["index"]
    assert gpus(events)[1000]["mig_profile"] == "1g.5gb"


def test_a_lost_gpu_takes_its_mig_instances_in_the_same_tick_and_one_problem() -> None:
    nvml = FakeNvml(gpus=3, model="a100", mig=1, scenario="gpu_lost", lost_after=1)
    src = make(nvml)
    tick(src)
    events, statuses = tick(src)  # GPU 1 is lost now
    assert sorted(gpus(events)) == [0, 2, 1000, 3000]  # the GPUs after it still report this tick
    lost = [e for e in gpu_events(events) if e["kind"] == "lost"]
    assert [(e["index"], e["count"]) for e in lost] == [(1, 1), (2000, 1)]
    assert lost[1]["uuid"].startswith("MIG-")
    assert statuses[-1][1] == "error" and "GPU 1 (" in statuses[-1][3]
    assert "GPU 2000" not in statuses[-1][3]  # one problem: the instance went with its GPU
    events, statuses = tick(src)
    assert sorted(gpus(events)) == [0, 2, 1000, 3000] and statuses[-1][1] == "ok"


def test_every_gpu_lost_is_an_error_on_every_tick() -> None:
    nvml = FakeNvml(gpus=1)
    src = make(nvml)
    tick(src)
    nvml.devs[0].lost = True
    _, statuses = tick(src)
    assert statuses[-1][1] == "error" and "GPU 0" in statuses[-1][3]
    for _ in range(2):
        events, statuses = tick(src)
        assert gpus(events) == {} and statuses[-1][1] == "error" and statuses[-1][3].endswith("all GPUs lost")


@pytest.mark.parametrize(("model", "scenario", "kinds"), [
    ("a100", "row_remap", ["row_remap_pending"]),
    ("p100", "retired_pages", ["retired_pages_pending"]),
])
def test_a_remapping_or_retirement_turning_pending_is_one_event(model: str, scenario: str, kinds: list[str]) -> None:
    src = make(FakeNvml(gpus=1, model=model, scenario=scenario))
    every = []
    for _ in range(5):
        every += tick(src)[0]
    evs = [e for e in gpu_events(every) if e["kind"] in gpu_source._REMAP_STATES]
    assert [(e["kind"], e["count"], e["index"]) for e in evs] == [(k, 1, 0) for k in kinds]


def test_ecc_increases_of_either_kind_are_events_when_the_other_is_not_answered() -> None:
    nvml = FakeNvml(gpus=1)
    totals = {0: [0, 0, 3, 3, 10], 1: [0, 1, 1, 4, 4]}
    ticks = [0]

    def ecc(h, etype, counter):
        if etype == 0 and ticks[0] >= 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)  # corrected stops answering
        return totals[etype][ticks[0]]

    nvml.nvmlDeviceGetTotalEccErrors = ecc
    src = make(nvml)
    got = []
    for t in range(5):
        ticks[0] = t
        got += [(t, e["kind"], e["count"]) for e in gpu_events(tick(src)[0]) if e["kind"].startswith("ecc")]
    assert got == [(1, "ecc_uncorrected", 1), (2, "ecc_corrected", 3), (3, "ecc_uncorrected", 3)]
