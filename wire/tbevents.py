"""TensorBoard event files and CSV exports, read with the standard library alone.

An event file (``events.out.tfevents.*``) is a sequence of TFRecords::

    uint64 length (little endian) | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)

where each ``data`` is a serialized ``tensorflow.Event`` protobuf.  Only what step
telemetry needs is decoded: the event's wall time and step, and the scalar values of its
summary, whether written the TF1 way (``simple_value``) or the TF2 way (a one-element
float/double/int tensor).  Everything else (graphs, images, histograms) is skipped.

The CSV exports TensorBoard's UI produces have the header ``Wall time,Step,Value``.

Both readers raise ``TensorBoardError`` with a one-line message naming the file and the
record (event files) or line (CSV) that is wrong.  The agent's ``tensorboard`` source and
``analyze import tensorboard`` share this module and ``StepConverter``, so a live run and an
imported one produce the same step telemetry.
"""

from __future__ import annotations

import csv
import hashlib
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .protowire import fields, read_varint, signed64

STEPS_TAG = "global_step/sec"
EXAMPLES_TAG = "examples/sec"
EVENT_FILE_MARK = "tfevents"
MAX_RECORD = 256 << 20  # a length above this is garbage, not a record


class TensorBoardError(ValueError):
    """A malformed event file or CSV export; the message names the file and where."""


# -- CRC-32C (Castagnoli), as TFRecord frames use it ------------------------------------

_crc32c_c: Any
try:  # the optional C implementation (the ``crc32c`` package), when installed
    from crc32c import crc32c as _crc32c_c  # type: ignore[import-not-found,no-redef]
except ImportError:  # pragma: no cover - depends on the environment
    _crc32c_c = None


def _table() -> list[int]:
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _table()


def crc32c(data: bytes) -> int:
    if _crc32c_c is not None:
        return _crc32c_c(data)
    c, t = 0xFFFFFFFF, _T
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -- TFRecord framing --------------------------------------------------------------------


def read_records(buf: bytes, offset: int = 0, final: bool = True) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(record number from 0 at offset, end offset, data)`` for each whole record
    in ``buf[offset:]``.  With ``final=False`` an incomplete record at the end is not an
    error (the writer is still writing it): iteration just stops before it."""
    n, pos, size = 0, offset, len(buf)
    while pos < size:
        if size - pos < 12:
            if final:
                raise ValueError(f"record {n}: truncated header ({size - pos} bytes at byte {pos})")
            return
        (length,) = struct.unpack_from("<Q", buf, pos)
        (lcrc,) = struct.unpack_from("<I", buf, pos + 8)
        if masked_crc(buf[pos : pos + 8]) != lcrc:
            raise ValueError(f"record {n}: length checksum mismatch at byte {pos} (not a TFRecord file?)")
        if length > MAX_RECORD:
            raise ValueError(f"record {n}: implausible length {length} at byte {pos}")
        end = pos + 12 + length + 4
        if end > size:
            if final:
                raise ValueError(f"record {n}: truncated ({size - pos} of {end - pos} bytes at byte {pos})")
            return
        data = buf[pos + 12 : pos + 12 + length]
        (dcrc,) = struct.unpack_from("<I", buf, pos + 12 + length)
        if masked_crc(data) != dcrc:
            raise ValueError(f"record {n}: data checksum mismatch at byte {pos}")
        yield n, end, data
        n, pos = n + 1, end


def frame(data: bytes) -> bytes:
    """One TFRecord around ``data`` (used by tests and the fleet simulator)."""
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc(head)) + data + struct.pack("<I", masked_crc(data))


# -- the Event protobuf subset ------------------------------------------------------------

_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64 = 1, 2, 3, 9


def _scalar_tensor(buf: bytes) -> float | None:
    """The single number of a scalar TensorProto, or None when it is not one."""
    dtype, content, dims = 0, b"", 0
    vals: list[float] = []
    for num, wt, v in fields(buf):
        if num == 1 and wt == 0:
            dtype = v
        elif num == 2 and wt == 2:  # TensorShapeProto: repeated Dim dim = 2 {int64 size = 1}
            for dn, _dwt, dv in fields(v):
                if dn == 2:
                    for sn, _swt, sv in fields(dv):
                        if sn == 1 and signed64(sv) != 1:
                            dims += 1
        elif num == 4 and wt == 2:
            content = v
        elif num == 5:  # float_val, packed or not
            vals += struct.unpack(f"<{len(v) // 4}f", v) if wt == 2 else struct.unpack("<f", v)
        elif num == 6:  # double_val
            vals += struct.unpack(f"<{len(v) // 8}d", v) if wt == 2 else struct.unpack("<d", v)
        elif num in (7, 10):  # int_val / int64_val
            if wt == 0:
                vals.append(signed64(v))
            elif wt == 2:
                p = 0
                while p < len(v):
                    x, p = read_varint(v, p)
                    vals.append(signed64(x))
    if dims:
        return None
    if content:
        fmt = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q"}.get(dtype)
        if fmt is None or len(content) != struct.calcsize(fmt):
            return None
        return float(struct.unpack(fmt, content)[0])
    if len(vals) == 1 and dtype in (_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64):
        return float(vals[0])
    return None


def parse_event(data: bytes) -> tuple[float, int, list[tuple[str, float]]]:
    """``(wall_time, step, [(tag, value)])`` of one serialized Event."""
    wall, step, scalars = 0.0, 0, []
    for num, wt, v in fields(data):
        if num == 1 and wt == 1:
            (wall,) = struct.unpack("<d", v)
        elif num == 2 and wt == 0:
            step = signed64(v)
        elif num == 5 and wt == 2:  # Summary: repeated Value value = 1
            for sn, swt, sv in fields(v):
                if sn != 1 or swt != 2:
                    continue
                tag, value = "", None
                for vn, vwt, vv in fields(sv):
                    if vn == 1 and vwt == 2:
                        tag = vv.decode("utf-8", "replace")
                    elif vn == 2 and vwt == 5:
                        (value,) = struct.unpack("<f", vv)
                    elif vn == 8 and vwt == 2 and value is None:
                        value = _scalar_tensor(vv)
                if tag and value is not None:
                    scalars.append((tag, float(value)))
    return wall, step, scalars


@dataclass(frozen=True)
class Point:
    """One scalar point: where it came from (for messages and deterministic ids)."""

    wall: float
    step: int
    tag: str
    value: float
    where: str  # "record N" or "line N"


def read_event_file(path: Path, data: bytes | None = None) -> list[Point]:
    """Every scalar point of a whole event file; TensorBoardError names the file and record."""
    buf = path.read_bytes() if data is None else data
    out: list[Point] = []
    try:
        for n, _end, rec in read_records(buf):
            try:
                wall, step, scalars = parse_event(rec)
            except (ValueError, struct.error) as e:
                raise ValueError(f"record {n}: not a TensorBoard event ({e})") from None
            out += [Point(wall, step, t, v, f"record {n}") for t, v in scalars]
    except ValueError as e:
        raise TensorBoardError(f"{path}: {e}") from None
    return out


def read_csv(path: Path, tag: str, f: Any = None) -> list[Point]:
    """A TensorBoard UI CSV export (``Wall time,Step,Value``); every row must parse. ``f``:
    the file, opened as text (``newline=""``), where the caller opened it."""
    out: list[Point] = []
    try:
        f = f if f is not None else path.open(newline="", encoding="utf-8-sig")
    except OSError as e:
        raise TensorBoardError(f"{path}: cannot read: {e.strerror or e}") from None
    with f:
        try:
            rows = csv.reader(f)
            head = next(rows, None)
            if head is None:
                raise TensorBoardError(
                    f"{path}: line 1: empty file, expected the header 'Wall time,Step,Value'"
                )
            if [h.strip().lower() for h in head] != ["wall time", "step", "value"]:
                raise TensorBoardError(
                    f"{path}: line 1: expected the header 'Wall time,Step,Value', got {','.join(head)[:80]!r}"
                )
            for row in rows:
                line = rows.line_num
                if not row or row == [""]:
                    continue
                if len(row) != 3:
                    raise TensorBoardError(f"{path}: line {line}: expected 3 columns, got {len(row)}")
                try:
                    wall, step_f, value = float(row[0]), float(row[1]), float(row[2])
                except ValueError:
                    raise TensorBoardError(
                        f"{path}: line {line}: not numbers: {','.join(row)[:80]!r}"
                    ) from None
                if not (math.isfinite(wall) and 0 < wall < 1e11):
                    raise TensorBoardError(f"{path}: line {line}: wall time {row[0]!r} is not unix seconds")
                if not (math.isfinite(step_f) and step_f == int(step_f) and step_f >= 0):
                    raise TensorBoardError(f"{path}: line {line}: step {row[1]!r} is not a whole number")
                if not math.isfinite(value):
                    raise TensorBoardError(f"{path}: line {line}: value {row[2]!r} is not finite")
                out.append(Point(wall, int(step_f), tag, value, f"line {line}"))
        except UnicodeDecodeError:
            raise TensorBoardError(f"{path}: not UTF-8 text (a CSV export is)") from None
        except csv.Error as e:
            raise TensorBoardError(f"{path}: line {rows.line_num}: {e}") from None
    return out


def csv_tag(path: Path, default: str = STEPS_TAG) -> str:
    """The tag of a CSV export, from TensorBoard's file name ``run-<run>-tag-<tag>.csv``
    (``/`` written as ``_``); ``default`` when the name does not say."""
    stem = path.stem
    if "-tag-" in stem:
        t = stem.rsplit("-tag-", 1)[1]
        for known in (STEPS_TAG, EXAMPLES_TAG):
            if t == known.replace("/", "_"):
                return known
        return t
    return default


def csv_run(path: Path) -> str | None:
    stem = path.stem
    if stem.startswith("run-") and "-tag-" in stem:
        return stem[4:].rsplit("-tag-", 1)[0] or None
    return None


def is_event_file(path: Path) -> bool:
    return EVENT_FILE_MARK in path.name and path.is_file()


# -- scalar points -> step telemetry ------------------------------------------------------


class StepConverter:
    """Turns ``global_step/sec`` points (and ``examples/sec`` at the same step) of one run
    into ``train_steps`` data, each point covering the steps since the run's previous one.

    The first point of a run has no previous point, so its step count and interval are
    unknown: it carries the rate alone (``steps_per_second``, ``step_mean_seconds``).
    """

    def __init__(self, run: str, rank: int = 0, steps_tag: str = STEPS_TAG, examples_tag: str = EXAMPLES_TAG):
        self.run, self.rank = run, rank
        self.steps_tag, self.examples_tag = steps_tag, examples_tag
        self.prev: tuple[float, int] | None = None
        self.examples: dict[int, float] = {}

    def feed(self, points: list[Point]) -> list[tuple[float, dict[str, Any], Point]]:
        """``[(ts, train_steps data, the point)]`` for the steps points among ``points``."""
        for p in points:
            if p.tag == self.examples_tag:
                self.examples[p.step] = p.value
        if len(self.examples) > 10000:
            self.examples.clear()
        out = []
        for p in points:
            if p.tag != self.steps_tag or not p.value > 0:
                continue
            d: dict[str, Any] = {
                "run": self.run,
                "rank": self.rank,
                "steps_per_second": p.value,
                "step_mean_seconds": 1.0 / p.value,
                "last_step": p.step,
            }
            ex = self.examples.pop(p.step, None)
            if ex is not None:
                d["examples_per_second"] = ex
            prev = self.prev
            if prev is not None and p.step > prev[1] and p.wall > prev[0]:
                n = p.step - prev[1]
                d.update(steps=n, first_step=prev[1] + 1, interval_seconds=round(p.wall - prev[0], 6))
                if ex is not None:
                    d["examples"] = ex * n / p.value
            self.prev = (p.wall, p.step)
            out.append((p.wall, d, p))
        return out


def point_id(job: str, source: str, p: Point) -> str:
    """A deterministic event id for a point, so that reading the same file again (agent
    restart, a second import) is stored once by the collector's de-duplication."""
    h = hashlib.sha1(f"{job}\0{source}\0{p.tag}\0{p.step}\0{p.wall!r}".encode()).hexdigest()
    return f"tb-{h[:40]}"
