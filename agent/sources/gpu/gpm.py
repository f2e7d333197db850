"""Profiling activity through NVML's GPM API (Hopper and later): two samples per GPU kept
across ticks, each tick one sample taken and the metrics of the interval between the two
read (SM / tensor / DRAM activity, NVLink throughput in all and per link)."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from .fields import AT

log = logging.getLogger("cmdare.agent.gpu")

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
_PLACES = [(name, AT[name], scale) for name, _, scale in GPM_METRICS]


class _Metric(ctypes.Structure):
    """nvml.h's nvmlGpmMetric_t, as a plain ctypes struct: nvidia-ml-py's own class hooks
    every field read (``__getattribute__``), a third of the GPM read's cost."""

    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_double),
                ("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p), ("unit", ctypes.c_char_p)]


def metrics_view(req: Any) -> Any:
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


def setup(n: Any, g: Any, links: list[int]) -> None:
    """Two samples and the request (the metric ids set once) for ``g``; nothing where the
    binding has no GPM API or cannot allocate."""
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
    g.gpm_view = metrics_view(req)


def free(n: Any, g: Any) -> None:
    for smp in g.gpm_samples:
        try:
            n.nvmlGpmSampleFree(smp)
        except Exception:
            pass
    g.gpm, g.gpm_samples = None, []


def read(src: Any, g: Any, d: dict[str, Any], t: list[str]) -> dict[int, list[float]]:
    """Take this tick's sample; with the last tick's, the metrics of the interval into
    ``d`` / ``t``. Returns the per-link throughput (link -> [rx, tx] bytes/s)."""
    n = src.nvml
    rates: dict[int, list[float]] = {}
    turn = 1 - g.gpm_turn if g.gpm_turn >= 0 else 0
    smp = g.gpm_samples[turn]
    if g.parent is not None:
        ok = src.call(g, "nvmlGpmMigSampleGet", g.mig.get("gpu_instance_id", 0), smp, handle=g.parent.handle)
    else:
        ok = src.call(g, "nvmlGpmSampleGet", smp)
    if ok is None:
        g.gpm_turn = -1
        return rates
    if g.gpm_turn >= 0:
        req = g.gpm
        req.sample1, req.sample2 = g.gpm_samples[g.gpm_turn], smp
        try:
            n.nvmlGpmMetricsGet(req)
        except n.NVMLError as e:
            log.debug("GPU %d: nvmlGpmMetricsGet: %s", g.index, e)
        else:
            m = g.gpm_view  # the request's metrics without the binding's per-field hooks
            for i, (name, at, scale) in enumerate(_PLACES):
                x = m[i]
                v = x.value
                if x.nvmlReturn == 0 and v >= 0 and v - v == 0.0:  # finite, not negative (a NaN fails both)
                    v *= scale
                    if scale == 0.01 and v > 1.0:
                        v = 1.0
                    d[name] = v
                    t[at] = float.__repr__(v)
            for i in range(len(GPM_METRICS), req.numMetrics, 2):
                x, y = m[i], m[i + 1]
                rx, tx = x.value, y.value
                if x.nvmlReturn == 0 and y.nvmlReturn == 0 and rx >= 0 and tx >= 0 and rx - rx == tx - tx == 0.0:
                    rates[(x.metricId - GPM_LINK_RX0) // 2] = [x.value * MIB, y.value * MIB]
    g.gpm_turn = turn
    return rates
