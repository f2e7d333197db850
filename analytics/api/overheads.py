"""The overheads' library calls: import checkpoint / start-up records, predict a save and a
VM start-up with the latest overhead fit (cmdare.analytics.api re-exports them)."""

from __future__ import annotations

from typing import Any

from .. import overheads
from ..db import AnalyticsError, Database


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
    f, m = _fit(db, "vm_startup", "VM start-up")
    return _answer(f, m, predict(m, region, purchase, gpu_type))
