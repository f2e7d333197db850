"""The resource table (cmdare.analytics.resources) holds every front end to the same
library: each resource is a route of the API with its method, the API has no resource
outside the table, the client's answer is the library's own through the HTTP API, the
report reads the resources the table marks, and every library call the CLI makes is a
resource."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from cmdare.analytics import api
from cmdare.analytics.cli.client import Local, Remote
from cmdare.analytics.db import Database
from cmdare.analytics.resources import BY_NAME, RESOURCES
from cmdare.analytics.server.http import create_app
from tests.analytics.test_demo_fleet import demo_db  # noqa: F401  (the simulated fleet, a module fixture)
from tests.conftest import ROOT, serving

SINCE = dt.datetime(2000, 1, 1)
# arguments each resource is called with (on the demo fleet); {job}: a job of it
EXAMPLES: dict[str, dict] = {
    "nodes": {"lost_after": 3}, "instances": {"since": SINCE}, "revocations": {"since": SINCE, "gpu_type": "v100"},
    "gpu": {"every": 300.0}, "tpu": {}, "gpu_processes": {}, "host": {"since": SINCE}, "jobs": {},
    "job_detail": {"job": "{job}"}, "steps": {"job": "{job}"}, "runs": {"job": "{job}"}, "fleet_goodput": {"by": "job"},
    "trace": {"job": "{job}"},
    "goodput": {"job": "{job}"}, "fleet_summary": {"with_nodes": False}, "gpu_heatmap": {"columns": 12},
    "job_series": {"job": "{job}", "columns": 12}, "job_advice": {"job": "{job}"}, "scaling_curve": {"job": "{job}"},
    "stored_fits": {}, "sql": {"query": "SELECT count(*) AS n FROM heartbeats"}, "stored_findings": {},
    "bottlenecks": {"store": False}, "alerts": {}, "check_rules": {"files": []},
    "predict_revocation": {"region": "us-central1", "gpu_type": "v100", "hours": 3.0},
    "predict_checkpoint": {"size_mb": 100.0}, "predict_startup": {"region": "us-central1", "purchase": "spot",
                                                                   "gpu_type": "v100"},
    "recommend": {"kind": "data_workers", "consumer_ms": ["10", "10"], "worker_ms": ["40", "40", "40", "400"]},
}
# calls that write, or answer from a fit the demo does not have: reached, compared by error
WRITES = {"fit", "import_overheads", "import_events", "import_trace_rank", "predict_speed", "predict_cluster"}


def test_every_resource_is_a_route_and_every_route_a_resource(tmp_path: Path) -> None:
    app = create_app(Database(tmp_path / "x.duckdb"))
    routes = {(m, r.path_format) for r in app.routes if getattr(r, "path", "").startswith("/api/") for m in r.methods}
    table = {(r.method, r.route) for r in RESOURCES}
    assert routes == table
    assert len(BY_NAME) == len(RESOURCES) and all(hasattr(api, r.name) for r in RESOURCES)
    for r in RESOURCES:  # every parameter is the library function's
        import inspect

        names = set(inspect.signature(getattr(api, r.name)).parameters)
        assert {p.name for p in r.params} <= names, r.name


def test_every_library_call_the_cli_makes_is_a_resource() -> None:
    called = set()
    for p in (ROOT / "analytics" / "cli").glob("*.py"):
        called |= set(re.findall(r"call\(\s*\w+,\s*api\.(\w+)", p.read_text()))
    assert called and called <= set(BY_NAME), called - set(BY_NAME)


def _job(db: Path) -> str:
    t = Local(str(db)).call("jobs")
    return t.rows[0][t.columns.index("job")]


def test_the_client_answers_as_the_library_through_the_api(demo_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from cmdare.analytics.db import Database

    # the same answers from the file read here and from a live collector (or a lake): judged
    # as of now on each side (a file no collector writes: tests/analytics/test_offline_liveness.py)
    monkeypatch.setattr(Database, "OFFLINE_AFTER", float("inf"))
    job = _job(demo_db)
    local = Local(str(demo_db))
    answered = []
    with serving(demo_db, tmp_path / "served.duckdb") as url:
        remote = Remote(url)
        for r in RESOURCES:
            if r.name in WRITES:
                continue
            kw = {k: (v.replace("{job}", job) if isinstance(v, str) else v) for k, v in EXAMPLES[r.name].items()}
            want, got = _answer(local, r.name, kw), _answer(remote, r.name, kw)
            if r.name == "gpu_heatmap":  # JSON through the wire: lists, not tuples
                import json

                want = json.loads(json.dumps(want, default=str))
            assert _same(got, want), r.name
            if not (isinstance(want, tuple) and want[:1] == ("error",)):
                answered.append(r.name)
    assert len(answered) >= 22, answered  # (three predictions need fits the demo has not)


def _answer(front, name: str, kw: dict):
    """The call's answer, or its one-line error (no fit yet, say): the same either way."""
    from cmdare.analytics.db import AnalyticsError

    try:
        return front.call(name, **dict(kw))
    except AnalyticsError as e:
        return ("error", str(e))


def _same(a, b) -> bool:
    if hasattr(a, "__dataclass_fields__"):
        a, b = a.__dict__, b.__dict__
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-12)
    return a == b


def test_the_report_reads_what_the_table_marks(demo_db: Path) -> None:  # noqa: F811
    from cmdare.dashboards.report import gather, local_get

    job = _job(demo_db)
    data = gather(local_get(Database(demo_db)), job=job)
    want = {r.route for r in RESOURCES if r.report == "fleet"}
    want |= {r.route.replace("{job}", job) for r in RESOURCES if r.report == "job"}
    assert set(data) - {"$report"} == want
    assert not [k for k, v in data.items() if isinstance(v, dict) and "error" in v]
