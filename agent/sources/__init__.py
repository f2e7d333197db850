"""Agent sources, registered by name (``@SOURCES.register``).  The name is also the module
name and the ``[sources.<name>]`` config table; the contract is cmdare.wire.plugin's."""

from __future__ import annotations

from . import cloud, gpu, heartbeat, host, tensorboard, tpu, train  # noqa: F401  (they register)
from .base import SOURCES, Source, SourceUnavailable

SOURCES.order(("host", "gpu", "heartbeat", "tpu", "train", "tensorboard", "cloud"))  # the runtime starts them so
REGISTRY = SOURCES

__all__ = ["REGISTRY", "SOURCES", "Source", "SourceUnavailable"]
