"""``analyze import checkpoints|startups``: overhead records a team already has, as CSV.

Two formats, the columns of CM-DARE's overhead measurements (docs/training.md has them):

- **checkpoints**: one checkpoint save a row. Required ``size_mb`` (the whole checkpoint,
  MB) and ``save_s`` (the save as training sees it, seconds); optional ``model``,
  ``weight_mb``, ``meta_mb``, ``index_mb``, ``graph_mb``, ``tensors``, ``params``,
  ``local_write_s``.
- **startups**: one VM start a row. Required ``region``, ``purchase`` (``spot`` or
  ``on-demand``; ``preemptible`` is read as spot), ``gpu_type`` and the three phases the cloud
  reports, ``provisioning_s``, ``staging_s``, ``booting_s`` (seconds; start-up = their sum).

Other columns are ignored. Every file is read and checked in full before anything is
written (a missing column: one line naming it; a bad value: one line with the file, the
line number and the column, never more than a short excerpt); then all files are stored
in one transaction, so an import is all or nothing. A record's id is a hash of its values
and of how many identical rows came before it in its file, so importing a file again
stores nothing twice (and two identical saves in one file stay two).
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .db import AnalyticsError, Database, read_text_file
from .output import one_line

MAX_FILE = 64 << 20  # bytes a file
MAX_ROWS = 1_000_000  # rows one import
MAX_FIELD = 256  # characters a text value
MAX_SECONDS = 86400.0  # a save or a start-up phase longer than a day is not one
MAX_MB = 1e8  # 100 TB checkpoint


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "text" | "float" | "int" | "purchase" | "region"
    required: bool
    lo: float = 0.0
    hi: float = math.inf
    positive: bool = False  # strictly above lo
    help: str = ""


FORMATS: dict[str, tuple[Column, ...]] = {
    "checkpoints": (
        Column("model", "text", False, help="model name (cross-validation leaves one out at a time)"),
        Column("size_mb", "float", True, hi=MAX_MB, positive=True, help="whole checkpoint, MB"),
        Column("save_s", "float", True, hi=MAX_SECONDS, positive=True, help="the save as training sees it, s"),
        Column("weight_mb", "float", False, hi=MAX_MB, help="data part, MB"),
        Column("meta_mb", "float", False, hi=MAX_MB, help="meta graph, MB"),
        Column("index_mb", "float", False, hi=MAX_MB, help="index part, MB"),
        Column("graph_mb", "float", False, hi=MAX_MB, help="graph file, MB"),
        Column("tensors", "int", False, hi=1e9, help="parameter tensors of the model"),
        Column("params", "int", False, hi=1e15, help="parameters of the model"),
        Column("local_write_s", "float", False, hi=MAX_SECONDS, help="write to local disk alone, s"),
    ),
    "startups": (
        Column("region", "region", True, help="cloud region, e.g. us-east1"),
        Column("purchase", "purchase", True, help="spot (preemptible) or on-demand"),
        Column("gpu_type", "text", True, help="accelerator, e.g. K80, P100"),
        Column("provisioning_s", "float", True, hi=MAX_SECONDS, help="request to resources found, s"),
        Column("staging_s", "float", True, hi=MAX_SECONDS, help="resources allocated, image attached, s"),
        Column("booting_s", "float", True, hi=MAX_SECONDS, help="guest boot to ready, s"),
    ),
}
TABLES = {"checkpoints": "checkpoint_records", "startups": "startup_records"}
_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
PURCHASES = {"spot": "spot", "preemptible": "spot", "on-demand": "on-demand", "ondemand": "on-demand",
             "on_demand": "on-demand"}


@dataclass
class Records:
    kind: str
    rows: list[dict[str, Any]]
    files: int


def _value(col: Column, text: str, where: str) -> Any:
    text = text.strip()
    if not text:
        if col.required:
            raise AnalyticsError(f"{where}: {col.name} is empty (it is required)")
        return None
    if len(text) > MAX_FIELD:
        raise AnalyticsError(f"{where}: {col.name} longer than {MAX_FIELD} characters")
    if col.kind == "text":
        if any(ord(c) < 32 for c in text):
            raise AnalyticsError(f"{where}: {col.name} has control characters")
        return text
    if col.kind == "region":
        if not _REGION.match(text.lower()):
            raise AnalyticsError(f"{where}: region {one_line(text, 24)!r} is not a region name (like us-east1)")
        return text.lower()
    if col.kind == "purchase":
        p = PURCHASES.get(text.lower())
        if p is None:
            raise AnalyticsError(f"{where}: purchase {one_line(text, 24)!r} is not spot or on-demand")
        return p
    try:
        x = float(text)
    except ValueError:
        raise AnalyticsError(f"{where}: {col.name} {one_line(text, 24)!r} is not a number") from None
    if x != 0 and abs(x) < sys.float_info.min:  # subnormal: no measurement is that small, a typo or an attack
        raise AnalyticsError(f"{where}: {col.name} {one_line(text, 24)!r} is too small to be a measurement")
    if not math.isfinite(x) or x < col.lo or x > col.hi or (col.positive and x <= col.lo):
        rng = f"{'above' if col.positive else 'at least'} {col.lo:g} and at most {col.hi:g}"
        raise AnalyticsError(f"{where}: {col.name} {one_line(text, 24)!r} is out of range ({rng})")
    if col.kind == "int":
        if x != int(x):
            raise AnalyticsError(f"{where}: {col.name} {one_line(text, 24)!r} is not a whole number")
        return int(x)
    return x


def _id(kind: str, rec: dict[str, Any], seen: dict[str, int]) -> str:
    """The record's id: its values and how many identical ones came before it in its file."""
    key = "\x1f".join(repr(rec[c.name]) for c in FORMATS[kind])
    # any numbering of repeats that is the same on every import gives the same records
    n = seen.get(key, 0)
    seen[key] = n + 1
    return hashlib.sha256(f"{kind}\x1e{key}\x1e{n}".encode()).hexdigest()[:32]


def parse(kind: str, text: str, name: str) -> list[dict[str, Any]]:
    """The records of one CSV file's text (``name`` says where in errors)."""
    cols = FORMATS[kind]
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise AnalyticsError(f"{name}: empty: expected a header line with {', '.join(c.name for c in cols if c.required)}") from None
    except csv.Error as e:
        raise AnalyticsError(f"{name}: line 1: not CSV ({e})") from None
    header = [h.strip().lstrip("\ufeff").lower() for h in header]
    twice = sorted({h for h in header if h and header.count(h) > 1})
    if twice:
        raise AnalyticsError(f"{name}: line 1: column {one_line(twice[0], 40)!r} appears twice in the header")
    missing = [c.name for c in cols if c.required and c.name not in header]
    if missing:
        raise AnalyticsError(f"{name}: missing required column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                             f"(a {kind} file has {', '.join(c.name for c in cols if c.required)})")
    at = {c.name: header.index(c.name) for c in cols if c.name in header}
    seen: dict[str, int] = {}
    out = []
    try:
        for row in reader:
            line = reader.line_num
            if not any(x.strip() for x in row):
                continue
            if len(out) >= MAX_ROWS:
                raise AnalyticsError(f"{name}: more than {MAX_ROWS} rows: split the file")
            where = f"{name}: line {line}"
            if len(row) < len(header):
                raise AnalyticsError(f"{where}: {len(row)} fields, the header has {len(header)}")
            rec = {c.name: (_value(c, row[at[c.name]], where) if c.name in at else None) for c in cols}
            rec["id"] = _id(kind, rec, seen)
            rec["source"] = one_line(Path(name).name, 120)
            rec["line"] = line
            out.append(rec)
    except csv.Error as e:
        raise AnalyticsError(f"{name}: line {reader.line_num}: not CSV ({one_line(str(e), 60)})") from None
    if not out:
        raise AnalyticsError(f"{name}: no records after the header")
    return out


def find(paths: Sequence[str | Path]) -> list[Path]:
    """The files of ``paths``: files, and the ``*.csv`` files under directories."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*.csv") if f.is_file())
            if not found:
                raise AnalyticsError(f"{p}: no .csv files in it")
            files += found
        elif p.exists():
            files.append(p)
        else:
            raise AnalyticsError(f"{p}: no such file or directory")
    return files


def read(kind: str, paths: Sequence[str | Path], progress: Callable[[Path], None] | None = None) -> Records:
    """Every record of ``paths`` (files, or directories whose ``*.csv`` are taken), checked."""
    if kind not in FORMATS:
        raise AnalyticsError(f"import: unknown kind {kind!r} (known: {', '.join(FORMATS)})")
    files = find(paths)
    rows: list[dict[str, Any]] = []
    for i, f in enumerate(files):
        if progress:
            progress(f)
        got = parse(kind, read_text_file(f, MAX_FILE, f"a {kind} CSV file"), str(f))
        for r in got:
            r["file"] = i
        rows += got
        if len(rows) > MAX_ROWS:
            raise AnalyticsError(f"import: more than {MAX_ROWS} rows in all: import fewer files at once")
    return Records(kind, rows, len(files))


def check(kind: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records that came over the API, checked as a file's are (ids recomputed: a client
    does not choose them)."""
    if kind not in FORMATS:
        raise AnalyticsError(f"import: unknown kind {one_line(kind, 40)!r} (known: {', '.join(FORMATS)})")
    if len(rows) > MAX_ROWS:
        raise AnalyticsError(f"import: more than {MAX_ROWS} records")
    cols = FORMATS[kind]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([c.name for c in cols])
    for r in rows:
        if not isinstance(r, dict):
            raise AnalyticsError("import: each record must be an object")
        w.writerow(["" if r.get(c.name) is None else str(r.get(c.name)) for c in cols])
    out = parse(kind, buf.getvalue(), "import")
    per_file: dict[Any, dict[str, int]] = {}
    for rec, r in zip(out, rows, strict=True):  # ids per file; the file's name and line as the client read them
        f = r.get("file") if isinstance(r.get("file"), int) else 0
        rec["id"] = _id(kind, rec, per_file.setdefault(f, {}))
        src, line = r.get("source"), r.get("line")
        rec["source"] = one_line(str(src), 120) if src else "api"
        rec["line"] = line if isinstance(line, int) and 0 < line < 1 << 31 else None
    return out


def store(db: Database, kind: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Store checked records in one transaction (writes); (stored, duplicates)."""
    table = TABLES[kind]
    cols = [c.name for c in FORMATS[kind]] + ["id", "source", "line"]
    with db.write() as con:
        from .queries import needs_schema

        needs_schema(con, 14, f"analyze import {kind}")
        if not rows:
            return {"kind": kind, "records": 0, "stored": 0, "duplicates": 0}
        before = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        import pyarrow as pa

        t = pa.table({c: [r.get(c) for r in rows] for c in cols})
        con.register("incoming", t)
        try:
            con.execute(f"""INSERT INTO {table} ({", ".join(cols)}, imported_at)
                            SELECT DISTINCT ON (id) {", ".join(cols)}, now()::TIMESTAMP FROM incoming
                            WHERE id NOT IN (SELECT id FROM {table})""")
        finally:
            con.unregister("incoming")
        after = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
    return {"kind": kind, "records": len(rows), "stored": after - before, "duplicates": len(rows) - (after - before)}
