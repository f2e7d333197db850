"""The source interface.

A source has a typed config validated up front (no network or device calls there),
``start()``, ``collect(emit)`` for one tick, and ``close()``.  The I/O is a thin adapter
passed in by the runtime (a seam tests replace); the conversion to event data is pure.

A source that cannot work on this machine (no NVML, no GPU) raises ``SourceUnavailable``
from ``start()`` or ``collect()``: that is a normal state, reported once, retried later.
Any other exception is a failure of that tick only; the other sources carry on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ..config import ConfigError, _bool, _int, _str, parse_duration

Emit = Callable[..., None]  # emit(type, data, ts=None)


class SourceUnavailable(Exception):
    """This source cannot run here (yet); the message says why."""


class Source:
    name: ClassVar[str]
    # key -> (kind, default, help); kinds: bool, int, str, duration, list
    OPTIONS: ClassVar[dict[str, tuple[str, Any, str]]] = {}
    DEFAULT_ENABLED: ClassVar[bool] = True  # off for sources that need configuring first

    def __init__(self, config: Mapping[str, Any], **adapters: Any) -> None:
        self.config = dict(config)

    @classmethod
    def parse_config(cls, where: str, raw: Mapping[str, Any]) -> dict[str, Any]:
        options = {"enabled": ("bool", cls.DEFAULT_ENABLED, "turn the source on or off"), **cls.OPTIONS}
        unknown = sorted(set(raw) - set(options))
        if unknown:
            raise ConfigError(f"unknown key '{where}.{unknown[0]}' (known: {', '.join(sorted(options))})")
        out: dict[str, Any] = {}
        for key, (kind, default, _help) in options.items():
            if key not in raw:
                out[key] = default
                continue
            v, k = raw[key], f"{where}.{key}"
            if kind == "bool":
                out[key] = _bool(k, v)
            elif kind == "int":
                out[key] = _int(k, v, 0, 1 << 31)
            elif kind == "str":
                out[key] = _str(k, v)
            elif kind == "duration":
                out[key] = parse_duration(k, v)
            elif kind == "list":
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    raise ConfigError(f"{k}: expected a list of strings, got {v!r}")
                out[key] = list(v)
            else:  # pragma: no cover
                raise AssertionError(kind)
        return out

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

    def close(self) -> None:
        """Release what start() took."""
