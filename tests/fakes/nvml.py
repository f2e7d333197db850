"""A fake NVML with the same functions as nvidia-ml-py's ``pynvml`` module, built from
values read off real data-centre GPUs, with named failure scenarios (the gpustat way).

Use it as a module (``backend = "python:tests.fakes.nvml"``; the scenario comes from
``$CMDARE_FAKE_NVML``, e.g. ``gpus=2,model=a100`` or ``scenario=gpu_lost``), or build an
instance in tests: ``FakeNvml(gpus=8, scenario="field_not_supported")``.

Scenarios:
  healthy               every field answers
  driver_missing        nvmlInit fails with NVML_ERROR_LIBRARY_NOT_FOUND (no driver at start)
  driver_not_loaded     nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED
  no_gpus               nvmlDeviceGetCount returns 0
  gpu_lost              GPU 1 returns NVML_ERROR_GPU_IS_LOST after ``lost_after`` samples
  field_not_supported   power, PCIe, ECC and process queries return NOT_SUPPORTED (e.g. GeForce, T4 on some drivers)
  xid                   an Xid 79 (GPU fell off the bus) and ECC increases are reported after 2 samples
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pynvml as _real

# constants and error classes are the real ones, so code under test sees real types
NVMLError = _real.NVMLError
for _k in dir(_real):
    if _k.startswith(("NVML_", "nvmlClocks", "nvmlEventType")):
        globals()[_k] = getattr(_real, _k)

# name, memory total (bytes), power limit (mW), max SM / mem clock (MHz): from nvidia-smi -q on real parts
MODELS = {
    "a100": ("NVIDIA A100-SXM4-40GB", 42949672960, 400000, 1410, 1215),
    "h100": ("NVIDIA H100 80GB HBM3", 85520809984, 700000, 1980, 2619),
    "v100": ("Tesla V100-SXM2-16GB", 17179869184, 300000, 1530, 877),
    "t4": ("Tesla T4", 16106127360, 70000, 1590, 5000),
    "k80": ("Tesla K80", 12079136768, 149000, 875, 2505),
    "p100": ("Tesla P100-PCIE-16GB", 17071734784, 250000, 1328, 715),
}

SCENARIOS = (
    "healthy",
    "driver_missing",
    "driver_not_loaded",
    "no_gpus",
    "gpu_lost",
    "field_not_supported",
    "xid",
)


class _Dev:
    def __init__(self, index: int, model: str) -> None:
        name, mem, power, sm, memclk = MODELS[model]
        self.index, self.name, self.mem_total = index, name, mem
        self.power_limit, self.sm_max, self.mem_clk = power, sm, memclk
        self.uuid = f"GPU-{index:08x}-fake-4e1f-9a7b-{model}{index:04d}"
        self.samples = 0
        self.lost = False
        self.ecc = [0, 0]


class FakeNvml:
    NVMLError = _real.NVMLError

    def __init__(
        self, gpus: int = 2, model: str = "a100", scenario: str = "healthy", lost_after: int = 2
    ) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown fake NVML scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
        if model not in MODELS:
            raise ValueError(f"unknown fake GPU model {model!r} (known: {', '.join(MODELS)})")
        self.scenario, self.lost_after = scenario, lost_after
        self.devs = [_Dev(i, model) for i in range(gpus)]
        self.inited = 0
        self.calls = 0
        self._xid_pending: list[tuple[_Dev, int]] = []
        for k in dir(_real):
            if k.startswith(("NVML_", "nvmlClocks", "nvmlEventType")):
                setattr(self, k, getattr(_real, k))

    # -- lifecycle
    def nvmlInit(self) -> None:
        if self.scenario == "driver_missing":
            raise _real.NVMLError(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.scenario == "driver_not_loaded":
            raise _real.NVMLError(_real.NVML_ERROR_DRIVER_NOT_LOADED)
        self.inited += 1

    def nvmlShutdown(self) -> None:
        self.inited = max(0, self.inited - 1)

    def _check(self) -> None:
        self.calls += 1
        if not self.inited:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return 0 if self.scenario == "no_gpus" else len(self.devs)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> _Dev:
        self._check()
        if not 0 <= i < len(self.devs):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self.devs[i]

    def nvmlDeviceGetUUID(self, h: _Dev) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: _Dev) -> str:
        return h.name

    def _dev(self, h: _Dev, unsupported: bool = False) -> _Dev:
        self._check()
        if h.lost:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
        if unsupported and self.scenario == "field_not_supported":
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return h

    # -- per-sample queries (utilisation is the first call of a sample: it advances the clock)
    def nvmlDeviceGetUtilizationRates(self, h: _Dev) -> Any:
        if self.scenario == "gpu_lost" and h.index == 1 and h.samples >= self.lost_after:
            h.lost = True  # falls off the bus after lost_after good samples
        d = self._dev(h)
        d.samples += 1
        if self.scenario == "xid" and d.samples == 3:
            d.ecc[0] += 5
            self._xid_pending.append((d, 79))
        return SimpleNamespace(gpu=90 + (d.samples + d.index) % 10, memory=40 + d.samples % 20)

    def nvmlDeviceGetMemoryInfo(self, h: _Dev) -> Any:
        d = self._dev(h)
        return SimpleNamespace(total=d.mem_total, used=d.mem_total * 3 // 4, free=d.mem_total // 4)

    def nvmlDeviceGetPowerUsage(self, h: _Dev) -> int:
        d = self._dev(h, unsupported=True)
        return d.power_limit * 8 // 10 + d.samples * 7 % 5000

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Dev) -> int:
        return self._dev(h, unsupported=True).power_limit

    def nvmlDeviceGetTemperature(self, h: _Dev, sensor: int) -> int:
        return 60 + self._dev(h).samples % 15

    def nvmlDeviceGetClockInfo(self, h: _Dev, clock: int) -> int:
        d = self._dev(h)
        return d.sm_max if clock == _real.NVML_CLOCK_SM else d.mem_clk

    def nvmlDeviceGetPcieThroughput(self, h: _Dev, counter: int) -> int:
        d = self._dev(h, unsupported=True)
        return 1_200_000 + 1000 * d.samples if counter == _real.NVML_PCIE_UTIL_TX_BYTES else 3_400_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Dev) -> int:
        d = self._dev(h)
        return 0x4 if d.samples % 4 == 0 else 0  # sw power cap now and then

    def nvmlDeviceGetTotalEccErrors(self, h: _Dev, etype: int, counter: int) -> int:
        d = self._dev(h, unsupported=True)
        return d.ecc[0] if etype == _real.NVML_MEMORY_ERROR_TYPE_CORRECTED else d.ecc[1]

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Dev) -> list[Any]:
        d = self._dev(h, unsupported=True)
        return [SimpleNamespace(pid=4000 + d.index, usedGpuMemory=d.mem_total // 2)]

    # -- Xid events
    def nvmlEventSetCreate(self) -> list[Any]:
        self._check()
        return []

    def nvmlDeviceRegisterEvents(self, h: _Dev, types: int, es: list[Any]) -> None:
        es.append(h)

    def nvmlEventSetWait_v2(self, es: list[Any], timeout_ms: int) -> Any:
        if self._xid_pending:
            d, xid = self._xid_pending.pop(0)
            return SimpleNamespace(device=d, eventType=_real.nvmlEventTypeXidCriticalError, eventData=xid)
        raise _real.NVMLError(_real.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, es: list[Any]) -> None:
        pass


def from_env() -> FakeNvml:
    opts = dict(kv.split("=", 1) for kv in os.environ.get("CMDARE_FAKE_NVML", "").split(",") if "=" in kv)
    return FakeNvml(
        gpus=int(opts.get("gpus", 2)),
        model=opts.get("model", "a100"),
        scenario=opts.get("scenario", "healthy"),
        lost_after=int(opts.get("lost_after", 2)),
    )


_instance = from_env()


def __getattr__(name: str) -> Any:  # module-level API: ``python:tests.fakes.nvml``
    return getattr(_instance, name)
