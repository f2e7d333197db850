"""Models: fit, predict speed, cluster speed and revocation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from cmdare.wire.plugin import Option

from ..db import AnalyticsError, Database

FIT_KINDS = ("speed", "cluster", "overhead", "lifetime")


@dataclass
class FitResult:
    """A stored fit: its summary (fit_id, family, rows, groups, cv_mape, cv_r2,
    coefficients, notes), held-out details (``cv``) and the model's own numbers."""

    kind: str
    summary: dict[str, Any]
    cv: dict[str, Any]
    model: dict[str, Any]


def latest_or_none(con: Any, kind: str) -> dict[str, Any] | None:
    from .. import models

    try:
        return models.latest(con, kind)
    except AnalyticsError:
        return None


def fit(db: Database, kind: str, lost_after: float = 3) -> FitResult:
    """Fit a model of ``kind`` from the database and store it in model_fits (writes)."""
    from .. import models

    if kind not in FIT_KINDS:
        raise AnalyticsError(f"fit: unknown kind {kind!r} (known: {', '.join(FIT_KINDS)})")
    if not db.exists():
        raise AnalyticsError(f"{db.path}: no such database (load one with cmdare-collector, or pass --db)")
    with db.write() as con:
        if kind in ("speed", "cluster"):
            js, skipped = models.job_speeds(con)
            f = models.fit_speed(js) if kind == "speed" else models.fit_cluster(js, latest_or_none(con, "speed"))
            f.notes += skipped
        elif kind == "overhead":
            f = models.fit_overhead(con)
        else:
            f = models.fit_lifetime(con, lost_after)
        models.save(con, f)
    return FitResult(kind, f.summary(), dict(f.cv), dict(f.model))


@dataclass(frozen=True)
class ModelSpec:
    """The model a prediction is for, when no job supplies it."""

    flops_per_step: float
    params: float
    tensors: int
    batch_size: int | None = None

    @classmethod
    def of(cls, flops_per_step: float, params: float, tensors: int | None = None,
           batch_size: int | None = None) -> ModelSpec:
        """With the default tensor count (params / 1e5, at least 1) when none is given."""
        return cls(flops_per_step, params, tensors or max(1, round(params / 1e5)), batch_size)


def _measured(a: Any) -> dict[str, Any]:
    """What a --from-job job supplied (the keys every such prediction adds)."""
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


# each prediction's options, declared once: the CLI's options are generated from these
# tables, and the HTTP API's query parameters carry the same names and bounds
MODEL_OPTIONS: dict[str, Any] = {
    "from_job": Option("str", "", "a job in the database: its model, accelerator and measured steady-state speed "
                                  "(instead of the options below)"),
    "flops_per_step": Option("float", 0.0, "FLOPs per training step", lo=0, lo_open=True),
    "params": Option("float", 0.0, "parameter count", lo=0, lo_open=True),
    "tensors": Option("int", 0, "parameter tensors (default: params / 1e5, at least 1)", lo=1, hi=1 << 31),
    "batch_size": Option("int", 0, "per-worker batch size (adds examples/s)", lo=1, hi=1 << 31),
}
PREDICTIONS: dict[str, dict[str, Any]] = {
    "speed": {"gpu_type": Option("str", "", "accelerator (catalogue name or alias, e.g. v100)"), **MODEL_OPTIONS},
    "cluster": {
        "gpu_type": Option("str", "", "accelerator of every worker (with workers)"),
        "workers": Option("int", 0, "number of workers (with gpu_type)", lo=1, hi=65536),
        "gpus": Option("str", "", "heterogeneous workers, TYPE:COUNT,... e.g. k80:2,p100:2"),
        "ps": Option("int", 0, "parameter servers", lo=1, hi=4096),
        **MODEL_OPTIONS,
    },
    "revocation": {
        "region": Option("str", "", "the region (e.g. us-central1)"),
        "gpu_type": Option("str", "", "the accelerator (catalogue name or alias)"),
        "hours": Option("float", 0.0, "hours after boot", lo=0, lo_open=True, hi=1e6),
    },
    "checkpoint": {
        "size_mb": Option("float", 0.0, "checkpoint size, MB", lo=0, lo_open=True, hi=1e8),
        "tensors": Option("int", 0, "parameter tensors of the model (where known)", lo=1, hi=10**9),
        "params": Option("int", 0, "parameters of the model (where known)", lo=1, hi=10**15),
    },
    "startup": {
        "region": Option("str", "", "the region (e.g. us-east1)"),
        "purchase": Option("str", "spot", "purchase option: spot or on-demand", choices=("spot", "on-demand")),
        "gpu_type": Option("str", "", "the accelerator (e.g. p100)"),
    },
}


def predict_speed(db: Database, gpu_type: str, model: ModelSpec | None = None, from_job: str | None = None,
                  batch_size: int | None = None) -> dict[str, Any]:
    """Single-worker steps/s of a model (or of job ``from_job``'s) on an accelerator."""
    from .. import catalog, models

    with db.read() as con:
        acc = catalog.lookup(gpu_type)
        f = models.latest(con, "speed")
        if model is None:
            if not from_job:
                raise AnalyticsError("give --flops-per-step and --params, or --from-job JOB")
            a = models.anchor(con, from_job, latest_or_none(con, "cluster"))
            j = a.job
            v_fit, lo, hi = models.predict_speed(f, acc, j.flops_per_step, j.params, j.tensors)
            v = 1.0 / a.t1_on(acc, f)
            k = v / v_fit  # the fit's interval, carried to the measured level
            out = {"prediction": v, "interval": [lo * k, hi * k], "fit_id": f["fit_id"], **_measured(a)}
            bs = batch_size or j.batch_size
            spec = models.range_inputs(j.flops_per_step, j.params, j.tensors)
        else:
            v, lo, hi = models.predict_speed(f, acc, model.flops_per_step, model.params, model.tensors)
            out = {"prediction": v, "interval": [lo, hi], "fit_id": f["fit_id"]}
            bs = model.batch_size
            spec = models.range_inputs(model.flops_per_step, model.params, model.tensors)
        _extrapolation(out, f, **spec, accelerator=acc.name)
    out |= {"accelerator": acc.name, "step_seconds": 1 / v}
    if bs:
        out["examples_per_second"] = v * bs
    return out


def predict_cluster(db: Database, gpus: list[tuple[str, int]], ps: int, model: ModelSpec | None = None,
                    from_job: str | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """Cluster steps/s of a PS job on workers ``gpus`` ((type, count); type "" is the job's)."""
    with db.read() as con:
        return cluster_prediction(con, gpus, ps, model, from_job, batch_size)


def cluster_prediction(con: duckdb.DuckDBPyConnection, gpus: list[tuple[str, int]], ps: int,
                       model: ModelSpec | None = None, from_job: str | None = None, batch_size: int | None = None,
                       cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """``predict_cluster`` on an open connection; ``cache``: the fits and the job's anchor kept
    across calls (a scaling curve predicts one job at many worker counts)."""
    from .. import catalog, models

    cache = cache if cache is not None else {}
    if "fits" not in cache:
        cache["fits"] = models.latest(con, "speed"), models.latest(con, "cluster")
    sfit, cfit = cache["fits"]
    extra: dict[str, Any] = {}
    ws: list[float] = []
    if model is None:
        if not from_job:
            raise AnalyticsError("give --flops-per-step and --params, or --from-job JOB")
        if cache.get("anchor_of") != from_job:
            cache["anchor"], cache["anchor_of"] = models.anchor(con, from_job, cfit), from_job
        a = cache["anchor"]
        params, bs = a.job.params, batch_size or a.job.batch_size
        for name, n in gpus:
            acc = catalog.lookup(name) if name else a.job.acc
            ws += [a.t1_on(acc, sfit)] * n
        extra = _measured(a)
    else:
        params, bs = model.params, model.batch_size
        for name, n in gpus:
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
    accs = sorted({catalog.lookup(n).name if n else a.job.acc.name for n, _ in gpus if n or a.job.acc})
    _extrapolation(out, cfit, workers=len(ws), ps=ps, workers_per_ps=len(ws) / max(ps, 1), params=params,
                   accelerator=accs)
    if model is not None:  # the single-worker time came from the speed fit: its rule holds too (issue 66)
        _also(out, sfit, **models.range_inputs(model.flops_per_step, model.params, model.tensors), accelerator=accs)
    if bs:
        out["examples_per_second"] = out["prediction"] * bs
    return out


def _also(out: dict[str, Any], fit: dict[str, Any], **inputs: Any) -> None:
    """A second fit's extrapolation rule over the same prediction (the cluster's from a
    declaration rests on the speed fit too): its reasons added, its interval widening
    applied on top, no interval (``rough``) when either fit is past its limit."""
    second: dict[str, Any] = {"prediction": out["prediction"], "interval": out["interval"] or [0.0, 0.0]}
    _extrapolation(second, fit, **inputs)
    reasons = [*out.get("extrapolation", []), *(r for r in second.get("extrapolation", [])
                                                 if r not in out.get("extrapolation", []))]
    if reasons:
        out["extrapolation"] = reasons
    if second["extrapolated"]:
        out["extrapolated"] = True
    if "rough" in second or out.get("interval") is None:
        out["interval"] = None
        out["rough"] = "; ".join(dict.fromkeys(x for x in (out.get("rough"), second.get("rough")) if x))
        return
    out["interval"] = second["interval"]
    if "interval_widened" in second:
        out["interval_widened"] = round(out.get("interval_widened", 1.0) * second["interval_widened"], 3)


def _extrapolation(out: dict[str, Any], fit: dict[str, Any], **inputs: Any) -> None:
    """``extrapolated`` (None: the fit cannot tell), the reasons, and the interval widened
    by the decades outside the fitted ranges; past the limit no interval and ``rough``, why
    (cmdare.analytics.models.ranges)."""
    from ..models.ranges import check, rough, widen

    ex, reasons, decades = check(fit, **inputs)
    out["extrapolated"] = ex
    if reasons:
        out["extrapolation"] = reasons
    if why := rough(fit, **inputs):  # too far for any interval: a point estimate, said to be rough
        out["interval"] = None
        out["rough"] = why
        return
    if ex and decades > 0:
        lo, hi = out["interval"]
        out["interval"] = list(widen(out["prediction"], lo, hi, decades))
        out["interval_widened"] = round(1 + decades, 3)


def predict_revocation(db: Database, region: str, gpu_type: str, hours: float) -> dict[str, Any]:
    """P(a spot VM of this region and accelerator is revoked within ``hours`` of boot)."""
    from .. import models

    with db.read() as con:
        f = models.latest(con, "lifetime")
        r = models.predict_revocation(f, region, gpu_type, hours)
    return {"prediction": r.pop("probability"), "interval": [r.pop("lower"), r.pop("upper")],
            "fit_id": f["fit_id"], **r}
