"""The row form: a high-volume sample as one tab-separated line instead of a JSON object.

    r1<TAB>type<TAB>id<TAB>ts<TAB>node<TAB>role<TAB>job<TAB>labels<TAB>field1<TAB>field2...

The data fields in the registry's order (new fields are only ever appended), an empty
field meaning absent; trailing absent fields are left off.  Same event, same validation,
same tables: only the encoding differs, and it costs the collector a fifth of the JSON
form to parse (no keys, no nesting).  Documented in docs/wire-format.md ("Row form").
The collector reads row lines in SQL (cmdare.collector.ingest.row_sql); ``decode_row``
is the reference reader for other consumers and the tests.

Standard library only (the agent's dependency rule).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from .registry import (
    BOOL,
    DATA_FIELDS,
    FLOAT,
    INT,
    JSON_ENCODER,
    ROW_ENVELOPE,
    ROW_PREFIX,
    ROW_TYPES,
    STR,
    VERSION,
)
from .validation import InvalidEvent, kind_ok, reason

__all__ = ["ROW_ENVELOPE", "ROW_PREFIX", "ROW_START", "ROW_TYPES", "decode_row", "encode_row_data", "row_field", "row_str"]

_INT_TEXT = re.compile(r"-?(0|[1-9][0-9]*)")
ROW_START = re.compile(r"r[0-9]+\t")  # a row line; anything else is read as JSON

class Encoded(dict):
    """Event data that also carries its encoded text, made by the source that built it (the
    hot path: a GPU sample formatted from a template costs a fraction of the generic
    encoders).  ``text``, when set, must equal the compact JSON encoding of the dict,
    ``row``, when set, ``encode_row_data`` of it, and each of ``parts`` (field -> text) the
    compact JSON of that field, byte for byte; tests check every producer."""

    __slots__ = ("text", "row", "parts")

    def __init__(
        self,
        data: dict[str, Any],
        text: str | None = None,
        row: str | None = None,
        parts: dict[str, str] | None = None,
    ) -> None:
        super().__init__(data)
        self.text, self.row = text, row
        self.parts = parts  # field -> its compact JSON, for the row encoder to use as is


def row_str(s: str) -> str:
    """A string field: as is, or as a JSON string literal when it is empty, starts with a
    quote or holds a tab, line break or other character that is not printable."""
    if s and s[0] != '"' and s.isprintable():
        return s
    return JSON_ENCODER.encode(s)


def row_field(kind: str, v: Any) -> str:
    if v is None:
        return ""
    if kind == STR:
        return row_str(v)
    t = type(v)
    if t is int:  # what the JSON encoder writes for an int (and a float's repr when finite),
        return int.__repr__(v)  # without its call chain: most host fields are numbers
    if t is float and v - v == 0.0:  # finite (inf - inf and nan - nan are nan)
        return float.__repr__(v)
    if kind == BOOL:
        return "true" if v else "false"
    if kind in (FLOAT, INT):
        return JSON_ENCODER.encode(v)  # int -> digits, float -> repr; NaN / Infinity refused
    return JSON_ENCODER.encode(v)  # the list kinds: compact JSON (never a raw tab or newline)


def encode_row_data(type_: str, data: Mapping[str, Any]) -> str | None:
    """The data fields of a row line, or None when ``data`` holds a field the type does not
    declare (only the JSON form can carry it)."""
    spec = DATA_FIELDS[type_]
    if not data.keys() <= spec.keys():
        return None
    parts = data.parts if type(data) is Encoded else None
    if parts:
        return "\t".join(
            parts[n] if n in parts else row_field(k, data.get(n)) for n, (k, _) in spec.items()
        ).rstrip("\t")
    return "\t".join(row_field(k, data.get(n)) for n, (k, _) in spec.items()).rstrip("\t")


def _row_value(type_: str, name: str, kind: str, x: str) -> Any:
    """Decode one row field (``x`` non-empty); InvalidEvent naming the field otherwise."""
    try:
        if kind == FLOAT:
            f = float(x)
            if math.isfinite(f):
                return f
        elif kind == INT:
            if _INT_TEXT.fullmatch(x) and -(2**63) <= int(x) < 2**63:
                return int(x)
        elif kind == STR:
            v = json.loads(x) if x[0] == '"' else x
            if type(v) is str:
                return v
        elif kind == BOOL:
            if x in ("true", "false"):
                return x == "true"
        else:
            v = json.loads(x)
            if kind_ok(kind, v):
                return v
    except ValueError:
        pass
    raise InvalidEvent(reason("field", type=type_, field=name, kind=kind, got=x[:60]))


def decode_row(line: str) -> dict[str, Any]:
    """A row line as the event dict it stands for (not yet validated)."""
    parts = line.rstrip("\n").split("\t")
    if parts[0] != ROW_PREFIX:
        raise InvalidEvent(reason("row_format", got=repr(parts[0][:20])))
    if len(parts) < 1 + len(ROW_ENVELOPE):
        raise InvalidEvent(reason("row_short", got=len(parts)))
    type_, id_, ts, node, role, job, labels = parts[1:8]
    ev: dict[str, Any] = {"v": VERSION}
    for key, x in (("type", type_), ("id", id_), ("node", node), ("role", role), ("job", job)):
        ev[key] = _row_value("row", key, STR, x) if x else ""
    try:
        ev["ts"] = float(ts)
    except ValueError:
        ev["ts"] = ts  # validate() says what is wrong with it
    try:
        ev["labels"] = json.loads(labels) if labels else {}
    except ValueError:
        raise InvalidEvent(reason("labels")) from None
    spec = DATA_FIELDS.get(ev["type"])
    values = parts[8:]
    if spec is None:
        raise InvalidEvent(reason("row_type", got=repr(ev["type"][:60])))
    if len(values) > len(spec):
        raise InvalidEvent(reason("row_long", type=ev["type"], got=len(values), known=len(spec)))
    ev["data"] = {
        name: _row_value(ev["type"], name, kind, x)
        for (name, (kind, _)), x in zip(spec.items(), values, strict=False)
        if x
    }
    return ev




