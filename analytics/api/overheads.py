"""The overheads' library calls: import checkpoint / start-up records, predict a save and a
VM start-up with the latest overhead fit (cmdare.analytics.api re-exports them)."""

from __future__ import annotations

from typing import Any

from ..db import AnalyticsError, Database
from ..imports import overheads


def import_overheads(db: Database, kind: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Store ``kind`` records (checked again here, whoever read them) in one transaction
    (writes); how many were stored and how many were there already."""
    rows = overheads.check(kind, records) if records else []
    return overheads.store(db, kind, rows)


def _fit(db: Database, part: str, what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from .. import models

    with db.read() as con:
        f = models.latest(con, "overhead")
    m = f["model"].get(part)
    if m is None:
        raise AnalyticsError(f"the overhead fit {f['fit_id']} has no {what} model (import records with "
                             f"analyze import {'checkpoints' if part == 'checkpoint_save' else 'startups'} FILE.csv, "
                             "then analyze fit overhead)")
    return f, m


def _answer(f: dict[str, Any], m: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    predicted = {"seconds": p["seconds"], "interval": p["interval"], "fit_id": f["fit_id"],
                 "extrapolates": p["extrapolates"]}
    rest = {k: v for k, v in p.items() if k not in predicted}
    return {"predicted": predicted, "prediction": p["seconds"], "interval": p["interval"], "fit_id": f["fit_id"],
            "extrapolated": p["extrapolates"], **rest, "family": m["family"],
            "held_out_mape": m["cv"]["mape"]}


def predict_checkpoint(db: Database, size_mb: float, tensors: int | None = None,
                       params: int | None = None) -> dict[str, Any]:
    """Seconds to save a checkpoint of ``size_mb`` MB (the model's tensors / params where known)."""
    from ..models.overhead_records import predict_save

    f, m = _fit(db, "checkpoint_save", "checkpoint save")
    return _answer(f, m, predict_save(m, size_mb, tensors, params))


def predict_startup(db: Database, region: str, purchase: str, gpu_type: str) -> dict[str, Any]:
    """Seconds from a VM request to the guest ready, for this region, purchase option and accelerator."""
    from ..models.overhead_records import predict_startup as predict

    if purchase not in ("spot", "on-demand"):
        raise AnalyticsError(f"purchase must be spot or on-demand, not {purchase[:20]!r}")
    from .. import models

    with db.read() as con:
        f = models.latest(con, "overhead")
    if f["model"].get("vm_startup") is None and f["model"].get("vm_startup_seconds"):
        return _from_lives(f, region, purchase, gpu_type)  # what the agents measured, as recommend region reads it
    f, m = _fit(db, "vm_startup", "VM start-up")
    return _answer(f, m, predict(m, region, purchase, gpu_type))


def _from_lives(f: dict[str, Any], region: str, purchase: str, gpu_type: str) -> dict[str, Any]:
    """A start-up prediction from the start-ups the agents measured (the overhead fit's
    ``vm_startup_seconds``, the figures ``fit overhead`` lists and ``recommend region``
    uses) when no start-up records were imported: the group of this region, accelerator
    and purchase option; else the nearest (the same accelerator and purchase elsewhere,
    then the same purchase option, then every VM), saying that it extrapolates."""
    from .. import catalog

    def acc_name(a: str) -> str:
        try:
            return catalog.lookup(a).name
        except AnalyticsError:
            return " ".join(a.lower().split())

    want = (region.strip().lower(), acc_name(gpu_type), purchase)
    groups = []
    for key, g in f["model"]["vm_startup_seconds"].items():
        r, a, kind = (key.split("/") + ["", ""])[:3]
        groups.append(((r.lower(), acc_name(a), kind), key, g))
    levels = (("group", lambda k: k == want), ("the same accelerator and purchase in other regions",
                                               lambda k: k[1:] == want[1:]),
              ("the same purchase option", lambda k: k[2] == want[2]), ("every VM", lambda k: True))
    level, hit = "", []
    for name, match in levels:
        level, hit = name, [(key, g) for k, key, g in groups if match(k)]
        if hit:
            break
    n = sum(g["n"] for _, g in hit)
    mean = sum(g["mean"] * g["n"] for _, g in hit) / n
    one = len(hit) == 1 and hit[0][1]["lower"] is not None
    interval = [hit[0][1]["lower"], hit[0][1]["upper"]] if one else None
    extrapolates = level != "group"
    p = {"seconds": mean, "interval": interval, "extrapolates": extrapolates,
         "from": "the agents' measured VM start-ups (" + ", ".join(sorted({g["covers"] for _, g in hit})) + ")",
         "groups": [k for k, _ in hit], "group_vms": n}
    if interval is None:
        p["no_interval"] = ("no 95% interval: " + ("one VM measured" if n == 1 else f"{len(hit)} groups pooled"))
    if extrapolates:
        p["extrapolation"] = [f"{'/'.join(want)} never measured: from {level}"]
    return {"predicted": {"seconds": mean, "interval": interval, "fit_id": f["fit_id"], "extrapolates": extrapolates},
            "prediction": mean, "interval": interval, "fit_id": f["fit_id"], "extrapolated": extrapolates,
            **{k: v for k, v in p.items() if k not in ("seconds", "interval", "extrapolates")},
            "family": "measured means", "held_out_mape": None}
