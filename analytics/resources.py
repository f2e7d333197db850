"""The HTTP API's resources, each declared once: its library call (``api.<name>``), method,
route, typed parameters, answer shape, and whether the report reads it. From this table
``http.create_app`` makes the routes (FastAPI: validation and the OpenAPI document follow
from the parameters), ``client.Remote`` makes its calls, and ``dashboards.report`` its list
of routes; tests/analytics/test_resources.py walks it (every resource answers the same
through the library, the HTTP API and the client).

A resource whose request or answer has a shape of its own (a body, a model spec, a
recommender's option table) sets ``custom``: its route is written in http.py
(``_custom_routes``) and its client call in client.py, under the same name; the table
still names it, so the walk covers it.

Adding a resource: its library function in ``api/<group>.py`` (exported by ``api``), one
``Resource`` here; the route and the client follow, and its row in docs/service.md's table
of resources (docs/extending.md, "A resource of the API"; tests/test_docs.py checks
that every route is documented)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator

from .db import TIME_RANGE, in_time_range

# how a front end finds the server holding a database file: the file the service writes
# beside it (``client.trusted_service`` checks it) and the token's environment variable
SERVICE_SUFFIX = ".service.json"
TOKEN_ENV = "CMDARE_HTTP_TOKEN"


def service_file(db: str | Path) -> Path:
    """Where a collector holding ``db`` writes how to reach its API."""
    p = Path(db)
    return p.with_name(p.name + SERVICE_SUFFIX)

Since = "only rows newer than this (ISO 8601, UTC)"
Until = "only rows older than this (ISO 8601, UTC)"


def _in_range(t: dt.datetime) -> dt.datetime:
    """A time parameter from 1970 to 2200 (analytics.db.in_time_range): a one-line 422
    outside it, never an overflow deeper down."""
    if not in_time_range(t):
        raise ValueError(TIME_RANGE)
    return t


Stamp = Annotated[dt.datetime, AfterValidator(_in_range)]  # every time parameter of the API


@dataclass(frozen=True)
class Param:
    """One query (or path) parameter: its name (the library's keyword), Python type,
    default (``...``: required) and bounds as FastAPI's ``Query`` takes them; ``naive``:
    a time with a zone is made naive UTC before the call (the database's timestamps)."""

    name: str
    type: Any
    default: Any = None
    bounds: dict[str, Any] = field(default_factory=dict)
    description: str | None = None
    naive: bool = False
    alias: str | None = None  # its name in the query string, where not the library's


def p_since(naive: bool = False) -> Param:
    return Param("since", Stamp | None, description=Since, naive=naive)


def p_until(naive: bool = False) -> Param:
    return Param("until", Stamp | None, description=Until, naive=naive)


P_NODE = Param("node", str | None, bounds={"max_length": 512})
P_LABEL = Param("label", str | None, bounds={"max_length": 330})
P_LOST = Param("lost_after", float, 3, {"ge": 1, "le": 1e6})
P_REGION = Param("region", str | None, bounds={"max_length": 256})
P_GPU_TYPE = Param("gpu_type", str | None, bounds={"max_length": 256})
P_EVERY = Param("every", float | None, bounds={"ge": 1, "le": 1e9})
P_COLUMNS = Param("columns", int, 120, {"ge": 1, "le": 1440}, "time buckets across the window")


@dataclass(frozen=True)
class Resource:
    """``name``: the library call; ``answer``: ``table`` (an ``api.Table``), ``plain`` (a
    plain structure through codec.plain), or ``custom``; ``report``: ``fleet`` (read once
    by the report) or ``job`` (once per job in it), with the parameters the report sends."""

    name: str
    route: str
    tag: str
    params: tuple[Param, ...] = ()
    method: str = "GET"
    answer: str = "table"
    report: str = ""
    report_params: tuple[str, ...] = ()  # of since, columns
    custom: bool = False

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if "{" + p.name + "}" in self.route)


P_JOB = Param("job", str, ..., {"max_length": 512})  # a path segment

RESOURCES: tuple[Resource, ...] = (
    # telemetry
    Resource("nodes", "/api/v1/nodes", "telemetry", (P_LOST, P_LABEL), report="fleet"),
    Resource("instances", "/api/v1/instances", "telemetry", (P_LOST, p_since(), P_REGION, P_GPU_TYPE)),
    Resource("revocations", "/api/v1/revocations", "telemetry", (p_since(), P_REGION, P_GPU_TYPE), report="fleet",
             report_params=("since",)),
    Resource("gpu", "/api/v1/gpus", "telemetry", (P_NODE, p_since(), p_until(), P_LABEL, P_EVERY)),
    Resource("tpu", "/api/v1/tpus", "telemetry", (P_NODE, p_since(), p_until(), P_LABEL)),
    Resource("gpu_processes", "/api/v1/gpu-processes", "telemetry",
             (P_NODE, p_since(), p_until(), Param("job", str | None, bounds={"max_length": 256}))),
    Resource("host", "/api/v1/hosts", "telemetry", (P_NODE, p_since(), p_until(), P_LABEL, P_EVERY)),
    # jobs
    Resource("jobs", "/api/v1/jobs", "jobs", (p_since(),), report="fleet", report_params=("since",)),
    Resource("job_detail", "/api/v1/jobs/{job}", "jobs", (P_JOB,), answer="custom", report="job", custom=True),
    Resource("steps", "/api/v1/jobs/{job}/steps", "jobs", (P_JOB, P_NODE, p_since())),
    Resource("runs", "/api/v1/runs", "jobs", (Param("job", str | None, bounds={"max_length": 512}), p_since())),
    Resource("trace", "/api/v1/jobs/{job}/trace", "jobs", (P_JOB,), answer="plain"),
    Resource("fleet_goodput", "/api/v1/goodput", "jobs",
             (p_since(True), p_until(True),
              Param("by", str, "fleet", {"max_length": 64, "pattern": r"^[A-Za-z0-9_.-]+$"}),
              Param("every", float | None, bounds={"ge": 60, "le": 1e8}), Param("detect", bool, True))),
    Resource("goodput", "/api/v1/jobs/{job}/goodput", "jobs",
             (P_JOB, p_since(True), p_until(True), Param("every", float | None, bounds={"ge": 60, "le": 1e8})),
             report="job", report_params=("since",)),
    # the pages' resources
    Resource("fleet_summary", "/api/v1/fleet", "fleet",
             (p_since(True), p_until(True), P_LOST,
              Param("with_nodes", bool, True, description="count nodes by liveness (false: a client with the node "
                                                          "table)", alias="nodes")),
             answer="plain", report="fleet", report_params=("since",)),
    Resource("gpu_heatmap", "/api/v1/fleet/heatmap", "fleet",
             (p_since(True), p_until(True), P_COLUMNS, P_LABEL,
              Param("group", str, "auto", {"pattern": "^(auto|gpu|node|job)$"}),
              Param("job", str | None, bounds={"max_length": 512}), Param("node", str | None, bounds={"max_length": 256})),
             answer="custom", report="fleet", report_params=("since", "columns"), custom=True),
    Resource("job_series", "/api/v1/jobs/{job}/series", "jobs", (P_JOB, p_since(True), p_until(True), P_COLUMNS),
             answer="plain", report="job", report_params=("since", "columns")),
    Resource("job_advice", "/api/v1/jobs/{job}/advice", "jobs", (P_JOB,), answer="plain", report="job"),
    Resource("scaling_curve", "/api/v1/jobs/{job}/scaling", "jobs", (P_JOB,), answer="plain", report="job"),
    Resource("stored_fits", "/api/v1/fits", "models", answer="custom", report="fleet", custom=True),
    Resource("sql", "/api/v1/sql", "sql", method="POST", answer="custom", custom=True),
    # findings and alerts
    Resource("stored_findings", "/api/v1/findings", "findings",
             (Param("job", str | None, bounds={"max_length": 512}), p_since()), report="fleet",
             report_params=("since",)),
    Resource("bottlenecks", "/api/v1/findings/run", "findings", method="POST", answer="custom", custom=True),
    Resource("alerts", "/api/v1/alerts", "alerts", answer="custom", report="fleet", custom=True),
    Resource("check_rules", "/api/v1/alerts/check", "alerts", method="POST", answer="custom", custom=True),
    # models
    Resource("fit", "/api/v1/fits/{kind}", "models", method="POST", answer="custom", custom=True),
    Resource("predict_speed", "/api/v1/predictions/speed", "models", answer="custom", custom=True),
    Resource("predict_cluster", "/api/v1/predictions/cluster", "models", answer="custom", custom=True),
    Resource("predict_revocation", "/api/v1/predictions/revocation", "models",
             (Param("region", str, ..., {"max_length": 128}), Param("gpu_type", str, ..., {"max_length": 128}),
              Param("hours", float, ..., {"gt": 0, "le": 1e6})), answer="plain"),
    Resource("predict_checkpoint", "/api/v1/predictions/checkpoint", "models",
             (Param("size_mb", float, ..., {"gt": 0, "le": 1e8}), Param("tensors", int | None, None, {"ge": 1, "le": 10**9}),
              Param("params", int | None, None, {"ge": 1, "le": 10**15})), answer="plain"),
    Resource("predict_startup", "/api/v1/predictions/startup", "models",
             (Param("region", str, ..., {"max_length": 64}), Param("purchase", Literal["spot", "on-demand"], ...),
              Param("gpu_type", str, ..., {"max_length": 128})), answer="plain"),
    # recommendations and imports
    Resource("recommend", "/api/v1/recommendations/{kind}", "recommendations", answer="custom", custom=True),
    Resource("import_overheads", "/api/v1/imports/{kind}", "imports", method="POST", answer="custom", custom=True),
    Resource("import_events", "/api/v1/imports", "imports", method="POST", answer="custom", custom=True),
    Resource("import_trace_rank", "/api/v1/imports/trace", "imports", method="POST", answer="custom", custom=True),
)
BY_NAME = {r.name: r for r in RESOURCES}
