"""Storing fits in ``model_fits`` and reading the latest one of a kind back."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from typing import Any

import duckdb

from ..db import AnalyticsError
from ..queries import needs_schema
from .regression import Fit


def clean(x: Any) -> Any:
    """JSON without NaN / infinity (DuckDB's JSON and other tools reject them)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def save(con: duckdb.DuckDBPyConnection, fit: Fit) -> str:
    fit.fit_id = f"{fit.kind}-{dt.datetime.now(dt.timezone.utc):%Y%m%d%H%M%S}-{uuid.uuid4().hex[:6]}"
    con.execute(
        "INSERT INTO model_fits VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now()::TIMESTAMP)",
        [
            fit.fit_id,
            fit.kind,
            fit.family,
            json.dumps(fit.features),
            json.dumps(clean(fit.model.get("coefficients", {}))),
            json.dumps(clean(fit.model)),
            fit.data_from,
            fit.data_to,
            fit.rows,
            fit.groups,
            clean(fit.cv.get("mape")),
            clean(fit.cv.get("r2")),
            json.dumps(clean({k: v for k, v in fit.cv.items() if k != "predictions"})),
            json.dumps(fit.notes),
        ],
    )
    return fit.fit_id


def latest(con: duckdb.DuckDBPyConnection, kind: str) -> dict[str, Any]:
    needs_schema(con, 5, f"a {kind} prediction")
    r = con.execute(
        """SELECT fit_id, family, model, cv_mape, rows, cv FROM model_fits WHERE kind = ?
           ORDER BY fitted_at DESC, fit_id DESC LIMIT 1""",
        [kind],
    ).fetchone()
    if r is None:
        raise AnalyticsError(f"no {kind} fit stored yet: run analyze fit {kind} first")
    return {"fit_id": r[0], "family": r[1], "model": json.loads(r[2]), "cv_mape": r[3], "rows": r[4],
            "cv": json.loads(r[5]) if r[5] else {}}
