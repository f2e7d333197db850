"""Column blocks: how the shipper packs row-form samples into a Kafka message.

The spool holds lines (the wire format's JSON and row forms).  When it ships to Kafka, the
agent can turn the row lines of one message (host / gpu / tpu samples) into binary columns:
the collector then loads them without parsing a number from text, which is most of what a
sample costs it.  It is a transport encoding, like compression: the same events, the same
validation, the same tables (docs/wire-format.md, "Column blocks").

    message := MAGIC  u32 header_length  header (JSON, padded with spaces)  body
    header  := {"text": T, "blocks": [{"type", "rows", "node", "role", "job", "labels",
                                       "columns": [[name, has_mask], ...]}, ...]}
    body    := T bytes of text lines (events in the line forms, newline-terminated), zero
               bytes up to a multiple of 8, then, per block and column in header order, each part starting at a
               multiple of 8 bytes of the body: a presence mask (rows bytes, 1 = present)
               when has_mask, then the values:
                 float: rows x float64 LE; int: rows x int64 LE; bool: rows x u8;
                 id, str and the list kinds (their JSON text): (rows + 1) x u32 LE
                 offsets into the UTF-8 bytes that follow.

``columns`` starts with ``id`` and ``ts`` (never masked); the data fields follow by name.
A row line the encoder cannot carry exactly (a value not in the form the agent writes) stays
a text line in the same message, for the collector to judge: the encoder never changes what
the collector would have stored from the text.

Standard library only (the agent's dependency rule).
"""

from __future__ import annotations

import json
import math
import re
import struct
from array import array
from itertools import accumulate
from typing import Any

from .events import BOOL, DATA_FIELDS, FLOAT, INT, ROW_PREFIX, ROW_TYPES, STR

MAGIC = b"\x00cmdare-columns-1\n"
_HEAD = struct.Struct("<I")
_ROW_HEAD = ROW_PREFIX.encode() + b"\t"
_NENV = 8  # prefix, type, id, ts, node, role, job, labels
_TYPES = {t.encode(): t for t in ROW_TYPES}

# the texts the agent writes (``events.row_field``): anything else travels as text
_FLOAT = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_INT = rb"-?(?:0|[1-9][0-9]*)"
_BOOL = rb"true|false"
_COL = {
    k: re.compile(rb"(?:%s)?(?:\t(?:%s)?)*" % (p, p))
    for k, p in ((FLOAT, _FLOAT), (INT, _INT), (BOOL, _BOOL))
}
_ONE = {k: re.compile(p) for k, p in ((FLOAT, _FLOAT), (INT, _INT), (BOOL, _BOOL))}


class _Bad(Exception):
    """Rows (indexes) of a group that cannot be carried as columns."""

    def __init__(self, rows: set[int]) -> None:
        self.rows = rows


def _text(x: bytes) -> bytes:
    """A row-form string field as UTF-8 bytes (JSON literal when it starts with a quote)."""
    if x[:1] != b'"':
        return x
    v = json.loads(x)
    if type(v) is not str:
        raise ValueError("not a string")
    return v.encode("utf-8")


def _pad(out: bytearray) -> None:
    out += b"\0" * (-len(out) % 8)


def _strings(out: bytearray, values: list[bytes]) -> None:
    out += array("I", [0, *accumulate(map(len, values))]).tobytes()
    out += b"".join(values)


def _column(kind: str, col: tuple[bytes, ...], masked: bool) -> tuple[bytes | None, bytes]:
    """(presence mask or None, values) of one column; _Bad naming the rows it cannot carry."""
    mask = bytes(1 if x else 0 for x in col) if masked else None
    if kind in (FLOAT, INT, BOOL):
        if not _COL[kind].fullmatch(b"\t".join(col)):
            raise _Bad({i for i, x in enumerate(col) if x and not _ONE[kind].fullmatch(x)})
        if kind == BOOL:
            return mask, bytes(1 if x == b"true" else 0 for x in col)
        if kind == FLOAT:
            vals = list(map(float, col)) if mask is None else [float(x) if x else 0.0 for x in col]
            if not math.isfinite(sum(vals)):  # overflow to inf (or a sum that overflows)
                bad = {i for i, v in enumerate(vals) if not math.isfinite(v)}
                if bad:
                    raise _Bad(bad)
            return mask, array("d", vals).tobytes()
        ints = list(map(int, col)) if mask is None else [int(x) if x else 0 for x in col]
        try:
            return mask, array("q", ints).tobytes()
        except OverflowError:
            raise _Bad({i for i, v in enumerate(ints) if not -(2**63) <= v < 2**63}) from None
    # strings: the str kind decoded from the row form; list kinds keep their JSON text
    if kind == STR and any(x[:1] == b'"' for x in col):
        vals, bad = [], set()
        for i, x in enumerate(col):
            try:
                vals.append(_text(x))
            except ValueError:  # json, UnicodeEncodeError (a lone surrogate): not carried
                bad.add(i)
        if bad:
            raise _Bad(bad)
    else:
        vals = list(col)
    out = bytearray()
    _strings(out, vals)
    return mask, bytes(out)


def _block(type_: str, env: tuple[bytes, ...], rows: list[list[bytes]]) -> tuple[dict[str, Any], bytes]:
    """Header entry and body of one block; _Bad when some rows cannot be carried."""
    node, role, job, labels = env
    spec = list(DATA_FIELDS[type_].items())
    width = max(map(len, rows))
    if width > _NENV + len(spec):
        raise _Bad({i for i, r in enumerate(rows) if len(r) > _NENV + len(spec)})
    if any(len(r) < width for r in rows):
        rows = [r + [b""] * (width - len(r)) for r in rows]
    cols = list(zip(*rows, strict=True))
    ids, ts = cols[2], cols[3]
    if any(not x for x in ts):
        raise _Bad({i for i, x in enumerate(ts) if not x})
    body = bytearray()
    columns: list[list[Any]] = []
    parts = [("id", STR, ids, False), ("ts", FLOAT, ts, False)]
    parts += [
        (name, kind, cols[_NENV + i], b"" in cols[_NENV + i])
        for i, (name, (kind, _)) in enumerate(spec[: width - _NENV])
    ]
    for name, kind, col, masked in parts:
        mask, values = _column(kind, col, masked)  # (an empty id is an empty string: not masked)
        columns.append([name, 1 if mask is not None else 0])
        if mask is not None:
            body += mask
            _pad(body)
        body += values
        _pad(body)
    head = {
        "type": type_,
        "rows": len(rows),
        "node": _text(node).decode(),
        "role": role.decode(),
        "job": _text(job).decode() if job else "",
        "labels": labels.decode(),
        "columns": columns,
    }
    return head, bytes(body)


def encode(data: bytes) -> bytes:
    """One message's worth of spooled lines (newline-terminated) as a column-block message;
    ``data`` unchanged when none of its lines is a row the agent sends as columns."""
    if _ROW_HEAD not in data[:3] and b"\n" + _ROW_HEAD not in data:
        return data
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return data  # the collector dead-letters it whole, as it would the text
    text: list[bytes] = []
    groups: dict[tuple[bytes, ...], list[list[bytes]]] = {}
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    for line in lines:
        if line[:3] == _ROW_HEAD:
            parts = line.split(b"\t")
            if len(parts) >= _NENV and parts[1] in _TYPES:
                groups.setdefault((parts[1], *parts[4:8]), []).append(parts)
                continue
        text.append(line)
    heads, bodies = [], []
    for (tb, *env), rows in groups.items():
        type_ = _TYPES[tb]
        while rows:
            try:
                head, body = _block(type_, tuple(env), rows)
            except _Bad as e:
                text += [b"\t".join(rows[i]) for i in sorted(e.rows)]
                rows = [r for i, r in enumerate(rows) if i not in e.rows]
                continue
            except (ValueError, UnicodeError):  # the envelope itself (node, job)
                text += [b"\t".join(r) for r in rows]
                break
            heads.append(head)
            bodies.append(body)
            break
    if not heads:
        return data
    tpart = b"".join(x + b"\n" for x in text)
    header = json.dumps({"text": len(tpart), "blocks": heads}, separators=(",", ":")).encode()
    header += b" " * (-(len(MAGIC) + _HEAD.size + len(header)) % 8)
    tpart += b"\0" * (-len(tpart) % 8)
    return b"".join([MAGIC, _HEAD.pack(len(header)), header, tpart, *bodies])


def decode(value: bytes) -> list[dict[str, Any]]:
    """The events of one Kafka message value, column blocks or lines, as validated event
    dicts (``events.InvalidEvent`` on the first problem).  For consumers of the topic other
    than the collector (which reads blocks through Arrow, without making dicts)."""
    from .events import VERSION, InvalidEvent, decode_line, validate

    if value[: len(MAGIC)] != MAGIC:
        return [decode_line(x) for x in value.split(b"\n") if x]
    try:
        start = len(MAGIC) + _HEAD.size
        (hlen,) = _HEAD.unpack_from(value, len(MAGIC))
        head = json.loads(value[start : start + hlen])
        pos = start + hlen
        text = value[pos : pos + head["text"]]
        pos += head["text"] + (-head["text"] % 8)
        out = [decode_line(x) for x in text.split(b"\n") if x]
        for b in head["blocks"]:
            n, spec = b["rows"], DATA_FIELDS[b["type"]]
            cols: dict[str, list[Any]] = {}
            for name, masked in b["columns"]:
                kind = "id" if name == "id" else FLOAT if name == "ts" else spec[name][0]
                present = value[pos : pos + n] if masked else b"\1" * n
                if masked:
                    pos += n + (-n % 8)
                if kind in (FLOAT, INT, BOOL):
                    code, width = {FLOAT: ("d", 8), INT: ("q", 8), BOOL: ("B", 1)}[kind]
                    vals: list[Any] = list(array(code, value[pos : pos + n * width]))
                    if kind == BOOL:
                        vals = [bool(v) for v in vals]
                    size = n * width
                else:
                    offs = array("I", value[pos : pos + 4 * (n + 1)])
                    at = pos + 4 * (n + 1)
                    vals = [value[at + offs[i] : at + offs[i + 1]].decode() for i in range(n)]
                    if kind not in ("id", STR):
                        vals = [json.loads(v) if v else None for v in vals]
                    size = 4 * (n + 1) + offs[n]
                if len(vals) != n:
                    raise ValueError(f"column {name} runs past the message")
                cols[name] = [v if p else None for v, p in zip(vals, present, strict=True)]
                pos += size + (-size % 8)
            labels = json.loads(b["labels"]) if b["labels"] else {}
            for i in range(n):
                data = {k: c[i] for k, c in cols.items() if k not in ("id", "ts") and c[i] is not None}
                ev = {"v": VERSION, "id": cols["id"][i], "ts": cols["ts"][i], "node": b["node"]}
                ev.update(role=b["role"], job=b["job"], labels=labels, type=b["type"], data=data)
                out.append(validate(ev))
        return out
    except InvalidEvent:
        raise
    except (ValueError, KeyError, TypeError, IndexError, struct.error) as e:
        raise InvalidEvent(f"not a readable column block message: {e}"[:200]) from None
