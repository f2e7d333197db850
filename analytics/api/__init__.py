"""The analytics library: what the ``analyze`` CLI, the collector's HTTP API and the pages
call. Plain arguments in, plain data out; no click, no printing, no HTTP.

Every function takes a ``Database`` (cmdare.analytics.db): a file opened per call, or the
live database of the collector serving it. Reads run on connections that cannot write;
the functions that write (``fit``, ``import_events``, ``bottlenecks(store=True)``) say so.
Problems a user can fix raise ``AnalyticsError`` with one line.

Resources by group, a module each: telemetry, findings, alerts, models, recommend, imports,
overheads, pages; this package re-exports them, so a front end imports ``api`` alone.
"""

from __future__ import annotations

from .alerts import Alerts, RulesChecked, alerts, check_rules, empty_db
from .base import Table
from .findings import Bottlenecks, bottlenecks, detector_options, job_detail, stored_findings
from .imports import IMPORT_TYPES, import_events, import_jobs
from .models import (
    FIT_KINDS,
    PREDICTIONS,
    FitResult,
    ModelSpec,
    cluster_prediction,
    fit,
    latest_or_none,
    predict_cluster,
    predict_revocation,
    predict_speed,
)
from .overheads import import_overheads, predict_checkpoint, predict_startup
from .pages import fleet_summary, gpu_heatmap, job_advice, job_series, scaling_curve, stored_fits
from .recommend import PATH_OPTIONS, recommend, recommender_options
from .telemetry import (
    fleet_goodput,
    goodput,
    gpu,
    gpu_processes,
    host,
    instances,
    jobs,
    nodes,
    revocations,
    runs,
    sql,
    steps,
    tpu,
)
from .traces import import_trace, import_trace_rank, trace

__all__ = [
    "PATH_OPTIONS",
    "PREDICTIONS",
    "Alerts",
    "Bottlenecks",
    "FIT_KINDS",
    "FitResult",
    "IMPORT_TYPES",
    "ModelSpec",
    "RulesChecked",
    "Table",
    "alerts",
    "bottlenecks",
    "check_rules",
    "cluster_prediction",
    "detector_options",
    "empty_db",
    "fit",
    "fleet_goodput",
    "fleet_summary",
    "goodput",
    "gpu",
    "gpu_heatmap",
    "gpu_processes",
    "host",
    "import_events",
    "import_jobs",
    "import_overheads",
    "import_trace",
    "import_trace_rank",
    "instances",
    "job_advice",
    "job_detail",
    "job_series",
    "jobs",
    "latest_or_none",
    "nodes",
    "predict_checkpoint",
    "predict_cluster",
    "predict_revocation",
    "predict_speed",
    "predict_startup",
    "recommend",
    "recommender_options",
    "revocations",
    "runs",
    "scaling_curve",
    "sql",
    "steps",
    "trace",
    "stored_findings",
    "stored_fits",
    "tpu",
]
