"""The library's results as JSON and back, for the HTTP API and its client: what the API
sends is standard JSON (no NaN tokens), and what the client rebuilds is equal to what the
library returned, so ``analyze`` prints the same through a collector as locally.

- A table: ``{"columns": [...], "types": [...], "rows": [[...], ...]}``; each column's type
  says how its values are written (``timestamp``/``date``/``time``: ISO 8601; ``decimal``:
  a string; ``float``: a number, or "NaN" / "Infinity" / "-Infinity"; ``interval``:
  [days, seconds, microseconds]; ``bytes``: hex; ``uuid``: a string; ``json``: lists and
  maps, their own times as text), ``mixed`` for a column of several (each value then
  ``{"t": type, "v": value}``).
- Other results are plain JSON objects; a float that is not finite is written
  ``{"$float": "Infinity"}`` (and read back).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import uuid
from typing import Any

from .units import Finding, Recommendation


def json_object(text: str | None) -> dict[str, Any]:
    """A stored JSON object (evidence, labels), or {} for NULL, bad JSON or any other value:
    a hand-made or older row costs only itself."""
    try:
        got = json.loads(text) if text else {}
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def _tag(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, dt.datetime):
        return "timestamp"
    if isinstance(v, dt.date):
        return "date"
    if isinstance(v, dt.time):
        return "time"
    if isinstance(v, dt.timedelta):
        return "interval"
    if isinstance(v, decimal.Decimal):
        return "decimal"
    if isinstance(v, bytes | bytearray | memoryview):
        return "bytes"
    if isinstance(v, uuid.UUID):
        return "uuid"
    if isinstance(v, list | dict | tuple):
        return "json"
    return "text"


def _enc(tag: str, v: Any) -> Any:
    if v is None:
        return None
    if tag in ("timestamp", "date", "time"):
        return v.isoformat()
    if tag == "float":
        return v if math.isfinite(v) else ("NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity"))
    if tag == "interval":
        return [v.days, v.seconds, v.microseconds]
    if tag == "decimal" or tag == "uuid" or tag == "text":
        return str(v)
    if tag == "bytes":
        return bytes(v).hex()
    if tag == "json":
        return json.loads(json.dumps(v, default=str))
    return v


def _dec(tag: str, v: Any) -> Any:
    if v is None:
        return None
    if tag == "timestamp":
        return dt.datetime.fromisoformat(v)
    if tag == "date":
        return dt.date.fromisoformat(v)
    if tag == "time":
        return dt.time.fromisoformat(v)
    if tag == "float":
        return float(v)
    if tag == "interval":
        return dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2])
    if tag == "decimal":
        return decimal.Decimal(v)
    if tag == "bytes":
        return bytes.fromhex(v)
    if tag == "uuid":
        return uuid.UUID(v)
    return v


def table_json(columns: list[str], rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    types: list[str] = []
    for i in range(len(columns)):
        tags = {_tag(r[i]) for r in rows} - {""}
        types.append(tags.pop() if len(tags) == 1 else ("mixed" if tags else "str"))
    out_rows = []
    for r in rows:
        out_rows.append([
            {"t": _tag(v), "v": _enc(_tag(v), v)} if t == "mixed" and v is not None else _enc(t, v)
            for t, v in zip(types, r, strict=True)
        ])
    return {"columns": list(columns), "types": types, "rows": out_rows}


def table_rows(d: dict[str, Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
    types = d["types"]
    rows = []
    for r in d["rows"]:
        rows.append(tuple(
            (_dec(v["t"], v["v"]) if isinstance(v, dict) else v) if t == "mixed" else _dec(t, v)
            for t, v in zip(types, r, strict=True)
        ))
    return list(d["columns"]), rows


def plain(x: Any) -> Any:
    """JSON-safe: tuples as lists, non-finite floats tagged, times as ISO strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return {"$float": _enc("float", x)}
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    if isinstance(x, dt.datetime | dt.date):
        return x.isoformat()
    return x


def unplain(x: Any) -> Any:
    if isinstance(x, dict):
        if set(x) == {"$float"}:
            return float(x["$float"])
        return {k: unplain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [unplain(v) for v in x]
    return x


def finding_json(f: Finding) -> dict[str, Any]:
    """A finding with every field (its confidence unrounded, unlike the documented
    ``Finding.to_json``)."""
    return plain({**f.to_json(), "confidence": f.confidence})


def finding(d: dict[str, Any]) -> Finding:
    d = unplain(d)
    when = {k: None if d.get(k) is None else dt.datetime.fromisoformat(d[k]) for k in ("window_start", "window_end")}
    return Finding(kind=d["kind"], job=d["job"], summary=d["summary"], severity=d["severity"],
                   confidence=d["confidence"], node=d["node"], subject=d["subject"], evidence=d["evidence"],
                   suggests=tuple(d["suggests"]), rank=d["rank"], fit_ids=tuple(d["fit_ids"]), **when)


def recommendation_json(r: Recommendation) -> dict[str, Any]:
    return plain(r.to_json())


def recommendation(d: dict[str, Any]) -> Recommendation:
    d = unplain(d)
    return Recommendation(kind=d["kind"], action=d["action"], predicted=d["predicted"], why=d["why"],
                          interval={k: tuple(v) for k, v in d["interval"].items()}, cost=d["cost"],
                          fit_ids=tuple(d["fit_ids"]), assumptions=d["assumptions"])
