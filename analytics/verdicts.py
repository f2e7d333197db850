"""Verdict rules, each defined once as data, with its SQL and its Python rendered from it:
queries, detectors and recommendations all call these, never restate the thresholds.

- input-bound classes: the TensorFlow profiler's input-pipeline verdict from the share of
  step time spent waiting for input (under 5 % not input-bound, 5-20 % moderately, 20 % or
  more highly)
- throttled: a GPU sample whose NVML clocks-event mask has any reason but ``gpu_idle``
  (an idle GPU lowering its clocks is not throttling)

(The revoked / stopped / lost verdict on a VM's life is one SQL macro, collector/schema/views/
instance_lives.sql.)
"""

from __future__ import annotations

# (upper bound of the input-wait share, exclusive, or None for the rest; class)
INPUT_BOUND_CLASSES: tuple[tuple[float | None, str], ...] = (
    (0.05, "not input-bound"),
    (0.20, "moderately input-bound"),
    (None, "highly input-bound"),
)
GPU_IDLE_BIT = 0x1  # NVML clocksEventReasonGpuIdle (cmdare.wire.events.THROTTLE_BITS)


def input_bound_class(share: float | None) -> str | None:
    """The input-bound class of an input-wait share (0..1); None without one."""
    if share is None:
        return None
    for upper, name in INPUT_BOUND_CLASSES:
        if upper is None or share < upper:
            return name
    raise AssertionError("INPUT_BOUND_CLASSES must end with a class for the rest")


def input_bound_sql(share: str) -> str:
    """The same verdict as a SQL CASE over the expression ``share``."""
    whens = " ".join(
        f"WHEN {share} < {upper} THEN '{name}'" for upper, name in INPUT_BOUND_CLASSES if upper is not None
    )
    return f"CASE WHEN {share} IS NULL THEN NULL {whens} ELSE '{INPUT_BOUND_CLASSES[-1][1]}' END"


def throttled(mask: int | None) -> bool | None:
    """Whether a clocks-event mask means throttled; None without a mask."""
    return None if mask is None else mask & ~GPU_IDLE_BIT != 0


def throttled_sql(mask: str) -> str:
    """The same as a SQL boolean over the expression ``mask`` (NULL without one)."""
    return f"({mask} & ~{GPU_IDLE_BIT} <> 0)"
