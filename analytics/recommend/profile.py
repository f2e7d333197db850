"""The provisioning profile (``analyze recommend provision --profile FILE``): a TOML file of
the job (model size, batch, iterations or a loss target, a deadline), its instance types
(GPUs, profiled speed, quota, prices) and spotDNN's loss model; read bounded, every value
checked, each error one line naming the file, the table and the key (docs/recommendations.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

from cmdare.wire.units import ConfigError, parse_duration

from .. import prices
from ..db import AnalyticsError, read_text_file


@dataclass(frozen=True)
class InstanceType:
    type: str
    gpus: int
    batch_per_gpu: int
    images_per_second: float
    quota: int
    spot_price: float | None
    on_demand_price: float | None
    spot_as_of: str  # "profile" or the catalogue row's date
    on_demand_as_of: str
    region: str | None
    accelerator: str | None

    @property
    def batch(self) -> int:
        return self.batch_per_gpu * self.gpus


@dataclass(frozen=True)
class Profile:
    path: str
    param_mb: float
    worker_bandwidth: float
    ps_bandwidth: float
    pcie: float
    alpha: float
    beta: float
    gammas: tuple[float, float, float, float, float] | None
    heterogeneity: str
    iterations: float | None
    loss_target: float | None
    deadline: float | None
    checkpoint_interval: float | None
    restart_seconds: float | None
    instances: tuple[InstanceType, ...] = field(default_factory=tuple)

    def comm_alone(self) -> np.ndarray:
        g = np.array([t.gpus for t in self.instances], dtype=float)
        return 2 * self.param_mb / self.worker_bandwidth + 2 * g * self.param_mb / self.pcie

    def t_prof(self) -> np.ndarray:
        return np.array([t.batch / t.images_per_second for t in self.instances])

    def t_comp(self) -> np.ndarray:
        return self.t_prof() - self.comm_alone()


_KEYS = {
    "job": {"param_mb", "worker_bandwidth_mbps", "iterations", "loss_target", "deadline",
            "checkpoint_interval_s", "restart_seconds"},
    "ps": {"bandwidth_mbps", "pcie_mbps", "contention_alpha", "contention_beta"},
    "loss": {"g1", "g2", "g3", "g4", "g5", "heterogeneity"},
    "instance": {"type", "gpus", "batch_per_gpu", "images_per_second", "quota", "spot_price",
                 "on_demand_price", "region", "accelerator"},
}


class _P:
    """Typed reads of one profile table, each error one line naming file, table and key."""

    def __init__(self, where: str, table: dict[str, Any], allowed: set[str]) -> None:
        self.where, self.t = where, table
        for k in table:
            if k not in allowed:
                raise AnalyticsError(f"{where}: unknown key {k!r} (expected one of {', '.join(sorted(allowed))})")

    def num(self, k: str, *, required: bool = True, positive: bool = False, nonneg: bool = False) -> float | None:
        if k not in self.t:
            if required:
                raise AnalyticsError(f"{self.where}: missing {k}")
            return None
        v = self.t[k]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise AnalyticsError(f"{self.where}: {k} must be a number, got {v!r}")
        if positive and not v > 0:
            raise AnalyticsError(f"{self.where}: {k} must be above 0, got {v!r}")
        if nonneg and v < 0:
            raise AnalyticsError(f"{self.where}: {k} must be at least 0, got {v!r}")
        return float(v)

    def whole(self, k: str, lo: int) -> int:
        if k not in self.t:
            raise AnalyticsError(f"{self.where}: missing {k}")
        v = self.t[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise AnalyticsError(f"{self.where}: {k} must be a whole number >= {lo}, got {v!r}")
        return v

    def text(self, k: str, *, required: bool = True) -> str | None:
        v = self.t.get(k)
        if v is None and not required:
            return None
        if not isinstance(v, str) or not v.strip():
            raise AnalyticsError(f"{self.where}: {'missing ' + k if v is None else k + ' must be a non-empty string'}")
        return v.strip()


MAX_PROFILE = 1 << 20


def load_profile(path: str | Path, text: str | None = None) -> Profile:
    """The provisioning profile (TOML, docs/recommendations.md#provision) of ``path``, or
    ``text`` sent to the API (named by ``path``); one line naming file, table and key if bad."""
    p = Path(path)
    try:
        if text is None:
            text = read_text_file(p, MAX_PROFILE, "a profile")
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AnalyticsError(f"{p}: not valid TOML: {str(e)[:200]}") from None
    for k in doc:
        if k not in _KEYS:
            raise AnalyticsError(f"{p}: unknown table [{k}] (expected [job], [ps], [loss], [[instance]])")
    for k in ("job", "ps"):
        if not isinstance(doc.get(k), dict):
            raise AnalyticsError(f"{p}: missing table [{k}]")
    job = _P(f"{p}: [job]", doc["job"], _KEYS["job"])
    ps = _P(f"{p}: [ps]", doc["ps"], _KEYS["ps"])
    gammas, het = None, "none"
    if "loss" in doc:
        if not isinstance(doc["loss"], dict):
            raise AnalyticsError(f"{p}: [loss] must be a table")
        lo = _P(f"{p}: [loss]", doc["loss"], _KEYS["loss"])
        gammas = tuple(lo.num(f"g{i}") for i in range(1, 6))  # type: ignore[assignment]
        het = lo.text("heterogeneity", required=False) or "none"  # spotDNN's own model
        if het not in ("share", "none"):
            raise AnalyticsError(f"{p}: [loss] heterogeneity must be \"share\" or \"none\", got {het!r}")
    iterations = job.num("iterations", required=False, positive=True)
    if gammas is None and iterations is None:
        raise AnalyticsError(f"{p}: give a [loss] table (g1..g5) or [job] iterations")
    deadline = None
    if "deadline" in doc["job"]:
        try:
            deadline = parse_duration(f"{p}: [job] deadline", doc["job"]["deadline"])
        except ConfigError as e:
            raise AnalyticsError(str(e)) from None
        if not deadline > 0:
            raise AnalyticsError(f"{p}: [job] deadline must be above 0")
    raw = doc.get("instance")
    if not isinstance(raw, list) or not raw or not all(isinstance(x, dict) for x in raw):
        raise AnalyticsError(f"{p}: give at least one [[instance]] table")
    cat = prices.load()
    insts: list[InstanceType] = []
    for i, t in enumerate(raw, 1):
        where = f"{p}: [[instance]] {i}"
        r = _P(where, t, _KEYS["instance"])
        itype = r.text("type") or ""  # (required: a string)
        where = f"{p}: [[instance]] {i} ({itype})"
        r.where = where
        if any(x.type == itype for x in insts):
            raise AnalyticsError(f"{where}: the type is listed twice")
        region = r.text("region", required=False)
        row = prices.lookup(itype, region, cat)
        spot = r.num("spot_price", required=False, nonneg=True)
        od = r.num("on_demand_price", required=False, nonneg=True)
        if spot is None and (row is None or row.spot is None):
            raise AnalyticsError(f"{where}: no spot_price in the profile and none in the price catalogue")
        acc = r.text("accelerator", required=False) or (row.accelerator if row else None)
        insts.append(InstanceType(
            itype, r.whole("gpus", 1), r.whole("batch_per_gpu", 1), r.num("images_per_second", positive=True),  # type: ignore[arg-type]
            r.whole("quota", 0), spot if spot is not None else row.spot,  # type: ignore[union-attr]
            od if od is not None else (row.on_demand if row else None),
            "profile" if spot is not None else row.as_of,  # type: ignore[union-attr]
            "profile" if od is not None else (row.as_of if row and row.on_demand is not None else ""),
            region or (row.region if row else None), acc,
        ))
    if not any(x.quota for x in insts):
        raise AnalyticsError(f"{p}: every [[instance]] quota is 0: nothing can be provisioned")
    prof = Profile(
        str(p), job.num("param_mb", positive=True), job.num("worker_bandwidth_mbps", positive=True),  # type: ignore[arg-type]
        ps.num("bandwidth_mbps", positive=True), ps.num("pcie_mbps", positive=True),  # type: ignore[arg-type]
        ps.num("contention_alpha"), ps.num("contention_beta"), gammas, het, iterations,  # type: ignore[arg-type]
        job.num("loss_target", required=False), deadline,
        job.num("checkpoint_interval_s", required=False, nonneg=True),
        job.num("restart_seconds", required=False, nonneg=True), tuple(insts),
    )
    bad = [(t, c, a) for t, c, a in zip(insts, prof.t_comp(), prof.comm_alone(), strict=True) if not c > 0]
    if bad:
        t, _, a = bad[0]
        raise AnalyticsError(
            f"{p}: [[instance]] {t.type}: {t.images_per_second:g} images/s means {t.batch / t.images_per_second:.3g} s "
            f"per iteration, no more than its communication alone ({a:.3g} s): check param_mb and the bandwidths"
        )
    return prof
