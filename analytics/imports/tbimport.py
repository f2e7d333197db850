"""``analyze import tensorboard``: historical runs as step telemetry of a job.

Event files (``events.out.tfevents.*``) and TensorBoard UI CSV exports (``Wall time,Step,
Value``) are read in full and checked before anything is written; then the job
declaration, the ``global_step/sec`` points (as ``steps`` intervals) and every other scalar
(``scalars``) go to the database in one transaction through the collector's writer, so an
import is all or nothing.  Event ids are derived from the job and the points, so importing
the same files again (or files the agent's ``tensorboard`` source already streamed) stores
nothing twice.
"""

from __future__ import annotations

import hashlib
import io
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from cmdare.collector.writer import Writer
from cmdare.wire.events import DATA_FIELDS, ROLES, EventFactory, InvalidEvent, encode, validate
from cmdare.wire.tbevents import (
    EXAMPLES_TAG,
    STEPS_TAG,
    Point,
    StepConverter,
    TensorBoardError,
    csv_run,
    csv_tag,
    point_id,
    read_csv,
    read_event_file,
)

from .. import csvstream
from ..db import AnalyticsError

MAX_FILE = 512 << 20  # bytes of one event file or CSV export (read whole)
MAX_POINTS = 5_000_000  # scalar points one import holds


@dataclass
class ImportResult:
    files: int = 0
    points: int = 0
    steps: int = 0  # step intervals (rows of steps) stored
    scalars: int = 0
    duplicates: int = 0
    runs: list[str] = field(default_factory=list)


def find_files(paths: Sequence[str | Path]) -> list[tuple[Path, str, str]]:
    """``[(file, "event" | "csv", run)]`` for the given files and directories (walked)."""
    out: list[tuple[Path, str, str]] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise AnalyticsError(f"{p}: no such file or directory")
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and ("tfevents" in f.name or f.suffix.lower() == ".csv")
            )
            if not found:
                raise AnalyticsError(
                    f"{p}: no TensorBoard event files (events.out.tfevents.*) or CSV exports"
                )
            csvs = Counter(f.parent for f in found if "tfevents" not in f.name)
            for f in found:
                rel = f.parent.relative_to(p).as_posix()
                kind = "event" if "tfevents" in f.name else "csv"
                # a directory of event files is one run (TensorBoard's layout), as is one CSV
                # export alone in its directory; a CSV beside others is the run its
                # run-<run>-tag-<tag>.csv name gives, else its own path under the directory
                # without .csv (so a folder of exports is that many runs, not one named ".")
                run = rel if kind == "event" else csv_run(f) or (
                    rel if csvs[f.parent] == 1 else f.relative_to(p).with_suffix("").as_posix())
                out.append((f, kind, run))
        elif "tfevents" in p.name:
            out.append((p, "event", "."))
        elif p.suffix.lower() == ".csv":
            out.append((p, "csv", csv_run(p) or "."))
        else:
            raise AnalyticsError(
                f"{p}: not a TensorBoard event file (events.out.tfevents.*) or CSV export (*.csv)"
            )
    return out


def drop_stored(con: duckdb.DuckDBPyConnection, job: str, lines: list[bytes]) -> tuple[list[bytes], int]:
    """``lines`` less the events ``job`` already has stored under the same id, from any node:
    import ids are derived from the points, so a point the agent's ``tensorboard`` source
    streamed (its node's) is the same event as the one an import of its file makes (the
    ``import`` node's). The writer's identity is (node, id): this is the one place where an
    id alone identifies an event, and only within the importing job. (kept, dropped)."""
    import json

    from cmdare.wire.registry import TABLES

    by_type: dict[str, list[str]] = defaultdict(list)
    parsed = []
    for line in lines:
        ev = json.loads(line)
        parsed.append(ev)
        by_type[ev.get("type", "")].append(str(ev.get("id", "")))
    have: set[tuple[str, str]] = set()
    for t, ids in by_type.items():
        table = TABLES.get(t)
        if table is None:
            continue
        have |= {(t, i) for (i,) in con.execute(
            f"SELECT DISTINCT id FROM {table} WHERE job = ? AND id IN (SELECT unnest(?::VARCHAR[]))",
            [job, ids]).fetchall()}
    kept = [line for line, ev in zip(lines, parsed, strict=True) if (ev.get("type"), str(ev.get("id"))) not in have]
    return kept, len(lines) - len(kept)


def import_tensorboard(
    con: duckdb.DuckDBPyConnection, paths: Sequence[str | Path], job: str, **options: Any
) -> ImportResult:
    """Read, check and store; raises AnalyticsError (one line) with nothing written."""
    lines, res = prepare_tensorboard(paths, job, **options)  # the options: prepare_tensorboard's
    lines, stored = drop_stored(con, job, lines)
    w = Writer(con).write([(f"import:{job}", b"".join(lines))])
    if w.dead:  # validated above, so this is a bug; the rows went to dead_letters, not lost
        raise AnalyticsError(f"{w.dead} imported events were rejected by the writer; see dead_letters")
    res.steps = w.rows.get("steps", 0)
    res.scalars = w.rows.get("scalars", 0)
    res.duplicates = w.duplicates + stored
    return res


def prepare_tensorboard(
    paths: Sequence[str | Path],
    job: str,
    node: str = "import",
    role: str = "worker",
    run: str | None = None,
    rank: int = 0,
    csv_tag_: str | None = None,
    steps_tag: str = STEPS_TAG,
    examples_tag: str = EXAMPLES_TAG,
    declare: dict[str, Any] | None = None,
    progress: Callable[[Path], None] | None = None,
    files: list[tuple[Path, str, str]] | None = None,
) -> tuple[list[bytes], ImportResult]:
    """Read and check every file (``files`` as find_files gives them, else those under
    ``paths``): the wire-format events to store (JSON lines) and the counts so far (files,
    points, runs); AnalyticsError (one line) for a bad file. ``progress`` is called with
    each file once it is read."""
    if not job:
        raise AnalyticsError("--job must not be empty")
    if role not in ROLES:
        raise AnalyticsError(f"--role must be one of {', '.join(ROLES)}, got {role!r}")
    files = find_files(paths) if files is None else files
    res = ImportResult(files=len(files))
    per_run: dict[str, list[tuple[Point, str]]] = defaultdict(list)
    for path, kind, file_run in files:
        try:
            with csvstream.open_regular(path, MAX_FILE, "a TensorBoard event file or CSV export") as fh:
                if kind == "event":
                    data = fh.read(MAX_FILE + 1)
                    if len(data) > MAX_FILE:
                        raise AnalyticsError(f"{path}: larger than {MAX_FILE >> 20} MiB (it grew while read)")
                    pts = read_event_file(path, data)
                else:
                    text = io.TextIOWrapper(fh, encoding="utf-8-sig", newline="")
                    pts = read_csv(path, csv_tag_ or csv_tag(path, steps_tag), text)
        except TensorBoardError as e:
            raise AnalyticsError(str(e)) from None
        except OSError as e:
            raise AnalyticsError(f"{path}: cannot read: {e.strerror or e}") from None
        if progress:
            progress(path)
        source = path.name  # ids depend on the file's name, not where it sits now
        per_run[run or file_run] += [(p, source) for p in pts]
        res.points += len(pts)
        if res.points > MAX_POINTS:  # each point is held (a run's steps are ordered whole)
            raise AnalyticsError(f"import: more than {MAX_POINTS:,} scalar points: import fewer files at once")
    if not res.points:
        raise AnalyticsError(f"no scalar points in {len(files)} file(s): nothing to import")

    f = EventFactory(node, role, job)
    lines: list[bytes] = []

    def add(type_: str, data: dict[str, Any], ts: float, id_: str) -> None:
        ev = f.make(type_, data, ts)
        ev["id"] = id_
        try:
            validate(ev)
        except InvalidEvent as e:
            raise AnalyticsError(f"cannot import {type_} at {ts}: {e}") from None
        lines.append(encode(ev))

    first_ts = min(p.wall for pts in per_run.values() for p, _ in pts)
    known = DATA_FIELDS["train_job"]
    decl = {k: v for k, v in (declare or {}).items() if v not in (None, "") and k in known}
    decl.setdefault("role", role)
    for r in sorted(per_run):
        jd = {"run": r, "rank": rank, "framework": "tensorboard", **decl}
        h = hashlib.sha1(repr((job, node, sorted(jd.items()))).encode()).hexdigest()[:40]
        add("train_job", jd, first_ts, f"tbjob-{h}")
    for r, pts in sorted(per_run.items()):
        res.runs.append(r)
        pts.sort(key=lambda x: (x[0].wall, x[0].step))
        conv = StepConverter(r, rank, steps_tag, examples_tag)
        sources = {id(p): s for p, s in pts}
        for ts, data, p in conv.feed([p for p, _ in pts]):
            add("train_steps", data, ts, point_id(job, sources[id(p)], p))
        for p, s in pts:
            if p.tag not in (steps_tag, examples_tag):
                add(
                    "train_scalar",
                    {"run": r, "rank": rank, "tag": p.tag, "step": p.step, "value": p.value},
                    p.wall,
                    point_id(job, s, p),
                )
    return lines, res
