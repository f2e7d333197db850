"""``analyze``: queries over the cmdare DuckDB database (a thin click layer over the
library functions in cmdare.analytics.queries)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from . import queries
from .db import AnalyticsError, default_db, open_ro, since_cutoff
from .output import as_json, table

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


def _show(fn: Callable[..., queries.Result], db: str, as_json_: bool, *args: Any) -> None:
    try:
        con = open_ro(db)
        try:
            cols, rows = fn(con, *args)
        finally:
            con.close()
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    if as_json_:
        click.echo(as_json(cols, rows))
    elif not rows:
        click.echo("(no rows)")
    else:
        click.echo(table(cols, rows))


def _cutoff(since: str | None) -> Any:
    try:
        return since_cutoff(since)
    except AnalyticsError as e:
        raise click.BadParameter(str(e).split(": ", 1)[1], param_hint="--since") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cmdare", prog_name="analyze")
def cli() -> None:
    """Query cmdare telemetry: nodes, GPUs, hosts, training jobs and steps, or any SQL.

    \b
    Examples:
      analyze nodes
      analyze gpu --node gpu-7 --since 10m
      analyze host --since 1h --json
      analyze jobs
      analyze steps --job resnet50-a --since 1h
      analyze sql "SELECT node, count(*) FROM gpu_samples GROUP BY node"
    """


@cli.command()
@db_option
@json_option
def nodes(db: str, as_json_: bool) -> None:
    """Every node seen: role, job, first/last seen, agent version, heartbeats, GPUs, spool
    backlog, dropped events and sources that are not ok.

    \b
    Example:
      analyze nodes --db fleet.duckdb
    """
    _show(queries.nodes, db, as_json_)


@cli.command()
@node_option
@since_option
@db_option
@json_option
def gpu(node: str | None, since: str | None, db: str, as_json_: bool) -> None:
    """Per GPU: utilisation, memory, power, temperature, throttling, ECC / Xid events.

    \b
    Example:
      analyze gpu --node gpu-7 --since 10m
    """
    _show(queries.gpu, db, as_json_, node, _cutoff(since))


@cli.command()
@node_option
@since_option
@db_option
@json_option
def host(node: str | None, since: str | None, db: str, as_json_: bool) -> None:
    """Per node: CPU, load, memory, processes, network and disk throughput.

    \b
    Example:
      analyze host --since 1h
    """
    _show(queries.host, db, as_json_, node, _cutoff(since))


@cli.command()
@since_option
@db_option
@json_option
def jobs(since: str | None, db: str, as_json_: bool) -> None:
    """Training jobs: model, size, ranks, nodes, steps/s, examples/s, input-wait share and
    the input-bound verdict (TensorFlow profiler thresholds: under 5% not, 5-20%
    moderately, 20% or more highly input-bound).

    \b
    Example:
      analyze jobs --since 1d
    """
    _show(queries.jobs, db, as_json_, _cutoff(since))


@cli.command()
@click.option("--job", required=True, help="the training job's id (see analyze jobs)")
@node_option
@since_option
@db_option
@json_option
def steps(job: str, node: str | None, since: str | None, db: str, as_json_: bool) -> None:
    """Per run and rank of one job: steps/s, examples/s, mean step time, input-wait share
    and verdict, slow steps, and the node's GPU / CPU utilisation over the same intervals.

    \b
    Example:
      analyze steps --job resnet50-a --since 1h
    """
    _show(queries.steps, db, as_json_, job, node, _cutoff(since))


@cli.command()
@click.argument("query")
@db_option
@json_option
def sql(query: str, db: str, as_json_: bool) -> None:
    """Run QUERY on a read-only connection (tables: nodes, host_samples, gpu_samples,
    gpu_events, heartbeats, agent_status, jobs, steps, slow_steps, checkpoints,
    unknown_events, dead_letters; view step_hardware).

    \b
    Example:
      analyze sql "SELECT node, max(ts) FROM heartbeats GROUP BY node"
    """
    _show(queries.sql, db, as_json_, query)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
