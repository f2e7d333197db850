"""Heartbeat source: one event per tick with a contiguous sequence number, the agent's
version and uptime, and its own counters (samples, events, spooled, shipped, dropped).

The collector checks liveness and gaps from these; ``instance`` tells agent restarts
apart (the sequence starts again at 1 for each instance).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import SOURCES, Emit, Source


@SOURCES.register
class HeartbeatSource(Source):
    """One heartbeat per tick: a contiguous sequence and the agent's own counters."""

    name = "heartbeat"

    def __init__(
        self, config: dict[str, Any], stats: Callable[[], dict[str, Any]] | None = None, **_: Any
    ) -> None:
        super().__init__(config)
        self.stats = stats or (lambda: {})
        self.seq = 0

    def collect(self, emit: Emit) -> None:
        self.seq += 1
        emit("heartbeat", {"seq": self.seq, **self.stats()})
