"""Agent sources, registered by name.  The name is also the module name and the
``[sources.<name>]`` config table."""

from __future__ import annotations

from .base import Source, SourceUnavailable
from .cloud import CloudSource
from .gpu import GpuSource
from .heartbeat import HeartbeatSource
from .host import HostSource
from .tensorboard import TensorBoardSource
from .tpu import TpuSource
from .train import TrainSource

REGISTRY: dict[str, type[Source]] = {
    HostSource.name: HostSource,
    GpuSource.name: GpuSource,
    HeartbeatSource.name: HeartbeatSource,
    TpuSource.name: TpuSource,
    TrainSource.name: TrainSource,
    TensorBoardSource.name: TensorBoardSource,
    CloudSource.name: CloudSource,
}

__all__ = ["REGISTRY", "Source", "SourceUnavailable"]
