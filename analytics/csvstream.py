"""CSV files read as a stream, for every ``analyze import`` of records: bounded memory
whatever the file's size (one physical line at a time, never the whole file), a FIFO, a
device or a directory refused without waiting on it, over-long lines and bad encodings
refused with the line number, the bytes read so far for a progress bar.

A record's identity is its values and how many identical records came before it in its
file (``Repeats``): importing a file again finds every record already stored, and two
identical rows in one file stay two. The numbering keeps 8 bytes of digest per distinct
row, so it costs memory in proportion to a file's distinct rows (bounded by the importer's
row limit), never to its size in bytes.
"""

from __future__ import annotations

import csv
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .db import AnalyticsError
from .output import one_line

MAX_LINE = 64 << 10  # bytes of one physical line


def open_regular(path: str | Path, limit: int, what: str, where: str = "") -> BinaryIO:
    """A regular file of at most ``limit`` bytes, opened for reading (a FIFO's open does
    not wait for a writer; one is refused, as are devices, sockets and directories)."""
    where = where or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise AnalyticsError(f"{where}: cannot read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                    else "a device or socket")
            raise AnalyticsError(f"{where}: {kind}, not a regular file")
        if st.st_size > limit:
            raise AnalyticsError(f"{where}: larger than {_size(limit)}: not {what}")
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return f


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and not n % (1 << 30) else f"{n >> 20} MiB" if n >= 1 << 20 \
        else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} bytes"


class Lines:
    """The physical lines of a binary file as text (UTF-8, a BOM dropped), each at most
    ``MAX_LINE`` bytes, the file read no further than ``limit`` bytes (it may grow while
    read); ``done`` is the bytes taken so far."""

    def __init__(self, f: BinaryIO, name: str, limit: int) -> None:
        self.name, self.limit, self.raw = name, limit, f
        self.n = self.done = 0

    def __iter__(self) -> Iterator[str]:
        while True:
            b = self.raw.readline(MAX_LINE + 1)
            if not b:
                return
            self.n += 1
            self.done += len(b)
            if len(b) > MAX_LINE:
                raise AnalyticsError(f"{self.name}: line {self.n}: longer than {MAX_LINE:,} bytes")
            if self.done > self.limit:
                raise AnalyticsError(f"{self.name}: larger than {_size(self.limit)} (it grew while read)")
            if self.n == 1 and b.startswith(b"\xef\xbb\xbf"):
                b = b[3:]
            try:
                yield b.decode()
            except UnicodeDecodeError:
                raise AnalyticsError(f"{self.name}: line {self.n}: not a text file (not UTF-8)") from None


def reader(lines: Iterator[str] | Lines, name: str) -> Iterator[tuple[int, list[str]]]:
    """(line number where the row starts, its fields) of each row with a value; a broken
    quote or a field over the csv module's limit is one line."""
    r = csv.reader(iter(lines))
    start = 1
    try:
        for row in r:
            line, start = start, r.line_num + 1
            if any(x.strip() for x in row):
                yield line, row
    except csv.Error as e:
        raise AnalyticsError(f"{name}: line {r.line_num}: not CSV ({one_line(str(e), 60)})") from None


def header(row: list[str], name: str, required: list[str], what: str) -> dict[str, int]:
    """Column name -> index from a header row (names stripped and lower-cased); a name
    twice or a required one missing is one line."""
    names = [h.strip().lstrip("\ufeff").lower() for h in row]
    twice = sorted({h for h in names if h and names.count(h) > 1})
    if twice:
        raise AnalyticsError(f"{name}: line 1: column {one_line(twice[0], 40)!r} appears twice in the header")
    missing = [c for c in required if c not in names]
    if missing:
        raise AnalyticsError(f"{name}: missing required column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                             f"(a {what} file has {', '.join(required)})")
    return {h: i for i, h in enumerate(names) if h}


class Repeats:
    """How many identical records came before each in one file (0 for the first)."""

    def __init__(self) -> None:
        self.seen: dict[bytes, int] = {}

    def number(self, key: str) -> int:
        d = hashlib.blake2b(key.encode(), digest_size=8).digest()
        n = self.seen.get(d, 0)
        self.seen[d] = n + 1
        return n


def record_id(kind: str, key: str, repeat: int) -> str:
    """A record's id: its kind, its values (``key``) and its repeat number in its file."""
    return hashlib.sha256(f"{kind}\x1e{key}\x1e{repeat}".encode()).hexdigest()[:32]
