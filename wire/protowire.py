"""The protobuf wire format, the small part of it cmdare needs, with the standard library
alone: decoding TensorBoard events and libtpu's metric responses, and encoding the
one-string requests the TPU source sends.  Unknown fields are skipped, as protobuf does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(field number, wire type, value)`` of one protobuf message: ints for
    varint, bytes for fixed64/fixed32 (8 or 4 raw bytes) and length-delimited fields."""
    pos, size = 0, len(buf)
    v: int | bytes
    while pos < size:
        key, pos = read_varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = read_varint(buf, pos)
        elif wt == 1:
            v, pos = buf[pos : pos + 8], pos + 8
        elif wt == 2:
            ln, pos = read_varint(buf, pos)
            v, pos = buf[pos : pos + ln], pos + ln
        elif wt == 5:
            v, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wt} (field {num})")
        if pos > size or num == 0:
            raise ValueError("truncated or corrupt protobuf message")
        yield num, wt, v


def signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def encode_varint(v: int) -> bytes:
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_bytes_field(num: int, data: bytes) -> bytes:
    """A length-delimited field (string, bytes or nested message)."""
    return encode_varint(num << 3 | 2) + encode_varint(len(data)) + data


def encode_varint_field(num: int, v: int) -> bytes:
    return encode_varint(num << 3) + encode_varint(v)
