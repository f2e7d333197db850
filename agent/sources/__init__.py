"""Agent sources, registered by name (``@SOURCES.register``): every module (or package) of
this folder is loaded, so a new source is one new file. The name is also the module name
and the ``[sources.<name>]`` config table; the contract is cmdare.wire.plugin's."""

from __future__ import annotations

from cmdare.wire.plugin import load_units

from .base import SOURCES, Source, SourceUnavailable

load_units(__name__, __path__)
SOURCES.order(("host", "gpu", "heartbeat", "tpu", "train", "tensorboard", "cloud"))  # the runtime starts them so
REGISTRY = SOURCES

__all__ = ["REGISTRY", "SOURCES", "Source", "SourceUnavailable"]
