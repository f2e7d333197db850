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
from ..db import AnalyticsError
from ..overheads import FORMATS
from .common import call, cli, db_option, json_option


@cli.group(name="import")
def import_() -> None:
    """Load historical runs into the database (read-write; not while a collector runs on it).

    \b
    Examples:
      analyze import tensorboard runs/ --job resnet50-a --gpu-type v100 --workers 4
      analyze import checkpoints checkpoints.csv
      analyze import startups startups/
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


def _overheads(kind: str, paths: tuple[str, ...], db: str, as_json_: bool) -> None:
    from .. import overheads

    call(db, api.import_overheads, kind=kind, records=[])  # the database first
    try:
        files = overheads.find(paths)
        if len(files) > 1 and sys.stderr.isatty():
            with click.progressbar(length=len(files), label=f"reading {kind}", file=sys.stderr,
                                   show_pos=True, item_show_func=lambda p: p and Path(p).name) as bar:
                recs = overheads.read(kind, files, progress=lambda p: bar.update(1, str(p)))
        elif len(files) > 1:  # a log, not a terminal: one line a file
            done = iter(range(1, len(files) + 1))
            recs = overheads.read(kind, files, progress=lambda p: click.echo(
                f"reading {kind}: {p.name} ({next(done)}/{len(files)})", err=True))
        else:
            recs = overheads.read(kind, files)
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    out = call(db, api.import_overheads, kind=kind, records=recs.rows)
    out["files"] = recs.files
    if as_json_:
        click.echo(json.dumps(out))
    else:
        click.echo(f"imported {out['stored']} {kind[:-1]} record(s) from {recs.files} file(s)"
                   + (f"; {out['duplicates']} already stored" if out["duplicates"] else "")
                   + " (analyze fit overhead fits them)")


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


checkpoints.help = (checkpoints.help or "").replace("{fmt}", _FORMAT_HELP["checkpoints"])
startups.help = (startups.help or "").replace("{fmt}", _FORMAT_HELP["startups"])
