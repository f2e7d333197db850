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
  no_tensor             GPM: the tensor pipes idle, FP32 busy (a model trained without mixed precision)
  nvlink_errors         NVLink replay errors grow on link 0 (3 a sample)
  row_remap             an uncorrectable row remapping pending from the second sample on
  retired_pages         (Kepler to Turing) 2 pages retired for single-bit, 1 for double-bit ECC errors and a
                        retirement pending from the second sample on

Options: ``nvlinks=N`` active NVLinks per GPU (default none, as on a one-GPU VM), ``mig=N``
MIG instances per GPU (A100 / H100; 1g profiles, a seventh of the SMs each).  What a model
answers follows its generation: energy from Volta on, row remapping and MIG from Ampere
on, GPM (profiling metrics) on Hopper only; process utilisation answers NOT_FOUND until a
GPU has two samples.  The C stub (nvml_stub.c) answers the same values.
"""

from __future__ import annotations

import ctypes
import os
import time
from types import SimpleNamespace
from typing import Any

import pynvml as _real

# constants and error classes are the real ones, so code under test sees real types
NVMLError = _real.NVMLError
for _k in dir(_real):
    if _k.startswith(("NVML_", "nvmlClocks", "nvmlEventType", "c_nvmlGpm")):
        globals()[_k] = getattr(_real, _k)

# name, memory total (bytes), power limit (mW), max SM / mem clock (MHz), SMs, generation
# (0 Kepler/Pascal, 1 Volta/Turing: energy, 2 Ampere: + row remapping, MIG, 3 Hopper: + GPM):
# from nvidia-smi -q on real parts
MODELS = {
    "a100": ("NVIDIA A100-SXM4-40GB", 42949672960, 400000, 1410, 1215, 108, 2),
    "h100": ("NVIDIA H100 80GB HBM3", 85520809984, 700000, 1980, 2619, 132, 3),
    "v100": ("Tesla V100-SXM2-16GB", 17179869184, 300000, 1530, 877, 80, 1),
    "t4": ("Tesla T4", 16106127360, 70000, 1590, 5000, 40, 1),
    "k80": ("Tesla K80", 12079136768, 149000, 875, 2505, 13, 0),
    "p100": ("Tesla P100-PCIE-16GB", 17071734784, 250000, 1328, 715, 56, 0),
}
MAX_MIG, MAX_LINKS = 7, 18

SCENARIOS = (
    "healthy",
    "driver_missing",
    "driver_not_loaded",
    "no_gpus",
    "gpu_lost",
    "field_not_supported",
    "xid",
    "no_tensor",
    "nvlink_errors",
    "row_remap",
    "retired_pages",
    "hang",  # after lost_after samples a utilisation read never returns (a driver stuck in an ioctl)
)


class _Dev:
    def __init__(self, index: int, model: str, mig_slot: int = -1, parent: _Dev | None = None) -> None:
        name, mem, power, sm, memclk, sms, _ = MODELS[model]
        self.index, self.name, self.mem_total, self.sms = index, name, mem, sms
        self.power_limit, self.sm_max, self.mem_clk = power, sm, memclk
        self.uuid = f"GPU-{index:08x}-fake-4e1f-9a7b-{model}{index:04d}"
        self.samples = 0
        self.lost = False
        self.ecc = [0, 0]
        self.mig_slot, self.parent, self.gi, self.ci = mig_slot, parent, 7 + mig_slot, 0
        self.migs: list[_Dev] = []
        if parent is not None:  # a 1g MIG instance: an eighth of the memory, a seventh of the SMs
            self.name = f"{name} MIG 1g.{mem // 8 // 1_000_000_000}gb"
            self.uuid = f"MIG-{index * 16 + mig_slot:08x}-fake-4e1f-9a7b-{model}{index:04d}"
            self.mem_total, self.sms = mem // 8, sms // 7

    @property
    def lost_(self) -> bool:
        return self.lost or (self.parent is not None and self.parent.lost)


class FakeNvml:
    NVMLError = _real.NVMLError

    def __init__(
        self,
        gpus: int = 2,
        model: str = "a100",
        scenario: str = "healthy",
        lost_after: int = 2,
        nvlinks: int = 0,
        mig: int = 0,
    ) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown fake NVML scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
        if model not in MODELS:
            raise ValueError(f"unknown fake GPU model {model!r} (known: {', '.join(MODELS)})")
        self.scenario, self.lost_after = scenario, lost_after
        self.devs = [_Dev(i, model) for i in range(gpus)]
        self.gen, self.model = MODELS[model][6], model
        self.nvlinks = max(0, min(MAX_LINKS, nvlinks))
        self.nmig = max(0, min(MAX_MIG, mig)) if self.gen >= 2 else 0
        for d in self.devs:
            d.migs = [_Dev(d.index, model, k, d) for k in range(self.nmig)]
        self._gpm_buffers: dict[int, Any] = {}  # sample address -> its state (kept alive)
        self.inited = 0
        self.unbalanced = 0  # nvmlShutdown calls with no init left
        self.event_sets = 0  # created and not freed
        self.calls = 0
        self._xid_pending: list[tuple[_Dev, int]] = []
        for k in dir(_real):
            if k.startswith(("NVML_", "nvmlClocks", "nvmlEventType", "c_nvmlGpm")):
                setattr(self, k, getattr(_real, k))

    # -- lifecycle
    def nvmlInit(self) -> None:
        if self.scenario == "driver_missing":
            raise _real.NVMLError(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.scenario == "driver_not_loaded":
            raise _real.NVMLError(_real.NVML_ERROR_DRIVER_NOT_LOADED)
        self.inited += 1

    def nvmlShutdown(self) -> None:
        if not self.inited:  # as the real library: a shutdown with no init is an error
            self.unbalanced += 1
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
        self.inited -= 1

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

    def _dev(self, h: _Dev, unsupported: bool = False, mig_ok: bool = True) -> _Dev:
        self._check()
        if h.lost_:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
        if unsupported and self.scenario == "field_not_supported":
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        if not mig_ok and h.parent is not None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return h

    @staticmethod
    def _err(code: int) -> _real.NVMLError:
        return _real.NVMLError(code)

    # -- per-sample queries (utilisation is the first call of a sample: it advances the clock)
    def nvmlDeviceGetUtilizationRates(self, h: _Dev) -> Any:
        if self.scenario == "gpu_lost" and h.index == 1 and h.samples >= self.lost_after:
            h.lost = True  # falls off the bus after lost_after good samples
        d = self._dev(h, mig_ok=False)
        if self.nmig:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)  # no GPU_UTIL in MIG mode
        if self.scenario == "hang" and d.samples >= self.lost_after:
            while True:  # signals and all: as a call blocked in the kernel would
                time.sleep(3600)
        d.samples += 1
        if self.scenario == "xid" and d.samples == 3:
            d.ecc[0] += 5
            self._xid_pending.append((d, 79))
        return SimpleNamespace(gpu=90 + (d.samples + d.index) % 10, memory=40 + d.samples % 20)

    def nvmlDeviceGetMemoryInfo(self, h: _Dev) -> Any:
        if self.nmig and self.scenario == "gpu_lost" and h.index == 1 and h.parent is None \
                and h.samples >= self.lost_after:
            h.lost = True  # MIG mode (no GPU_UTIL to ask): it falls off the bus here
        d = self._dev(h)
        if self.nmig:
            d.samples += 1  # MIG mode: memory is a sample's first answer
        return SimpleNamespace(total=d.mem_total, used=d.mem_total * 3 // 4, free=d.mem_total // 4)

    def nvmlDeviceGetPowerUsage(self, h: _Dev) -> int:
        d = self._dev(h, unsupported=True, mig_ok=False)
        return d.power_limit * 8 // 10 + d.samples * 7 % 5000

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Dev) -> int:
        return self._dev(h, unsupported=True, mig_ok=False).power_limit

    def nvmlDeviceGetTemperature(self, h: _Dev, sensor: int) -> int:
        return 60 + self._dev(h, mig_ok=False).samples % 15

    def nvmlDeviceGetClockInfo(self, h: _Dev, clock: int) -> int:
        d = self._dev(h, mig_ok=False)
        return d.sm_max if clock == _real.NVML_CLOCK_SM else d.mem_clk

    def nvmlDeviceGetPcieThroughput(self, h: _Dev, counter: int) -> int:
        d = self._dev(h, unsupported=True, mig_ok=False)
        return 1_200_000 + 1000 * d.samples if counter == _real.NVML_PCIE_UTIL_TX_BYTES else 3_400_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Dev) -> int:
        d = self._dev(h, mig_ok=False)
        return 0x4 if d.samples % 4 == 0 else 0  # sw power cap now and then

    def nvmlDeviceGetTotalEccErrors(self, h: _Dev, etype: int, counter: int) -> int:
        d = self._dev(h, unsupported=True, mig_ok=False)
        return d.ecc[0] if etype == _real.NVML_MEMORY_ERROR_TYPE_CORRECTED else d.ecc[1]

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Dev) -> list[Any]:
        d = self._dev(h, unsupported=True)
        pid = 4000 + d.index + (100 * (d.mig_slot + 1) if d.parent is not None else 0)
        return [SimpleNamespace(pid=pid, usedGpuMemory=d.mem_total // 2)]

    # -- issue 38: energy, row remapping, NVLink, per-process utilisation, MIG, GPM
    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Dev) -> int:
        d = self._dev(h, unsupported=True, mig_ok=False)
        if self.gen < 1:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        return 1_000_000 + 300_000 * d.samples

    def nvmlDeviceGetRemappedRows(self, h: _Dev) -> tuple[int, int, int, int]:
        d = self._dev(h, unsupported=True, mig_ok=False)
        if self.gen < 2:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        bad = int(self.scenario == "row_remap" and d.samples >= 2)
        return (0, bad, bad, 0)

    def nvmlDeviceGetRetiredPages(self, h: _Dev, cause: int) -> list[int]:
        d = self._dev(h, unsupported=True, mig_ok=False)
        if self.gen >= 2:  # Ampere and later remap rows instead
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        if cause not in (0, 1):
            raise self._err(_real.NVML_ERROR_INVALID_ARGUMENT)
        n = (2 if cause == 0 else 1) if self.scenario == "retired_pages" and d.samples >= 2 else 0
        return [0x100000 * (cause + 1) + 0x1000 * i for i in range(n)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: _Dev) -> int:
        d = self._dev(h, unsupported=True, mig_ok=False)
        if self.gen >= 2:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        return int(self.scenario == "retired_pages" and d.samples >= 2)

    def nvmlDeviceGetNvLinkState(self, h: _Dev, link: int) -> int:
        self._dev(h, mig_ok=False)
        if not self.nvlinks:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < MAX_LINKS:
            raise self._err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return int(link < self.nvlinks)

    def nvmlDeviceGetNvLinkErrorCounter(self, h: _Dev, link: int, counter: int) -> int:
        d = self._dev(h, mig_ok=False)
        if not self.nvlinks:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        if not (0 <= link < self.nvlinks and 0 <= counter <= 4):
            raise self._err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return 3 * d.samples if self.scenario == "nvlink_errors" and link == 0 and counter == 0 else 0

    def nvmlDeviceGetProcessUtilization(self, h: _Dev, last_seen: int) -> list[Any]:
        d = self._dev(h, unsupported=True, mig_ok=False)
        if self.model == "k80":  # Maxwell and later
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        ts = 1_700_000_000_000_000 + 1_000_000 * d.samples
        if d.samples < 2 or last_seen >= ts:
            raise self._err(_real.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=4000 + d.index, timeStamp=ts, smUtil=70 + d.samples % 10,
                                memUtil=30 + d.samples % 5, encUtil=0, decUtil=0)]

    def nvmlDeviceGetMigMode(self, h: _Dev) -> list[int]:
        self._dev(h, mig_ok=False)
        if self.gen < 2:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        return [int(bool(self.nmig))] * 2

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Dev) -> int:
        self._dev(h, mig_ok=False)
        if self.gen < 2:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        return MAX_MIG if self.nmig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Dev, i: int) -> _Dev:
        d = self._dev(h, mig_ok=False)
        if not self.nmig:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= i < MAX_MIG:
            raise self._err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if i >= self.nmig:
            raise self._err(_real.NVML_ERROR_NOT_FOUND)
        return d.migs[i]

    def nvmlDeviceGetGpuInstanceId(self, h: _Dev) -> int:
        d = self._dev(h)
        if d.parent is None:
            raise self._err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return d.gi

    def nvmlDeviceGetComputeInstanceId(self, h: _Dev) -> int:
        d = self._dev(h)
        if d.parent is None:
            raise self._err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return d.ci

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: _Dev) -> _Dev:
        d = self._dev(h)
        if d.parent is None:
            raise self._err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return d.parent

    def nvmlDeviceGetAttributes_v2(self, h: _Dev) -> Any:
        d = self._dev(h)
        return SimpleNamespace(multiprocessorCount=d.sms, gpuInstanceSliceCount=1 if d.parent else 7,
                               computeInstanceSliceCount=1 if d.parent else 7, memorySizeMB=d.mem_total >> 20)

    # GPM: a sample is a real ``c_nvmlGpmSample_t`` (the agent puts it into pynvml's
    # c_nvmlGpmMetricsGet_t); its state is kept here by address
    def nvmlGpmQueryDeviceSupport(self, h: _Dev) -> Any:
        d = self._dev(h)
        return SimpleNamespace(version=1, isSupportedDevice=int(self.gen >= 3 and d.parent is None))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._check()
        buf = ctypes.create_string_buffer(16)
        p = ctypes.cast(buf, _real.c_nvmlGpmSample_t)
        self._gpm_buffers[ctypes.addressof(buf)] = [buf, None]
        return p

    def nvmlGpmSampleFree(self, s: Any) -> None:
        self._gpm_buffers.pop(ctypes.cast(s, ctypes.c_void_p).value or 0, None)

    def _gpm_take(self, h: _Dev, gi: int, s: Any) -> Any:
        d = self._dev(h, mig_ok=False)
        if self.gen < 3:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        self._gpm_buffers[ctypes.cast(s, ctypes.c_void_p).value or 0][1] = (d, gi, d.samples)
        return s

    def nvmlGpmSampleGet(self, h: _Dev, s: Any) -> Any:
        return self._gpm_take(h, -1, s)

    def nvmlGpmMigSampleGet(self, h: _Dev, gi: int, s: Any) -> Any:
        if not self.nmig:
            raise self._err(_real.NVML_ERROR_NOT_SUPPORTED)
        return self._gpm_take(h, gi, s)

    def nvmlGpmMetricsGet(self, m: Any) -> Any:
        self._check()
        if m.version != 1:
            raise self._err(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        a, b = (self._gpm_buffers.get(ctypes.cast(x, ctypes.c_void_p).value or 0, [None, None])[1]
                for x in (m.sample1, m.sample2))
        if a is None or b is None or a[:2] != b[:2] or m.numMetrics > len(m.metrics):
            raise self._err(_real.NVML_ERROR_INVALID_ARGUMENT)
        d, gi, t = b
        k = gi if gi >= 0 else d.index
        tensor_off = self.scenario == "no_tensor"
        for i in range(m.numMetrics):
            x = m.metrics[i]
            v = {
                1: 90 + (t + k) % 10, 2: 80 + t % 10, 3: 35 + t % 5, 5: 0 if tensor_off else 60 + t % 10,
                10: 30 + t % 20, 11: 0, 12: 70 if tensor_off else 10, 13: 0,
                60: 1000.0 * self.nvlinks, 61: 2000.0 * self.nvlinks,
            }.get(x.metricId, -1)
            if v == -1 and 62 <= x.metricId <= 97 and (x.metricId - 62) // 2 < self.nvlinks:
                v = 2000.0 if x.metricId % 2 else 1000.0
            x.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED if v == -1 else _real.NVML_SUCCESS
            x.value = 0.0 if v == -1 else float(v)
        return m

    # -- Xid events
    def nvmlEventSetCreate(self) -> list[Any]:
        self._check()
        self.event_sets += 1
        return []

    def nvmlDeviceRegisterEvents(self, h: _Dev, types: int, es: list[Any]) -> None:
        es.append(h)

    def nvmlEventSetWait_v2(self, es: list[Any], timeout_ms: int) -> Any:
        while self._xid_pending:  # only the GPUs registered in this set report
            d, xid = self._xid_pending.pop(0)
            if d not in es:
                continue
            return SimpleNamespace(device=d, eventType=_real.nvmlEventTypeXidCriticalError, eventData=xid)
        raise _real.NVMLError(_real.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, es: list[Any]) -> None:
        self.event_sets -= 1


def from_env() -> FakeNvml:
    opts = dict(kv.split("=", 1) for kv in os.environ.get("CMDARE_FAKE_NVML", "").split(",") if "=" in kv)
    return FakeNvml(
        gpus=int(opts.get("gpus", 2)),
        model=opts.get("model", "a100"),
        scenario=opts.get("scenario", "healthy"),
        lost_after=int(opts.get("lost_after", 2)),
        nvlinks=int(opts.get("nvlinks", 0)),
        mig=int(opts.get("mig", 0)),
    )


_instance = from_env()


def __getattr__(name: str) -> Any:  # module-level API: ``python:tests.fakes.nvml``
    return getattr(_instance, name)
