"""Column blocks: how the shipper packs row-form samples into a Kafka message, and how a
consumer reads them back (encoder and decoder side by side).

The spool holds lines (the wire format's JSON and row forms).  When it ships to Kafka, the
agent can turn the row lines of one message (host / gpu / tpu samples) into binary columns:
the collector then loads them without parsing a number from text, which is most of what a
sample costs it.  It is a transport encoding, like compression: the same events, the same
validation, the same tables (docs/wire-format.md, "Column blocks").

    message := MAGIC  u32 header_length  header (JSON, padded with spaces)  body  u32 crc
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

``encode`` (the agent) and ``decode`` (events as dicts, for any consumer) use the standard
library only (the agent's dependency rule).  ``read_blocks`` (the collector) gives the
blocks as Arrow arrays over the message's own bytes, and imports numpy and pyarrow (the
server extra) when first called.
"""

from __future__ import annotations

import functools
import json
import math
import re
import struct
import zlib
from array import array
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from .registry import BOOL, DATA_FIELDS, FLOAT, INT, ROW_PREFIX, ROW_TYPES, STR

MAGIC = b"\x00cmdare-columns-2\n"  # what the agent writes: ends with a CRC-32 of all before it
MAGIC_V1 = b"\x00cmdare-columns-1\n"  # agents before 0.1 (no checksum): still read
CRC = struct.Struct("<I")  # zlib.crc32 of every byte of the message before it
HEAD = struct.Struct("<I")
_ROWHEAD = ROW_PREFIX.encode() + b"\t"
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
        texts: list[bytes] = []
        bad = set()
        for i, x in enumerate(col):
            try:
                texts.append(_text(x))
            except ValueError:  # json, UnicodeEncodeError (a lone surrogate): not carried
                bad.add(i)
        if bad:
            raise _Bad(bad)
    else:
        texts = list(col)
    out = bytearray()
    _strings(out, texts)
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
    # a field no row of the block carries is left out (the reader takes it as absent): the
    # row form is positional, so a GPU without GPM metrics still has their empty places
    parts += [
        (name, kind, cols[_NENV + i], b"" in cols[_NENV + i])
        for i, (name, (kind, _)) in enumerate(spec[: width - _NENV])
        if any(cols[_NENV + i])
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
    if _ROWHEAD not in data[:3] and b"\n" + _ROWHEAD not in data:
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
        if line[:3] == _ROWHEAD:
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
    header += b" " * (-(len(MAGIC) + HEAD.size + len(header)) % 8)
    tpart += b"\0" * (-len(tpart) % 8)
    msg = b"".join([MAGIC, HEAD.pack(len(header)), header, tpart, *bodies])
    return msg + CRC.pack(zlib.crc32(msg))


def checked_size(raw: bytes) -> int:
    """The length of a column-block message without its checksum, once the checksum is
    right (a version 1 message has none); BlockError when it is not."""
    if raw[: len(MAGIC)] == MAGIC_V1:
        return len(raw)
    if len(raw) < len(MAGIC) + HEAD.size + CRC.size:
        raise BlockError(f"column block message of {len(raw)} bytes is truncated (no header)")
    n = len(raw) - CRC.size
    if zlib.crc32(memoryview(raw)[:n]) != CRC.unpack_from(raw, n)[0]:
        raise BlockError(
            f"column block message of {len(raw)} bytes fails its checksum (damaged in transit or on disk)"
        )
    return n


def decode(value: bytes) -> list[dict[str, Any]]:
    """The events of one Kafka message value, column blocks or lines, as validated event
    dicts (``events.InvalidEvent`` on the first problem).  For consumers of the topic other
    than the collector (which reads blocks through Arrow, without making dicts)."""
    from .events import decode_line
    from .registry import VERSION
    from .validation import InvalidEvent, validate

    if not is_block(value):
        return [decode_line(x) for x in value.split(b"\n") if x]
    try:
        value = value[: checked_size(value)]
        start = len(MAGIC) + HEAD.size
        (hlen,) = HEAD.unpack_from(value, len(MAGIC))
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
    except (ValueError, KeyError, TypeError, IndexError, struct.error) as e:  # BlockError included
        raise InvalidEvent(f"not a readable column block message: {e}"[:200]) from None


# -- reading blocks into Arrow (the collector) -------------------------------------------
MAX_ROWS = 1 << 20
_WIDTH = {FLOAT: 8, INT: 8, BOOL: 1}


class BlockError(ValueError):
    pass


@dataclass
class Block:
    type: str
    rows: int
    node: str
    role: str
    job: str
    labels: str
    arrays: dict[str, Any]  # pyarrow arrays: id, ts, then the data fields it carries
    nbytes: Any  # numpy int64 array: bytes each row takes in the message (dead letters' size)


def _arrow() -> tuple[Any, Any]:
    import numpy as np
    import pyarrow as pa

    return np, pa


@functools.cache
def _arrow_types() -> dict[str, Any]:
    _, pa = _arrow()
    return {FLOAT: pa.float64(), INT: pa.int64(), BOOL: pa.bool_()}  # every other kind: its text


def arrow_type(kind: str) -> Any:
    """The Arrow type a column of ``kind`` is read as (numbers and bools typed, the rest text)."""
    _, pa = _arrow()
    return _arrow_types().get(kind, pa.string())


def is_block(raw: bytes) -> bool:
    return raw[: len(MAGIC)] in (MAGIC, MAGIC_V1)


def _str(h: dict[str, Any], key: str, where: str) -> str:
    v = h.get(key)
    if type(v) is not str:
        raise BlockError(f"{where}: '{key}' must be a string")
    return v


class _Cursor:
    """Where reading a column-block message stands: its bytes, their end (the checksum
    excluded), the next position, and the array libraries."""

    def __init__(self, raw: bytes, end: int, pos: int) -> None:
        self.np, self.pa = _arrow()
        self.arrow = _arrow_types()
        self.raw, self.buf, self.end, self.pos = raw, self.pa.py_buffer(raw), end, pos

    def column(self, where: str, name: str, kind: str, masked: int, n: int) -> tuple[Any, Any]:
        """One column of ``n`` rows as an Arrow array over the message's bytes, and its
        bytes per row (a number, or per-row lengths for text)."""
        np, pa, raw, end = self.np, self.pa, self.raw, self.end
        bitmap = None
        if masked:
            if self.pos + n > end:
                raise BlockError(f"{where}: column {name} runs past the message")
            present = np.frombuffer(raw, np.uint8, n, self.pos)
            if present.max() > 1:
                raise BlockError(f"{where}: column {name}: presence mask bytes must be 0 or 1")
            bitmap = pa.py_buffer(np.packbits(present, bitorder="little"))
            self.pos += n + (-n % 8)
        pos = self.pos
        width = _WIDTH.get(kind)
        if width is not None:
            size = n * width
            if pos + size > end:
                raise BlockError(f"{where}: column {name} runs past the message")
            if kind == BOOL and np.frombuffer(raw, np.uint8, n, pos).max() > 1:
                raise BlockError(f"{where}: column {name}: bool values must be 0 or 1")
            values = self.buf.slice(pos, size)
            if kind == BOOL:  # Arrow's booleans are bits
                values = pa.py_buffer(np.packbits(np.frombuffer(raw, np.uint8, n, pos), bitorder="little"))
            arr, per_row = pa.Array.from_buffers(self.arrow[kind], n, [bitmap, values]), width
        else:
            if pos + 4 * (n + 1) > end:
                raise BlockError(f"{where}: column {name} runs past the message")
            offsets = np.frombuffer(raw, "<u4", n + 1, pos)
            text_end = int(offsets[-1])
            lens = np.diff(offsets.astype(np.int64))
            if offsets[0] != 0 or (lens < 0).any() or text_end >= 1 << 31:
                raise BlockError(f"{where}: column {name}: string offsets must start at 0 and not decrease")
            data_at = pos + 4 * (n + 1)
            if data_at + text_end > end:
                raise BlockError(f"{where}: column {name} runs past the message")
            arr = pa.Array.from_buffers(
                pa.string(), n, [bitmap, self.buf.slice(pos, 4 * (n + 1)), self.buf.slice(data_at, text_end)]
            )
            try:
                arr.validate(full=True)
            except pa.ArrowInvalid:
                raise BlockError(f"{where}: column {name} is not UTF-8 text") from None
            per_row = lens + 4
            size = 4 * (n + 1) + text_end
        self.pos = pos + size + (-size % 8)
        return arr, per_row


def _kind(where: str, type_: str, spec: dict[str, Any], c: Any, seen: dict[str, Any]) -> tuple[str, str, int]:
    """A column's (name, kind, masked), checked against its type's fields."""
    if type(c) is not list or len(c) != 2 or type(c[0]) is not str or c[1] not in (0, 1):
        raise BlockError(f"{where}: a column must be [name, 0 or 1], got {str(c)[:60]}")
    name, masked = c
    if name in seen:
        raise BlockError(f"{where}: column {name[:60]!r} appears twice")
    if name == "id":
        kind = "str"
    elif name == "ts":
        kind = FLOAT
    elif name in spec:
        kind = spec[name][0]
    else:
        raise BlockError(f"{where}: {name[:60]!r} is not a {type_} field this collector knows (a newer agent?)")
    if masked and name in ("id", "ts"):
        raise BlockError(f"{where}: column {name} cannot have absent values")
    return name, kind, masked


def _read_block(cur: _Cursor, bi: int, h: Any, known: set[str]) -> Block:
    """One block of the header, its columns read at the cursor."""
    where = f"column block {bi}"
    if type(h) is not dict:
        raise BlockError(f"{where}: must be an object")
    type_ = _str(h, "type", where)
    if type_ not in known:
        raise BlockError(f"{where}: type {type_[:60]!r}, which this collector does not know")
    where = f"{type_} column block {bi}"
    n = h.get("rows")
    if type(n) is not int or not 1 <= n <= MAX_ROWS:
        raise BlockError(f"{where}: 'rows' must be an integer from 1 to {MAX_ROWS}")
    cols = h.get("columns")
    if type(cols) is not list or len(cols) < 2 or [c[:1] for c in cols[:2]] != [["id"], ["ts"]]:
        raise BlockError(f"{where}: 'columns' must be a list starting with id and ts")
    spec = DATA_FIELDS[type_]
    arrays: dict[str, Any] = {}
    nbytes = cur.np.zeros(n, cur.np.int64)
    for c in cols:
        name, kind, masked = _kind(where, type_, spec, c, arrays)
        arrays[name], per_row = cur.column(where, name, kind, masked, n)
        nbytes += per_row
    return Block(type_, n, _str(h, "node", where), _str(h, "role", where), _str(h, "job", where),
                 _str(h, "labels", where), arrays, nbytes)


def read_blocks(raw: bytes, known: set[str]) -> tuple[bytes, list[Block]]:
    """(text lines, blocks) of a column-block message, each block's columns as Arrow arrays
    over ``raw``'s bytes (no value is parsed or copied); ``known``: the types the reader
    loads.  The message's structure is checked (sizes, offsets, UTF-8, which fields a type
    has); what cannot be read raises ``BlockError`` with a one-line reason.  The values
    themselves (a NaN, an id too long, a role unknown) are left to the reader's checks."""
    msg_end = checked_size(raw)  # the message's bytes without its checksum
    start = len(MAGIC) + HEAD.size
    if msg_end < start:
        raise BlockError(f"column block message of {msg_end} bytes is truncated (no header)")
    (hlen,) = HEAD.unpack_from(raw, len(MAGIC))
    if start + hlen > msg_end:
        raise BlockError(f"column block header of {hlen} bytes runs past the message ({msg_end} bytes)")
    try:
        head = json.loads(raw[start : start + hlen])
    except (ValueError, UnicodeDecodeError):
        raise BlockError("column block header is not valid JSON") from None
    if type(head) is not dict or type(head.get("text")) is not int or type(head.get("blocks")) is not list:
        raise BlockError("column block header must be an object with 'text' (int) and 'blocks' (list)")
    pos = start + hlen
    tlen = head["text"]
    if tlen < 0 or pos + tlen > msg_end:
        raise BlockError(f"column block text part of {tlen} bytes runs past the message")
    text = raw[pos : pos + tlen]
    cur = _Cursor(raw, msg_end, pos + tlen + (-tlen % 8))
    blocks = [_read_block(cur, bi, h, known) for bi, h in enumerate(head["blocks"])]
    if cur.pos < msg_end:
        raise BlockError(f"column block message has {msg_end - cur.pos} bytes after its last block")
    return text, blocks
