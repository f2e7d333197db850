"""``analyze fit`` and ``analyze predict speed|cluster|revocation|checkpoint|startup``: performance models."""

from __future__ import annotations

from typing import Any

import click

from .. import api
from . import render
from .common import call, cli, db_option, json_option, lost_after_option
from .options import table_options


@cli.command(name="fit")
@click.argument("kind", type=click.Choice(api.FIT_KINDS))
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
    overhead  checkpoint save time from size (and tensors / params) over imported and
              live saves; VM start-up by region, purchase option and accelerator in
              the cloud's phases (imported) and as agents measured it; restore time
              against size; resume after a revocation
    lifetime  Kaplan-Meier survival of spot VM lives per region and accelerator, with
              Cox proportional hazards across them

    Error is held out: leave one model architecture out (MAPE, R^2; VM start-ups: leave
    one VM out), never training error.

    \b
    Example:
      analyze fit speed --json
    """
    render.fit(call(db, api.fit, kind=kind, lost_after=lost_after), as_json_)


@cli.group()
def predict() -> None:
    """Predict with the latest stored fit of a kind (read-only); every answer names its fit.

    \b
    Example:
      analyze predict speed --gpu-type v100 --flops-per-step 3.1e12 --params 25.6e6
    """


def _model(given: dict[str, Any]) -> tuple[api.ModelSpec | None, str | None, int | None]:
    """(model, from_job, batch_size) from the model options: a job, or a declaration."""
    from_job, fps, params = given.get("from_job"), given.get("flops_per_step"), given.get("params")
    tensors, batch = given.get("tensors"), given.get("batch_size")
    if from_job is not None:
        if fps or params or tensors:
            raise click.UsageError("give either --from-job, or the model's --flops-per-step and --params")
        if not from_job.strip():
            raise click.UsageError("--from-job must name a job")
        return None, from_job, batch
    if fps is None or params is None:
        raise click.UsageError("give --flops-per-step and --params, or --from-job JOB")
    return api.ModelSpec.of(fps, params, tensors, batch), None, batch


@predict.command(name="speed")
@table_options(api.PREDICTIONS["speed"], gpu_type={"required": True})
@db_option
@json_option
def predict_speed(db: str, as_json_: bool, **given: Any) -> None:
    """Single-worker steps/s of a model on an accelerator, with a 95% interval.

    With --from-job J: the model of job J, from J's measured steady-state speed and the
    speed fit's ratio between J's accelerator and --gpu-type (J ran several workers: its
    single-worker time through the cluster fit).

    \b
    Examples:
      analyze predict speed --gpu-type v100 --flops-per-step 3.1e12 --params 25.6e6 --json
      analyze predict speed --from-job resnet-k80 --gpu-type p100
    """
    model, from_job, batch_size = _model(given)
    out = call(db, api.predict_speed, gpu_type=given["gpu_type"], model=model, from_job=from_job, batch_size=batch_size)
    render.prediction(out, as_json_, "steps/s")


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
@table_options(api.PREDICTIONS["cluster"], ps={"required": True})
@db_option
@json_option
def predict_cluster(db: str, as_json_: bool, **given: Any) -> None:
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
    gpu_type, workers, gpus, ps = given.get("gpu_type"), given.get("workers"), given.get("gpus"), given["ps"]
    model, from_job, batch_size = _model(given)
    if gpus and (gpu_type or workers):
        raise click.UsageError("give either --gpus, or --gpu-type with --workers")
    if not gpus and not workers:
        raise click.UsageError("give --workers (and --gpu-type), or --gpus TYPE:COUNT,...")
    if not gpus and not gpu_type and from_job is None:
        raise click.UsageError("give --gpu-type and --workers, or --gpus TYPE:COUNT,...")
    spec = _parse_gpus(gpus) if gpus else [(gpu_type or "", workers or 1)]

    out = call(db, api.predict_cluster, gpus=spec, ps=ps, model=model, from_job=from_job, batch_size=batch_size)
    render.prediction(out, as_json_, "steps/s")


@predict.command(name="revocation")
@table_options(api.PREDICTIONS["revocation"], region={"required": True}, gpu_type={"required": True},
               hours={"required": True})
@db_option
@json_option
def predict_revocation(db: str, as_json_: bool, **given: Any) -> None:
    """Probability that a spot VM of this region and accelerator is revoked within HOURS of
    its boot (Kaplan-Meier), with a 95% interval.

    \b
    Example:
      analyze predict revocation --region us-central1 --gpu-type v100 --hours 6
    """
    out = call(db, api.predict_revocation, region=given["region"], gpu_type=given["gpu_type"], hours=given["hours"])
    render.prediction(out, as_json_, "probability")


@predict.command(name="checkpoint")
@table_options(api.PREDICTIONS["checkpoint"], size_mb={"required": True})
@db_option
@json_option
def predict_checkpoint(db: str, as_json_: bool, **given: Any) -> None:
    """Seconds to save a checkpoint of SIZE MB, from the overhead fit (imported and live
    saves), with a 95% interval. The model's --tensors (and --params) sharpen it where the
    fit's family uses them; without them the fit's size-only member answers.

    \b
    Examples:
      analyze predict checkpoint --size-mb 48 --tensors 278
      analyze predict checkpoint --size-mb 93 --json
    """
    out = call(db, api.predict_checkpoint, size_mb=given["size_mb"], tensors=given.get("tensors"),
               params=given.get("params"))
    render.prediction(out, as_json_, "s")


@predict.command(name="startup")
@table_options(api.PREDICTIONS["startup"], region={"required": True}, purchase={"required": True},
               gpu_type={"required": True})
@db_option
@json_option
def predict_startup(db: str, as_json_: bool, **given: Any) -> None:
    """Seconds from a VM request to the guest ready (the cloud's provisioning, staging and
    booting phases) in this region, for this purchase option and accelerator, from the
    overhead fit, with a 95% interval for one VM. A group never measured is predicted from
    the nearest measured one and says that it extrapolates.

    \b
    Example:
      analyze predict startup --region us-east1 --purchase spot --gpu-type p100 --json
    """
    out = call(db, api.predict_startup, region=given["region"], purchase=given["purchase"], gpu_type=given["gpu_type"])
    render.prediction(out, as_json_, "s")
