"""GPU source (NVML through nvidia-ml-py, imported as ``pynvml``).

Per GPU per tick (one ``gpu`` event each): utilisation of GPU and memory, memory
used/total, power draw and limit, temperature, SM and memory clocks, PCIe tx/rx
throughput, clock-throttle reasons, volatile ECC totals and per-process memory; and where
the GPU answers them (``_extras``): profiling activity through NVML's GPM API (Hopper and
later), energy, row remapping, NVLink state / errors / throughput, per-process SM and
memory use.  Each MIG instance is a GPU of its own (index ``1000 * (parent + 1) + slot``,
with its parent, profile and share of the parent's SMs).
Xid critical errors (NVML event set), increases of the ECC totals and a row remapping that
turns pending or failed are sent as ``gpu_event`` events: counts of occurrences, never a
last-value gauge.

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
from cmdare.wire.rowform import row_field
from cmdare.wire.units import ConfigError

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
_NEVER = {NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION, 2}  # not asked again (2: invalid argument)
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
_REMAP_STATES = ("row_remap_pending", "row_remap_failed", "retired_pages_pending")  # gpu_event kinds when they turn true


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
# the fields after ``processes`` (issue 38), read by ``_extras`` with their own error handling
_GPU_FIELDS = tuple(DATA_FIELDS["gpu"])
EXTRAS = _GPU_FIELDS[_GPU_FIELDS.index("processes") + 1 :]
_EXTRA_KINDS = [(n, DATA_FIELDS["gpu"][n][0]) for n in EXTRAS]
_EXTRA_NAMES = tuple(EXTRAS)
_TAIL = ""  # ``texts`` key of a whole tail built by the source
# where ``_extras_fast`` puts its fields' text (in the registry's order)
_AT_ENERGY, _AT_REMAP, _AT_RETIRED = (EXTRAS.index(n) for n in ("energy_joules_total", "remapped_rows_correctable",
                                                                  "retired_pages_sbe"))
if (EXTRAS[_AT_REMAP : _AT_REMAP + 4] != ("remapped_rows_correctable", "remapped_rows_uncorrectable",
                                          "row_remap_pending", "row_remap_failed")
        or EXTRAS[_AT_RETIRED:] != ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending")):
    raise AssertionError("agent/sources/gpu.py _extras_fast writes the row-remap and retired-page fields in this order")
if _FROM_HANDLE + tuple(f.name for f in FIELDS) + _LISTS + EXTRAS != _GPU_FIELDS:
    raise AssertionError("agent/sources/gpu.py FIELDS must follow DATA_FIELDS['gpu'] (the row form is positional)")

MIB = 1048576.0
# GPM metrics (nvml.h's NVML_GPM_METRIC_* ids): field, metric id, scale to the field's unit
GPM_METRICS = (
    ("gr_engine_active_ratio", 1, 0.01),
    ("sm_active_ratio", 2, 0.01),
    ("sm_occupancy_ratio", 3, 0.01),
    ("tensor_active_ratio", 5, 0.01),
    ("fp16_active_ratio", 13, 0.01),
    ("fp32_active_ratio", 12, 0.01),
    ("fp64_active_ratio", 11, 0.01),
    ("dram_active_ratio", 10, 0.01),
    ("nvlink_total_rx_bytes_per_second", 60, MIB),
    ("nvlink_total_tx_bytes_per_second", 61, MIB),
)
GPM_LINK_RX0 = 62  # NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC; link l: rx 62 + 2l, tx 63 + 2l (links 0-17)
GPM_MAX_LINK = 18
# NVLink error counters (nvmlNvLinkErrorCounter_t) and their names in the ``nvlink`` objects
NVLINK_ERRORS = (("replay_errors_total", 0), ("recovery_errors_total", 1), ("crc_flit_errors_total", 2), ("crc_data_errors_total", 3))
MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS
MIG_INDEX_BASE = 1000  # a MIG instance's index: 1000 * (parent index + 1) + its slot
NOT_FOUND = 6


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


class _Metric(ctypes.Structure):
    """nvml.h's nvmlGpmMetric_t, as a plain ctypes struct: nvidia-ml-py's own class hooks
    every field read (``__getattribute__``), a third of the GPM read's cost."""

    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_double),
                ("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p), ("unit", ctypes.c_char_p)]


def _metrics_view(req: Any) -> Any:
    """The ``metrics`` array of a c_nvmlGpmMetricsGet_t, read through ``_Metric`` (the same
    memory); the request itself when it is not a ctypes struct of that layout."""
    try:
        cls = type(req)
        elem = type(req.metrics)._type_
        if ctypes.sizeof(elem) != ctypes.sizeof(_Metric) or any(
                getattr(elem, f).offset != getattr(_Metric, f).offset for f in ("metricId", "nvmlReturn", "value")):
            return req.metrics  # a binding with another layout: read through its own struct
        return (_Metric * len(req.metrics)).from_buffer(req, cls.metrics.offset)
    except (AttributeError, TypeError, ValueError):
        return req.metrics


def _procs_text(procs: list[dict[str, Any]]) -> str:
    """The JSON of the processes list as the source builds it (pid, used_bytes, then
    sm_ratio and mem_ratio where sampled), without the generic encoder."""
    parts = []
    for p in procs:
        t = f'{{"pid":{p["pid"]}'
        if "used_bytes" in p:
            t += f',"used_bytes":{p["used_bytes"]}'
        if "sm_ratio" in p:
            t += f',"sm_ratio":{float.__repr__(p["sm_ratio"])},"mem_ratio":{float.__repr__(p["mem_ratio"])}'
        parts.append(t + "}")
    return "[" + ",".join(parts) + "]"


def _tail(d: dict[str, Any], texts: dict[str, str]) -> str:
    """The row-form text of the fields after ``processes`` (``encode_row_data``'s, faster:
    each kind's text directly; list fields built by the source are in ``texts``)."""
    t = texts.get(_TAIL)
    if t is not None:
        return t
    vals = [d.get(name) for name in _EXTRA_NAMES]
    last = len(vals)
    while last and vals[last - 1] is None:
        last -= 1
    out = []
    for (name, kind), v in zip(_EXTRA_KINDS[:last], vals, strict=False):
        if v is None:
            out.append("")
        elif name in texts:
            out.append(texts[name])
        elif kind == "float" and type(v) is float and v - v == 0.0:
            out.append(float.__repr__(v))
        elif kind == "int" and type(v) is int:
            out.append(int.__repr__(v))
        else:
            out.append(row_field(kind, v))
    return "\t".join(out)


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    name: str
    lost: bool = False
    ecc_prev: dict[str, int] = field(default_factory=dict)
    remap_prev: dict[str, bool] = field(default_factory=dict)
    fast: bool = True  # every NVML call answered last time: take the straight path
    # issue 38: MIG (a MIG instance's parent GPU and identity), GPM, NVLink, process samples
    parent: _Gpu | None = None
    mig: dict[str, Any] = field(default_factory=dict)  # parent_index, mig_profile, ... (fields as sent)
    gpm: Any = None  # the c_nvmlGpmMetricsGet_t request (metric ids set once), None: no GPM
    gpm_samples: list[Any] = field(default_factory=list)  # two samples, used in turn
    gpm_turn: int = -1  # which sample the last tick took (-1: none yet)
    links: list[int] = field(default_factory=list)  # NVLinks whose state answers
    proc_ts: int = 0  # newest process-utilisation sample seen (NVML's microseconds)
    skip: set[str] = field(default_factory=set)  # extra calls this GPU does not support
    links_slow: bool = False  # an NVLink call failed once: each call's error mapped from then on
    xfast: bool = False  # the extra calls answered last tick: ``_extras_fast`` (set after a checked tick)
    gpm_view: Any = None  # the GPM request's metrics as plain ctypes structs (``_metrics_view``)

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
        "profiling": Option("bool", True, "GPM profiling metrics (SM / tensor / DRAM activity; Hopper and later)"),
        "nvlink": Option("bool", True, "NVLink state, error counters and throughput"),
        "mig": Option("bool", True, "each MIG instance as a GPU of its own"),
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
        self._discover()
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

    # -- issue 38: what each GPU answers beyond the fixed fields, found once at start
    def _try(self, fn: str, *args: Any) -> Any:
        """An NVML call at start: its answer, or None where the GPU cannot answer it."""
        f = getattr(self.nvml, fn, None)
        if f is None:
            return None
        try:
            return f(*args)
        except self.nvml.NVMLError as e:
            if getattr(e, "value", None) == GPU_IS_LOST:
                return None
            log.debug("%s: %s", fn, e)
            return None
        except (*_MISMATCH, TypeError, AttributeError):
            return None

    def _discover(self) -> None:
        """MIG instances (each a GPU of its own), GPM support and NVLinks of every GPU; one
        log line per kind of field a GPU cannot give."""
        cfg, n = self.config, self.nvml
        no_gpm = []
        for g in list(self.gpus):
            if g.handle is None:
                continue
            if cfg["mig"]:
                self._mig_instances(g)
            if cfg["nvlink"]:
                g.links = self._links(g.handle)
            if cfg["profiling"]:
                sup = self._try("nvmlGpmQueryDeviceSupport", g.handle)
                if sup is not None and getattr(sup, "isSupportedDevice", 0):
                    for x in [g] + [m for m in self.gpus if m.parent is g]:
                        self._gpm_setup(x, g.links if x is g else [])
                else:
                    no_gpm.append(f"{g.index} ({g.name})")
        if no_gpm:
            has = getattr(n, "nvmlGpmQueryDeviceSupport", None) is not None
            log.info(
                "GPU %s: no profiling metrics (SM / tensor / DRAM activity): %s",
                ", ".join(no_gpm),
                "NVML's GPM API needs a Hopper or later GPU" if has else "this nvidia-ml-py has no GPM API",
            )

    def _links(self, h: Any) -> list[int]:
        """The NVLinks active at start (their state is read every tick: a link that goes
        down reads ``active: 0``)."""
        links = []
        for link in range(MAX_LINKS):
            try:
                active = self.nvml.nvmlDeviceGetNvLinkState(h, link)
            except self.nvml.NVMLError as e:
                if getattr(e, "value", None) in (NOT_SUPPORTED, 2) and links:
                    break  # past the last link
                if getattr(e, "value", None) in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
                    return []  # no NVLink on this GPU (a VM's single GPU)
                continue
            except AttributeError:
                return []
            if active:
                links.append(link)
        return links

    def _mig_instances(self, g: _Gpu) -> None:
        mode = self._try("nvmlDeviceGetMigMode", g.handle)
        if not mode or int(mode[0]) != 1:
            return
        count = self._try("nvmlDeviceGetMaxMigDeviceCount", g.handle) or 0
        pattr = self._try("nvmlDeviceGetAttributes_v2", g.handle)
        parent_sms = getattr(pattr, "multiprocessorCount", 0) or 0
        for slot in range(min(int(count), 64)):
            mh = self._try("nvmlDeviceGetMigDeviceHandleByIndex", g.handle, slot)
            if mh is None:
                continue  # an empty slot (NOT_FOUND)
            uuid, name = self._try("nvmlDeviceGetUUID", mh), self._try("nvmlDeviceGetName", mh)
            if uuid is None:
                continue
            name = self._text(name) if name is not None else g.name
            attr = self._try("nvmlDeviceGetAttributes_v2", mh)
            profile = name.split(" MIG ", 1)[1] if " MIG " in name else ""
            if not profile and attr is not None:
                profile = f"{attr.gpuInstanceSliceCount}g.{round(attr.memorySizeMB / 1024)}gb"
            mig: dict[str, Any] = {"parent_index": g.index}
            if profile:
                mig["mig_profile"] = profile
            for key, fn in (("gpu_instance_id", "nvmlDeviceGetGpuInstanceId"), ("compute_instance_id", "nvmlDeviceGetComputeInstanceId")):
                v = self._try(fn, mh)
                if v is not None:
                    mig[key] = int(v)
            if attr is not None and parent_sms:
                mig["mig_slice_ratio"] = min(1.0, attr.multiprocessorCount / parent_sms)
            m = _Gpu(MIG_INDEX_BASE * (g.index + 1) + slot, mh, self._text(uuid), name, parent=g, mig=mig)
            self.gpus.append(m)

    def _gpm_setup(self, g: _Gpu, links: list[int]) -> None:
        n = self.nvml
        cls = getattr(n, "c_nvmlGpmMetricsGet_t", None)
        if cls is None:
            return
        try:
            samples = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
        except n.NVMLError as e:
            log.info("GPU %d: GPM samples cannot be allocated: %s", g.index, e)
            return
        req = cls()
        req.version = getattr(n, "NVML_GPM_METRICS_GET_VERSION", 1)
        ids = [m for _, m, _ in GPM_METRICS]
        ids += [GPM_LINK_RX0 + 2 * link + k for link in links if link < GPM_MAX_LINK for k in (0, 1)]
        for i, mid in enumerate(ids):
            req.metrics[i].metricId = mid
        req.numMetrics = len(ids)
        g.gpm, g.gpm_samples, g.gpm_turn = req, samples, -1
        g.gpm_view = _metrics_view(req)

    def _free_gpm(self) -> None:
        for g in self.gpus:
            for smp in g.gpm_samples:
                try:
                    self.nvml.nvmlGpmSampleFree(smp)
                except Exception:
                    pass
            g.gpm, g.gpm_samples = None, []

    def close(self) -> None:
        if self.nvml is not None and self._inited:
            self._free_gpm()
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
            for key in _REMAP_STATES:  # a row remapping that became pending / failed: a health event
                now_ = data.get(key)
                if now_ and not g.remap_prev.get(key):
                    emit("gpu_event", {"index": g.index, "uuid": g.uuid, "kind": key, "count": 1})
                if now_ is not None:
                    g.remap_prev[key] = bool(now_)
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
        if g.parent is not None:  # a MIG instance: most fixed fields are the parent's
            g.fast = False
            return self.sample(g)
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
                proc_row = "[" + ",".join(texts) + "]"
            else:
                proc_row = ""
        except (n.NVMLError, AttributeError, *_MISMATCH):  # an error, a binding without the function,
            g.fast = False  # or a driver older than the binding (its versioned call is missing)
            return self.sample(g)
        texts = {}
        if self._extras(g, d, texts):  # per-process utilisation merged: the processes' text again
            proc_row = _procs_text(d["processes"])
        tail = _tail(d, texts)
        if proc_row or tail:
            row += "\t" + proc_row
        if tail:
            row += "\t" + tail
        return Encoded(d, row=row)

    def _extras(self, g: _Gpu, d: dict[str, Any], texts: dict[str, str] | None = None) -> bool:
        """The fields after ``processes`` into ``d`` (those this GPU answers), and per-process
        SM / memory use into ``d["processes"]``; True when the latter changed.  A call the
        GPU does not support is not made again; a lost GPU raises GpuLost.  ``texts``: the
        row-form text of list fields built here (the ``nvlink`` objects), for ``_tail``."""
        n, h, skip, err = self.nvml, g.handle, g.skip, self.nvml.NVMLError
        if g.xfast and g.gpm is None and not g.links and not g.mig:
            try:
                return self._extras_fast(g, d, texts)
            except err as e:
                if getattr(e, "value", None) == GPU_IS_LOST:
                    raise GpuLost(str(e)) from None
                g.xfast = False  # a call that answered before does not now: checked from here on
            except (AttributeError, TypeError, *_MISMATCH):
                g.xfast = False

        def get(fn: str, *args: Any, handle: Any = h) -> Any:
            if fn in skip:
                return None
            f = getattr(n, fn, None)
            if f is None:
                skip.add(fn)
                return None
            try:
                return f(handle, *args)
            except err as e:
                code = getattr(e, "value", None)
                if code == GPU_IS_LOST:
                    raise GpuLost(str(e)) from None
                if code in _NEVER:
                    skip.add(fn)
                elif code != NOT_FOUND:
                    log.debug("GPU %d: %s: %s", g.index, fn, e)
                return None
            except (*_MISMATCH, TypeError):
                skip.add(fn)
                return None

        if g.mig:
            d.update(g.mig)
        mj = get("nvmlDeviceGetTotalEnergyConsumption")
        if mj is not None:
            d["energy_joules_total"] = int(mj) * 1e-3
        rr = get("nvmlDeviceGetRemappedRows")
        if rr is not None:
            d["remapped_rows_correctable"], d["remapped_rows_uncorrectable"] = int(rr[0]), int(rr[1])
            d["row_remap_pending"], d["row_remap_failed"] = bool(rr[2]), bool(rr[3])
        sbe = get("nvmlDeviceGetRetiredPages", 0)  # Kepler to Turing (later GPUs remap rows)
        if sbe is not None:
            d["retired_pages_sbe"] = len(sbe)
            dbe = get("nvmlDeviceGetRetiredPages", 1)
            if dbe is not None:
                d["retired_pages_dbe"] = len(dbe)
            pend = get("nvmlDeviceGetRetiredPagesPendingStatus")
            if pend is not None:
                d["retired_pages_pending"] = bool(pend)
        link_rate: dict[int, list[float]] = {}
        if g.gpm is not None:
            self._gpm_read(g, d, get, link_rate)
        if g.links and not g.links_slow:
            try:  # every link answers (the rule): the calls in a row, the text built beside
                self._links_fast(g, d, link_rate, texts)
            except (err, AttributeError, TypeError) as e:
                if getattr(e, "value", None) == GPU_IS_LOST:
                    raise GpuLost(str(e)) from None
                g.links_slow = True  # a link that does not answer: each call's error mapped from now on
        if g.links and g.links_slow:
            links, errors = [], 0
            for link in g.links:
                state = get("nvmlDeviceGetNvLinkState", link)
                if state is None:
                    continue
                o: dict[str, Any] = {"link": link, "active": int(state)}
                if state:
                    for key, counter in NVLINK_ERRORS:
                        c = get("nvmlDeviceGetNvLinkErrorCounter", link, counter)
                        if c is not None:
                            o[key] = int(c)
                            errors += int(c)
                    rate = link_rate.get(link)
                    if rate is not None:
                        o["rx_bytes_per_second"], o["tx_bytes_per_second"] = rate
                links.append(o)
            if links:
                d["nvlink"] = links
                d["nvlink_errors_total"] = errors
        g.xfast = True  # a whole checked pass: next time the calls that answered, in a row
        procs = d.get("processes")
        if procs:
            samples = get("nvmlDeviceGetProcessUtilization", g.proc_ts)
            if samples:
                return self._merge_procs(g, procs, samples)
        return False

    def _extras_fast(self, g: _Gpu, d: dict[str, Any], texts: dict[str, str] | None = None) -> bool:
        """``_extras`` for a GPU without GPM, NVLink or MIG whose calls all answered last
        time (most GPUs of a cloud fleet): the calls it answers, in a row, no error mapping
        but process utilisation's "no new sample"."""
        n, h, skip = self.nvml, g.handle, g.skip
        parts = [""] * len(_EXTRA_NAMES)  # the row text of each field after processes
        last = -1
        if "nvmlDeviceGetTotalEnergyConsumption" not in skip:
            v = d["energy_joules_total"] = int(n.nvmlDeviceGetTotalEnergyConsumption(h)) * 1e-3
            parts[_AT_ENERGY] = float.__repr__(v)
            last = _AT_ENERGY
        if "nvmlDeviceGetRemappedRows" not in skip:
            rr = n.nvmlDeviceGetRemappedRows(h)
            c, u, pend, fail = int(rr[0]), int(rr[1]), bool(rr[2]), bool(rr[3])
            d["remapped_rows_correctable"], d["remapped_rows_uncorrectable"] = c, u
            d["row_remap_pending"], d["row_remap_failed"] = pend, fail
            parts[_AT_REMAP : _AT_REMAP + 4] = (int.__repr__(c), int.__repr__(u), "true" if pend else "false",
                                                "true" if fail else "false")
            last = _AT_REMAP + 3
        if "nvmlDeviceGetRetiredPages" not in skip:
            a, b = len(n.nvmlDeviceGetRetiredPages(h, 0)), len(n.nvmlDeviceGetRetiredPages(h, 1))
            d["retired_pages_sbe"], d["retired_pages_dbe"] = a, b
            parts[_AT_RETIRED], parts[_AT_RETIRED + 1] = int.__repr__(a), int.__repr__(b)
            last = _AT_RETIRED + 1
            if "nvmlDeviceGetRetiredPagesPendingStatus" not in skip:
                p = d["retired_pages_pending"] = bool(n.nvmlDeviceGetRetiredPagesPendingStatus(h))
                parts[_AT_RETIRED + 2] = "true" if p else "false"
                last = _AT_RETIRED + 2
        if texts is not None:  # the row text of this shape (no GPM, NVLink or MIG fields), for _tail
            texts[_TAIL] = "\t".join(parts[: last + 1])
        procs = d.get("processes")
        if not procs or "nvmlDeviceGetProcessUtilization" in skip:
            return False
        try:
            samples = n.nvmlDeviceGetProcessUtilization(h, g.proc_ts)
        except n.NVMLError as e:
            if getattr(e, "value", None) == NOT_FOUND:
                return False  # no sample since the last one
            raise
        return self._merge_procs(g, procs, samples)

    def _merge_procs(self, g: _Gpu, procs: list[dict[str, Any]], samples: Any) -> bool:
        by_pid = {}
        for smp in samples:
            ts = int(smp.timeStamp)
            if ts > g.proc_ts:
                g.proc_ts = ts
            by_pid[int(smp.pid)] = (min(1.0, smp.smUtil / 100.0), min(1.0, smp.memUtil / 100.0))
        changed = False
        for p in procs:
            u = by_pid.get(p["pid"])
            if u is not None:
                p["sm_ratio"], p["mem_ratio"] = u
                changed = True
        return changed

    def _links_fast(self, g: _Gpu, d: dict[str, Any], link_rate: dict[int, list[float]],
                    texts: dict[str, str] | None) -> None:
        n, h = self.nvml, g.handle
        state, counter = n.nvmlDeviceGetNvLinkState, n.nvmlDeviceGetNvLinkErrorCounter
        links, parts, errors = [], [], 0
        for link in g.links:
            if state(h, link):
                a, b, c, e = int(counter(h, link, 0)), int(counter(h, link, 1)), int(counter(h, link, 2)), int(counter(h, link, 3))
                errors += a + b + c + e
                o = {"link": link, "active": 1, "replay_errors_total": a, "recovery_errors_total": b,
                     "crc_flit_errors_total": c, "crc_data_errors_total": e}
                t = (f'{{"link":{link},"active":1,"replay_errors_total":{a},"recovery_errors_total":{b},'
                     f'"crc_flit_errors_total":{c},"crc_data_errors_total":{e}')
                rate = link_rate.get(link)
                if rate is not None:
                    o["rx_bytes_per_second"], o["tx_bytes_per_second"] = rate
                    t += f',"rx_bytes_per_second":{rate[0]!r},"tx_bytes_per_second":{rate[1]!r}'
                parts.append(t + "}")
            else:
                o = {"link": link, "active": 0}
                parts.append(f'{{"link":{link},"active":0}}')
            links.append(o)
        d["nvlink"] = links
        d["nvlink_errors_total"] = errors
        if texts is not None:
            texts["nvlink"] = "[" + ",".join(parts) + "]"

    def _gpm_read(self, g: _Gpu, d: dict[str, Any], get: Callable[..., Any], link_rate: dict[int, list[float]]) -> None:
        """Take this tick's GPM sample; with the last tick's, the metrics of the interval."""
        n = self.nvml
        turn = 1 - g.gpm_turn if g.gpm_turn >= 0 else 0
        smp = g.gpm_samples[turn]
        if g.parent is not None:
            ok = get("nvmlGpmMigSampleGet", g.mig.get("gpu_instance_id", 0), smp, handle=g.parent.handle)
        else:
            ok = get("nvmlGpmSampleGet", smp)
        if ok is None:
            g.gpm_turn = -1
            return
        if g.gpm_turn >= 0:
            req = g.gpm
            req.sample1, req.sample2 = g.gpm_samples[g.gpm_turn], smp
            try:
                n.nvmlGpmMetricsGet(req)
            except n.NVMLError as e:
                log.debug("GPU %d: nvmlGpmMetricsGet: %s", g.index, e)
            else:
                m = g.gpm_view  # the request's metrics without the binding's per-field hooks
                for i, (name, _, scale) in enumerate(GPM_METRICS):
                    x = m[i]
                    v = x.value
                    if x.nvmlReturn == 0 and v >= 0:  # (a NaN fails v >= 0)
                        v *= scale
                        d[name] = (v if v < 1.0 else 1.0) if scale == 0.01 else v
                for i in range(len(GPM_METRICS), req.numMetrics, 2):
                    x, y = m[i], m[i + 1]
                    if x.nvmlReturn == 0 and y.nvmlReturn == 0:
                        link_rate[(x.metricId - GPM_LINK_RX0) // 2] = [x.value * MIB, y.value * MIB]
        g.gpm_turn = turn

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
        self._extras(g, d)
        return d
