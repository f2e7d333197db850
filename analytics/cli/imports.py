"""``analyze import tensorboard``: historical runs as a job's step telemetry."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Any

import click

from cmdare.wire.events import ROLES
from cmdare.wire.tbevents import EXAMPLES_TAG, STEPS_TAG

from .. import api
from ..db import AnalyticsError
from ..imports.overheads import FORMATS
from ..imports.tbplan import is_pattern
from .client import Remote
from .common import call, cli, database_or_remote, db_option, json_object_option
from .render import fold


@cli.group(name="import")
def import_() -> None:
    """Load historical runs into the database: into the file itself, or, while a collector
    serves it, through that collector's API (analyze finds it; an admin-scope token).

    \b
    Examples:
      analyze import tensorboard runs/ --job resnet50-a --gpu-type v100 --workers 4
      analyze import checkpoints checkpoints.csv
      analyze import startups startups/
      analyze import lives lives.csv
    """


@import_.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--job", help="job the runs are stored under; with {run} in it, one job per run (see below)")
@click.option("--manifest", type=click.Path(dir_okay=False),
              help="CSV naming each file's job and declaration (see below); instead of PATHS")
@click.option("--node", default="import", show_default=True, help="node the runs ran on")
@click.option("--role", type=click.Choice(ROLES), default="worker", show_default=True)
@click.option("--run", help="run id for all files (default: each file's run, see below)")
@click.option("--rank", type=click.IntRange(0), default=0, show_default=True)
@click.option("--gpu-type", help="accelerator type, e.g. v100, k80, tpu-v3")
@click.option("--workers", type=click.IntRange(1), help="number of workers")
@click.option("--ps", type=click.IntRange(0), help="number of parameter servers")
@click.option("--model", help="model name")
@click.option("--params", type=click.IntRange(0), help="parameter count")
@click.option("--tensors", type=click.IntRange(0), help="number of parameter tensors")
@click.option("--flops-per-step", type=click.FloatRange(0), help="FLOPs per training step")
@click.option("--batch-size", type=click.IntRange(1), help="per-worker batch size")
@click.option(
    "--tag", "csv_tag_", help="tag of the CSV files (default: from run-X-tag-Y.csv names, else the steps tag)"
)
@click.option("--steps-tag", default=STEPS_TAG, show_default=True, help="scalar holding the step rate")
@click.option("--examples-tag", default=EXAMPLES_TAG, show_default=True, help="scalar holding examples/s")
@db_option
@json_object_option
def tensorboard(paths: tuple[str, ...], job: str | None, manifest: str | None, db: str, as_json_: bool,
                **o: Any) -> None:
    """Import TensorBoard event files or UI CSV exports (Wall time,Step,Value) from PATHS
    (files or directories, walked) as step telemetry of a job, or of one job per run.

    global_step/sec becomes step intervals (analyze jobs / steps use them); every other
    scalar goes to the scalars table. Every file is checked before anything is written: a
    malformed one stops the import with its name and record or line, and nothing is
    stored. Importing the same points again stores nothing twice.

    \b
    Runs: a directory of event files, or of one CSV export, is one run named by its path
    under PATH ("." right in PATH); a CSV export beside others is the run its
    run-<run>-tag-<tag>.csv name gives, else its own path under PATH without .csv, so a
    folder of exports is that many runs.

    \b
    Many jobs in one command:
      --job 'cmdare-{run}'   one job per run; {run} is the run's name ("." becomes the
                             directory's name, or the CSV file's stem)
      --manifest jobs.csv    one job per row: columns file (relative to the manifest),
                             job (or --job with {run}), and optionally run, node, role,
                             rank, gpu_type, workers, ps, model, params, tensors,
                             flops_per_step, batch_size (the flags' names); others ignored.
                             Flags given apply to every row; a row's cells override them.

    \b
    Examples:
      analyze import tensorboard runs/resnet50-k80x4 --job resnet50-k80x4 \\
          --gpu-type k80 --workers 4 --ps 1 --model resnet50 --batch-size 32
      analyze import tensorboard logs/ --job 'sweep-{run}' --gpu-type v100
      analyze import tensorboard --manifest jobs.csv
    """
    from ..imports import tbimport
    from ..imports.tbplan import plan

    declare = {"accelerator": o.pop("gpu_type"), "world_size": o.pop("workers"), "ps": o.pop("ps"),
               "model": o.pop("model"), "params": o.pop("params"), "tensors": o.pop("tensors"),
               "flops_per_step": o.pop("flops_per_step"), "batch_size": o.pop("batch_size")}
    call(db, api.import_events, job="import", lines=[])  # the database first: a bad --db says so before reading
    try:
        jobs = plan(list(paths), job, manifest, declare=declare, **o)
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    prepared = []
    try:  # read and check every file here; then one call a job stores them (locally, or in the collector)
        files = [f for j in jobs for f, _, _ in j.files]
        with Progress("reading", files) as shown:
            points = 0
            for j in jobs:
                lines, res = tbimport.prepare_tensorboard(
                    (), j.job, files=j.files, progress=lambda p: shown(p, shown.sizes[p]), **j.options)
                points += res.points
                if points > tbimport.MAX_POINTS:  # every job's events are held until all are checked
                    raise AnalyticsError(f"import: more than {tbimport.MAX_POINTS:,} scalar points: import fewer files at once")
                prepared.append((j.job, lines, res))
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    target = database_or_remote(db)
    try:
        if isinstance(target, Remote):  # one call a job; the jobs before a failed one stay stored
            got = []
            for i, (name, lines, _) in enumerate(prepared):
                try:
                    got.append(target.call("import_events", job=name, lines=lines))
                except AnalyticsError as e:
                    raise AnalyticsError(f"{e} (jobs stored before it: {i} of {len(prepared)}; importing again "
                                         "stores nothing twice)" if i else str(e)) from None
        else:
            got = api.import_jobs(target, [(name, lines) for name, lines, _ in prepared])
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    outs = [{"job": name, "files": res.files, "points": res.points, "runs": res.runs, "steps": g["steps"],
             "scalars": g["scalars"], "duplicates": g["duplicates"]} for (name, _, res), g in zip(prepared, got, strict=True)]
    if len(outs) == 1 and not manifest and not is_pattern(job or ""):
        out: dict[str, Any] = outs[0]
    else:
        out = {"jobs": outs, **{k: sum(x[k] for x in outs) for k in ("files", "points", "steps", "scalars", "duplicates")}}
    if as_json_:
        click.echo(json.dumps(out))
        return
    for x in outs:
        click.echo(fold(f"imported job {x['job']}: {x['files']} file(s), runs {', '.join(x['runs'])}: {x['steps']} "
                        f"step intervals, {x['scalars']} scalars stored ({x['duplicates']} already there)"))
    if "jobs" in out:
        click.echo(f"{len(outs)} jobs, {out['files']} file(s): {out['steps']} step intervals, {out['scalars']} "
                   f"scalars stored ({out['duplicates']} already there)")


class Progress:
    """Where a long import stands: a bar over the files' bytes on a terminal (several files,
    or one over 4 MiB); in a log, one line a file and one every ``every`` seconds within a
    large one."""

    every = 10.0  # seconds between lines in a log

    def __init__(self, label: str, files: list[Path]) -> None:
        import time

        self.label, self.files, self.clock = label, files, time.monotonic
        self.sizes = {p: max(p.stat().st_size, 1) if p.is_file() else 1 for p in files}
        self.total = sum(self.sizes.values())
        self.shown = {p: 0 for p in files}
        self.bar: Any = None
        self.last = self.clock()

    def __enter__(self) -> Progress:
        if sys.stderr.isatty() and (len(self.files) > 1 or self.total > 4 << 20):
            self.bar = click.progressbar(length=self.total, label=self.label, file=sys.stderr,
                                         item_show_func=lambda p: p and Path(p).name).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, path: Path, done: int) -> None:
        done = min(done, self.sizes[path])
        step, self.shown[path] = done - self.shown[path], done
        if self.bar is not None:
            self.bar.update(step, str(path))
            return
        finished = done >= self.sizes[path]
        if (finished and len(self.files) > 1) or (not finished and self.clock() - self.last >= self.every):
            self.last = self.clock()
            i = self.files.index(path) + 1
            pct = f"{100 * done / self.sizes[path]:.0f} %" if not finished else "read"
            click.echo(f"{self.label}: {path.name} ({i}/{len(self.files)}) {pct}".replace(" read", ""), err=True)


def _overheads(kind: str, paths: tuple[str, ...], db: str, as_json_: bool) -> None:
    """Local or lake: read and stored in one transaction, a batch at a time. Through a
    collector: checked whole here first (nothing sent if a line is bad), then sent in
    batches; a batch the collector has is a duplicate if sent again."""
    from ..imports import overheads

    target = database_or_remote(db)
    try:
        if isinstance(target, Remote):
            target.call("import_overheads", kind=kind, records=[])  # reachable, and allowed to write
            files = overheads.find(paths)
            with Progress(f"checking {kind}", files) as p:
                for _ in overheads.stream(kind, files, progress=p):
                    pass
            out = {"kind": kind, "records": 0, "stored": 0, "duplicates": 0}
            with Progress(f"sending {kind}", files) as p:
                for batch in overheads.stream(kind, files, progress=p):
                    got = target.call("import_overheads", kind=kind, records=[_sent(r) for r in batch])
                    for k in ("records", "stored", "duplicates"):
                        out[k] += got[k]
        else:
            files = overheads.find(paths)
            with Progress(f"reading {kind}", files) as p:
                out = overheads.store_batches(target, kind, overheads.stream(kind, files, progress=p))
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    out["files"] = len(files)
    if as_json_:
        click.echo(json.dumps(out))
    else:
        what = "spot VM li" if kind == "lives" else kind[:-1] + " record"
        click.echo(f"imported {out['stored']} {what}{'ves' if kind == 'lives' else '(s)'} from {len(files)} file(s)"
                   + (f"; {out['duplicates']} already stored" if out["duplicates"] else "")
                   + f" (analyze fit {'lifetime' if kind == 'lives' else 'overhead'} fits them)")


def _sent(r: dict[str, Any]) -> dict[str, Any]:
    """A record as the API takes it: its values, file, line and repeat number (the
    collector computes its id again)."""
    return {k: v for k, v in r.items() if k != "id" and v is not None}


_FORMAT_HELP = {
    kind: "\n".join(f"  {c.name:15} {'required' if c.required else 'optional'}: {c.help}" for c in cols)
    for kind, cols in FORMATS.items()
}


@import_.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@db_option
@json_object_option
def checkpoints(paths: tuple[str, ...], db: str, as_json_: bool) -> None:
    """Import checkpoint saves from CSV files (or directories of them): one save a row.

    Columns (others ignored; a header line names them):

    \b
    {fmt}

    Every file is checked before anything is written (a missing column or a bad value: one
    line with the file, line and column, nothing stored); importing a file again stores
    nothing twice. Then `analyze fit overhead` fits save time from size (and tensors /
    params) and `analyze predict checkpoint` uses it.

    \b
    Example:
      analyze import checkpoints checkpoints.csv
    """
    _overheads("checkpoints", paths, db, as_json_)


@import_.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@db_option
@json_object_option
def startups(paths: tuple[str, ...], db: str, as_json_: bool) -> None:
    """Import cloud VM start-ups from CSV files (or directories of them): one VM a row, in
    the phases the cloud reports.

    Columns (others ignored; a header line names them):

    \b
    {fmt}

    Checked whole before anything is written; importing again stores nothing twice. Then
    `analyze fit overhead` fits start-up by region, purchase option and accelerator and
    `analyze predict startup` uses it.

    \b
    Example:
      analyze import startups startup.csv
    """
    _overheads("startups", paths, db, as_json_)


@import_.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@db_option
@json_object_option
def lives(paths: tuple[str, ...], db: str, as_json_: bool) -> None:
    """Import spot VM lives from CSV files (or directories of them): one VM life a row,
    with lifetime_s, or created and ended as a cloud's instance log gives them.

    Columns (others ignored; a header line names them):

    \b
    {fmt}

    ended_by: preempted is a revocation; max_lifetime (the provider's cap), deleted and
    running (ended may be empty: alive at the file's modification time) are lives that did
    not end in one. Checked a line at a time, stored in one transaction; importing again
    stores nothing twice; a VM exported again in a later state counts in its final state.
    Then `analyze fit lifetime` fits them with the lives the agents recorded, and
    `analyze predict revocation` and `analyze recommend region` use them.

    \b
    Examples:
      analyze import lives lives.csv
      analyze import lives gce-instances/ --json
    """
    _overheads("lives", paths, db, as_json_)


checkpoints.help = inspect.cleandoc(checkpoints.help or "").replace("{fmt}", _FORMAT_HELP["checkpoints"])
lives.help = inspect.cleandoc(lives.help or "").replace("{fmt}", _FORMAT_HELP["lives"])
startups.help = inspect.cleandoc(startups.help or "").replace("{fmt}", _FORMAT_HELP["startups"])


@import_.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--job", required=True, help="job id the traces are stored under")
@db_option
@json_object_option
def trace(paths: tuple[str, ...], job: str, db: str, as_json_: bool) -> None:
    """Import PyTorch profiler (Kineto) traces from PATHS (.json or .json.gz files, one a
    rank, or directories of them) as JOB's traces; `analyze trace --job JOB` reads them.

    Each file's rank and world size come from its distributedInfo. Every file is read and
    reduced first (a bad one: one line, nothing stored); each rank then replaces that rank's
    trace of the job, and a file imported again changes nothing. A file is at most 1 GiB
    (512 MiB of JSON once decompressed), read by DuckDB within 2 GB of memory.

    \b
    Example:
      analyze import trace traces/ --job ddp-resnet
    """
    target = database_or_remote(db)
    n = len(paths)

    def shown(path: Path, i: int, total: int) -> None:
        if total > 1 or n > 1:
            click.echo(f"reading: {path.name} ({i}/{total})", err=True)

    try:
        if isinstance(target, Remote):  # read and reduced here, then one request a rank
            out = _trace_through(target, job, paths, shown)
        else:
            out = api.import_trace(target, job, list(paths), progress=shown)
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    if as_json_:
        click.echo(json.dumps(out))
        return
    click.echo(fold(f"imported job {job}: {out['files']} file(s), ranks {', '.join(map(str, out['ranks']))}: "
                    f"{out['kernels']:,} GPU kernels stored" + (f" ({out['unchanged']} rank(s) unchanged)"
                                                                if out["unchanged"] else "")
                    + f" (analyze trace --job {job} reads them)"))


def _trace_through(target: Remote, job: str, paths: tuple[str, ...], shown: Any) -> dict[str, Any]:
    """Every file read and reduced here first (a bad one: nothing sent), then each rank sent
    to the collector holding the database; a failure says how many ranks it had stored."""
    from ..imports import traces

    ranks = traces.read_all(paths, shown)
    out: dict[str, Any] = {"job": job, "ranks": [], "kernels": 0, "unchanged": 0, "files": len(ranks)}
    for i, t in enumerate(ranks):
        try:
            got = target.call("import_trace_rank", job=job, rank=traces.payload(t))
        except AnalyticsError as e:
            raise AnalyticsError(f"{e} (ranks stored before it: {i} of {len(ranks)}; importing again "
                                 "stores nothing twice)" if i else str(e)) from None
        out["ranks"] += got["ranks"]
        out["kernels"] += got["kernels"]
        out["unchanged"] += got["unchanged"]
    return out
