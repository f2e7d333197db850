"""``analyze recommend KIND``: what to do about it (one command per recommender)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import api
from ..db import AnalyticsError, default_db
from . import call, cli, db_option, json_option, render


def _recommend(db: str | None, kind: str, **options: Any) -> list[Any]:
    """Recommender ``kind`` on ``db`` (locally or through its collector), or with no
    database when its options give it everything."""
    if db is not None:
        return call(db, "recommend", kind=kind, **options)
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
    def run(db_: str | None) -> list[Any]:
        return _recommend(db_, "data_workers", consumer_ms=_csv(consumer_ms), worker_ms=_csv(worker_ms), current=current,
            batch_ms=_csv(batch_ms), knee=knee, worker_price=worker_price, job=job or "", window=window,
        )

    recs = run(db if job else None)
    for r in recs:
        render.recommendation(r, as_json_)


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
    def run(db_: str | None) -> list[Any]:
        return _recommend(db_, "placement", trace=trace or "", job=job or "", host_price=host_price,
            worker_price=worker_price, threshold=threshold, local_stop=local_stop, local_limit=local_limit,
        )

    recs = run(db if job else None)
    for r in recs:
        render.recommendation(r, as_json_)


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
    recs = _recommend(db, "region", gpu_type=gpu_type, min_lives=min_lives, hours=hours, prices=list(prices),
                      zones=zones)
    for r in recs:
        render.recommendation(r, as_json_)


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
    def run(db_: str | None) -> list[Any]:
        return _recommend(db_, "provision", profile=profile, loss=loss or 0.0, deadline=deadline or 0.0,
            confidence=confidence, on_demand=on_demand, max_plans=max_plans,
        )

    recs = run(None if db is None and not Path(default_db()).exists() else db or default_db())
    for r in recs:
        render.recommendation(r, as_json_)


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
    if deadline and not steps:
        raise click.UsageError("--deadline needs --steps")

    def run(db_: str | None) -> list[Any]:
        return _recommend(db_, "cluster", from_job=from_job or "", gpu_type=gpu_type or "", flops_per_step=flops_per_step or 0.0,
            params=params or 0.0, tensors=tensors or 0, max_workers=max_workers, max_ps=max_ps, knee=knee,
            steps=steps, deadline=deadline or 0.0, worker_price=worker_price, ps_price=ps_price,
            worker_type=worker_type or "", ps_type=ps_type or "", region=region or "", purchase=purchase,
        )

    for r in run(db):
        render.recommendation(r, as_json_)
