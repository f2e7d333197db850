"""The GPU sample's field table: each NVML call that answers fields of a ``gpu`` event
(``DATA_FIELDS["gpu"]`` in cmdare.wire.registry: kinds and units), in the order the source
makes them, with the function that turns its answer into the fields and their row-form
text. The row form is positional: each field's text goes to its place in the row
(``AT``), so a sample's row is built as it is read, never re-encoded.

A new field that one NVML call answers: append it to ``DATA_FIELDS["gpu"]`` (wire), add a
converter and a ``Call`` here, and its column in a migration (collector/schema). GPM,
NVLink, MIG and per-process utilisation have modules of their own (gpm.py, nvlink.py,
mig.py, processes.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cmdare.wire.events import THROTTLE_BITS, jstr
from cmdare.wire.registry import DATA_FIELDS
from cmdare.wire.rowform import row_field

from .slurm import FIELDS as SLURM_FIELDS

GPU_FIELDS = tuple(DATA_FIELDS["gpu"])
AT = {name: i for i, name in enumerate(GPU_FIELDS)}  # each field's place in the row
KIND = {name: kind for name, (kind, _) in DATA_FIELDS["gpu"].items()}
_f, _i = float.__repr__, int.__repr__

# NVML clocks-event (throttle) reason bits, as in nvml.h: cmdare.wire.events.THROTTLE_BITS
_THROTTLE_NAMES: dict[int, tuple[str, ...]] = {}
_REASONS_JSON: dict[int, str] = {}


def throttle_names(mask: int) -> list[str]:
    """The reasons a clocks-event mask sets (cached per mask: a handful of masks occur)."""
    t = _THROTTLE_NAMES.get(mask)
    if t is None:
        if len(_THROTTLE_NAMES) > 4096:
            _THROTTLE_NAMES.clear()
        t = _THROTTLE_NAMES[mask] = tuple(name for bit, name in THROTTLE_BITS.items() if mask & bit)
    return list(t)


def _reasons_json(mask: int) -> str:
    """The JSON of ``throttle_names(mask)``, cached per mask."""
    t = _REASONS_JSON.get(mask)
    if t is None:
        if len(_REASONS_JSON) > 4096:
            _REASONS_JSON.clear()
        t = _REASONS_JSON[mask] = "[" + ",".join(map(jstr, throttle_names(mask))) + "]"
    return t


def put(d: dict[str, Any], t: list[str], name: str, v: Any) -> None:
    """One field into the sample and its text into the row (the general way: rare fields)."""
    d[name] = v
    t[AT[name]] = row_field(KIND[name], v)


# -- converters: an NVML answer -> fields of the sample ``d`` and their texts in the row ``t``

_U0, _U1, _M0, _M1 = AT["util_gpu_ratio"], AT["util_mem_ratio"], AT["mem_used_bytes"], AT["mem_total_bytes"]
_PW, _PL, _TC = AT["power_watts"], AT["power_limit_watts"], AT["temp_celsius"]
_SC, _MC, _TX, _RX = AT["sm_clock_hz"], AT["mem_clock_hz"], AT["pcie_tx_bytes_per_second"], AT["pcie_rx_bytes_per_second"]
_TM, _TR, _EC, _EU = AT["throttle_mask"], AT["throttle_reasons"], AT["ecc_corrected_total"], AT["ecc_uncorrected_total"]
_EN, _RR, _RP = AT["energy_joules_total"], AT["remapped_rows_correctable"], AT["retired_pages_sbe"]


def _util(v: Any, d: dict[str, Any], t: list[str]) -> None:
    d["util_gpu_ratio"] = a = v.gpu / 100.0
    d["util_mem_ratio"] = b = v.memory / 100.0
    t[_U0], t[_U1] = _f(a), _f(b)


def _memory(v: Any, d: dict[str, Any], t: list[str]) -> None:
    d["mem_used_bytes"] = a = int(v.used)
    d["mem_total_bytes"] = b = int(v.total)
    t[_M0], t[_M1] = _i(a), _i(b)


def _scaled(name: str, at: int, scale: float) -> Callable[[Any, dict[str, Any], list[str]], None]:
    def conv(v: Any, d: dict[str, Any], t: list[str]) -> None:
        d[name] = x = float(v) * scale
        t[at] = _f(x)

    return conv


def _count(name: str, at: int, of: Callable[[Any], int] = int) -> Callable[[Any, dict[str, Any], list[str]], None]:
    """An integer field: the answer itself (a counter), or ``of`` it (``len``: a list's length)."""

    def conv(v: Any, d: dict[str, Any], t: list[str]) -> None:
        d[name] = x = of(v)
        t[at] = _i(x)

    return conv


def _throttle(v: Any, d: dict[str, Any], t: list[str]) -> None:
    m = int(v)
    d["throttle_mask"], d["throttle_reasons"] = m, throttle_names(m)
    t[_TM], t[_TR] = _i(m), _reasons_json(m)


def _energy(v: Any, d: dict[str, Any], t: list[str]) -> None:
    d["energy_joules_total"] = x = int(v) * 1e-3  # NVML: millijoules since the driver loaded
    t[_EN] = _f(x)


def _remapped(v: Any, d: dict[str, Any], t: list[str]) -> None:
    c, u, pend, fail = int(v[0]), int(v[1]), bool(v[2]), bool(v[3])
    d["remapped_rows_correctable"], d["remapped_rows_uncorrectable"] = c, u
    d["row_remap_pending"], d["row_remap_failed"] = pend, fail
    t[_RR], t[_RR + 1], t[_RR + 2], t[_RR + 3] = _i(c), _i(u), "true" if pend else "false", "true" if fail else "false"


def _pending(v: Any, d: dict[str, Any], t: list[str]) -> None:
    d["retired_pages_pending"] = p = bool(v)
    t[_RP + 2] = "true" if p else "false"


@dataclass(frozen=True)
class Call:
    """One NVML call (with the device handle, then the named NVML constants ``args``) and
    the fields ``convert`` makes of its answer; ``fallback``: an older function that
    answers the same where ``fn`` is absent."""

    fn: str
    names: tuple[str, ...]
    convert: Callable[[Any, dict[str, Any], list[str]], None]
    args: tuple[str | int, ...] = ()  # NVML constants by name, or plain values
    fallback: str = ""


_CLOCKS_EVENTS, _THROTTLE_REASONS = "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"
_ECC = "nvmlDeviceGetTotalEccErrors"
# the fixed fields, in the row's order (checked below); index, uuid, name come from the
# device at start, processes from processes.py
FIXED = (
    Call("nvmlDeviceGetUtilizationRates", ("util_gpu_ratio", "util_mem_ratio"), _util),
    Call("nvmlDeviceGetMemoryInfo", ("mem_used_bytes", "mem_total_bytes"), _memory),
    Call("nvmlDeviceGetPowerUsage", ("power_watts",), _scaled("power_watts", _PW, 1e-3)),
    Call("nvmlDeviceGetEnforcedPowerLimit", ("power_limit_watts",), _scaled("power_limit_watts", _PL, 1e-3)),
    Call("nvmlDeviceGetTemperature", ("temp_celsius",), _scaled("temp_celsius", _TC, 1.0), ("NVML_TEMPERATURE_GPU",)),
    Call("nvmlDeviceGetClockInfo", ("sm_clock_hz",), _scaled("sm_clock_hz", _SC, 1e6), ("NVML_CLOCK_SM",)),
    Call("nvmlDeviceGetClockInfo", ("mem_clock_hz",), _scaled("mem_clock_hz", _MC, 1e6), ("NVML_CLOCK_MEM",)),
    Call("nvmlDeviceGetPcieThroughput", ("pcie_tx_bytes_per_second",),
         _scaled("pcie_tx_bytes_per_second", _TX, 1e3), ("NVML_PCIE_UTIL_TX_BYTES",)),
    Call("nvmlDeviceGetPcieThroughput", ("pcie_rx_bytes_per_second",),
         _scaled("pcie_rx_bytes_per_second", _RX, 1e3), ("NVML_PCIE_UTIL_RX_BYTES",)),
    Call(_CLOCKS_EVENTS, ("throttle_mask", "throttle_reasons"), _throttle, fallback=_THROTTLE_REASONS),
    Call(_ECC, ("ecc_corrected_total",), _count("ecc_corrected_total", _EC),
         ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC")),
    Call(_ECC, ("ecc_uncorrected_total",), _count("ecc_uncorrected_total", _EU),
         ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC")),
)
# health a GPU answers where it has it (energy: Volta+, row remapping: Ampere+, retired
# pages: Kepler to Turing), read after the processes
HEALTH = (
    Call("nvmlDeviceGetTotalEnergyConsumption", ("energy_joules_total",), _energy),
    Call("nvmlDeviceGetRemappedRows", ("remapped_rows_correctable", "remapped_rows_uncorrectable",
                                       "row_remap_pending", "row_remap_failed"), _remapped),
    Call("nvmlDeviceGetRetiredPages", ("retired_pages_sbe",), _count("retired_pages_sbe", _RP, len), (0,)),
    Call("nvmlDeviceGetRetiredPages", ("retired_pages_dbe",), _count("retired_pages_dbe", _RP + 1, len), (1,)),
    Call("nvmlDeviceGetRetiredPagesPendingStatus", ("retired_pages_pending",), _pending),
)

if ("index", "uuid", "name", *(n for c in FIXED for n in c.names), "processes") != GPU_FIELDS[: AT["processes"] + 1]:
    raise AssertionError("agent/sources/gpu/fields.py FIXED must follow DATA_FIELDS['gpu'] (the row form is positional)")
if GPU_FIELDS[_RR : _RR + 4] != HEALTH[1].names or GPU_FIELDS[_RP : _RP + 3] != (
        "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"):
    raise AssertionError("agent/sources/gpu/fields.py writes the row-remap and retired-page fields in this order")


def procs_text(procs: list[dict[str, Any]]) -> str:
    """The JSON of a processes list as the source builds it (pid, used_bytes, then sm_ratio
    and mem_ratio where sampled, then the Slurm job fields where known), without the generic
    encoder."""
    parts = []
    for p in procs:
        t = f'{{"pid":{p["pid"]}'
        if "used_bytes" in p:
            t += f',"used_bytes":{p["used_bytes"]}'
        if "sm_ratio" in p:
            t += f',"sm_ratio":{_f(p["sm_ratio"])},"mem_ratio":{_f(p["mem_ratio"])}'
        for k in SLURM_FIELDS:
            if k in p:
                t += f',"{k}":{jstr(p[k])}'
        parts.append(t + "}")
    return "[" + ",".join(parts) + "]"
