"""``analyze recommend KIND``: what to do about it (one command per recommender)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import api
from ..db import AnalyticsError, default_db
from . import render
from .common import call, cli, db_option, json_option
from .options import table_options, table_values


def _recommend(db: str | None, kind: str, **options: Any) -> list[Any]:
    """Recommender ``kind`` on ``db`` (locally or through its collector), or with no
    database when its options give it everything."""
    if db is not None:
        return call(db, api.recommend, kind=kind, **options)
    try:
        return api.recommend(None, kind, **options)
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None


@cli.group()
def recommend() -> None:
    """What to do about it: each answer gives the action, the predicted outcome with an
    interval, its cost where prices are known, the fits used, the assumptions and a one-line
    why (docs/recommendations.md).

    \b
    Example:
      analyze recommend data-workers --consumer-ms 10,10 --worker-ms 40,40,40,400
    """


def _table(kind: str) -> dict[str, Any]:
    return api.recommender_options(kind)


@recommend.command(name="data-workers")
@table_options(_table("data_workers"))
@db_option
@json_option
def recommend_data_workers(db: str, as_json_: bool, **given: Any) -> None:
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
    o = table_values(_table("data_workers"), given)
    recs = _recommend(db if o["job"] else None, "data_workers", **o)
    for r in recs:
        render.recommendation(r, as_json_)


@recommend.command(name="placement")
@table_options(_table("placement"), trace={"type": click.Path(dir_okay=False)})
@db_option
@json_option
def recommend_placement(db: str, as_json_: bool, **given: Any) -> None:
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
    left out). A price not given is the price catalogue's for the job's own nodes (its
    accelerator hosts', its input workers'); --trace needs both prices.
    """
    o = table_values(_table("placement"), given)
    recs = _recommend(db if o["job"] else None, "placement", **o)
    for r in recs:
        render.recommendation(r, as_json_)


@recommend.command(name="region")
@table_options(_table("region"), gpu_type={"required": True},
               prices={"decls": ["--price"], "multiple": True, "metavar": "REGION=DOLLARS",
                       "help": "spot $/hour in a region (repeatable; default: the price catalogue's, per accelerator)"})
@db_option
@json_option
def recommend_region(db: str, as_json_: bool, **given: Any) -> None:
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
    recs = _recommend(db, "region", **table_values(_table("region"), given))
    for r in recs:
        render.recommendation(r, as_json_)


@recommend.command(name="provision")
@table_options(_table("provision"), profile={"required": True, "type": click.Path(dir_okay=False)},
               profile_text={"hidden": True})
@click.option("--db", default=None, show_default="$CMDARE_DB or ./cmdare.duckdb where it exists",
              help="database with lifetime / overhead fits (revocation-aware plans); without one, revocations are not counted")
@json_option
def recommend_provision(db: str | None, as_json_: bool, **given: Any) -> None:
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
    o = table_values(_table("provision"), given)
    recs = _recommend(None if db is None and not Path(default_db()).exists() else db or default_db(), "provision", **o)
    for r in recs:
        render.recommendation(r, as_json_)


@recommend.command(name="cluster")
@table_options(_table("cluster"))
@db_option
@json_option
def recommend_cluster(db: str, as_json_: bool, **given: Any) -> None:
    """How many workers and parameter servers for job J's model and accelerator: per PS
    count, the knee (the count past which one more worker adds 7 % or less), from the
    model's measured runs at several worker counts where they show it, else from the
    cluster fit; whether a second PS pays (its knee is faster by more than the threshold);
    with --steps and --deadline, the cheapest counts that finish in time.

    With --gpu-type, the job's model sized on another accelerator (its single-worker time
    carried there by the speed fit). Without a job: a declaration (--flops-per-step,
    --params, --tensors) and --gpu-type, through the speed and cluster fits.

    A data-parallel job (no parameter server; it reports its all-reduce: DDP, FSDP): the
    world size and nodes from the all-reduce cost model fitted to its model's runs, and
    what hides its communication (gradient accumulation, one node, fp16 compression),
    each with its predicted gain (docs/recommendations.md).

    \b
    Examples:
      analyze recommend cluster --from-job resnet-1gpu
      analyze recommend cluster --from-job resnet-k80 --gpu-type p100
      analyze recommend cluster --flops-per-step 3.1e12 --params 25.6e6 --gpu-type v100
      analyze recommend cluster --from-job resnet-1gpu --steps 1e6 --deadline 8h --worker-price 0.9 --ps-price 0.2
    """
    o = table_values(_table("cluster"), given)
    if o["deadline"] and not o["steps"]:
        raise click.UsageError("--deadline needs --steps")
    for r in _recommend(db, "cluster", **o):
        render.recommendation(r, as_json_)
