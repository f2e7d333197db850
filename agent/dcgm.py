"""dcgm-exporter's names for the agent's GPU samples (``[prometheus] names = "dcgm"``), so
NVIDIA's Grafana dashboard and alert rules written for dcgm-exporter read cmdare's agent.

Each metric of dcgm-exporter's default counter list (``default-counters.csv``) that the
agent's NVML sampling gives is served under its DCGM name, Prometheus type, help text and
unit: clocks in MHz, memory in MiB, energy in mJ, utilisation in %, the profiling
(``DCGM_FI_PROF_*``) activities as ratios 0..1, PCIe throughput in bytes/s. The labels are
dcgm-exporter's: ``gpu`` (the NVML index; a MIG instance's parent), ``UUID``, ``device``
(``nvidia<gpu>``), ``modelName``, ``Hostname`` (the agent's node name), and for a MIG
instance ``GPU_I_PROFILE`` and ``GPU_I_ID``; ``pod``, ``namespace`` and ``container`` of the
Kubernetes pod holding the GPU (the kubelet's pod-resources API, as dcgm-exporter maps them)
and ``hpc_job``, the Slurm job holding it (dcgm-exporter's HPC job mapping), empty where
none; the agent's own labels (``node``, ``role``, ``job``, ``[labels]``) come too.

Left out, because the agent does not sample them (docs/agent.md#dcgm-exporter-names):
``DCGM_FI_DEV_MEMORY_TEMP`` (an NVML field value), ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``,
``DCGM_FI_DEV_ENC_UTIL`` / ``DEC_UTIL``, ``DCGM_FI_DEV_FB_RESERVED`` (the v2 memory info),
``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` (a counter: the agent samples NVLink throughput),
``DCGM_FI_DEV_VGPU_LICENSE_STATUS`` (vGPU hosts) and the ``DCGM_FI_DRIVER_VERSION`` label.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MIB = 1048576.0
LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "GPU_I_PROFILE", "GPU_I_ID", "pod", "namespace", "container",
          "hpc_job")


@dataclass(frozen=True)
class Counter:
    """One dcgm-exporter metric: its name, Prometheus type, help (as the CSV has it) and
    its value from one GPU sample (None: not in this sample)."""

    name: str
    kind: str  # gauge | counter
    help: str
    value: Callable[[dict[str, Any]], float | None]


def _f(field: str, scale: float = 1.0) -> Callable[[dict[str, Any]], float | None]:
    def get(d: dict[str, Any]) -> float | None:
        v = d.get(field)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        return float(v) * scale
    return get


def _free(d: dict[str, Any]) -> float | None:
    used, total = d.get("mem_used_bytes"), d.get("mem_total_bytes")
    if not isinstance(used, int) or not isinstance(total, int) or isinstance(used, bool) or isinstance(total, bool):
        return None
    return max(0, total - used) / MIB


def _flag(field: str) -> Callable[[dict[str, Any]], float | None]:
    def get(d: dict[str, Any]) -> float | None:
        v = d.get(field)
        return None if not isinstance(v, bool) else float(v)
    return get


COUNTERS = (
    Counter("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", _f("sm_clock_hz", 1e-6)),
    Counter("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", _f("mem_clock_hz", 1e-6)),
    Counter("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", _f("temp_celsius")),
    Counter("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", _f("power_watts")),
    Counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).",
            _f("energy_joules_total", 1000.0)),
    Counter("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", _f("util_gpu_ratio", 100.0)),
    Counter("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", _f("util_mem_ratio", 100.0)),
    Counter("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _free),
    Counter("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", _f("mem_used_bytes", 1 / MIB)),
    Counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors",
            _f("remapped_rows_uncorrectable")),
    Counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors",
            _f("remapped_rows_correctable")),
    Counter("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", _flag("row_remap_failed")),
    Counter("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
            _f("gr_engine_active_ratio")),
    Counter("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
            _f("tensor_active_ratio")),
    Counter("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
            "Ratio of cycles the device memory interface is active sending or receiving data.", _f("dram_active_ratio")),
    Counter("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including both "
            "protocol headers and data payloads - in bytes per second.", _f("pcie_tx_bytes_per_second")),
    Counter("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including both "
            "protocol headers and data payloads - in bytes per second.", _f("pcie_rx_bytes_per_second")),
)
XID = Counter("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", lambda d: None)
LEFT_OUT = ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
            "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
            "DCGM_FI_DRIVER_VERSION")


def labels(d: dict[str, Any], hostname: str) -> tuple[str, ...] | None:
    """A GPU sample's dcgm-exporter label values (``LABELS``), or None without an index."""
    index = d.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        return None
    parent = d.get("parent_index")
    gpu = parent if isinstance(parent, int) and not isinstance(parent, bool) else index
    mig = isinstance(parent, int) and not isinstance(parent, bool)
    gi = d.get("gpu_instance_id")
    return (str(gpu), str(d.get("uuid") or ""), f"nvidia{gpu}", str(d.get("name") or ""), hostname,
            str(d.get("mig_profile") or "") if mig else "", str(gi) if mig and gi is not None else "",
            str(d.get("pod") or ""), str(d.get("namespace") or ""), str(d.get("container") or ""),
            str(d.get("slurm_job") or ""))
