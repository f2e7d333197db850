"""``analyze``: queries over the cmdare DuckDB database (a thin click layer over the
library functions in cmdare.analytics.queries)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import duckdb

from cmdare.wire.events import ROLES
from cmdare.wire.tbevents import EXAMPLES_TAG, STEPS_TAG

from . import queries
from .db import AnalyticsError, default_db, live_cursor, open_ro, since_cutoff
from .output import as_json, table
from .queries import needs_schema

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
@click.pass_context
def cli(ctx: click.Context, group_db: str | None, server: str | None) -> None:
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

    A database held by a running collector is read through that collector's API (found
    in DB.service.json beside it; $CMDARE_HTTP_TOKEN is sent as the bearer token), with the
    same output; --server URL names a collector explicitly.
    """
    if group_db is not None:  # `analyze --db X nodes` as `analyze nodes --db X`
        ctx.default_map = _db_defaults(cli, group_db)


lost_after_option = click.option(
    "--lost-after",
    type=click.FloatRange(1),
    default=3,
    show_default=True,
    envvar="CMDARE_LOST_AFTER",
    help="a node whose heartbeats stopped for this many sampling intervals is lost ($CMDARE_LOST_AFTER)",
)
region_option = click.option("--region", help="only this region (substring, e.g. us-central1)")
gpu_type_option = click.option(
    "--gpu-type", help="only this accelerator (substring of the cloud's or the GPU's name, e.g. v100)"
)


@cli.command()
@lost_after_option
@db_option
@json_option
def nodes(lost_after: float, db: str, as_json_: bool) -> None:
    """Every node seen: role, job, cloud zone and instance type, spot, the state of its
    latest life (alive, or how it ended: revoked, stopped, lost), lives seen, first/last
    seen, agent version, heartbeats, GPUs, spool backlog and dropped events (as its last
    heartbeat reported them: events loaded since are not subtracted), sources that are
    not ok, and clock skew: events stamped further from the collector's clock than its
    --max-clock-skew (count, and the latest skew in seconds, + ahead / - behind); they are
    left out of states and lifetimes (state "clock skew": a node seen only through them).

    \b
    Example:
      analyze nodes --db fleet.duckdb --lost-after 5
    """
    _show(queries.nodes, db, as_json_, lost_after)


@cli.command()
@since_option
@region_option
@gpu_type_option
@lost_after_option
@db_option
@json_option
def instances(
    since: str | None, region: str | None, gpu_type: str | None, lost_after: float, db: str, as_json_: bool
) -> None:
    """Every life of every VM (boot to end): cloud identity, boot, last seen, state, how it
    ended (revoked: a notice that takes the VM away was seen; stopped: a clean stop; lost:
    heartbeats stopped without either), lifetime and notices.

    \b
    Example:
      analyze instances --since 30d --gpu-type v100
    """
    _show(queries.instances, db, as_json_, lost_after, _cutoff(since), region, gpu_type)


@cli.command()
@since_option
@region_option
@gpu_type_option
@db_option
@json_option
def revocations(since: str | None, region: str | None, gpu_type: str | None, db: str, as_json_: bool) -> None:
    """Revocation and maintenance notices: when seen, node and identity, kind, the cloud's
    deadline and the lead time it gave, how long the node was still seen, how its life
    ended, and per training job on the node the progress lost since its last checkpoint
    (steps and seconds of work from the last good save to the last step reported).

    \b
    Example:
      analyze revocations --since 7d --region us-central1 --gpu-type v100
    """
    _show(queries.revocations, db, as_json_, _cutoff(since), region, gpu_type)


@cli.command()
@click.option("--job", required=True, help="the training job's id (see analyze jobs)")
@db_option
@json_option
def goodput(job: str, db: str, as_json_: bool) -> None:
    """Split a job's wall time into productive step time and badput: input wait, start-up,
    checkpoint save and restore, revocations (work redone since the last checkpoint, and
    notice to steps resuming) and idle. The parts add up to the wall time.

    \b
    Example:
      analyze goodput --job resnet50-a
      analyze fit speed
      analyze predict speed --gpu-type v100 --flops-per-step 3.1e12 --params 25.6e6 --json
    """
    from .goodput import goodput as compute

    _show(lambda con: compute(con, job).result(), db, as_json_)


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
    """Training jobs: model, size, ranks, nodes, steps/s (mean per rank), examples/s (all
    examples over the time the job stepped: ranks side by side add up, a restart's runs
    do not), input-wait share and the input-bound verdict (TensorFlow profiler
    thresholds: under 5% not, 5-20% moderately, 20% or more highly input-bound).

    \b
    Example:
      analyze jobs --since 1d
    """
    _show(queries.jobs, db, as_json_, _cutoff(since))


def _detector_names() -> list[str]:
    from .detectors import DETECTORS

    return list(DETECTORS)


@cli.command()
@click.option("--job", help="only this job (default: every job)")
@since_option
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(_detector_names()),
    help="only this detector (repeatable; default: all)",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="CMDARE_ANALYZE_CONFIG",
    help="TOML file of detector thresholds, [detectors.<name>] tables ($CMDARE_ANALYZE_CONFIG)",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="DETECTOR.OPTION=VALUE",
    help="override one threshold for this run (repeatable), e.g. ps_bound.min_efficiency=0.7",
)
@click.option("--no-store", is_flag=True, help="compute only: do not write the findings table")
@db_option
@json_option
def bottlenecks(
    job: str | None,
    since: str | None,
    kinds: tuple[str, ...],
    config_path: str | None,
    sets: tuple[str, ...],
    no_store: bool,
    db: str,
    as_json_: bool,
) -> None:
    """What is wrong with which job, how sure, and the numbers: PS-bound and input-bound
    jobs, stragglers, idle, throttled and failing GPUs, checkpoint overhead. Sorted by
    severity (critical, warning, info), then confidence.

    Findings are stored in the findings table (replacing those of the same detectors and
    scope: running it again stores nothing twice); a read-only database is analysed
    without storing, and says so. A detector without the data it needs says what it
    needed, once, on stderr; the others still run. Thresholds: docs/detectors.md.

    \b
    Examples:
      analyze bottlenecks
      analyze bottlenecks --job resnet50-a --since 6h --json
      analyze bottlenecks --kind ps_bound --set ps_bound.min_efficiency=0.7
      analyze bottlenecks --config thresholds.toml
    """
    import datetime as dt

    from . import findings
    from .units import Scope

    cutoff = _cutoff(since)
    try:
        config = findings.load_config(config_path) if config_path else {}
        options = findings.merged(config, findings.parse_set(list(sets)))
        findings.check_options(options)
        con, stored_note = _open_for_findings(db, not no_store)
        try:
            if job is not None:
                _known_job(con, job)
            scope = Scope(job, cutoff, None)
            out = findings.run(con, scope, list(kinds) or None, options)
            if stored_note is None:
                n = findings.store(con, out, scope)
                stored_note = f"stored {n} finding{'s' if n != 1 else ''} in {db} (table findings)"
        finally:
            con.close()
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    for line in out.skipped:
        click.echo(f"note: {line}", err=True)
    if as_json_:
        click.echo(json.dumps([f.to_json() for f in out.findings], indent=1))
    elif not out.findings:
        click.echo(f"no findings ({len(out.ran)} detector{'s' if len(out.ran) != 1 else ''} ran: {', '.join(out.ran) or 'none'})")
    else:
        def when(t: dt.datetime | None) -> str:
            return "" if t is None else t.strftime("%m-%d %H:%M")

        cols = ["severity", "kind", "job", "node", "rank", "conf", "from", "to", "summary"]
        rows = [
            (f.severity, f.kind, f.job or "", f.node or "", "" if f.rank is None else f.rank, f"{f.confidence:.2f}",
             when(f.window_start), when(f.window_end), f.summary)
            for f in out.findings
        ]
        click.echo(table(cols, rows))
        nexts = []
        for f in out.findings:
            for k in f.suggests:
                cmd = _suggested(k, f.job)
                if cmd and cmd not in nexts:
                    nexts.append(cmd)
        if nexts:
            click.echo("\nwhat to do about them:")
            for cmd in nexts:
                click.echo(f"  {cmd}")
    click.echo(stored_note, err=True)


def _suggested(kind: str, job: str | None) -> str | None:
    """The analyze recommend command answering a finding's ``suggests`` kind for its job."""
    if not job:
        return None
    return {
        "data-workers": f"analyze recommend data-workers --job {job}",
        "placement": f"analyze recommend placement --job {job} --host-price C --worker-price W",
        "cluster": f"analyze recommend cluster --from-job {job}",
    }.get(kind)


def _known_job(con: Any, job: str) -> None:
    known = con.execute(
        "SELECT (SELECT count(*) FROM jobs WHERE job = $j) + (SELECT count(*) FROM steps WHERE job = $j)", {"j": job}
    ).fetchall()[0][0]
    if not known:
        raise AnalyticsError(f"--job {job}: no such job in the database (analyze jobs lists them)")


def _open_for_findings(db: str, store: bool) -> tuple[Any, str | None]:
    """A connection for analyze bottlenecks, and None when findings will be stored, else the
    note saying why not (--no-store, a read-only file)."""
    import os

    from cmdare.collector.db import DatabaseError, connect

    p = Path(db)
    if not store:
        return open_ro(db), "not stored (--no-store)"
    # a file without write permission is a read-only copy, even to root (who could write it)
    if p.exists() and os.access(p, os.W_OK) and p.stat().st_mode & 0o222 and os.access(p.parent, os.W_OK):
        try:
            return connect(db), None
        except DatabaseError as e:
            if "lock" in str(e):
                raise AnalyticsError(str(e)) from None
    con = open_ro(db)
    return con, f"{db} is read-only: findings computed, not stored"


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
@click.option("--max-rows", type=click.IntRange(1), default=10_000, show_default=True,
              help="rows shown at most (the result says when it was cut)")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="seconds before the query is stopped")
@db_option
@json_option
def sql(query: str, max_rows: int, timeout: float, db: str, as_json_: bool) -> None:
    """Run one SELECT QUERY on the database, read-only (tables: nodes, host_samples,
    gpu_samples, gpu_events, tpu_samples, heartbeats, agent_status, jobs, steps, data_batches,
    slow_steps, checkpoints, scalars, instance_identity, lifecycle_events, revocations,
    model_fits, findings, unknown_events, dead_letters; views step_hardware, instances;
    table macro instance_lives(lost_after := 3)).

    The query reads the database and nothing else: no files, network or extensions, no
    settings (SET, PRAGMA), one statement; a row limit and a time limit.

    \b
    Example:
      analyze sql "SELECT node, max(ts) FROM heartbeats GROUP BY node"
    """
    from . import safesql

    try:
        con = safesql.open_safe(db)
        try:
            r = safesql.run(con, query, max_rows, timeout)
        finally:
            con.close()
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    if as_json_:
        click.echo(as_json(r.columns, r.rows))
    elif not r.rows:
        click.echo("(no rows)")
    else:
        click.echo(table(r.columns, r.rows))
    if r.truncated:
        click.echo(f"note: more than {max_rows:,} rows: showing the first {max_rows:,} (--max-rows; or add LIMIT)", err=True)


@cli.group(name="alerts", invoke_without_command=True)
@click.option("--rule", "rule_filter", help="only this rule (group/alert or alert name)")
@db_option
@json_option
@click.pass_context
def alerts_(ctx: click.Context, rule_filter: str | None, db: str, as_json_: bool) -> None:
    """Active alerts (pending, firing, inhibited, recently resolved) with their state, since,
    value and labels, and each rule's health, as the collector's rule evaluation last saved
    them (cmdare-collector --rules FILE...).

    \b
    Examples:
      analyze alerts
      analyze alerts --json
      analyze alerts check rules/*.yml
    """
    if ctx.invoked_subcommand:
        return
    from . import alerts

    try:
        con = open_ro(db)
        try:
            needs_schema(con, 10, "analyze alerts")
            cols, rows, health = alerts.listing(con)
        finally:
            con.close()
    except (AnalyticsError, duckdb.Error) as e:
        raise click.ClickException(str(e).splitlines()[0]) from None
    if rule_filter:
        rows = [r for r in rows if r[0] == rule_filter or r[0].split("/", 1)[-1] == rule_filter]
        health = [h for h in health if h[0] == rule_filter or h[0].split("/", 1)[-1] == rule_filter]
    if as_json_:
        out = [dict(zip(cols, r, strict=True)) | {"labels": json.loads(r[4])} for r in rows]
        rules = [dict(zip(["rule", "health", "last_error", "last_eval", "eval_seconds", "instances"], h, strict=True))
                 for h in health]
        click.echo(json.dumps({"alerts": out, "rules": rules}, default=str))
        return
    if not health:
        click.echo("(no rules evaluated yet: start the collector with --rules FILE...)")
        return
    shown = [(r[0], r[1], r[2], r[3], ",".join(f"{k}={v}" for k, v in sorted(json.loads(r[4]).items())
                                              if k != "alertname"), r[5] or r[6] or "") for r in rows]
    click.echo(table(["rule", "state", "since", "value", "labels", "summary"], shown) if shown else "(no active alerts)")
    bad = [h for h in health if h[1] != "ok"]
    click.echo(f"\n{len(health)} rules, {len(health) - len(bad)} healthy")
    for h in bad:
        click.echo(f"  {h[0]}: {h[1]}{': ' + h[2] if h[2] else ''}")


@alerts_.command(name="check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@db_option
def alerts_check(files: tuple[str, ...], db: str) -> None:
    """Validate rule FILES: YAML shape, durations, labels, templates, and each rule's SQL
    against the database's tables (--db; without one, an empty database of the current
    schema). Exit 1 with one line naming the file, group, rule and problem.

    \b
    Examples:
      analyze alerts check my-rules.yml --db fleet.duckdb
      analyze alerts check default          # the shipped pack
    """
    from . import alerts

    try:
        groups = alerts.load_files(files)
        con = _schema_con(db)
        try:
            alerts.validate(con, groups)
        finally:
            con.close()
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    n = sum(len(g.rules) for g in groups)
    click.echo(f"{len(files)} file(s), {len(groups)} group(s), {n} rule(s): ok")


def _schema_con(db: str) -> Any:
    """The database when it exists, else an in-memory one with the collector's schema (to
    bind SQL against the documented tables)."""
    if Path(db).exists() or live_cursor(db) is not None:
        return open_ro(db)
    return _empty_db()


def _empty_db() -> Any:
    """An in-memory database with the collector's current schema and views."""
    from cmdare.collector.db import migrate

    from . import views

    con = duckdb.connect(":memory:")
    migrate(con)
    views.apply(con)
    return con


@alerts_.command(name="test")
@click.argument("file", type=click.Path(dir_okay=False))
def alerts_test(file: str) -> None:
    """Run the unit tests of FILE against the rules it names, as `promtool test rules`
    does: each test loads its input rows into an empty database (times as offsets: 0s, 90s,
    5m), evaluates the rules every evaluation_interval, and compares the firing alerts at each
    eval_time with exp_alerts. Exit 1 when a test fails. Format: docs/alerts.md.

    \b
    Example:
      analyze alerts test rules/gpu.test.yml
    """
    from . import alerts

    try:
        results = alerts.run_tests(file, _empty_db)
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    failed = 0
    for r in results:
        click.echo(f"{'ok  ' if not r.failures else 'FAIL'} {r.name}")
        for f in r.failures:
            click.echo(f"     {f}")
        failed += bool(r.failures)
    click.echo(f"{len(results)} test(s), {failed} failed")
    if failed:
        raise SystemExit(1)


@cli.group(name="import")
def import_() -> None:
    """Load historical runs into the database (read-write; not while a collector runs on it).

    \b
    Example:
      analyze import tensorboard runs/ --job resnet50-a --gpu-type v100 --workers 4
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
def tensorboard(
    paths: tuple[str, ...],
    job: str,
    node: str,
    role: str,
    run: str | None,
    rank: int,
    gpu_type: str | None,
    workers: int | None,
    ps: int | None,
    model: str | None,
    params: int | None,
    tensors: int | None,
    flops_per_step: float | None,
    batch_size: int | None,
    csv_tag_: str | None,
    steps_tag: str,
    examples_tag: str,
    db: str,
    as_json_: bool,
) -> None:
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
    from cmdare.collector.db import DatabaseError, connect

    from .tbimport import import_tensorboard

    declare = {
        "accelerator": gpu_type,
        "world_size": workers,
        "ps": ps,
        "model": model,
        "params": params,
        "tensors": tensors,
        "flops_per_step": flops_per_step,
        "batch_size": batch_size,
    }
    try:
        con = connect(db)
    except DatabaseError as e:
        raise click.ClickException(str(e)) from None
    try:
        res = import_tensorboard(
            con,
            paths,
            job,
            node=node,
            role=role,
            run=run,
            rank=rank,
            csv_tag_=csv_tag_,
            steps_tag=steps_tag,
            examples_tag=examples_tag,
            declare=declare,
            progress=lambda p: (
                click.echo(f"reading {p}", err=True) if len(paths) > 1 or Path(paths[0]).is_dir() else None
            ),
        )
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    finally:
        con.close()
    out = {
        "job": job,
        "files": res.files,
        "points": res.points,
        "runs": res.runs,
        "steps": res.steps,
        "scalars": res.scalars,
        "duplicates": res.duplicates,
    }
    if as_json_:
        click.echo(json.dumps(out))
    else:
        click.echo(
            f"imported job {job}: {res.files} file(s), runs {', '.join(res.runs)}: {res.steps} step intervals, "
            f"{res.scalars} scalars stored ({res.duplicates} already there)"
        )


FIT_KINDS = ("speed", "cluster", "overhead", "lifetime")


@cli.command(name="fit")
@click.argument("kind", type=click.Choice(FIT_KINDS))
@lost_after_option
@db_option
@json_option
def fit_(kind: str, lost_after: float, db: str, as_json_: bool) -> None:
    """Fit a performance model from the database and store it in model_fits (read-write).

    \b
    speed     single-worker step time from FLOPs per step / accelerator peak, parameter
              bytes / memory bandwidth and tensor count (roofline, log-linear, power and
              compute+tensors families; the one with the lowest held-out error is kept)
    cluster   per-worker step time as workers and parameter servers grow (spotDNN's
              PS-bandwidth contention term)
    overhead  checkpoint save / restore time against size; resume after a revocation;
              VM start-up by region, accelerator and spot
    lifetime  Kaplan-Meier survival of spot VM lives per region and accelerator, with
              Cox proportional hazards across them

    Error is held out: leave one model architecture out (MAPE, R^2), never training error.

    \b
    Example:
      analyze fit speed --json
    """
    from cmdare.collector.db import DatabaseError, connect

    from . import models

    try:
        con = connect(db) if Path(db).exists() else None
    except DatabaseError as e:
        raise click.ClickException(str(e)) from None
    if con is None:
        raise click.ClickException(f"{db}: no such database (load one with cmdare-collector, or pass --db)")
    try:
        if kind in ("speed", "cluster"):
            jobs, skipped = models.job_speeds(con)
            if kind == "speed":
                f = models.fit_speed(jobs)
            else:
                f = models.fit_cluster(jobs, _latest_or_none(con, "speed"))
            f.notes += skipped
        elif kind == "overhead":
            f = models.fit_overhead(con)
        else:
            f = models.fit_lifetime(con, lost_after)
        models.save(con, f)
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    finally:
        con.close()
    out = f.summary()
    if as_json_:
        click.echo(json.dumps(models.store.clean(out), indent=1))
        return
    mape = "n/a" if out["cv_mape"] is None else f"{out['cv_mape'] * 100:.1f}%"
    r2 = "n/a" if out["cv_r2"] is None else f"{out['cv_r2']:.3f}"
    click.echo(
        f"fit {out['fit_id']}: {kind} ({out['family']}) from {out['rows']} rows, {out['groups']} groups"
    )
    click.echo(f"held-out error (leave one group out): MAPE {mape}, R^2 {r2}")
    fams = f.cv.get("families")
    if fams:
        click.echo(
            "families tried (held-out MAPE): "
            + ", ".join(f"{k} {v['cv_mape'] * 100:.1f}%" for k, v in sorted(fams.items(), key=lambda x: x[1]["cv_mape"]))
        )
    if f.cv.get("worst"):
        click.echo(
            "predicted worst (held out): "
            + ", ".join(f"{w['group']} {w['ape'] * 100:.1f}%" for w in f.cv["worst"])
        )
    for k, v in out["coefficients"].items():
        click.echo(f"  {k} = {v:.6g}")
    if kind == "overhead":
        for k in ("resume_after_revocation_seconds", "resume_after_restart_seconds"):
            if k in f.model:
                m = f.model[k]
                click.echo(
                    f"  {k}: mean {m['mean']:.1f} (95% {m['lower']:.1f}..{m['upper']:.1f}), n={m['n']}"
                )
        for g, m in f.model.get("vm_startup_seconds", {}).items():
            click.echo(f"  vm start-up {g}: mean {m['mean']:.1f}s, n={m['n']}")
    if kind == "lifetime":
        cv = f.cv
        if "brier" in cv:
            click.echo(
                f"held-out (5 folds by VM) Brier score of P(revoked within {cv['horizon_hours']:.2f} h): "
                f"{cv['brier']:.4f} (one pooled curve: {cv['brier_pooled']:.4f})"
            )
        for g, c in f.model["curves"].items():
            med = "not reached" if c["median_hours"] is None else f"{c['median_hours']:.2f} h"
            click.echo(f"  {g}: {c['n']} lives, {c['events']} revoked, median lifetime {med}")
    for n in out["notes"][:20]:
        click.echo(f"  note: {n}")


@cli.group()
def recommend() -> None:
    """What to do about it: each answer gives the action, the predicted outcome with an
    interval, its cost where prices are known, the fits used, the assumptions and a one-line
    why (docs/recommendations.md).

    \b
    Example:
      analyze recommend data-workers --consumer-ms 10,10 --worker-ms 40,40,40,400
    """


def _emit_recommendation(rec: Any, as_json_: bool) -> None:
    if as_json_:
        from .models.store import clean

        click.echo(json.dumps(clean({"kind": rec.kind.replace("_", "-"), **{k: v for k, v in rec.to_json().items() if k != "kind"}})))
        return
    act = ", ".join(
        f"{k} " + (", ".join(f"{n} x {t}" for t, n in v.items()) if isinstance(v, dict) else str(v))
        for k, v in rec.action.items()
    )
    click.echo(f"{rec.kind.replace('_', '-')}: {act}")
    click.echo(f"  why: {rec.why}")
    for k, v in rec.predicted.items():
        iv = rec.interval.get(k)
        click.echo(f"  predicted {k}: {v:.4g}" + (f" (interval {iv[0]:.4g} .. {iv[1]:.4g})" if iv else ""))
    for k, v in rec.cost.items():
        click.echo(f"  cost {k}: {v}")
    if rec.fit_ids:
        click.echo(f"  fits: {', '.join(rec.fit_ids)}")
    click.echo("  assumptions: " + ", ".join(f"{k}={v}" for k, v in rec.assumptions.items() if v is not None))


def _csv(value: str | None) -> list[str]:
    return [x.strip() for x in (value or "").split(",") if x.strip()]


@recommend.command(name="data-workers")
@click.option("--consumer-ms", help="each consumer's target time per element, ms, comma-separated (e.g. 10,10)")
@click.option("--worker-ms", help="each data worker's processing time per element, ms (e.g. 40,40,40,400)")
@click.option("--current", type=click.IntRange(0), default=0, help="data workers running now (bounds the growth)")
@click.option("--batch-ms", help="batch time at each worker count, WORKERS:MS,... (Cachew's knee), e.g. 1:120,2:70,3:62")
@click.option("--knee", type=click.FloatRange(0, 1), default=0.07, show_default=True,
              help="Cachew: stop when one more worker improves batch time by this share or less")
@click.option("--worker-price", type=click.FloatRange(0), default=0.0, help="$/hour of one data worker (adds the cost)")
@click.option("--job", help="a job in --db: consumers' and workers' times from its telemetry (input workers report with role data)")
@click.option("--window", default="10m", show_default=True, help="with --job: the telemetry window read, ending at the job's last report")
@db_option
@json_option
def recommend_data_workers(
    consumer_ms: str | None, worker_ms: str | None, current: int, batch_ms: str | None, knee: float,
    worker_price: float, job: str | None, window: str, db: str, as_json_: bool,
) -> None:
    """How many input (data) workers: the tf.data service auto-scaler's rule on consumers'
    target times and workers' processing times (values outside mean +/- 1 standard
    deviation replaced by the median; N = max(1, ceil(sum of consumption rates / mean
    worker throughput)); growth bounded to min(4 x current, current + 500)), or Cachew's
    knee on the batch times a job saw at consecutive worker counts (add one while it
    improves batch time by more than 7 %).

    \b
    Examples:
      analyze recommend data-workers --consumer-ms 10,10 --worker-ms 40,40,40,400
      analyze recommend data-workers --batch-ms 1:120,2:70,3:62,4:60 --json
      analyze recommend data-workers --job resnet50-a --worker-price 0.19

    With --job, from the job's telemetry: consumers' target time per batch is the training
    ranks' step compute time (step time minus input wait), workers' processing time per
    batch comes from its input workers (track.init(role="data"), run.produced(...)), per
    element where both report examples; and Cachew's knee when the job ran at several
    input-worker counts.
    """
    from .recommend import recommend as run_recommender
    from .units import Scope

    def run(con: Any) -> list[Any]:
        return run_recommender(
            "data_workers", con, Scope(), consumer_ms=_csv(consumer_ms), worker_ms=_csv(worker_ms), current=current,
            batch_ms=_csv(batch_ms), knee=knee, worker_price=worker_price, job=job or "", window=window,
        )

    if job:
        recs = _with_ro(db, run)
    else:
        try:
            recs = run(None)
        except AnalyticsError as e:
            raise click.ClickException(str(e)) from None
    for r in recs:
        _emit_recommendation(r, as_json_)


@recommend.command(name="placement")
@click.option("--trace", type=click.Path(dir_okay=False), help="CSV of observed batch times: remote,local,batch_ms")
@click.option("--job", help="instead of --trace: the job's configurations and batch times from its telemetry in --db")
@click.option("--host-price", type=click.FloatRange(0), required=True, help="$/hour of the accelerator host")
@click.option("--worker-price", type=click.FloatRange(0), required=True, help="$/hour of one remote input worker")
@click.option("--threshold", type=click.FloatRange(0, 1), default=0.03, show_default=True,
              help="least improvement for another remote worker")
@click.option("--local-stop", type=click.FloatRange(-1, 0), default=-0.10, show_default=True,
              help="improvement below which adding local workers stops")
@click.option("--local-limit", type=click.IntRange(0), default=8, show_default=True,
              help="most local workers (idle CPUs on the accelerator host)")
@db_option
@json_option
def recommend_placement(
    trace: str | None, job: str | None, host_price: float, worker_price: float, threshold: float, local_stop: float,
    local_limit: int, db: str, as_json_: bool,
) -> None:
    """Local versus remote input workers: Pecan's AutoPlacement replayed over the batch times
    a job observed per (remote, local) configuration. Scale remote workers up while the
    batch time improves by more than --threshold, then add local workers (free) while it
    does not get worse by more than 10 %, then remove remote workers while the removal is
    economical (w > -r x (c + n_remote x w)). Gives the configuration it settles on (or,
    when the trace ends first, the next one to measure) and the cost per 1,000 steps of each.

    \b
    Examples:
      analyze recommend placement --trace batches.csv --host-price 2.48 --worker-price 0.19
      analyze recommend placement --job resnet50-a --host-price 2.48 --worker-price 0.19

    With --job, the trace comes from telemetry: per minute, the job's input workers on a
    host of its training ranks (local) or elsewhere (remote), and the training ranks'
    median batch time; a configuration held two minutes or more counts (its first minute
    left out).
    """
    from .recommend import recommend as run_recommender
    from .units import Scope

    def run(con: Any) -> list[Any]:
        return run_recommender(
            "placement", con, Scope(), trace=trace or "", job=job or "", host_price=host_price,
            worker_price=worker_price, threshold=threshold, local_stop=local_stop, local_limit=local_limit,
        )

    if job:
        recs = _with_ro(db, run)
    else:
        try:
            recs = run(None)
        except AnalyticsError as e:
            raise click.ClickException(str(e)) from None
    for r in recs:
        _emit_recommendation(r, as_json_)


@recommend.command(name="region")
@click.option("--gpu-type", required=True, help="the accelerator (catalogue name or alias, e.g. v100)")
@click.option("--min-lives", type=click.IntRange(1), default=10, show_default=True,
              help="VM lives a region needs before it is ranked")
@click.option("--hours", type=click.FloatRange(0), default=0.0, help="plan length: adds the expected revocations over it")
@click.option("--price", "prices", multiple=True, metavar="REGION=DOLLARS",
              help="spot $/hour in a region (repeatable; default: the price catalogue's cheapest spot VM, per accelerator)")
@click.option("--zones/--no-zones", default=True, show_default=True, help="also rank the zones of the best region")
@db_option
@json_option
def recommend_region(
    gpu_type: str, min_lives: int, hours: float, prices: tuple[str, ...], zones: bool, db: str, as_json_: bool
) -> None:
    """Where to run spot VMs of an accelerator: regions ranked by expected revocations per
    hour (the lifetime fit: the cumulative hazard -ln S(t) over t at the survival curve's
    last point with lives at risk, with a 95 % interval), then spot VM start-up time (the
    overhead fit), then the price (given, or the price catalogue's). A region with fewer
    than --min-lives lives is listed, not ranked; overlapping intervals are said. The zones
    of the best region are ranked the same way (Kaplan-Meier on the lives stored now).

    \b
    Example:
      analyze recommend region --gpu-type v100 --hours 12 --price us-central1=0.74
    """
    from .recommend import recommend as run_recommender
    from .units import Scope

    recs = _with_ro(
        db,
        lambda con: run_recommender(
            "region", con, Scope(), gpu_type=gpu_type, min_lives=min_lives, hours=hours, prices=list(prices),
            zones=zones,
        ),
    )
    for r in recs:
        _emit_recommendation(r, as_json_)


@recommend.command(name="provision")
@click.option("--profile", required=True, type=click.Path(dir_okay=False),
              help="the provisioning profile, TOML (docs/recommendations.md#provision)")
@click.option("--loss", type=click.FloatRange(min=0, min_open=True), help="loss target (default: the profile's [job] loss_target)")
@click.option("--deadline", help="training must finish within this, e.g. 90m or 6h (default: the profile's)")
@click.option("--confidence", type=click.FloatRange(0, 1), default=0.9, show_default=True,
              help="P(meeting the deadline) a spot plan needs, with the lifetime fit's revocations")
@click.option("--on-demand/--no-on-demand", default=True, show_default=True,
              help="fall back to on-demand prices when no spot plan meets the deadline")
@click.option("--max-plans", type=click.IntRange(1), default=20_000_000, show_default=True,
              help="largest search space (the product of quota + 1 over the types)")
@click.option("--db", default=None, show_default="$CMDARE_DB or ./cmdare.duckdb where it exists",
              help="database with lifetime / overhead fits (revocation-aware plans); without one, revocations are not counted")
@json_option
def recommend_provision(
    profile: str, loss: float | None, deadline: str | None, confidence: float, on_demand: bool, max_plans: int,
    db: str | None, as_json_: bool,
) -> None:
    """The cheapest mix of spot instance types within quotas that reaches a loss target by a
    deadline, under spotDNN's model (heterogeneous iteration time T_exp = 1 / sum 1/T_i, PS
    bandwidth contention, the loss model): an exact search over every count vector. With a
    database holding a lifetime fit, each plan's expected revocations over its duration add
    the restart time (overhead fit) and the work since the last checkpoint, and a plan needs
    P(meeting the deadline) >= --confidence; on-demand is the fallback. Prices come from
    the profile or the price catalogue ($CMDARE_PRICES), with their as-of date. When no
    plan is possible it says which constraint binds.

    \b
    Example:
      analyze recommend provision --profile resnet.toml --loss 0.8 --deadline 1h
    """
    from .recommend import recommend as run_recommender
    from .units import Scope

    def run(con: Any) -> list[Any]:
        return run_recommender(
            "provision", con, Scope(), profile=profile, loss=loss or 0.0, deadline=deadline or 0.0,
            confidence=confidence, on_demand=on_demand, max_plans=max_plans,
        )

    if db is None and not Path(default_db()).exists():
        try:
            recs = run(None)
        except AnalyticsError as e:
            raise click.ClickException(str(e)) from None
    else:
        recs = _with_ro(db or default_db(), run)
    for r in recs:
        _emit_recommendation(r, as_json_)


@recommend.command(name="cluster")
@click.option("--from-job", help="the job whose model and accelerator to size (see analyze jobs)")
@click.option("--gpu-type", help="size for this accelerator (default: the job's; with a declaration: required)")
@click.option("--flops-per-step", type=click.FloatRange(min=0, min_open=True), help="instead of --from-job: the model's FLOPs per step")
@click.option("--params", type=click.FloatRange(min=0, min_open=True), help="instead of --from-job: the model's parameter count")
@click.option("--tensors", type=click.IntRange(1), help="instead of --from-job: parameter tensors (default params / 1e5)")
@click.option("--max-workers", type=click.IntRange(1, 4096), default=16, show_default=True)
@click.option("--max-ps", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--knee", type=click.FloatRange(0, 1), default=0.07, show_default=True,
              help="one more worker must add more than this share of speed")
@click.option("--steps", type=click.FloatRange(0), default=0.0, help="training steps to run")
@click.option("--deadline", help="time the steps must finish in (e.g. 6h): the cheapest counts that do")
@click.option("--worker-price", type=click.FloatRange(0), default=0.0, help="$/hour of one worker VM")
@click.option("--ps-price", type=click.FloatRange(0), default=0.0, help="$/hour of one parameter-server VM")
@click.option("--worker-type", help="instead of --worker-price: the worker VM type in the price catalogue ($CMDARE_PRICES)")
@click.option("--ps-type", help="instead of --ps-price: the PS VM type in the price catalogue")
@click.option("--region", help="with --worker-type / --ps-type: the catalogue region")
@click.option("--purchase", type=click.Choice(["on-demand", "spot"]), default="on-demand", show_default=True,
              help="with --worker-type / --ps-type: which catalogue price")
@db_option
@json_option
def recommend_cluster(
    from_job: str | None, gpu_type: str | None, flops_per_step: float | None, params: float | None,
    tensors: int | None, max_workers: int, max_ps: int, knee: float, steps: float, deadline: str | None,
    worker_price: float, ps_price: float, worker_type: str | None, ps_type: str | None, region: str | None,
    purchase: str, db: str, as_json_: bool,
) -> None:
    """How many workers and parameter servers for job J's model and accelerator: per PS
    count, the knee (the count past which one more worker adds 7 % or less), from the
    model's measured runs at several worker counts where they show it, else from the
    cluster fit; whether a second PS pays (its knee is faster by more than the threshold);
    with --steps and --deadline, the cheapest counts that finish in time.

    With --gpu-type, the job's model sized on another accelerator (its single-worker time
    carried there by the speed fit). Without a job: a declaration (--flops-per-step,
    --params, --tensors) and --gpu-type, through the speed and cluster fits.

    \b
    Examples:
      analyze recommend cluster --from-job resnet-1gpu
      analyze recommend cluster --from-job resnet-k80 --gpu-type p100
      analyze recommend cluster --flops-per-step 3.1e12 --params 25.6e6 --gpu-type v100
      analyze recommend cluster --from-job resnet-1gpu --steps 1e6 --deadline 8h --worker-price 0.9 --ps-price 0.2
    """
    from .recommend import recommend as run_recommender
    from .units import Scope

    if deadline and not steps:
        raise click.UsageError("--deadline needs --steps")

    def run(con: Any) -> list[Any]:
        return run_recommender(
            "cluster", con, Scope(), from_job=from_job or "", gpu_type=gpu_type or "", flops_per_step=flops_per_step or 0.0,
            params=params or 0.0, tensors=tensors or 0, max_workers=max_workers, max_ps=max_ps, knee=knee,
            steps=steps, deadline=deadline or 0.0, worker_price=worker_price, ps_price=ps_price,
            worker_type=worker_type or "", ps_type=ps_type or "", region=region or "", purchase=purchase,
        )

    for r in _with_ro(db, run):
        _emit_recommendation(r, as_json_)


@cli.group()
def predict() -> None:
    """Predict with the latest stored fit of a kind (read-only); every answer names its fit.

    \b
    Example:
      analyze predict speed --gpu-type v100 --flops-per-step 3.1e12 --params 25.6e6
    """


def _emit_prediction(out: dict[str, Any], as_json_: bool, unit: str) -> None:
    if as_json_:
        from .models.store import clean

        click.echo(json.dumps(clean(out)))
        return
    lo, hi = out["interval"]
    click.echo(f"{out['prediction']:.4g} {unit} (95% interval {lo:.4g} .. {hi:.4g}; fit {out['fit_id']})")
    for k, v in out.items():
        if k not in ("prediction", "interval", "fit_id"):
            click.echo(f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}")


def _with_ro(db: str, fn: Callable[[Any], Any]) -> Any:
    try:
        con = open_ro(db)
        try:
            return fn(con)
        finally:
            con.close()
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None


model_options = [
    click.option(
        "--from-job",
        help="a job in the database: its model, accelerator and measured steady-state speed (instead of the options below)",
    ),
    click.option("--flops-per-step", type=click.FloatRange(min=0, min_open=True), help="FLOPs per training step"),
    click.option("--params", type=click.FloatRange(min=0, min_open=True), help="parameter count"),
    click.option(
        "--tensors",
        type=click.IntRange(1),
        default=None,
        help="parameter tensors (default: params / 1e5, at least 1)",
    ),
    click.option("--batch-size", type=click.IntRange(1), help="per-worker batch size (adds examples/s)"),
]


@dataclass(frozen=True)
class _Model:
    """The model a prediction is for, from the --flops-per-step ... options."""

    flops_per_step: float
    params: float
    tensors: int
    batch_size: int | None


def _model_opts(f: Callable[..., Any]) -> Callable[..., Any]:
    """The model options, handed to the command as one ``model`` argument."""

    @functools.wraps(f)
    def command(
        *args: Any,
        from_job: str | None,
        flops_per_step: float | None,
        params: float | None,
        tensors: int | None,
        batch_size: int | None,
        **kw: Any,
    ) -> Any:
        if from_job is not None:
            if flops_per_step or params or tensors:
                raise click.UsageError("give either --from-job, or the model's --flops-per-step and --params")
            if not from_job.strip():
                raise click.UsageError("--from-job must name a job")
            return f(*args, model=None, from_job=from_job, batch_size=batch_size, **kw)
        if flops_per_step is None or params is None:
            raise click.UsageError("give --flops-per-step and --params, or --from-job JOB")
        t = tensors or max(1, round(params / 1e5))
        return f(*args, model=_Model(flops_per_step, params, t, batch_size), from_job=None, batch_size=batch_size, **kw)

    for o in reversed(model_options):
        command = o(command)
    return command


@predict.command(name="speed")
@click.option("--gpu-type", required=True, help="accelerator (catalogue name or alias, e.g. v100)")
@_model_opts
@db_option
@json_option
def predict_speed(
    gpu_type: str, model: _Model | None, from_job: str | None, batch_size: int | None, db: str, as_json_: bool
) -> None:
    """Single-worker steps/s of a model on an accelerator, with a 95% interval.

    With --from-job J: the model of job J, from J's measured steady-state speed and the
    speed fit's ratio between J's accelerator and --gpu-type (J ran several workers: its
    single-worker time through the cluster fit).

    \b
    Examples:
      analyze predict speed --gpu-type v100 --flops-per-step 3.1e12 --params 25.6e6 --json
      analyze predict speed --from-job resnet-k80 --gpu-type p100
    """
    from . import catalog, models

    def run(con: Any) -> dict[str, Any]:
        acc = catalog.lookup(gpu_type)
        f = models.latest(con, "speed")
        if model is None:
            assert from_job is not None
            a = models.anchor(con, from_job, _latest_or_none(con, "cluster"))
            j = a.job
            v_fit, lo, hi = models.predict_speed(f, acc, j.flops_per_step, j.params, j.tensors)
            v = 1.0 / a.t1_on(acc, f)
            k = v / v_fit  # the fit's interval, carried to the measured level
            out = {"prediction": v, "interval": [lo * k, hi * k], "fit_id": f["fit_id"], **_measured(a)}
            bs = batch_size or j.batch_size
        else:
            v, lo, hi = models.predict_speed(f, acc, model.flops_per_step, model.params, model.tensors)
            out = {"prediction": v, "interval": [lo, hi], "fit_id": f["fit_id"]}
            bs = model.batch_size
        out |= {"accelerator": acc.name, "step_seconds": 1 / v}
        if bs:
            out["examples_per_second"] = v * bs
        return out

    _emit_prediction(_with_ro(db, run), as_json_, "steps/s")


def _latest_or_none(con: Any, kind: str) -> dict[str, Any] | None:
    from . import models

    try:
        return models.latest(con, kind)
    except AnalyticsError:
        return None


def _measured(a: Any) -> dict[str, Any]:
    """What --from-job's job supplied (the JSON keys every --from-job prediction adds)."""
    j = a.job
    return {
        "from_job": j.job,
        "measured_steps_per_second": j.speed,
        "measured_accelerator": j.accelerator,
        "measured_workers": j.workers,
        "measured_ps": j.ps,
        "single_worker_step_seconds": a.t1,
        "single_worker_from": "cluster fit" if a.derived else "measured",
    }


def _parse_gpus(spec: str) -> list[tuple[str, int]]:
    out = []
    for part in spec.split(","):
        name, sep, n = part.strip().rpartition(":")
        if not sep or not name or not n.isdigit() or int(n) < 1:
            raise click.BadParameter(
                f"expected TYPE:COUNT[,TYPE:COUNT...] like k80:2,p100:2, got {part!r}", param_hint="--gpus"
            )
        out.append((name, int(n)))
    return out


@predict.command(name="cluster")
@click.option("--gpu-type", help="accelerator of every worker (with --workers)")
@click.option("--workers", type=click.IntRange(1), help="number of workers (with --gpu-type)")
@click.option("--gpus", help="heterogeneous workers, TYPE:COUNT,... e.g. k80:2,p100:2")
@click.option("--ps", type=click.IntRange(1), required=True, help="parameter servers")
@_model_opts
@db_option
@json_option
def predict_cluster(
    gpu_type: str | None,
    workers: int | None,
    gpus: str | None,
    ps: int,
    model: _Model | None,
    from_job: str | None,
    batch_size: int | None,
    db: str,
    as_json_: bool,
) -> None:
    """Cluster steps/s of a parameter-server job, homogeneous (--gpu-type and --workers) or
    heterogeneous (--gpus k80:2,p100:2: T_exp = 1 / sum(1/T_i), spotDNN), with a 95%
    interval, the speed the parameter servers cap it at, and the workers that reach 90% of it.

    With --from-job J: the model and (without --gpu-type or --gpus) the accelerator of job
    J, whose measured steady-state speed replaces the speed fit's single-worker time (J ran
    several workers: derived through the cluster fit; another accelerator: scaled by the
    speed fit's ratio between the two).

    \b
    Examples:
      analyze predict cluster --gpus k80:2,p100:2 --ps 1 --flops-per-step 3.1e12 --params 25.6e6
      analyze predict cluster --from-job resnet-1gpu --workers 8 --ps 2 --json
    """
    from . import catalog, models

    if gpus and (gpu_type or workers):
        raise click.UsageError("give either --gpus, or --gpu-type with --workers")
    if not gpus and not workers:
        raise click.UsageError("give --workers (and --gpu-type), or --gpus TYPE:COUNT,...")
    if not gpus and not gpu_type and from_job is None:
        raise click.UsageError("give --gpu-type and --workers, or --gpus TYPE:COUNT,...")
    spec = _parse_gpus(gpus) if gpus else [(gpu_type or "", workers or 1)]

    def run(con: Any) -> dict[str, Any]:
        sfit, cfit = models.latest(con, "speed"), models.latest(con, "cluster")
        extra: dict[str, Any] = {}
        ws = []
        if model is None:
            assert from_job is not None
            a = models.anchor(con, from_job, cfit)
            params, bs = a.job.params, batch_size or a.job.batch_size
            for name, n in spec:
                acc = catalog.lookup(name) if name else a.job.acc
                ws += [a.t1_on(acc, sfit)] * n
            extra = _measured(a)
        else:
            params, bs = model.params, model.batch_size
            for name, n in spec:
                acc = catalog.lookup(name)
                v1 = models.predict_speed(sfit, acc, model.flops_per_step, model.params, model.tensors)[0]
                ws += [1.0 / v1] * n
        r = models.predict_cluster(cfit, ws, ps, params)
        out = {
            "prediction": r.pop("steps_per_second"),
            "interval": [r.pop("lower"), r.pop("upper")],
            "fit_id": cfit["fit_id"],
            "speed_fit_id": sfit["fit_id"],
            "workers": len(ws),
            **r,
            **extra,
        }
        if bs:
            out["examples_per_second"] = out["prediction"] * bs
        return out

    _emit_prediction(_with_ro(db, run), as_json_, "steps/s")


@predict.command(name="revocation")
@click.option("--region", required=True)
@click.option("--gpu-type", required=True)
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), required=True)
@db_option
@json_option
def predict_revocation(region: str, gpu_type: str, hours: float, db: str, as_json_: bool) -> None:
    """Probability that a spot VM of this region and accelerator is revoked within HOURS of
    its boot (Kaplan-Meier), with a 95% interval.

    \b
    Example:
      analyze predict revocation --region us-central1 --gpu-type v100 --hours 6
    """
    from . import models

    def run(con: Any) -> dict[str, Any]:
        f = models.latest(con, "lifetime")
        r = models.predict_revocation(f, region, gpu_type, hours)
        return {
            "prediction": r.pop("probability"),
            "interval": [r.pop("lower"), r.pop("upper")],
            "fit_id": f["fit_id"],
            **r,
        }

    _emit_prediction(_with_ro(db, run), as_json_, "probability")


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


def _serving(db: str) -> str | None:
    """The API URL of a running collector holding ``db`` (its service file, its process
    alive), else None."""
    import os

    from cmdare.collector.service import service_file

    f = service_file(db)
    try:
        info = json.loads(f.read_text())
        pid, url = int(info["pid"]), str(info["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # a stale file: that collector is gone
    except PermissionError:
        pass  # alive, another user's
    return url


def _forward(url: str, argv: list[str]) -> int:
    """Run ``argv`` through a collector's API; print what it printed; its exit code."""
    import os
    import ssl
    import sys
    import urllib.error
    import urllib.request

    from cmdare.collector.service import TOKEN_ENV

    req = urllib.request.Request(
        url.rstrip("/") + "/api/v1/analyze", data=json.dumps({"argv": argv}).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    if os.environ.get(TOKEN_ENV):
        req.add_header("Authorization", f"Bearer {os.environ[TOKEN_ENV].strip()}")
    ctx = ssl.create_default_context(cafile=os.environ.get("CMDARE_HTTP_CA") or None) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(req, timeout=600, context=ctx) as r:
            res = json.loads(r.read())
    except urllib.error.HTTPError as e:
        why = "unauthorized: set $CMDARE_HTTP_TOKEN" if e.code == 401 else f"HTTP {e.code}: {e.read()[:200]!r}"
        print(f"Error: the collector's API at {url}: {why}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        print(f"Error: the collector's API at {url} does not answer ({reason})", file=sys.stderr)
        return 1
    sys.stdout.write(res.get("stdout", ""))
    sys.stderr.write(res.get("stderr", ""))
    return int(res.get("exit_code", 1))


def main() -> None:
    import os
    import sys

    argv = sys.argv[1:]
    argv, servers = _strip(argv, "--server")
    local = not argv or any(a in ("--help", "-h", "--version") for a in argv)
    url = servers[-1] if servers else None
    if url is None and not local:
        _, dbs = _strip(argv, "--db")
        url = _serving(dbs[-1] if dbs else os.environ.get("CMDARE_DB") or "cmdare.duckdb")
    if url is not None and not local:
        # the collector serves its own database: the client's --db only found it
        sys.exit(_forward(url, _strip(argv, "--db")[0]))
    cli(args=argv, prog_name="analyze")


if __name__ == "__main__":
    main()
