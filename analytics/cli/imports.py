"""``analyze import tensorboard``: historical runs as a job's step telemetry."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from cmdare.wire.events import ROLES
from cmdare.wire.tbevents import EXAMPLES_TAG, STEPS_TAG

from .. import api
from ..client import Remote
from ..db import AnalyticsError
from ..overheads import FORMATS
from .common import call, cli, database_or_remote, db_option, json_option


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
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--job", required=True, help="job id the runs are stored under")
@click.option("--node", default="import", show_default=True, help="node the runs ran on")
@click.option("--role", type=click.Choice(ROLES), default="worker", show_default=True)
@click.option("--run", help="run id for all files (default: each file's directory under PATH)")
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
@json_option
def tensorboard(paths: tuple[str, ...], job: str, db: str, as_json_: bool, **o: Any) -> None:
    """Import TensorBoard event files or UI CSV exports (Wall time,Step,Value) from PATHS
    (files or directories, walked) as step telemetry of JOB.

    global_step/sec becomes step intervals (analyze jobs / steps use them); every other
    scalar goes to the scalars table. Every file is checked before anything is written: a
    malformed one stops the import with its name and record or line, and nothing is
    stored. Importing the same points again stores nothing twice.

    \b
    Example:
      analyze import tensorboard runs/resnet50-k80x4 --job resnet50-k80x4 \\
          --gpu-type k80 --workers 4 --ps 1 --model resnet50 --batch-size 32
    """
    from ..tbimport import prepare_tensorboard

    declare = {"accelerator": o["gpu_type"], "world_size": o["workers"], "ps": o["ps"], "model": o["model"],
               "params": o["params"], "tensors": o["tensors"], "flops_per_step": o["flops_per_step"],
               "batch_size": o["batch_size"]}
    call(db, api.import_events, job=job, lines=[])  # the database first: a bad --db says so before any reading
    try:  # read and check every file here; then one call stores them (locally, or in the collector)
        lines, res = prepare_tensorboard(
            paths, job, node=o["node"], role=o["role"], run=o["run"], rank=o["rank"], csv_tag_=o["csv_tag_"],
            steps_tag=o["steps_tag"], examples_tag=o["examples_tag"], declare=declare,
            progress=lambda p: (
                click.echo(f"reading {p}", err=True) if len(paths) > 1 or Path(paths[0]).is_dir() else None
            ),
        )
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    stored = call(db, api.import_events, job=job, lines=lines)
    out = {
        "job": job,
        "files": res.files,
        "points": res.points,
        "runs": res.runs,
        "steps": stored["steps"],
        "scalars": stored["scalars"],
        "duplicates": stored["duplicates"],
    }
    if as_json_:
        click.echo(json.dumps(out))
    else:
        click.echo(
            f"imported job {job}: {res.files} file(s), runs {', '.join(res.runs)}: {out['steps']} step intervals, "
            f"{out['scalars']} scalars stored ({out['duplicates']} already there)"
        )


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
    from .. import overheads

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
@json_option
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
@json_option
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
@json_option
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


checkpoints.help = (checkpoints.help or "").replace("{fmt}", _FORMAT_HELP["checkpoints"])
lives.help = (lives.help or "").replace("{fmt}", _FORMAT_HELP["lives"])
startups.help = (startups.help or "").replace("{fmt}", _FORMAT_HELP["startups"])
