"""``analyze nodes|instances|revocations|goodput|gpu|host|jobs|steps|sql``: telemetry as tables."""

from __future__ import annotations

import click

from .. import api
from . import render
from .common import (
    call,
    cli,
    columns_option,
    cutoff,
    db_option,
    every_option,
    every_value,
    gpu_type_option,
    json_object_option,
    json_option,
    label_option,
    lost_after_option,
    node_option,
    region_option,
    since_option,
    time_option_value,
    until_option,
    wide_option,
)

# the columns each table shows by default: those that fit 120 characters (--wide: all)
NODES_COLUMNS = ("node", "role", "job", "state", "lives", "last_seen", "gpus", "dropped", "not_ok")
GPU_COLUMNS = ("node", "gpu", "name", "util_pct", "mem_used_gib", "power_w", "temp_max_c", "throttled_pct",
               "xid_events")
HOST_COLUMNS = ("node", "cpu_pct", "load1", "mem_used_gib", "mem_total_gib", "net_rx_mb_s", "net_tx_mb_s",
                "last_sample")


@cli.command()
@lost_after_option
@label_option
@columns_option
@wide_option
@db_option
@json_option
def nodes(lost_after: float, label: str | None, columns: str | None, wide: bool, db: str, as_json_: bool) -> None:
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
      analyze nodes --label team=vision --wide
    """
    render.rows(call(db, api.nodes, lost_after=lost_after, label=label), as_json_, columns, NODES_COLUMNS, wide)


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
    render.rows(call(db, api.instances, lost_after=lost_after, since=cutoff(since), region=region, gpu_type=gpu_type), as_json_)


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
    render.rows(call(db, api.revocations, since=cutoff(since), region=region, gpu_type=gpu_type), as_json_)


@cli.command()
@click.option("--job", help="the training job's id (see analyze jobs)")
@click.option("--fleet", is_flag=True,
              help="every job in the range (stepping, or a Kubernetes pod or Slurm job holding GPUs), rolled up --by")
@click.option("--by", default="fleet", show_default=True, metavar="job|region|accelerator|fleet|namespace|slurm_job|user|LABEL",
              help="with --fleet: one row per job, region, accelerator, the fleet, Kubernetes namespace, Slurm job "
                   "or user, or value of a node label (team)")
@click.option("--detect/--no-detect", default=True, show_default=True,
              help="with --fleet: run the detectors now for jobs no detector run looked at (a database no collector "
                   "keeps current); --no-detect: stored findings only")
@click.option("--since", help="only the part of the wall time newer than this (e.g. 30m, 24h, 7d)")
@until_option
@every_option
@columns_option
@wide_option
@db_option
@json_option
def goodput(job: str | None, fleet: bool, by: str, detect: bool, since: str | None, until: str | None,
            every: str | None, columns: str | None, wide: bool, db: str, as_json_: bool) -> None:
    """Split accelerator time (wall time x the GPUs held) into closed buckets: productive
    steps, start-up, checkpoint save and restore, input wait, waiting on a saturated PS,
    stragglers, idle accelerators, work lost to revocations and restarts, and other. Every
    GPU-second lands in exactly one; the buckets add up to the total. GPU-hours, and dollars
    from the price catalogue (spot or on-demand price of each node's instance type).

    PS wait, stragglers and idle GPUs come from the detectors' evidence: the findings the
    collector's detector schedule keeps current or `analyze bottlenecks` stored; for jobs no
    detector run looked at, the detectors run now.
    With --fleet, every job that stepped in the range and every Kubernetes pod or Slurm job
    that held GPUs there, one row per --by group.

    \b
    Examples:
      analyze goodput --job resnet50-a
      analyze goodput --job resnet50-a --since 24h --every 1h
      analyze goodput --fleet --since 7d --by team
      analyze goodput --fleet --since 7d --by user
    """
    if fleet == bool(job):
        raise click.UsageError("give --job JOB, or --fleet (with --by)")
    if not fleet and by != "fleet":
        raise click.UsageError("--by goes with --fleet")
    if len(by) > 64 or not all(c.isalnum() or c in "_.-" for c in by):
        raise click.BadParameter("a group (job, region, accelerator, fleet) or a label key", param_hint="--by")
    ev = every_value(every)
    if ev is not None and ev < 60:
        raise click.BadParameter("goodput windows are at least 1m", param_hint="--every")
    if fleet:
        t = call(db, api.fleet_goodput, since=cutoff(since), until=time_option_value("--until", until), by=by,
                 every=ev, detect=detect)
    else:
        t = call(db, api.goodput, job=job, since=cutoff(since), until=time_option_value("--until", until), every=ev)
    default = None
    if fleet:  # the bucket columns are many: the main ones, and the badput buckets that hold anything
        busy = {c for c in t.columns if c.endswith("_gpu_hours") and c != "productive_gpu_hours"
                and any(r[t.columns.index(c)] for r in t.rows)}
        heavy = sorted(busy, key=lambda c: -sum(r[t.columns.index(c)] or 0 for r in t.rows))  # the largest first
        default = ("window", by, "jobs", "gpu_hours", "goodput_pct", "dollars", "badput_dollars", *heavy)
    render.rows(t, as_json_, columns, default, wide)


@cli.command()
@node_option
@since_option
@until_option
@every_option
@label_option
@click.option("--job", default=None, help="per process of this job: how much of each GPU it used (implies --processes)")
@click.option("--processes", is_flag=True,
              help="per GPU and process, with the job and rank each is (by PID; else its Kubernetes pod's job; else "
                   "its Slurm job: slurm-<id>)")
@columns_option
@wide_option
@db_option
@json_option
def gpu(node: str | None, since: str | None, until: str | None, every: str | None, label: str | None,
        job: str | None, processes: bool, columns: str | None, wide: bool, db: str, as_json_: bool) -> None:
    """Per GPU: utilisation, memory, power, temperature, throttling, ECC / Xid events, and
    the job of the Kubernetes pod or Slurm job holding it (held_by, shown where any GPU has
    one; namespace, pod, slurm_job with --wide) (with --every: per GPU and time bucket); --wide adds the profiling activity (graphics
    engine, SMs, tensor pipes, DRAM bandwidth: GPM, Hopper and later), energy, NVLink
    errors and MIG identity (a MIG instance is a GPU of its own; its parent's activity is
    its instances' weighted by their share of its SMs).  With --processes or --job: per GPU
    and process instead, with the training job and rank each process is (its PID as the
    rank declared it; else the job of the Kubernetes pod holding its GPU, with namespace,
    pod and container; else the Slurm job the agent found it in, as slurm-<id>, with its
    step and user), so what a job really used of each GPU, and what no job holds.

    \b
    Examples:
      analyze gpu --node gpu-7 --since 10m
      analyze gpu --since 2h --until 1h --every 10m --label team=vision
      analyze gpu --job resnet-42 --since 1h
      analyze gpu --processes --node gpu-7
      analyze gpu --job slurm-4243 --since 1h
      analyze gpu --job nlp/bert-0 --since 1h
    """
    if job is not None or processes:
        if every is not None or label is not None:
            raise click.UsageError("--every and --label do not apply to --processes / --job")
        render.rows(call(db, api.gpu_processes, node=node, since=cutoff(since),
                         until=time_option_value("--until", until), job=job), as_json_, columns, None, wide)
        return
    render.rows(call(db, api.gpu, node=node, since=cutoff(since), until=time_option_value("--until", until),
                     label=label, every=every_value(every)), as_json_, columns, GPU_COLUMNS, wide)


@cli.command()
@node_option
@since_option
@until_option
@label_option
@columns_option
@wide_option
@db_option
@json_option
def tpu(node: str | None, since: str | None, until: str | None, label: str | None,
        columns: str | None, wide: bool, db: str, as_json_: bool) -> None:
    """Per TPU device: TensorCore duty cycle (mean and peak), HBM used and total, HBM
    bandwidth use where libtpu reports it, and the jobs on its node.

    \b
    Examples:
      analyze tpu --since 1h
      analyze tpu --node tpu-vm-3 --json
    """
    render.rows(call(db, api.tpu, node=node, since=cutoff(since), until=time_option_value("--until", until),
                     label=label), as_json_, columns, None, wide)


@cli.command()
@node_option
@since_option
@until_option
@every_option
@label_option
@columns_option
@wide_option
@db_option
@json_option
def host(node: str | None, since: str | None, until: str | None, every: str | None, label: str | None,
         columns: str | None, wide: bool, db: str, as_json_: bool) -> None:
    """Per node: CPU, load, memory, processes, network and disk throughput (with --every:
    per node and time bucket).

    \b
    Examples:
      analyze host --since 1h
      analyze host --since 1h --every 5m --columns bucket,node,cpu_pct,load1
    """
    render.rows(call(db, api.host, node=node, since=cutoff(since), until=time_option_value("--until", until),
                     label=label, every=every_value(every)), as_json_, columns, HOST_COLUMNS, wide)


@cli.command()
@since_option
@db_option
@json_option
def jobs(since: str | None, db: str, as_json_: bool) -> None:
    """Training jobs: model, size, ranks, nodes, steps/s (mean per rank), examples/s (all
    examples over the time the job stepped: ranks side by side add up, a restart's runs
    do not), input-wait share and the input-bound verdict (TensorFlow profiler
    thresholds: under 5% not, 5-20% moderately, 20% or more highly input-bound), and the
    state of its latest run (running, finished, failed, interrupted, crashed, or its node's
    end: analyze runs shows each rank) with when it ended.

    \b
    Example:
      analyze jobs --since 1d
    """
    render.rows(call(db, api.jobs, since=cutoff(since)), as_json_)


@cli.command()
@click.option("--job", default=None, help="one training job's id (default: every job)")
@since_option
@db_option
@json_option
def runs(job: str | None, since: str | None, db: str, as_json_: bool) -> None:
    """Every training run and rank and how it stands: running, finished, failed (its error
    or exit code), interrupted, crashed (the agent saw its process gone without an end), or
    "node lost" / "node revoked" / "node stopped" (its node ended before the run said).

    \b
    Example:
      analyze runs --job resnet50-a
    """
    render.rows(call(db, api.runs, job=job, since=cutoff(since)), as_json_)


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
    render.rows(call(db, api.steps, job=job, node=node, since=cutoff(since)), as_json_)


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
    slow_steps, checkpoints, run_ends, scalars, instance_identity, lifecycle_events,
    revocations, model_fits, findings, unknown_events, dead_letters; views step_hardware,
    instances; table macros instance_lives(lost_after := 3), runs(since := NULL)).

    The query reads the database and nothing else: no files, network or extensions, no
    settings (SET, PRAGMA), one statement; a row limit and a time limit.

    \b
    Example:
      analyze sql "SELECT node, max(ts) FROM heartbeats GROUP BY node"
    """
    render.sql(call(db, api.sql, query=query, max_rows=max_rows, timeout=timeout), as_json_, max_rows)


@cli.command(name="trace")
@click.option("--job", required=True, help="the job whose imported traces to read (analyze import trace)")
@db_option
@json_object_option
def trace_(job: str, db: str, as_json_: bool) -> None:
    """Per rank of JOB's imported PyTorch profiler traces, HTA's temporal breakdown (idle,
    compute and non-compute share of the time from its first GPU kernel to its last) and the
    computation-communication overlap (the share of communication time computation hid),
    with the communication left exposed; then per profiler step the slowest rank and the
    exposed communication (mean over ranks).

    \b
    Example:
      analyze trace --job ddp-resnet
    """
    import json

    out = call(db, api.trace, job=job)
    if as_json_:
        click.echo(json.dumps(out))
        return
    for title, key in (("ranks", "ranks"), ("profiler steps", "steps")):
        rows = out[key]
        if rows:
            cols = list(rows[0])
            click.echo(f"{title}:")
            click.echo(render.table(cols, [tuple(r[c] for c in cols) for r in rows], render.WIDTH))
    click.echo(render.fold(f"note: {out['note']}"), err=True)
