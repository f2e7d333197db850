"""Durations and sizes as users write them (``500ms``, ``10s``, ``24h``, ``7d``; ``512MiB``,
``1GB``), for the agent's config, the collector's flags and analyze's ``--since``.

Standard library only (the agent's dependency rule).
"""

from __future__ import annotations

import re
from typing import Any


class ConfigError(ValueError):
    """A configuration problem; str() is a one-line message naming the key."""


SIZE_UNITS = {
    None: 1,
    "b": 1,
    "kb": 10**3,
    "kib": 2**10,
    "mb": 10**6,
    "mib": 2**20,
    "gb": 10**9,
    "gib": 2**30,
    "tb": 10**12,
    "tib": 2**40,
}
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
CONFIG_DURATION_UNITS = ("ms", "s", "m", "h", "d")  # what config keys and collector flags take
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|kib|mb|mib|gb|gib|tb|tib)?\s*$", re.I)
_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)?\s*$")


def duration_seconds(text: str, units: tuple[str, ...] = CONFIG_DURATION_UNITS, bare: bool = True) -> float | None:
    """Seconds in a duration text such as ``10s``, or None when it is not one; ``units``:
    the unit suffixes allowed, ``bare``: whether a number without a unit (seconds) is."""
    m = _DUR.match(text)
    if not m or (m.group(2) is None and not bare) or (m.group(2) is not None and m.group(2) not in units):
        return None
    return float(m.group(1)) * (DURATION_UNITS[m.group(2)] if m.group(2) else 1.0)


def parse_size(key: str, v: Any) -> int:
    """A size in bytes from an int or a text like ``512MiB``; ConfigError naming ``key``."""
    if isinstance(v, bool):
        raise ConfigError(f"{key}: expected a size like 512MiB, got {v!r}")
    if isinstance(v, int):
        if v < 0:
            raise ConfigError(f"{key}: size must not be negative, got {v}")
        return v
    m = _SIZE.match(str(v))
    if not m:
        raise ConfigError(f"{key}: expected a size like 512MiB or 1GB, got {v!r}")
    return int(float(m.group(1)) * SIZE_UNITS[(m.group(2) or "").lower() or None])


def parse_duration(key: str, v: Any) -> float:
    """Seconds from a number or a text like ``10s``; ConfigError naming ``key``."""
    if isinstance(v, bool):
        raise ConfigError(f"{key}: expected a duration like 10s, got {v!r}")
    if isinstance(v, (int, float)):
        if v < 0:
            raise ConfigError(f"{key}: duration must not be negative, got {v}")
        return float(v)
    seconds = duration_seconds(str(v))
    if seconds is None:
        raise ConfigError(f"{key}: expected a duration like 500ms, 10s, 5m or 24h, got {v!r}")
    return seconds
