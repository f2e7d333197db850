"""Performance models fitted from the database (CM-DARE / spotDNN, as a product), each
with held-out error, stored in ``model_fits`` and used for predictions with intervals:

- ``steady``: steady-state speed per job from step telemetry (the speed and cluster input)
- ``speed``: single-worker step time from model complexity over accelerator capability
- ``cluster``: per-worker step time as workers and parameter servers grow
- ``fromjob``: predictions anchored on a job's measured speed (``--from-job``)
- ``overhead``: checkpoint save / restore, resume after a revocation, VM start-up
- ``lifetime``: spot VM survival (Kaplan-Meier, Cox) and P(revoked within H hours)
- ``regression``: what they share (OLS, leave-one-group-out cross-validation, ``Fit``)
- ``store``: saving fits in ``model_fits`` and reading the latest of a kind back

Documented in docs/models.md.
"""

from __future__ import annotations

from .cluster import cluster_features, fit_cluster, predict_cluster, single_worker_seconds
from .fromjob import Anchor, anchor, measured
from .lifetime import fit_lifetime, predict_revocation
from .overhead import fit_overhead, predict_checkpoint
from .regression import ALPHA, Fit, Linear, logo_cv
from .speed import SPEED_FAMILIES, fit_speed, predict_speed, range_inputs, speed_features
from .steady import JobSpeed, job_speeds, steady_rates
from .store import latest, save

__all__ = [
    "ALPHA", "Anchor", "Fit", "JobSpeed", "Linear", "SPEED_FAMILIES", "anchor", "cluster_features", "fit_cluster",
    "fit_lifetime", "fit_overhead", "fit_speed", "job_speeds", "latest", "logo_cv", "measured",
    "predict_checkpoint", "predict_cluster", "predict_revocation", "predict_speed", "range_inputs", "save",
    "single_worker_seconds", "speed_features", "steady_rates"
]
