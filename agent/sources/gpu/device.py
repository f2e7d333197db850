"""What the source keeps per GPU (a MIG instance is a GPU of its own) across ticks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cmdare.wire.rowform import row_str

from .fields import GPU_FIELDS


@dataclass
class Gpu:
    index: int
    handle: Any
    uuid: str
    name: str
    lost: bool = False
    parent: Gpu | None = None  # a MIG instance's GPU
    mig: dict[str, Any] = field(default_factory=dict)  # parent_index, mig_profile, ... (fields as sent)
    plan: list[Any] | None = None  # the calls of a sample, resolved (source.Step), made at the first tick
    absent: set[str] = field(default_factory=set)  # NVML functions this GPU does not answer: not asked again
    said: set[tuple[str, Any]] = field(default_factory=set)  # (function, code) errors already logged
    ecc_prev: dict[str, int] = field(default_factory=dict)
    remap_prev: dict[str, bool] = field(default_factory=dict)
    gpm: Any = None  # the c_nvmlGpmMetricsGet_t request (metric ids set once), None: no GPM
    gpm_samples: list[Any] = field(default_factory=list)  # two samples, used in turn
    gpm_turn: int = -1  # which sample the last tick took (-1: none yet)
    gpm_view: Any = None  # the request's metrics as plain ctypes structs (gpm.metrics_view)
    links: list[int] = field(default_factory=list)  # NVLinks active at start
    proc_ts: int = 0  # newest process-utilisation sample seen (NVML's microseconds)
    pod: Any = None  # the Kubernetes pod holding it at the last sample (kubelet.Pod), None: none known
    slurm_job: str | None = None  # the Slurm job holding it at the last sample (its id), None: none known

    def __post_init__(self) -> None:
        self.blank = [""] * len(GPU_FIELDS)  # the row with this GPU's identity, every other field absent
        self.blank[:3] = (str(self.index), row_str(self.uuid), row_str(self.name))
