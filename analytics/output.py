"""Rendering results: aligned text tables for people, JSON for programs."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:g}" if abs(v) < 1e15 else f"{v:.6g}"
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat(sep=" ") if isinstance(v, dt.datetime) else v.isoformat()
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=str)
    return str(v)


def table(columns: list[str], rows: list[tuple[Any, ...]], max_width: int | None = None) -> str:
    """Aligned columns; ``max_width``: the widest text columns are cut (cells end in "~")
    until a line fits, none narrower than 12 characters or its heading."""
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    if max_width is not None:
        floor = [max(12, len(c)) for c in columns]
        while sum(widths) + 2 * (len(widths) - 1) > max_width:
            i = max(range(len(widths)), key=lambda k: widths[k] - floor[k])
            excess = sum(widths) + 2 * (len(widths) - 1) - max_width
            cut = max(floor[i], widths[i] - excess)
            if cut >= widths[i]:
                break  # nothing left to cut
            widths[i] = cut
            for r in cells:
                if len(r[i]) > cut:
                    r[i] = r[i][: cut - 1] + "~"
    numeric = [
        all(isinstance(r[i], (int, float, decimal.Decimal)) or r[i] is None for r in rows) and rows
        for i in range(len(columns))
    ]

    def fmt(vals: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric, strict=True)
        ).rstrip()

    lines = [fmt(columns), fmt(["-" * w for w in widths])]
    lines += [fmt(r) for r in cells]
    return "\n".join(lines)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, bytes):
        return v.hex()
    return v


def as_json(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    return json.dumps([{c: _jsonable(v) for c, v in zip(columns, r, strict=True)} for r in rows], default=str)


def one_line(s: str, n: int = 500) -> str:
    """``s`` on one line, at most ``n`` characters (errors quote no more)."""
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 3] + "..."
