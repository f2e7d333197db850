"""Which files of an ``analyze import tensorboard`` go to which job.

One job (``--job NAME``), one job per run (``--job 'PREFIX{run}'``: a pattern), or one job
per row of a manifest CSV (``--manifest FILE``: ``file``, ``job`` and the job's declaration,
the columns CM-DARE's ``jobs.csv`` has). Everything here is checked before any file is
read: a bad pattern, row or path is one line, and nothing is stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cmdare.wire.events import ROLES

from .. import csvstream
from ..db import AnalyticsError
from ..output import one_line
from .tbimport import find_files

MAX_MANIFEST = 4 << 20  # bytes of a manifest CSV
MAX_JOBS = 10_000  # jobs one import makes (manifest rows, or runs under a pattern)
MAX_NAME = 200  # characters of a job, run, node, model or accelerator name in a manifest
RUN = "{run}"

# manifest column -> (train_job field, kind, least value); the names are the CLI's flags
DECLARE = {
    "gpu_type": ("accelerator", str, None),
    "workers": ("world_size", int, 1),
    "ps": ("ps", int, 0),
    "model": ("model", str, None),
    "params": ("params", int, 0),
    "tensors": ("tensors", int, 0),
    "flops_per_step": ("flops_per_step", float, 0),
    "batch_size": ("batch_size", int, 1),
}
PER_ROW = {"run": str, "node": str, "role": str, "rank": int}  # prepare_tensorboard options
COLUMNS = ("file", "job", *PER_ROW, *DECLARE)


@dataclass
class JobImport:
    """One job of an import: its files (as find_files gives them) and the keyword options
    of prepare_tensorboard (node, role, run, rank, tags, declare)."""

    job: str
    files: list[tuple[Path, str, str]]
    options: dict[str, Any] = field(default_factory=dict)


def plan(paths: list[str], job: str | None, manifest: str | None, **options: Any) -> list[JobImport]:
    """The jobs to import and their files; ``options`` are prepare_tensorboard's, the
    command line's for every job (a manifest's cells override them per row)."""
    if manifest:
        if paths:
            raise AnalyticsError("give PATHS or --manifest, not both (the manifest names the files)")
        return read_manifest(Path(manifest), job, options)
    if not paths:
        raise AnalyticsError("nothing to import: give event files, CSV exports or directories (or --manifest CSV)")
    if not job:
        raise AnalyticsError("--job is required: a job name, a pattern with {run} in it, or use --manifest")
    if not is_pattern(job):
        return [JobImport(job, find_files(paths), options)]
    groups: dict[str, list[tuple[Path, str, str]]] = {}
    for root in paths:
        for f in find_files([root]):
            name = job.replace(RUN, options.get("run") or run_name(f, Path(root)))
            groups.setdefault(name, []).append(f)
    if len(groups) > MAX_JOBS:
        raise AnalyticsError(f"--job {one_line(job, 40)!r} makes {len(groups):,} jobs: at most {MAX_JOBS:,}")
    return [JobImport(name, fs, options) for name, fs in groups.items()]


def is_pattern(job: str) -> bool:
    """Whether ``--job`` is a pattern; braces other than ``{run}`` are one line."""
    rest = job.replace(RUN, "")
    if "{" in rest or "}" in rest:
        raise AnalyticsError(f"--job {one_line(job, 40)!r}: the one placeholder is {RUN} (the run's name)")
    return rest != job


def run_name(f: tuple[Path, str, str], root: Path) -> str:
    """The name ``{run}`` stands for: the file's run; for a run named "." (files right in
    the directory given, or a file given alone) the directory's name, or a CSV export's
    own stem when the file was given by itself."""
    path, kind, run = f
    if run != ".":
        return run
    if kind == "csv" and not root.is_dir():
        return path.stem
    return (root if root.is_dir() else path.parent).resolve().name


def read_manifest(path: Path, pattern: str | None, options: dict[str, Any]) -> list[JobImport]:
    """One JobImport per job named in the manifest: rows naming the same job are merged
    (their declarations must agree); a file listed twice is refused."""
    name = one_line(str(path), 80)
    if pattern and not is_pattern(pattern):
        raise AnalyticsError("--job with --manifest must be a pattern with {run} (for rows with no job), "
                             "or be left out")
    jobs: dict[str, JobImport] = {}
    declared: dict[str, tuple[int, dict[str, Any]]] = {}
    seen: dict[Path, int] = {}
    with csvstream.open_regular(path, MAX_MANIFEST, "a manifest CSV") as fh:
        rows = csvstream.reader(csvstream.Lines(fh, name, MAX_MANIFEST), name)
        first = next(rows, None)
        if first is None:
            raise AnalyticsError(f"{name}: empty: a manifest has a header line ({', '.join(COLUMNS[:2])}, ...) "
                                 "and one row per file")
        cols = csvstream.header(first[1], name, ["file"] if pattern else ["file", "job"], "manifest")
        for line, row in rows:
            where = f"{name}: line {line}"

            def cell(c: str, row: list[str] = row) -> str:
                i = cols.get(c)
                return row[i].strip() if i is not None and i < len(row) else ""

            file = cell("file")
            if not file:
                raise AnalyticsError(f"{where}: the file is empty")
            fp = Path(file) if Path(file).is_absolute() else path.parent / file
            key = fp.resolve()
            if key in seen:
                raise AnalyticsError(f"{where}: {one_line(file, 60)} is listed again (line {seen[key]})")
            seen[key] = line
            try:
                files = find_files([fp])
            except AnalyticsError as e:
                raise AnalyticsError(f"{where}: {e}") from None
            opts = {**options, "declare": {**(options.get("declare") or {})}}
            for c, kind in PER_ROW.items():
                if cell(c):
                    opts[c] = _value(where, c, cell(c), kind, 0)
            if opts.get("role", "worker") not in ROLES:
                raise AnalyticsError(f"{where}: role must be one of {', '.join(ROLES)}")
            for c, (fname, kind, least) in DECLARE.items():
                if cell(c):
                    opts["declare"][fname] = _value(where, c, cell(c), kind, least)
            job = cell("job")
            if not job and not pattern:
                raise AnalyticsError(f"{where}: the job is empty (or give --job with {RUN} for rows with none)")
            if len(job) > MAX_NAME:
                raise AnalyticsError(f"{where}: job longer than {MAX_NAME} characters")
            named = [(job or str(pattern).replace(RUN, opts.get("run") or run_name(f, fp)), f) for f in files]
            for j in sorted({n for n, _ in named}):
                mine = [f for n, f in named if n == j]
                if j in declared and declared[j][1] != opts:
                    raise AnalyticsError(f"{where}: job {one_line(j, 40)!r} is declared differently "
                                         f"on line {declared[j][0]}")
                declared.setdefault(j, (line, opts))
                jobs.setdefault(j, JobImport(j, [], opts)).files.extend(mine)
            if len(jobs) > MAX_JOBS:
                raise AnalyticsError(f"{where}: more than {MAX_JOBS:,} jobs in one manifest")
    if not jobs:
        raise AnalyticsError(f"{name}: no rows: nothing to import")
    return list(jobs.values())


def _value(where: str, column: str, text: str, kind: type, least: float | None) -> Any:
    """A manifest cell as ``kind``: a name bounded in length, a number finite and in range."""
    if kind is str:
        if len(text) > MAX_NAME or any(ord(ch) < 32 for ch in text):
            raise AnalyticsError(f"{where}: {column} must be a name of at most {MAX_NAME} printable characters")
        return text
    try:
        v = kind(text)
    except ValueError:
        v = None
    if v is None or not math.isfinite(v) or (least is not None and v < least) or abs(v) > 1e30:
        at_least = f" of at least {least}" if least is not None else ""
        raise AnalyticsError(f"{where}: {column} must be a {'whole ' if kind is int else ''}number{at_least}, "
                             f"got {one_line(text, 30)!r}")
    return v
