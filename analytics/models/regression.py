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
    relative: bool = False  # fitted on relative error (WLS, weights 1/y^2): the residual scale is relative

    @classmethod
    def fit(cls, X: np.ndarray, y: np.ndarray, columns: list[str], log_target: bool = False,
            relative: bool = False) -> Linear:
        """OLS; ``relative``: weighted by 1/y^2, so that each row's error counts relative to
        its size (a fast model's seconds weigh as much as a slow one's)."""
        import statsmodels.api as sm

        t = np.log(y) if log_target else y
        r = (sm.WLS(t, X, weights=1.0 / np.square(t)) if relative else sm.OLS(t, X)).fit()
        return cls(
            columns,
            [float(v) for v in r.params],
            r.cov_params().tolist(),
            float(r.scale),
            float(r.df_resid),
            log_target,
            relative,
        )

    def predict(self, x: np.ndarray, alpha: float = ALPHA) -> tuple[float, float, float]:
        """(prediction, lower, upper) of one observation: the OLS prediction interval
        (t distribution), back-transformed for a log target."""
        from scipy import stats

        b, c = np.asarray(self.params), np.asarray(self.cov)
        mean = float(x @ b)
        noise = self.scale * mean * mean if self.relative else self.scale  # one new observation's variance
        se = math.sqrt(max(0.0, float(x @ c @ x) + noise))
        q = float(stats.t.ppf(1 - alpha / 2, max(1.0, self.df_resid)))
        lo, hi = mean - q * se, mean + q * se
        if self.log_target:
            return math.exp(mean), math.exp(lo), math.exp(hi)
        return mean, lo, hi

    def point(self, x: np.ndarray) -> float:
        m = float(x @ np.asarray(self.params))
        return math.exp(m) if self.log_target else m


# -- a nonlinear law, fitted on relative error ----------------------------------------------
def _compute_tensors(theta: np.ndarray, X: np.ndarray) -> np.ndarray:
    """t = a*compute + b*tensors/peak^e + d; X columns: compute seconds (FLOPs over peak),
    parameter tensors, peak TFLOP/s.  theta = (log a, log b, e, log d): a, b, d > 0."""
    la, lb, e, ld = theta
    return np.exp(la) * X[:, 0] + np.exp(lb) * X[:, 1] / X[:, 2] ** e + np.exp(ld)


KNORM_MAX_LOG_K = 4.0  # k = e^4 ~ 55: past it the k-norm is the maximum to within rounding


def knorm_k(log_k: float) -> float:
    """The k-norm's exponent from its fitted log, bounded (the law's and its readers')."""
    return math.exp(min(log_k, KNORM_MAX_LOG_K))


def _ps_knorm(theta: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Per-worker step time as the k-norm of compute and PS contention:
    t = (base^k + cont^k)^(1/k), base = a*T1 + b*S + d, cont = c*S*W/P * P^(1-g); X columns:
    T1 seconds, S (GB moved a step), S*W/P, P.  k = 1 is the linear sum (a harmonic mean of
    the two speed limits), a larger k bends to the plateau a saturated PS shows; g < 1 when
    a second PS does not double what the PS side serves.  theta = (log a, log b, log c,
    log d, log k, g)."""
    la, lb, lc, ld, lk, g = theta
    k = knorm_k(lk)
    base = np.exp(la) * X[:, 0] + np.exp(lb) * X[:, 1] + np.exp(ld)
    cont = np.exp(lc) * X[:, 2] * np.power(np.maximum(X[:, 3], 1.0), 1.0 - g)
    m = np.maximum(base, cont)
    return m * np.power(np.power(base / m, k) + np.power(cont / m, k), 1.0 / k)


def _ps_knorm_prior(theta: np.ndarray) -> np.ndarray:
    """g is drawn toward 1 (a second PS doubles what the PS side serves) unless the runs say
    otherwise: one extra residual 0.2 (g - 1), on the log-time residuals' scale (about 0.06
    on CM-DARE's runs) roughly a prior g = 1 +- 0.3.  Without it, leaving one of the two
    multi-worker architectures out let the other alone set g (held-out error from a measured
    run 9.1 % against 8.4 % with it; the knees the same)."""
    return np.array([0.2 * (theta[5] - 1.0)])


# name -> (law, starting point, prior residuals or None); a stored fit names its law, never code
LAWS = {"compute+tensors": (_compute_tensors, [0.0, -5.0, 1.0, -5.0], None),
        "ps-knorm": (_ps_knorm, [0.0, -3.0, -2.0, -6.0, math.log(2.0), 1.0], _ps_knorm_prior)}


@dataclass
class Nonlinear:
    """A law from ``LAWS`` fitted by least squares on log(y) (relative error; scipy's
    trust-region solver), reduced to what prediction needs.  Intervals: the delta method
    on log(y) (parameter covariance from the Jacobian) plus the residual variance."""

    law: str
    columns: list[str]
    params: list[float]
    cov: list[list[float]]
    scale: float
    df_resid: float

    @classmethod
    def fit(cls, X: np.ndarray, y: np.ndarray, columns: list[str], law: str) -> Nonlinear:
        from scipy.optimize import least_squares

        f, x0, prior = LAWS[law]
        ly = np.log(y)

        def resid(th: np.ndarray) -> np.ndarray:
            r = np.log(np.maximum(f(th, X), 1e-300)) - ly
            return r if prior is None else np.r_[r, prior(th)]

        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            r = least_squares(resid, x0, method="trf", ftol=1e-15, xtol=1e-15, gtol=1e-15, max_nfev=2000)
        df = max(1, len(y) - len(x0))
        scale = float(np.sum(r.fun[: len(y)] ** 2) / df)
        jtj = r.jac.T @ r.jac
        cov = np.linalg.pinv(jtj) * scale
        return cls(law, columns, [float(v) for v in r.x], cov.tolist(), scale, float(df))

    def _log(self, x: np.ndarray, theta: np.ndarray | None = None) -> float:
        f = LAWS[self.law][0]
        return float(np.log(f(np.asarray(self.params) if theta is None else theta, x[None, :])[0]))

    def point(self, x: np.ndarray) -> float:
        return math.exp(self._log(x))

    def predict(self, x: np.ndarray, alpha: float = ALPHA) -> tuple[float, float, float]:
        from scipy import stats

        th = np.asarray(self.params)
        m = self._log(x)
        grad = np.empty_like(th)
        for i in range(len(th)):  # central differences
            h = 1e-6 * max(1.0, abs(th[i]))
            up, dn = th.copy(), th.copy()
            up[i] += h
            dn[i] -= h
            grad[i] = (self._log(x, up) - self._log(x, dn)) / (2 * h)
        se = math.sqrt(max(0.0, float(grad @ np.asarray(self.cov) @ grad) + self.scale))
        q = float(stats.t.ppf(1 - alpha / 2, max(1.0, self.df_resid)))
        return math.exp(m), math.exp(m - q * se), math.exp(m + q * se)


def fit_model(X: np.ndarray, y: np.ndarray, columns: list[str], log_target: bool, law: str | None = None,
              relative: bool = False):
    """A ``Nonlinear`` fit of ``law``, else a least-squares ``Linear`` (``relative``: WLS)."""
    return Nonlinear.fit(X, y, columns, law) if law else Linear.fit(X, y, columns, log_target, relative)


def model_from(stored: dict[str, Any]) -> Linear | Nonlinear:
    """The model of a stored fit's ``model`` object."""
    if "nonlinear" in stored:
        return Nonlinear(**stored["nonlinear"])
    return Linear(**stored["linear"])


HELD_OUT_ROWS = 5000  # held-out predictions a stored fit keeps for its plot


def logo_cv(
    X: np.ndarray, y: np.ndarray, groups: list[str], columns: list[str], log_target: bool, law: str | None = None,
    relative: bool = False,
) -> dict[str, Any]:
    """Leave-one-group-out: each group is predicted by a fit on all the others.  Returns
    MAPE, R^2 (held out), the folds (for the test that they are disjoint) and the groups
    predicted worst (mean error over the group's rows)."""
    preds = np.empty_like(y, dtype=float)
    folds = []
    g = np.asarray(groups)
    for grp in sorted(set(groups)):
        test = g == grp
        train = ~test
        m = fit_model(X[train], y[train], columns, log_target, law, relative)
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
        # each row's group, measured and held-out predicted value (stored: the models page plots them)
        "held_out": [[str(gr), float(m), float(p)] for gr, m, p in zip(groups, y, preds, strict=True)][:HELD_OUT_ROWS],
        "worst": worst((gr, float(ape[g == gr].mean())) for gr in sorted(set(groups))),
    }


def worst(errors: Any, n: int = 3) -> list[dict[str, Any]]:
    """The ``n`` groups of largest error from ``(group, error)`` pairs, as ``{"group",
    "ape"}`` (ties keep the pairs' order)."""
    return sorted(({"group": gr, "ape": e} for gr, e in errors), key=lambda d: -d["ape"])[:n]


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
            "cv_worst": self.cv.get("worst", []),
            **{f"cv_{k}": self.cv[k] for k in ("in_range", "extrapolated", "nested_mape", "law", "law_choice", "nested")
               if k in self.cv},
            "data_from": self.data_from.isoformat(sep=" ") if self.data_from else None,
            "data_to": self.data_to.isoformat(sep=" ") if self.data_to else None,
            "coefficients": self.model.get("coefficients", {}),
            **{k: v for k, v in self.model.items() if k.endswith("_seconds")},  # overhead means
            **{k: {"family": m["family"], "cv": {a: b for a, b in m["cv"].items() if a != "held_out"}}
               for k, m in self.model.items() if k in ("checkpoint_save", "vm_startup")},  # overhead records' fits
            "notes": self.notes,
        }
