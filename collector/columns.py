"""Reading column-block messages (``cmdare.agent.columns``; docs/wire-format.md).

``decode`` checks the message's structure (sizes, offsets, UTF-8, which fields a type has)
and returns its text lines and its blocks as Arrow arrays over the message's own bytes (no
value is parsed or copied).  What it cannot read raises ``BlockError`` with a one-line
reason; the writer dead-letters the message whole.  The values themselves (a NaN, an id too
long, a role we do not know) are checked in DuckDB with the rest of the batch, row by row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from cmdare.agent.columns import _HEAD, MAGIC
from cmdare.agent.events import BOOL, DATA_FIELDS, FLOAT, INT

MAX_ROWS = 1 << 20
ARROW = {FLOAT: pa.float64(), INT: pa.int64(), BOOL: pa.bool_()}  # every other kind: its text
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
    arrays: dict[str, pa.Array]  # id, ts, then the data fields it carries
    nbytes: np.ndarray  # bytes each row takes in the message (dead letters' size)


def arrow_type(kind: str) -> pa.DataType:
    return ARROW.get(kind, pa.string())


def is_block(raw: bytes) -> bool:
    return raw[: len(MAGIC)] == MAGIC


def _str(h: dict[str, Any], key: str, where: str) -> str:
    v = h.get(key)
    if type(v) is not str:
        raise BlockError(f"{where}: '{key}' must be a string")
    return v


def decode(raw: bytes, known: set[str]) -> tuple[bytes, list[Block]]:
    """(text lines, blocks) of a column-block message; ``known``: the types the writer loads."""
    start = len(MAGIC) + _HEAD.size
    if len(raw) < start:
        raise BlockError(f"column block message of {len(raw)} bytes is truncated (no header)")
    (hlen,) = _HEAD.unpack_from(raw, len(MAGIC))
    if start + hlen > len(raw):
        raise BlockError(f"column block header of {hlen} bytes runs past the message ({len(raw)} bytes)")
    try:
        head = json.loads(raw[start : start + hlen])
    except (ValueError, UnicodeDecodeError):
        raise BlockError("column block header is not valid JSON") from None
    if type(head) is not dict or type(head.get("text")) is not int or type(head.get("blocks")) is not list:
        raise BlockError("column block header must be an object with 'text' (int) and 'blocks' (list)")
    buf = pa.py_buffer(raw)
    pos = start + hlen
    tlen = head["text"]
    if tlen < 0 or pos + tlen > len(raw):
        raise BlockError(f"column block text part of {tlen} bytes runs past the message")
    text = raw[pos : pos + tlen]
    pos += tlen + (-tlen % 8)
    blocks = []
    for bi, h in enumerate(head["blocks"]):
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
        arrays: dict[str, pa.Array] = {}
        nbytes = np.zeros(n, np.int64)
        for c in cols:
            if type(c) is not list or len(c) != 2 or type(c[0]) is not str or c[1] not in (0, 1):
                raise BlockError(f"{where}: a column must be [name, 0 or 1], got {str(c)[:60]}")
            name, masked = c
            if name in arrays:
                raise BlockError(f"{where}: column {name[:60]!r} appears twice")
            if name == "id":
                kind = "str"
            elif name == "ts":
                kind = FLOAT
            elif name in spec:
                kind = spec[name][0]
            else:
                raise BlockError(
                    f"{where}: {name[:60]!r} is not a {type_} field this collector knows (a newer agent?)"
                )
            if masked and name in ("id", "ts"):
                raise BlockError(f"{where}: column {name} cannot have absent values")
            bitmap = None
            if masked:
                if pos + n > len(raw):
                    raise BlockError(f"{where}: column {name} runs past the message")
                present = np.frombuffer(raw, np.uint8, n, pos)
                if present.max() > 1:
                    raise BlockError(f"{where}: column {name}: presence mask bytes must be 0 or 1")
                bitmap = pa.py_buffer(np.packbits(present, bitorder="little"))
                pos += n + (-n % 8)
            width = _WIDTH.get(kind)
            if width is not None:
                size = n * width
                if pos + size > len(raw):
                    raise BlockError(f"{where}: column {name} runs past the message")
                if kind == BOOL and np.frombuffer(raw, np.uint8, n, pos).max() > 1:
                    raise BlockError(f"{where}: column {name}: bool values must be 0 or 1")
                values = buf.slice(pos, size)
                if kind == BOOL:  # Arrow's booleans are bits
                    values = pa.py_buffer(
                        np.packbits(np.frombuffer(raw, np.uint8, n, pos), bitorder="little")
                    )
                arr = pa.Array.from_buffers(ARROW[kind], n, [bitmap, values])
                nbytes += width
            else:
                if pos + 4 * (n + 1) > len(raw):
                    raise BlockError(f"{where}: column {name} runs past the message")
                offsets = np.frombuffer(raw, "<u4", n + 1, pos)
                end = int(offsets[-1])
                lens = np.diff(offsets.astype(np.int64))
                if offsets[0] != 0 or (lens < 0).any() or end >= 1 << 31:
                    raise BlockError(
                        f"{where}: column {name}: string offsets must start at 0 and not decrease"
                    )
                data_at = pos + 4 * (n + 1)
                if data_at + end > len(raw):
                    raise BlockError(f"{where}: column {name} runs past the message")
                arr = pa.Array.from_buffers(
                    pa.string(), n, [bitmap, buf.slice(pos, 4 * (n + 1)), buf.slice(data_at, end)]
                )
                try:
                    arr.validate(full=True)
                except pa.ArrowInvalid:
                    raise BlockError(f"{where}: column {name} is not UTF-8 text") from None
                nbytes += lens + 4
                size = 4 * (n + 1) + end
            pos += size + (-size % 8)
            arrays[name] = arr
        blocks.append(
            Block(
                type_,
                n,
                _str(h, "node", where),
                _str(h, "role", where),
                _str(h, "job", where),
                _str(h, "labels", where),
                arrays,
                nbytes,
            )
        )
    if pos < len(raw):
        raise BlockError(f"column block message has {len(raw) - pos} bytes after its last block")
    return text, blocks
