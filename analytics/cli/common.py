"""What every ``analyze`` command shares: the group, the common options, ``call`` (one library
call on the database file, the lake, or through the collector holding it) and the parsing
of times.  The command modules (findings, imports, models, recommend, report, telemetry)
register on ``cli``; cli/__init__.py loads them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from ..db import AnalyticsError, default_db, since_cutoff
from .client import Local, backend

db_option = click.option(
    "--db",
    default=default_db,
    show_default="$CMDARE_DB or ./cmdare.duckdb",
    help="DuckDB database written by cmdare-collector",
)
node_option = click.option("--node", help="only this node")
since_option = click.option("--since", help="only samples newer than this (e.g. 10m, 2h, 7d)")
json_option = click.option(
    "--json", "as_json_", is_flag=True, help="machine-readable output (a JSON array of rows)"
)
json_object_option = click.option(
    "--json", "as_json_", is_flag=True, help="machine-readable output (one JSON object)"
)
lost_after_option = click.option(
    "--lost-after",
    type=click.FloatRange(1),
    default=3,
    show_default=True,
    envvar="CMDARE_LOST_AFTER",
    help="a node whose heartbeats stopped for this many sampling intervals is lost ($CMDARE_LOST_AFTER)",
)
region_option = click.option("--region", help="only this region (substring, e.g. us-central1)")
until_option = click.option("--until", help="only samples older than this: a duration ago (10m, 2h) or an ISO 8601 time")
every_option = click.option("--every", help="one row per series per this long (e.g. 1m, 1h): a leading bucket column")
label_option = click.option("--label", metavar="KEY=VALUE", help="only nodes with this label (e.g. team=vision)")
columns_option = click.option("--columns", metavar="A,B,...",
                              help="these columns, in this order (text and --json; see --wide for all of them)")
wide_option = click.option("--wide", is_flag=True, help="every column (the default shows those that fit 120 characters)")
gpu_type_option = click.option(
    "--gpu-type", help="only this accelerator (substring of the cloud's or the GPU's name, e.g. v100)"
)


def call(db: str, fn: Callable[..., Any], **kw: Any) -> Any:
    """Library call ``fn`` (a function of cmdare.analytics.api) on ``db``: locally, on the
    lake, or through the collector serving it (the resource of the same name)."""
    ctx = click.get_current_context(silent=True)
    obj = (ctx.find_root().obj or {}) if ctx is not None else {}
    server = obj.get("server")
    try:
        if obj.get("lake"):
            from ..lakedb import LakeDatabase

            return fn(LakeDatabase(obj["lake"], obj.get("catalog")), **kw)
        return backend(db, server).call(fn.__name__, **kw)
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None


def database_or_remote(db: str) -> Any:
    """What a command that streams its work writes to: the database (a file, or the lake
    with --lake) as a library ``Database``, or the collector serving it (``Remote``)."""
    ctx = click.get_current_context(silent=True)
    obj = (ctx.find_root().obj or {}) if ctx is not None else {}
    try:
        if obj.get("lake"):
            from ..lakedb import LakeDatabase

            return LakeDatabase(obj["lake"], obj.get("catalog"))
        b = backend(db, obj.get("server"))
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    return b.db if isinstance(b, Local) else b


def where(db: str) -> str:
    """What the command reads, in words: the database file, or the lake (--lake)."""
    ctx = click.get_current_context(silent=True)
    obj = (ctx.find_root().obj or {}) if ctx is not None else {}
    return f"the lake {obj['lake']}" if obj.get("lake") else db


def time_option_value(flag: str, text: str | None) -> Any:
    from ..db import time_arg

    try:
        return time_arg(flag, text)
    except AnalyticsError as e:
        raise click.BadParameter(str(e).split(": ", 1)[1], param_hint=flag) from None


def every_value(text: str | None) -> Any:
    from ..db import every_seconds

    try:
        return every_seconds(text)
    except AnalyticsError as e:
        raise click.BadParameter(str(e).split(": ", 1)[1], param_hint="--every") from None


def cutoff(since: str | None) -> Any:
    try:
        return since_cutoff(since)
    except AnalyticsError as e:
        raise click.BadParameter(str(e).split(": ", 1)[1], param_hint="--since") from None


def _db_defaults(group: click.Group, db: str) -> dict[str, Any]:
    """A ``default_map`` giving every command under ``group`` (nested groups too) ``--db``."""
    out: dict[str, Any] = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out[name] = _db_defaults(cmd, db)
            if any(p.name == "db" for p in cmd.params):  # a group that runs on its own too
                out[name]["db"] = db
        elif any(p.name == "db" for p in cmd.params):
            out[name] = {"db": db}
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cmdare", prog_name="analyze")
@click.option(
    "--db",
    "group_db",
    metavar="PATH",
    help="the database for the command that follows (as its own --db; either place works)",
)
@click.option(
    "--server",
    metavar="URL",
    help="run the command through this collector's API (default: the one holding the database, if any)",
)
@click.option("--lake", envvar="CMDARE_LAKE", metavar="URI",
              help="read (and write fits and findings to) an Iceberg lake written by cmdare-collector --lake, "
                   "instead of a database file ($CMDARE_LAKE)")
@click.option("--catalog", envvar="CMDARE_LAKE_CATALOG", metavar="URL",
              help="with --lake: its SQL catalog, postgresql://... or sqlite:///... ($CMDARE_LAKE_CATALOG; "
                   "default: DIR/catalog.db)")
@click.pass_context
def cli(ctx: click.Context, group_db: str | None, server: str | None, lake: str | None,
        catalog: str | None) -> None:
    """Query cmdare telemetry: nodes, GPUs, hosts, training jobs and steps, or any SQL.
    Times shown are UTC, as stored.

    \b
    Examples:
      analyze nodes
      analyze gpu --node gpu-7 --since 10m
      analyze host --since 1h --json
      analyze jobs
      analyze steps --job resnet50-a --since 1h
      analyze instances --region us-central1 --gpu-type v100
      analyze revocations --since 7d --gpu-type v100
      analyze goodput --job resnet50-a
      analyze bottlenecks --since 1d
      analyze alerts
      analyze recommend data-workers --consumer-ms 10,10 --worker-ms 40,40,40,400
      analyze fit speed
      analyze predict speed --gpu-type v100 --flops-per-step 3.1e12 --params 25.6e6
      analyze sql "SELECT node, count(*) FROM gpu_samples GROUP BY node"
      analyze import tensorboard runs/ --job resnet50-a --gpu-type v100 --workers 4
      analyze --lake /srv/cmdare-lake goodput --fleet --by team --since 30d

    A database held by a running collector is read through that collector's API (found
    in DB.service.json beside it, trusted only when it belongs to the database's owner and
    names that database; $CMDARE_HTTP_TOKEN is sent as the bearer token), with the same
    output; --server URL names a collector explicitly.
    """
    ctx.ensure_object(dict)
    if server:
        ctx.obj["server"] = server
    if lake is not None and not lake.strip():
        raise click.BadParameter("empty: give the lake's directory or object-store URI", param_hint="--lake")
    if lake:
        if server or group_db:
            raise click.UsageError("--lake: give either a lake or a database (--db / --server), not both")
        ctx.obj["lake"], ctx.obj["catalog"] = lake, catalog
    if group_db is not None:  # `analyze --db X nodes` as `analyze nodes --db X`
        ctx.default_map = _db_defaults(cli, group_db)


def _strip(argv: list[str], name: str) -> tuple[list[str], list[str]]:
    """argv without ``name VALUE`` / ``name=VALUE``, and the values."""
    out, vals, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            out += argv[i:]
            break
        if a == name and i + 1 < len(argv):
            vals.append(argv[i + 1])
            i += 2
            continue
        if a.startswith(name + "="):
            vals.append(a.split("=", 1)[1])
        else:
            out.append(a)
        i += 1
    return out, vals


def main() -> None:
    # --server may stand anywhere (as it did); the group takes it
    argv, servers = _strip(sys.argv[1:], "--server")
    obj = {"server": servers[-1]} if servers else {}
    cli(args=argv, prog_name="analyze", obj=obj)

