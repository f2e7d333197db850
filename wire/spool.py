"""The spool directory's on-disk format and its reader.  The agent writes it
(cmdare.agent.sinks.spool, its write-ahead log: the Fluent Bit filesystem-buffer model);
the agent's Kafka shipper and an embedded collector read it with ``read_lines``.

Layout of ``spool.dir``::

    0000000000000001.ndjson   segments, append-only, one event per line (wire format v1)
    0000000000000002.ndjson   ... the highest-numbered one is being written
    cursor.shipped            "<segment> <offset>": what Kafka acknowledged (Kafka mode)
    cursor.collected          "<segment> <offset>": what a collector loaded (embedded mode)

A consumer reads complete lines from a position (``read_lines``) and moves its cursor
(``write_cursor``, atomically) only after the data is safe downstream.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

SEGMENT = re.compile(r"^(\d{16})\.ndjson$")


@dataclass(frozen=True, order=True)
class Position:
    segment: int
    offset: int

    def __str__(self) -> str:
        return f"{self.segment} {self.offset}"


START = Position(0, 0)


def seg_name(n: int) -> str:
    return f"{n:016d}.ndjson"


def list_segments(d: Path) -> list[int]:
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(SEGMENT.match, names) if m)


def read_cursor(d: Path, name: str) -> Position | None:
    try:
        seg, off = (d / f"cursor.{name}").read_text().split()
        return Position(int(seg), int(off))
    except (FileNotFoundError, ValueError):
        return None


def write_cursor(d: Path, name: str, pos: Position, fsync: bool = True) -> None:
    tmp = d / f".cursor.{name}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{pos}\n")
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, d / f"cursor.{name}")


def read_lines(d: Path, pos: Position, max_bytes: int) -> tuple[list[tuple[bytes, Position]], Position, int]:
    """Complete lines from ``pos`` on, up to about ``max_bytes``.

    Returns ([(chunk, position after chunk)], next position, torn lines skipped).  A chunk
    is a run of whole lines from one segment.  A segment deleted by the bounds is skipped;
    a partial last line is left for later while its segment is the newest, and skipped as
    torn once a newer segment exists.
    """
    out: list[tuple[bytes, Position]] = []
    skipped, budget = 0, max_bytes
    segs = [s for s in list_segments(d) if s >= pos.segment]
    for i, s in enumerate(segs):
        off = pos.offset if s == pos.segment else 0
        try:
            with open(d / seg_name(s), "rb") as f:
                f.seek(off)
                buf = f.read(budget)
                if buf and not buf.endswith(b"\n"):
                    buf += f.readline()  # finish the line the budget cut into
        except FileNotFoundError:
            continue
        end = buf.rfind(b"\n") + 1
        pos = Position(s, off + end)
        if end:
            out.append((buf[:end], pos))
            budget -= end
        # a short read is the segment's end: a segment not read to its end has spent the budget
        if budget <= 0 or i == len(segs) - 1:
            return out, pos, skipped
        if end < len(buf):
            skipped += 1
        pos = Position(segs[i + 1], 0)
    return out, pos, skipped
