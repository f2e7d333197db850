"""The GPU source through the real nvidia-ml-py bindings, loaded over a stand-in
libnvidia-ml.so.1 (tests/fakes/nvml_stub.c) with the Python fake's scenarios.

What the Python fake cannot show: that the agent reads pynvml's real return types
(ctypes structs and pointers, bytes-or-str names, ``nvmlFriendlyObject`` processes),
that NVML's error codes arrive as the binding's own NVMLError subclasses, and that the
agent finds the library the way it does on a GPU VM (the dynamic loader's path).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cmdare.agent.sources.gpu import GpuSource
from tests.agent.test_gpu import tick
from tests.conftest import agent_env
from tests.fakes import nvml_stub
from tests.fakes.nvml import FakeNvml


@pytest.fixture(scope="module")
def stub_dir():
    try:
        return nvml_stub.build()
    except nvml_stub.NoCompiler as e:
        pytest.skip(str(e))


@pytest.fixture
def real_nvml(stub_dir, monkeypatch):
    """``pynvml`` bound to the stub for one test; unbound afterwards (the binding's library
    handle is process-wide, and other tests expect this machine to have no driver)."""
    import pynvml

    def bind(spec: str, driver: str = "current"):
        monkeypatch.setenv("CMDARE_FAKE_NVML", spec)  # read by the stub at nvmlInit
        return nvml_stub.load(driver=driver)

    yield bind
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()


def source(nvml, **cfg) -> GpuSource:
    return GpuSource(GpuSource.parse_config("sources.gpu", cfg), nvml=nvml)


def samples(src: GpuSource, ticks: int) -> list[tuple[list, list]]:
    return [tick(src) for _ in range(ticks)]


@pytest.mark.parametrize("model", ["a100", "h100", "t4"])
def test_real_binding_gives_the_same_samples_as_the_python_fake(real_nvml, model) -> None:
    real = source(real_nvml(f"gpus=3,model={model}"))
    fake = source(FakeNvml(gpus=3, model=model))
    for (er, sr), (ef, sf) in zip(samples(real, 5), samples(fake, 5), strict=True):
        assert er == ef and [s[:2] for s in sr] == [s[:2] for s in sf] == [("gpu", "ok")]
    g = er[0][1]
    assert type(g["uuid"]) is str and type(g["name"]) is str and g["processes"][0]["pid"] == 4000
    real.close()


def test_real_binding_rows_are_the_encoding_of_their_dict(real_nvml) -> None:
    from cmdare.wire.events import encode_row_data

    src = source(real_nvml("gpus=2,model=h100,nvlinks=4"))
    for events, _ in samples(src, 3):
        gpus = [d for t, d in events if t == "gpu"]
        assert len(gpus) == 2 and all(d.row == encode_row_data("gpu", dict(d)) for d in gpus)
    src.close()


def test_gpu_lost_through_the_binding(real_nvml) -> None:
    seen = samples(source(real_nvml("gpus=2,scenario=gpu_lost,lost_after=2")), 4)
    events = [e for evs, _ in seen for e in evs]
    lost = [d for t, d in events if t == "gpu_event"]
    assert lost == [{"index": 1, "uuid": "GPU-00000001-fake-4e1f-9a7b-a1000001", "kind": "lost", "count": 1}]
    assert [d["index"] for t, d in events if t == "gpu"].count(0) == 4
    assert seen[2][1][0][1] == "error" and "GPU is lost" in seen[2][1][0][3]


def test_field_not_supported_through_the_binding(real_nvml) -> None:
    src = source(real_nvml("gpus=1,scenario=field_not_supported"))
    (events, statuses), _ = samples(src, 2)
    g = events[0][1]
    for absent in ("power_watts", "power_limit_watts", "pcie_rx_bytes_per_second", "ecc_corrected_total"):
        assert absent not in g
    assert "processes" not in g and g["temp_celsius"] > 0 and statuses[0][1] == "ok"


def test_xid_event_names_its_gpu(real_nvml) -> None:
    """The binding hands back a new pointer object for the device of each event: the
    agent must match it to its GPU by address, not by identity."""
    src = source(real_nvml("gpus=2,scenario=xid"))
    events = [e for evs, _ in samples(src, 4) for e in evs]
    xids = [d for t, d in events if t == "gpu_event" and d["kind"] == "xid"]
    assert {(d["index"], d["uuid"]) for d in xids} == {
        (0, "GPU-00000000-fake-4e1f-9a7b-a1000000"),
        (1, "GPU-00000001-fake-4e1f-9a7b-a1000001"),
    }
    assert all(d["xid"] == 79 and d["count"] == 1 for d in xids)


@pytest.mark.parametrize(
    ("spec", "why"),
    [("scenario=no_gpus", "no NVIDIA GPU"), ("scenario=driver_not_loaded", "Driver Not Loaded")],
)
def test_unavailable_through_the_binding(real_nvml, spec, why) -> None:
    (_, statuses), _ = samples(source(real_nvml(spec)), 2)
    assert statuses[0][1] == "unavailable" and why in statuses[0][3]


def test_agent_finds_the_library_on_the_loader_path(stub_dir, tmp_path) -> None:
    """``cmdare-agent --once`` with the default backend: pynvml dlopens libnvidia-ml.so.1
    from LD_LIBRARY_PATH, as it finds the driver's library on a GPU VM."""
    env = agent_env(CMDARE_FAKE_NVML="gpus=2,model=h100", LD_LIBRARY_PATH=str(stub_dir))
    out = subprocess.run(
        [sys.executable, "-m", "cmdare.agent.cli", "--once", "--spool-dir", str(tmp_path / "sp")]
        + ["--set", "sources.tpu.enabled=false", "--set", "sources.cloud.enabled=false"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    events = json.loads(out.stdout)
    gpus = [e["data"] for e in events if e["type"] == "gpu"]
    assert [(g["index"], g["name"]) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3"),
        (1, "NVIDIA H100 80GB HBM3"),
    ]
    assert gpus[1]["mem_total_bytes"] == 85520809984 and gpus[1]["power_limit_watts"] == 700.0
    status = [e["data"] for e in events if e["type"] == "status" and e["data"]["source"] == "gpu"]
    assert status[0]["state"] == "ok"


def test_a_driver_older_than_the_binding_still_reports(real_nvml) -> None:
    """An R470 driver (the last for K80s) lacks the processes query the binding calls
    (_v3: the binding raises its mismatch error, not an NVMLError) and the renamed
    clock-event reasons: the agent falls back to _v2 and the throttle reasons."""
    seen = samples(source(real_nvml("gpus=2,model=k80", driver="r470")), 4)
    assert [s[0][:2] for _, s in seen] == [("gpu", "ok")] * 4
    gpus = [d for evs, _ in seen for t, d in evs if t == "gpu"]
    assert len(gpus) == 8 and all(
        g["processes"] == [{"pid": 4000 + g["index"], "used_bytes": 12079136768 // 2}] for g in gpus
    )
    masks = [g["throttle_mask"] for g in gpus]
    assert 4 in masks and all(
        g["throttle_reasons"] == (["sw_power_cap"] if g["throttle_mask"] else []) for g in gpus
    )


DEPTH = [
    "gpus=2,model=h100,nvlinks=2",
    "gpus=2,model=h100,scenario=no_tensor",
    "gpus=1,model=h100,nvlinks=3,scenario=nvlink_errors",
    "gpus=2,model=a100,mig=2",
    "gpus=1,model=h100,mig=3,nvlinks=1",
    "gpus=2,model=a100,scenario=row_remap",
    "gpus=2,model=v100",
    "gpus=2,model=k80",
    "gpus=2,model=v100,scenario=retired_pages",
    "gpus=1,model=t4,scenario=retired_pages",
]


@pytest.mark.parametrize("spec", DEPTH)
def test_gpu_depth_through_the_binding_equals_the_python_fake(real_nvml, spec) -> None:
    """GPM (pynvml's ctypes request, samples as opaque pointers), NVLink, MIG handles,
    process utilisation (NOT_FOUND before a GPU has samples) and what older GPUs do not
    support, through the real bindings: the same events as the Python fake."""
    opts = dict(kv.split("=") for kv in spec.split(","))
    real = source(real_nvml(spec))
    fake = source(FakeNvml(**{k: (v if k in ("model", "scenario") else int(v)) for k, v in opts.items()}))
    for (er, sr), (ef, sf) in zip(samples(real, 4), samples(fake, 4), strict=True):
        assert er == ef and [s[:2] for s in sr] == [s[:2] for s in sf] == [("gpu", "ok")]
    gpus = {d["index"]: d for t, d in er if t == "gpu"}
    model = opts["model"]
    assert ("sm_active_ratio" in gpus[0]) is (model == "h100")  # GPM: Hopper only
    assert ("energy_joules_total" in gpus[0]) is (model != "k80")
    assert ("remapped_rows_correctable" in gpus[0]) is (model in ("a100", "h100"))
    assert ("retired_pages_sbe" in gpus[0]) is (model not in ("a100", "h100"))  # before Ampere: pages retire
    if "mig" in opts:
        want = [1000 * (p + 1) + k for p in range(int(opts["gpus"])) for k in range(int(opts["mig"]))]
        assert sorted(i for i in gpus if i >= 1000) == want
    if "nvlinks" in opts:
        assert len(gpus[0]["nvlink"]) == int(opts["nvlinks"])
    real.close()
