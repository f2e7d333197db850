"""What a fit was fitted on, and whether a prediction goes past it.

Each speed and cluster fit stores the ranges of its inputs (``model["input_ranges"]``: the
smallest and largest FLOPs per step, parameters, tensors, workers, PS; the accelerators and
model architectures it saw). A prediction outside them says so (``extrapolated``, the
reasons, one per input) and its interval is widened: in log space, by one more width per
decade outside the fitted range (an unseen accelerator counts as half a decade). That
widening is a convention, not a derivation: a fit's interval says nothing about where it
has no data, so cmdare makes the interval grow with the distance instead of pretending.
A fit stored before ranges were kept says it cannot tell (``extrapolated``: None).

Past a limit no widening means anything: an input ``ROUGH_FACTOR`` (10) times outside what
was fitted, or an accelerator the fit never saw. There a prediction is a point estimate
given as a rough guide with no 95 % interval, and says why (``rough``): a narrow interval on
a far extrapolation would be a promise the data cannot keep.
"""

from __future__ import annotations

import math
from typing import Any

UNSEEN_ACCELERATOR_DECADES = 0.5
ROUGH_FACTOR = 10.0  # an input this many times outside its fitted range: no interval at all


def ranges_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``rows``: one dict per fitted row, numeric inputs and ``accelerator`` / ``model``."""
    out: dict[str, Any] = {}
    keys = sorted({k for r in rows for k, v in r.items() if isinstance(v, int | float) and not isinstance(v, bool)})
    for k in keys:
        vs = [float(r[k]) for r in rows if isinstance(r.get(k), int | float) and math.isfinite(r[k])]
        if vs:
            out[k] = [min(vs), max(vs)]
    for k in ("accelerator", "model"):
        seen = sorted({str(r[k]) for r in rows if r.get(k)})
        if seen:
            out[k + "s"] = seen
    return out


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def check(fit: dict[str, Any], **inputs: Any) -> tuple[bool | None, list[str], float]:
    """(extrapolated: None when the fit has no stored ranges, the reasons, decades outside)
    for ``inputs``: numeric ones by name; ``accelerator``: a name or a list of them."""
    r = (fit.get("model") or {}).get("input_ranges")
    if not r:
        return None, ["the fit was stored before input ranges were kept: refit to check extrapolation"], 0.0
    reasons: list[str] = []
    decades = 0.0
    for k, v in inputs.items():
        if k in ("accelerator", "model") or v is None or k not in r:
            continue
        lo, hi = r[k]
        x = float(v)
        if x > hi and hi > 0:
            d = math.log10(x / hi)
            reasons.append(f"{k} {_fmt(x)} is {x / hi:.3g}x the largest fitted ({_fmt(hi)})")
        elif x < lo and x > 0:
            d = math.log10(lo / x)
            reasons.append(f"{k} {_fmt(x)} is 1/{lo / x:.3g} of the smallest fitted ({_fmt(lo)})")
        else:
            continue
        decades = max(decades, d)
    acc = inputs.get("accelerator")
    for a in [acc] if isinstance(acc, str) else acc or []:  # one name, or those of a mixed cluster
        if a and r.get("accelerators") and a not in r["accelerators"]:
            reasons.append(f"accelerator {a} not in the fit (fitted on {', '.join(r['accelerators'])})")
            decades = max(decades, UNSEEN_ACCELERATOR_DECADES)
    return bool(reasons), reasons, decades


def widen(value: float, lo: float, hi: float, decades: float) -> tuple[float, float]:
    """The interval [lo, hi] around ``value`` widened in log space by (1 + decades)."""
    if decades <= 0 or value <= 0 or lo <= 0 or not math.isfinite(hi):
        return lo, hi
    k = 1.0 + decades
    return value * (lo / value) ** k, value * (hi / value) ** k


def rough(fit: dict[str, Any], **inputs: Any) -> str | None:
    """Why a prediction for ``inputs`` is only a rough guide (an input ROUGH_FACTOR times or
    more outside its fitted range, or an accelerator never fitted), or None."""
    r = (fit.get("model") or {}).get("input_ranges")
    if not r:
        return None
    why: list[str] = []
    for k, v in inputs.items():
        if k in ("accelerator", "model") or v is None or k not in r:
            continue
        lo, hi = r[k]
        x = float(v)
        if hi > 0 and x >= ROUGH_FACTOR * hi:
            why.append(f"{k} is {x / hi:.3g}x the largest fitted")
        elif x > 0 and lo >= ROUGH_FACTOR * x:
            why.append(f"{k} is 1/{lo / x:.3g} of the smallest fitted")
    acc = inputs.get("accelerator")
    for a in [acc] if isinstance(acc, str) else acc or []:
        if a and r.get("accelerators") and a not in r["accelerators"]:
            why.append(f"accelerator {a} was never fitted")
    if not why:
        return None
    return (f"{'; '.join(why)}: past {ROUGH_FACTOR:g}x outside the fitted inputs (or on an unfitted accelerator) "
            "no interval holds, so none is given")
