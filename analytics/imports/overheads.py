"""``analyze import checkpoints|startups``: overhead records a team already has, as CSV.

Two formats, the columns of CM-DARE's overhead measurements (docs/training.md has them):

- **checkpoints**: one checkpoint save a row. Required ``size_mb`` (the whole checkpoint,
  MB) and ``save_s`` (the save as training sees it, seconds); optional ``model``,
  ``weight_mb``, ``meta_mb``, ``index_mb``, ``graph_mb``, ``tensors``, ``params``,
  ``local_write_s``.
- **startups**: one VM start a row. Required ``region``, ``purchase`` (``spot`` or
  ``on-demand``; ``preemptible`` is read as spot), ``gpu_type`` and the three phases the cloud
  reports, ``provisioning_s``, ``staging_s``, ``booting_s`` (seconds; start-up = their sum).

Other columns are ignored. Files are read a line at a time (``csvstream``) and checked as
read (a missing column: one line naming it; a bad value: one line with the file, the line
number and the column, never more than a short excerpt); the records go to the database in
batches inside one transaction, so an import is all or nothing and its memory is a batch's.
A record's id is a hash of its values and of how many identical rows came before it in its
file, so importing a file again stores nothing twice (and two identical saves in one file
stay two).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import csvstream
from ..db import AnalyticsError, Database
from ..output import one_line

MAX_FILE = 1 << 30  # bytes a file (read a line at a time: the row limit comes first)
MAX_ROWS = 1_000_000  # rows one import
BATCH = 20_000  # records stored, or sent to a collector, at a time
MAX_FIELD = 256  # characters a text value
MAX_SECONDS = 86400.0  # a save or a start-up phase longer than a day is not one
MAX_MB = 1e8  # 100 TB checkpoint


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "text" | "float" | "int" | "purchase" | "region" | "accelerator" | "zone" | "time" | "ended_by"
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
    "lives": (  # analytics/imports/lives.py
        Column("vm", "text", False, help="the VM's name or id (a VM exported again: its final state counts)"),
        Column("accelerator", "accelerator", True, help="accelerator, e.g. k80, v100, a100"),
        Column("region", "region", False, help="cloud region, e.g. us-east1 (else read from zone)"),
        Column("zone", "zone", False, help="cloud zone, e.g. us-east1-b"),
        Column("instance_type", "text", False, help="machine type, e.g. n1-standard-8"),
        Column("purchase", "purchase", False, help="spot (default; preemptible is spot) or on-demand"),
        Column("lifetime_s", "float", False, hi=400 * 86400.0, positive=True,
               help="seconds from start to end (else created and ended)"),
        Column("created", "time", False, help="ISO 8601 time the VM started"),
        Column("ended", "time", False, help="ISO 8601 time it ended (empty for a running VM)"),
        Column("ended_by", "ended_by", True, help="preempted, max_lifetime, deleted or running"),
    ),
}
TABLES = {"checkpoints": "checkpoint_records", "startups": "startup_records", "lives": "spot_lives"}
EXTRA = {"lives": ("lifetime_seconds",)}  # derived columns a kind stores beside its own
SCHEMA = {"checkpoints": 14, "startups": 14, "lives": 21}  # the migration that made each kind's table


def _finish_life(rec: dict[str, Any], where: str, as_of: Any) -> None:
    from .lives import finish

    finish(rec, where, as_of)


FINISH = {"lives": _finish_life}  # per kind: derive values from a checked row (one line if it cannot)
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
    if col.kind in ("accelerator", "ended_by", "zone"):
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", text):
            raise AnalyticsError(f"{where}: {col.name} {one_line(text, 24)!r} is not a name (letters, digits, . _ -)")
        return text.lower()
    if col.kind == "time":
        from .lives import time_value

        return time_value(text, col.name, where)
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


def _key(kind: str, rec: dict[str, Any]) -> str:
    return "\x1f".join(repr(rec[c.name]) for c in FORMATS[kind])


def _rows(kind: str, rows: Iterator[tuple[int, list[str]]], name: str,
          as_of: Any = None) -> Iterator[dict[str, Any]]:
    """The checked records of one file's rows (``name`` says where in errors), each with
    its id (values and repeat number in the file), source file name and line."""
    cols = FORMATS[kind]
    required = [c.name for c in cols if c.required]
    try:
        _, first = next(rows)
    except StopIteration:
        raise AnalyticsError(f"{name}: empty: expected a header line with {', '.join(required)}") from None
    at = csvstream.header(first, name, required, kind)
    width = len(first)
    source = one_line(Path(name).name, 120)
    repeats = csvstream.Repeats()
    n = 0
    for line, row in rows:
        n += 1
        if n > MAX_ROWS:
            raise AnalyticsError(f"{name}: more than {MAX_ROWS} rows: split the file")
        where = f"{name}: line {line}"
        if len(row) < width:
            raise AnalyticsError(f"{where}: {len(row)} fields, the header has {width}")
        rec = {c.name: (_value(c, row[at[c.name]], where) if c.name in at else None) for c in cols}
        if kind in FINISH:  # a kind's derived values (lives: lifetime_seconds, the region from the zone)
            FINISH[kind](rec, where, as_of(line) if callable(as_of) else as_of)
        key = _key(kind, rec)  # its columns' values (a region read from the zone included), not derived ones
        rec["repeat"] = repeat = repeats.number(key)
        rec["id"] = csvstream.record_id(kind, key, repeat)
        rec["source"] = source
        rec["line"] = line
        yield rec
    if not n:
        raise AnalyticsError(f"{name}: no records after the header")


def parse(kind: str, text: str, name: str) -> list[dict[str, Any]]:
    """The records of one CSV file's text (``name`` says where in errors)."""
    return list(_rows(kind, csvstream.reader(iter(text.splitlines(keepends=True)), name), name))


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
        elif p.exists() or p.is_symlink():
            files.append(p)
        else:
            raise AnalyticsError(f"{p}: no such file or directory")
    return files


def stream(kind: str, files: Sequence[Path], batch: int | None = None,
           progress: Callable[[Path, int], None] | None = None) -> Iterator[list[dict[str, Any]]]:
    """The checked records of ``files`` in batches of at most ``batch``, read one line at a
    time (memory bounded by the batch, not the files); the first bad line raises.
    ``progress(file, bytes)`` after each batch and file: the bytes read of that file."""
    if kind not in FORMATS:
        raise AnalyticsError(f"import: unknown kind {one_line(kind, 40)!r} (known: {', '.join(FORMATS)})")
    batch = batch or BATCH
    out: list[dict[str, Any]] = []
    total = 0
    for i, path in enumerate(files):
        with csvstream.open_regular(path, MAX_FILE, f"a {kind} CSV file") as f:
            lines = csvstream.Lines(f, str(path), MAX_FILE)
            mtime = dt.datetime.fromtimestamp(os.fstat(f.fileno()).st_mtime, dt.timezone.utc).replace(tzinfo=None)
            for rec in _rows(kind, csvstream.reader(lines, str(path)), str(path), mtime):
                total += 1
                if total > MAX_ROWS:
                    raise AnalyticsError(f"import: more than {MAX_ROWS} rows in all: import fewer files at once")
                rec["file"] = i
                out.append(rec)
                if len(out) >= batch:
                    if progress:
                        progress(path, lines.done)
                    yield out
                    out = []
            if progress:
                progress(path, lines.done)
    if out:
        yield out


def read(kind: str, paths: Sequence[str | Path]) -> Records:
    """Every record of ``paths`` (files, or directories whose ``*.csv`` are taken), checked,
    in one list (small imports and tests; the CLI streams)."""
    files = find(paths)
    return Records(kind, [r for b in stream(kind, files) for r in b], len(files))


def check(kind: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records that came over the API, checked as a file's are (ids recomputed: a client
    does not choose them)."""
    if kind not in FORMATS:
        raise AnalyticsError(f"import: unknown kind {one_line(kind, 40)!r} (known: {', '.join(FORMATS)})")
    if len(rows) > MAX_ROWS:
        raise AnalyticsError(f"import: more than {MAX_ROWS} records")
    cols = FORMATS[kind]

    def lines() -> Iterator[tuple[int, list[str]]]:  # as a file's: a header, then line 2 on
        yield 1, [c.name for c in cols]
        for i, r in enumerate(rows):
            if not isinstance(r, dict):
                raise AnalyticsError("import: each record must be an object")
            yield i + 2, ["" if r.get(c.name) is None else str(r.get(c.name)) for c in cols]

    def as_of(line: int) -> Any:  # a running VM's censoring time, as the client read its file's
        from .lives import time_value

        v = rows[line - 2].get("as_of")
        if not v:
            return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)  # sent now: alive now
        return time_value(str(v), "as_of", f"import: line {line}")

    out = list(_rows(kind, lines(), "import", as_of))
    per_file: dict[Any, csvstream.Repeats] = {}
    for rec, r in zip(out, rows, strict=True):  # ids per file; the file's name and line as the client read them
        f = r.get("file") if isinstance(r.get("file"), int) else 0
        key = _key(kind, rec)
        n = r.get("repeat")  # a client sending a large file in parts numbers repeats across them
        if not (isinstance(n, int) and not isinstance(n, bool) and 0 <= n < MAX_ROWS):
            n = per_file.setdefault(f, csvstream.Repeats()).number(key)
        rec["repeat"] = n
        rec["id"] = csvstream.record_id(kind, key, n)
        src, line = r.get("source"), r.get("line")
        rec["source"] = one_line(str(src), 120) if src else "api"
        rec["line"] = line if isinstance(line, int) and 0 < line < 1 << 31 else None
    return out


def store(db: Database, kind: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Store checked records in one transaction (writes); (stored, duplicates)."""
    return store_batches(db, kind, [rows] if rows else [])


def store_batches(db: Database, kind: str, batches: Iterable[list[dict[str, Any]]]) -> dict[str, Any]:
    """Store batches of checked records (``stream``'s, read while stored) in one
    transaction: a bad line anywhere stores nothing; a record already stored, or twice in
    these batches, is counted a duplicate."""
    import pyarrow as pa

    from ..queries import needs_schema

    table = TABLES[kind]
    cols = [c.name for c in FORMATS[kind]] + list(EXTRA.get(kind, ())) + ["id", "source", "line"]
    n = 0
    with db.write() as con:
        needs_schema(con, SCHEMA[kind], f"analyze import {kind}")
        before = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        con.execute("BEGIN TRANSACTION")
        try:
            for rows in batches:
                n += len(rows)
                con.register("incoming", pa.table({c: [r.get(c) for r in rows] for c in cols}))
                try:
                    con.execute(f"""INSERT INTO {table} ({", ".join(cols)}, imported_at)
                                    SELECT DISTINCT ON (i.id) {", ".join("i." + c for c in cols)}, now()::TIMESTAMP
                                    FROM incoming i ANTI JOIN {table} t ON t.id = i.id""")
                finally:
                    con.unregister("incoming")
            after = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    return {"kind": kind, "records": n, "stored": after - before, "duplicates": n - (after - before)}
