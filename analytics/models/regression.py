"""What every model shares: ordinary least squares reduced to what prediction needs
(stored as JSON), leave-one-group-out cross-validation (a group is a model architecture or
a lifetime group, so no group is in both the training and the test fold; error is always
held out), the ``Fit`` every model returns, and the data-size check."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..db import AnalyticsError

ALPHA = 0.05  # 95 % intervals


# -- least squares with stored, reusable results -----------------------------------------
@dataclass
class Linear:
    """An OLS fit reduced to what prediction needs (stored as JSON)."""

    columns: list[str]
    params: list[float]
    cov: list[list[float]]
    scale: float
    df_resid: float
    log_target: bool = False

    @classmethod
    def fit(cls, X: np.ndarray, y: np.ndarray, columns: list[str], log_target: bool = False) -> Linear:
        import statsmodels.api as sm

        r = sm.OLS(np.log(y) if log_target else y, X).fit()
        return cls(
            columns,
            [float(v) for v in r.params],
            r.cov_params().tolist(),
            float(r.scale),
            float(r.df_resid),
            log_target,
        )

    def predict(self, x: np.ndarray, alpha: float = ALPHA) -> tuple[float, float, float]:
        """(prediction, lower, upper) of one observation: the OLS prediction interval
        (t distribution), back-transformed for a log target."""
        from scipy import stats

        b, c = np.asarray(self.params), np.asarray(self.cov)
        mean = float(x @ b)
        se = math.sqrt(max(0.0, float(x @ c @ x) + self.scale))
        q = float(stats.t.ppf(1 - alpha / 2, max(1.0, self.df_resid)))
        lo, hi = mean - q * se, mean + q * se
        if self.log_target:
            return math.exp(mean), math.exp(lo), math.exp(hi)
        return mean, lo, hi

    def point(self, x: np.ndarray) -> float:
        m = float(x @ np.asarray(self.params))
        return math.exp(m) if self.log_target else m


def logo_cv(
    X: np.ndarray, y: np.ndarray, groups: list[str], columns: list[str], log_target: bool
) -> dict[str, Any]:
    """Leave-one-group-out: each group is predicted by a fit on all the others.  Returns
    MAPE, R^2 (held out) and the folds (for the test that they are disjoint)."""
    preds = np.empty_like(y, dtype=float)
    folds = []
    g = np.asarray(groups)
    for grp in sorted(set(groups)):
        test = g == grp
        train = ~test
        m = Linear.fit(X[train], y[train], columns, log_target)
        preds[test] = [m.point(x) for x in X[test]]
        folds.append({"test_group": grp, "train_groups": sorted(set(g[train])), "test_rows": int(test.sum())})
    ape = np.abs(preds - y) / y
    ss_res = float(np.sum((y - preds) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return {
        "mape": float(ape.mean()),
        "r2": 1 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        "folds": folds,
        "predictions": preds.tolist(),  # held out, row order (reports; not stored)
        "worst": sorted(
            ({"group": gr, "ape": float(a)} for gr, a in zip(groups, ape, strict=False)),
            key=lambda d: -d["ape"],
        )[:5],
    }


def need_data(n: int, groups: int, min_rows: int, min_groups: int, what: str, hint: str) -> None:
    if n < min_rows or groups < min_groups:
        raise AnalyticsError(
            f"{what} needs at least {min_rows} configurations from {min_groups} model architectures "
            f"for a held-out error; the database has {n} from {groups} ({hint})"
        )



@dataclass
class Fit:
    kind: str
    family: str
    model: dict[str, Any]
    rows: int
    groups: int
    cv: dict[str, Any]
    data_from: dt.datetime | None
    data_to: dt.datetime | None
    features: list[str] = field(default_factory=list)
    fit_id: str = ""
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "fit_id": self.fit_id,
            "kind": self.kind,
            "family": self.family,
            "features": self.features,
            "rows": self.rows,
            "groups": self.groups,
            "cv_mape": self.cv.get("mape"),
            "cv_r2": self.cv.get("r2"),
            "data_from": self.data_from.isoformat(sep=" ") if self.data_from else None,
            "data_to": self.data_to.isoformat(sep=" ") if self.data_to else None,
            "coefficients": self.model.get("coefficients", {}),
            **{k: v for k, v in self.model.items() if k.endswith("_seconds")},  # overhead means
            "notes": self.notes,
        }
