"""GPU source (NVML through nvidia-ml-py, imported as ``pynvml``).

Per GPU per tick (one ``gpu`` event each): utilisation of GPU and memory, memory
used/total, power draw and limit, temperature, SM and memory clocks, PCIe tx/rx
throughput, clock-throttle reasons, volatile ECC totals and per-process memory.
Xid critical errors (NVML event set) and increases of the ECC totals are sent as
``gpu_event`` events: counts of occurrences, never a last-value gauge.

Failure handling (the scenarios tests/fakes/nvml.py names):
- NVML library or driver missing, or no GPU: the source is *unavailable*; that is
  reported once and start is retried every ``retry_interval``.
- A field the GPU does not support (NVML_ERROR_NOT_SUPPORTED): the field is left out.
- A GPU that falls off the bus (NVML_ERROR_GPU_IS_LOST): a ``gpu_event`` of kind
  ``lost`` is sent once, that GPU is skipped, the others keep reporting.

The NVML module is a seam: ``backend = "pynvml"`` (default) or ``"python:pkg.module"``,
a module exposing the same functions (tests and benchmarks use a fake).
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cmdare.wire.events import THROTTLE_BITS, Encoded, jstr, row_str
from cmdare.wire.plugin import Option
from cmdare.wire.registry import DATA_FIELDS

from ..config import ConfigError
from .base import SOURCES, Emit, Source, SourceUnavailable

log = logging.getLogger("cmdare.agent.gpu")

# NVML return codes (stable across driver versions; see nvml.h)
NOT_SUPPORTED, NO_PERMISSION, DRIVER_NOT_LOADED, TIMEOUT = 3, 4, 9, 10
LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND, GPU_IS_LOST, UNINITIALIZED = 12, 13, 15, 1
_UNAVAILABLE_AT_INIT = {DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND, NO_PERMISSION, 999}

# NVML clocks-event (throttle) reason bits, as in nvml.h: cmdare.wire.events.THROTTLE_BITS
_THROTTLE_NAMES: dict[int, tuple[str, ...]] = {}


def throttle_names(mask: int) -> list[str]:
    """The reasons a clocks-event mask sets (cached per mask: a handful of masks occur)."""
    t = _THROTTLE_NAMES.get(mask)
    if t is None:
        if len(_THROTTLE_NAMES) > 4096:
            _THROTTLE_NAMES.clear()
        t = _THROTTLE_NAMES[mask] = tuple(name for bit, name in THROTTLE_BITS.items() if mask & bit)
    return list(t)


_ABSENT = {NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION}
# nvidia-ml-py raises this (not an NVMLError) when an unversioned call it maps to a newer
# versioned function (processes -> _v3) meets a driver without it
_MISMATCH: tuple[type[BaseException], ...] = ()
try:
    from pynvml import NVMLLibraryMismatchError

    _MISMATCH = (NVMLLibraryMismatchError,)
except ImportError:  # an older binding, or none: then nothing raises it
    pass


_REASONS_JSON: dict[int, str] = {}
_ECC_KINDS = (("ecc_corrected", "ecc_corrected_total"), ("ecc_uncorrected", "ecc_uncorrected_total"))


def _reasons_json(mask: int, reasons: list[str]) -> str:
    """The JSON of ``throttle_names(mask)``, cached per mask (a handful of masks occur)."""
    t = _REASONS_JSON.get(mask)
    if t is None:
        if len(_REASONS_JSON) > 4096:
            _REASONS_JSON.clear()
        t = _REASONS_JSON[mask] = "[" + ",".join(map(jstr, reasons)) + "]"
    return t


def _missing(*_: Any) -> None:
    """Stands in for an NVML function this binding does not have: the field is absent."""
    return None


@dataclass(frozen=True)
class Field:
    """One field of a ``gpu`` sample (its kind and unit: ``DATA_FIELDS["gpu"]`` in
    cmdare.wire.registry) and how NVML gives it.  Fields that share ``fn`` and ``args`` share
    one call per tick."""

    name: str
    fn: str  # NVML function, called with the device handle, then ``args``
    args: tuple[str, ...] = ()  # names of NVML constants passed after the handle
    value: str = "v"  # Python expression of the field's value from NVML's answer ``v``
    fallback: str = ""  # an older NVML function that answers the same, where ``fn`` is absent
    row: str = ""  # Python expression of its row-form text, where not the value's repr


# The one table both sample paths and the row template are made from.  A new GPU field:
# append it to DATA_FIELDS["gpu"] (wire), add it here, and add its column in a migration.
# index, uuid and name come from the device handle at start; processes are a list (below).
_CLOCKS_EVENTS, _THROTTLE_REASONS = "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"
_ECC = "nvmlDeviceGetTotalEccErrors"
FIELDS = (
    Field("util_gpu_ratio", "nvmlDeviceGetUtilizationRates", value="v.gpu / 100.0"),
    Field("util_mem_ratio", "nvmlDeviceGetUtilizationRates", value="v.memory / 100.0"),
    Field("mem_used_bytes", "nvmlDeviceGetMemoryInfo", value="int(v.used)"),
    Field("mem_total_bytes", "nvmlDeviceGetMemoryInfo", value="int(v.total)"),
    Field("power_watts", "nvmlDeviceGetPowerUsage", value="float(v) * 1e-3"),
    Field("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", value="float(v) * 1e-3"),
    Field("temp_celsius", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",), "float(v)"),
    Field("sm_clock_hz", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",), "float(v) * 1e6"),
    Field("mem_clock_hz", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",), "float(v) * 1e6"),
    Field("pcie_tx_bytes_per_second", "nvmlDeviceGetPcieThroughput", ("NVML_PCIE_UTIL_TX_BYTES",), "float(v) * 1e3"),
    Field("pcie_rx_bytes_per_second", "nvmlDeviceGetPcieThroughput", ("NVML_PCIE_UTIL_RX_BYTES",), "float(v) * 1e3"),
    Field("throttle_mask", _CLOCKS_EVENTS, value="int(v)", fallback=_THROTTLE_REASONS),
    Field(
        "throttle_reasons",
        _CLOCKS_EVENTS,
        value="throttle_names(int(v))",
        fallback=_THROTTLE_REASONS,
        row="_reasons_json(throttle_mask, x)",
    ),
    Field("ecc_corrected_total", _ECC, ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"), "int(v)"),
    Field("ecc_uncorrected_total", _ECC, ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"), "int(v)"),
)
_FROM_HANDLE = ("index", "uuid", "name")
_LISTS = ("processes",)
if _FROM_HANDLE + tuple(f.name for f in FIELDS) + _LISTS != tuple(DATA_FIELDS["gpu"]):
    raise AssertionError("agent/sources/gpu.py FIELDS must follow DATA_FIELDS['gpu'] (the row form is positional)")


def _calls() -> list[tuple[str, tuple[str, ...], str, list[Field]]]:
    """FIELDS grouped by the NVML call that answers them: (fn, args, fallback, fields)."""
    out: list[tuple[str, tuple[str, ...], str, list[Field]]] = []
    for f in FIELDS:
        if out and (out[-1][0], out[-1][1]) == (f.fn, f.args):
            out[-1][3].append(f)
        else:
            out.append((f.fn, f.args, f.fallback, [f]))
    return out


CALLS = _calls()


def _expr(e: str, v: str) -> str:
    return re.sub(r"\bv\b", v, e)


def _straight_source() -> str:
    """Source of ``_straight(n, h, g)``: every call of CALLS in a row, no error mapping,
    returning (the sample dict, its row-form data fields but processes)."""
    body, names = [], []
    for i, (fn, args, _, fields) in enumerate(CALLS):
        call_args = "".join(f", n.{a}" for a in args)
        body.append(f"    v{i} = n.{fn}(h{call_args})")
        for f in fields:
            body.append(f"    {f.name} = {_expr(f.value, f'v{i}')}")
            names.append(f)
    d = ", ".join([f'"{k}": g.{k}' for k in _FROM_HANDLE] + [f'"{f.name}": {f.name}' for f in names])
    texts = ["{g.index}", "{g.uuid_row}", "{g.name_row}"]
    texts += ["{" + (re.sub(r"\bx\b", f.name, f.row) if f.row else f.name + "!r") + "}" for f in names]
    row = "\\t".join(texts)
    return "def _straight(n, h, g):\n" + "\n".join(body) + f"\n    return {{{d}}}, f\"{row}\"\n"


class GpuLost(Exception):
    pass


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    name: str
    lost: bool = False
    ecc_prev: dict[str, int] = field(default_factory=dict)
    fast: bool = True  # every NVML call answered last time: take the straight path

    def __post_init__(self) -> None:
        self.uuid_row, self.name_row = row_str(self.uuid), row_str(self.name)


_ns: dict[str, Any] = {"throttle_names": throttle_names, "_reasons_json": _reasons_json}
exec(compile(_straight_source(), "<cmdare.agent.sources.gpu FIELDS>", "exec"), _ns)
_straight: Callable[[Any, Any, _Gpu], tuple[dict[str, Any], str]] = _ns["_straight"]
# the checked path's conversions: (fields, each field's value from NVML's answer)
_CONVERT = [
    (fn, args, fallback, [(f.name, eval(f"lambda v: {f.value}", dict(_ns))) for f in fields])
    for fn, args, fallback, fields in CALLS
]


def _handle_key(h: Any) -> int:
    """What identifies a device handle: pynvml's handles are ctypes pointers, and the
    binding builds a new pointer object for each answer (an event's device), so the
    address it holds; any other binding's handle, the object itself."""
    try:
        return ctypes.cast(h, ctypes.c_void_p).value or 0
    except (ctypes.ArgumentError, TypeError):
        return id(h)


def load_backend(spec: str) -> Any:
    """``pynvml`` or ``python:some.module`` (a module with pynvml's functions)."""
    if spec == "pynvml":
        import pynvml

        return pynvml
    if spec.startswith("python:"):
        return importlib.import_module(spec[len("python:") :])
    raise ValueError(f"sources.gpu.backend: unknown backend {spec!r} (use 'pynvml' or 'python:module')")


@SOURCES.register
class GpuSource(Source):
    """Per-GPU samples from NVML each tick; Xid and ECC increases as ``gpu_event``s.
    Failure handling and the NVML seam: see the module docstring."""

    name = "gpu"
    OPTIONS = {
        "backend": Option("str", "pynvml", "NVML binding: 'pynvml' or 'python:module' (tests)"),
        "retry_interval": Option("duration", 60.0, "how often to retry when NVML or GPUs are missing"),
        "processes": Option("bool", True, "send per-process GPU memory"),
        "xid_events": Option("bool", True, "watch NVML Xid critical-error events"),
    }

    @classmethod
    def parse_config(cls, where: str, raw: Any) -> dict[str, Any]:
        cfg = super().parse_config(where, raw)
        b = cfg["backend"]
        if b != "pynvml" and not (b.startswith("python:") and len(b) > len("python:")):
            raise ConfigError(f"{where}.backend: must be 'pynvml' or 'python:<module>', got {b!r}")
        return cfg

    def __init__(
        self, config: dict[str, Any], nvml: Any = None, clock: Callable[[], float] = time.monotonic, **_: Any
    ) -> None:
        super().__init__(config)
        self._nvml_given = nvml
        self.nvml: Any = None
        self.clock = clock
        self.gpus: list[_Gpu] = []
        self.event_set: Any = None
        self._inited = False
        self._next_retry = 0.0  # while NVML or its GPUs are missing: no retry before this
        self._why = ""
        self._fns: dict[str, Any] = {}

    def _resolve(self, fn: str) -> Any:
        """NVML functions are looked up once; one the binding lacks reads as absent."""
        f = self._fns.get(fn)
        if f is None:
            f = self._fns[fn] = getattr(self.nvml, fn, None) or _missing
        return f

    def start(self) -> None:
        now = self.clock()
        if now < self._next_retry:
            raise SourceUnavailable(self._why)
        self._next_retry = now + self.config["retry_interval"]
        self._fns = {}
        try:
            self.nvml = (
                self._nvml_given if self._nvml_given is not None else load_backend(self.config["backend"])
            )
        except ImportError as e:
            hint = "; install nvidia-ml-py" if self.config["backend"] == "pynvml" else ""
            self._why = f"cannot import NVML backend {self.config['backend']!r}: {e}{hint}"
            raise SourceUnavailable(self._why) from None
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as e:
            self._why = f"NVML not available: {e} (no NVIDIA driver on this machine?)"
            raise SourceUnavailable(self._why) from None
        self._inited = True
        try:
            count = self.nvml.nvmlDeviceGetCount()
        except self.nvml.NVMLError as e:
            self.close()
            self._why = f"NVML cannot count GPUs: {e}"
            raise SourceUnavailable(self._why) from None
        if count == 0:
            self.close()
            self._why = "NVML found no NVIDIA GPU on this machine"
            raise SourceUnavailable(self._why)
        self.gpus = []
        for i in range(count):
            try:
                h = self.nvml.nvmlDeviceGetHandleByIndex(i)
                uuid, name = (
                    self._text(self.nvml.nvmlDeviceGetUUID(h)),
                    self._text(self.nvml.nvmlDeviceGetName(h)),
                )
            except self.nvml.NVMLError as e:
                log.warning("GPU %d: cannot open: %s", i, e)
                self.gpus.append(_Gpu(i, None, f"index-{i}", "unknown", lost=True))
                continue
            self.gpus.append(_Gpu(i, h, uuid, name))
        if self.config["xid_events"]:
            self._watch_xid()
        self._next_retry = 0.0  # started: a later start (after close) is not a retry

    @staticmethod
    def _text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    def _watch_xid(self) -> None:
        try:
            self.event_set = self.nvml.nvmlEventSetCreate()
            for g in self.gpus:
                if g.handle is not None:
                    try:
                        self.nvml.nvmlDeviceRegisterEvents(
                            g.handle, self.nvml.nvmlEventTypeXidCriticalError, self.event_set
                        )
                    except self.nvml.NVMLError as e:  # not supported on some GPUs (e.g. vGPU)
                        log.info("GPU %d: Xid events not available: %s", g.index, e)
        except (self.nvml.NVMLError, AttributeError) as e:
            log.info("Xid events not available: %s", e)
            self.event_set = None

    def close(self) -> None:
        if self.nvml is not None and self._inited:
            try:
                if self.event_set is not None:
                    self.nvml.nvmlEventSetFree(self.event_set)
            except Exception:
                pass
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
        self._inited, self.event_set = False, None

    def collect(self, emit: Emit) -> None:
        if not self._inited:
            self.start()  # raises SourceUnavailable until NVML and a GPU are there
        problems = []
        for g in self.gpus:
            if g.lost:
                continue
            try:
                data = self._sample_fast(g) if g.fast else self.sample(g)
            except GpuLost as e:
                g.lost = True
                emit("gpu_event", {"index": g.index, "uuid": g.uuid, "kind": "lost", "count": 1})
                problems.append(f"GPU {g.index} ({g.uuid}) lost: {e}")
                log.error("GPU %d (%s) is lost: %s", g.index, g.uuid, e)
                continue
            emit("gpu", data)
            for kind, key in _ECC_KINDS:
                total = data.get(key)
                if total is None:
                    continue
                prev = g.ecc_prev.get(kind)
                if prev is not None and total > prev:
                    emit("gpu_event", {"index": g.index, "uuid": g.uuid, "kind": kind, "count": total - prev})
                g.ecc_prev[kind] = total
        self._drain_xid(emit)
        if problems:
            raise RuntimeError("; ".join(problems))
        if self.gpus and all(g.lost for g in self.gpus):
            raise RuntimeError("all GPUs lost")

    def _drain_xid(self, emit: Emit) -> None:
        if self.event_set is None:
            return
        by_handle = None  # made when an event comes (most ticks have none)
        for _ in range(64):  # bounded per tick
            try:
                ev = self.nvml.nvmlEventSetWait_v2(self.event_set, 0)
            except self.nvml.NVMLError as e:
                if getattr(e, "value", None) != TIMEOUT:
                    log.debug("Xid wait: %s", e)
                return
            if by_handle is None:
                by_handle = {_handle_key(g.handle): g for g in self.gpus}
            g = by_handle.get(_handle_key(ev.device))
            emit(
                "gpu_event",
                {
                    "index": g.index if g else -1,
                    "uuid": g.uuid if g else "",
                    "kind": "xid",
                    "count": 1,
                    "xid": int(ev.eventData),
                },
            )

    def _sample_fast(self, g: _Gpu) -> dict[str, Any]:
        """The same dict as ``sample`` for a GPU that answers every call, without the
        per-call error mapping (most of the agent's own cost per GPU): FIELDS' calls in a
        row (``_straight``), the row form from the same table.  The first NVML error sends
        this GPU down ``sample`` for good, where each error gets its meaning."""
        n, h = self.nvml, g.handle
        try:
            d, row = _straight(n, h, g)
            if self.config["processes"]:
                procs, texts = [], []
                for p in n.nvmlDeviceGetComputeRunningProcesses(h):
                    pid, mem = int(p.pid), p.usedGpuMemory
                    if mem is None:
                        procs.append({"pid": pid})
                        texts.append(f'{{"pid":{pid}}}')
                    else:
                        mem = int(mem)
                        procs.append({"pid": pid, "used_bytes": mem})
                        texts.append(f'{{"pid":{pid},"used_bytes":{mem}}}')
                d["processes"] = procs
                row += "\t[" + ",".join(texts) + "]"
        except (n.NVMLError, AttributeError, *_MISMATCH):  # an error, a binding without the function,
            g.fast = False  # or a driver older than the binding (its versioned call is missing)
            return self.sample(g)
        return Encoded(d, row=row)

    def sample(self, g: _Gpu) -> dict[str, Any]:
        n, h, fns, err = self.nvml, g.handle, self._fns, self.nvml.NVMLError
        d: dict[str, Any] = {"index": g.index, "uuid": g.uuid, "name": g.name}

        # The one place that turns NVML errors into meaning (nvitop's habit): NotSupported,
        # NoPermission, FunctionNotFound -> the field is absent (None); GPU lost -> GpuLost.
        # Runs about 13 times per GPU per tick, hence a closure and not a method chain.
        def get(fn: str, *args: Any) -> Any:
            f = fns.get(fn) or self._resolve(fn)
            try:
                return f(h, *args)
            except err as e:
                code = getattr(e, "value", None)
                if code == GPU_IS_LOST:
                    raise GpuLost(str(e)) from None
                if code in _ABSENT:
                    return None
                raise
            except _MISMATCH:  # the driver predates the binding's versioned call: absent
                fns[fn] = _missing
                return None

        for fn, args, fallback, convert in _CONVERT:
            consts = [getattr(n, a) for a in args]
            v = get(fn, *consts)
            if v is None and fallback:
                v = get(fallback, *consts)
            if v is not None:
                for name, value in convert:
                    d[name] = value(v)
        if self.config["processes"]:
            procs = get("nvmlDeviceGetComputeRunningProcesses")
            if procs is None and fns["nvmlDeviceGetComputeRunningProcesses"] is _missing:
                procs = get("nvmlDeviceGetComputeRunningProcesses_v2")  # R470 and older drivers
            if procs is not None:
                d["processes"] = [
                    {"pid": int(p.pid), "used_bytes": int(p.usedGpuMemory)}
                    if p.usedGpuMemory is not None
                    else {"pid": int(p.pid)}
                    for p in procs
                ]
        return d
