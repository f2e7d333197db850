"""The source interface.

A source has a typed config validated up front (no network or device calls there),
``start()``, ``collect(emit)`` for one tick, and ``close()``.  The I/O is a thin adapter
passed in by the runtime (a seam tests replace); the conversion to event data is pure.

A source that cannot work on this machine (no NVML, no GPU) raises ``SourceUnavailable``
from ``start()`` or ``collect()``: that is a normal state, reported once, retried later.
Any other exception is a failure of that tick only; the other sources carry on.

A source is a pluggable unit (cmdare.wire.plugin): registered by name with
``@SOURCES.register``, typed ``OPTIONS``, a ``## name`` heading in docs/sources.md, a
``[sources.name]`` table in agent.sample.toml and tests/agent/test_<name>.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from cmdare.wire.plugin import Option, Registry, Unit

Emit = Callable[..., None]  # emit(type, data, ts=None)


class SourceUnavailable(Exception):
    """This source cannot run here (yet); the message says why."""


SOURCES: Registry[type[Source]] = Registry("source")  # filled by @SOURCES.register in each module


class Source(Unit):
    """Base of agent sources: a ``Unit`` (cmdare.wire.plugin) with an ``enabled`` option."""

    name: ClassVar[str]
    DEFAULT_ENABLED: ClassVar[bool] = True  # off for sources that need configuring first

    def __init__(self, config: Mapping[str, Any], **adapters: Any) -> None:
        self.config = dict(config)

    @classmethod
    def options(cls) -> dict[str, Option]:
        return {"enabled": Option("bool", cls.DEFAULT_ENABLED, "turn the source on or off"), **cls.OPTIONS}

    @classmethod
    def parse_config(cls, where: str, raw: Mapping[str, Any]) -> dict[str, Any]:
        """``parse_options``, then what a source checks beyond one option at a time."""
        return cls.parse_options(where, raw)

    def start(self) -> None:
        """Open devices / take a first reading.  Raise SourceUnavailable if it cannot run here."""

    def collect(self, emit: Emit) -> None:
        raise NotImplementedError

    def collect_urgent(self, emit: Emit) -> None:
        """Emit what must not wait for the next tick (a job declaration, a checkpoint, a
        revocation notice).  A source that has such events calls the ``wake`` callable the
        runtime passes to its constructor; the runtime then calls this at once, between
        ticks, and flushes."""

    def settle(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until what ``start()`` began in the background has a
        first result; ``--check`` and ``--once`` call it before their one collect."""

    def check(self) -> str:
        """``cmdare-agent --check``: whether the source can run here, without changing the
        machine (no directories or files created): by default one start, settle and
        collect; what it got.  SourceUnavailable when it cannot run."""
        import time

        t0 = time.perf_counter()
        self.start()
        self.settle(5.0)
        got: list[str] = []
        self.collect(lambda t, d, ts=None, got=got, **_: got.append(t))
        return f"{len(got)} events in {(time.perf_counter() - t0) * 1000:.1f} ms"

    def close(self) -> None:
        """Release what start() took."""
