"""The collector's API tried again as an attacker holding one read token (issue 69, the
second hostile round): stored rows nobody expected, catalogue reads, answers that grow
when serialised. Each gets a bounded answer; the service keeps answering."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cmdare.analytics.server.http import Limits
from cmdare.analytics.server.service import HttpConfig, Service
from cmdare.collector.db import connect
from cmdare.dashboards.pages import mount
from tests.analytics.test_golden_output import build


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("round2") / "base.duckdb")


def serve(db: Path, limits: Limits | None = None, token: str | None = None) -> tuple[Service, str, object]:
    con = connect(db)
    svc = Service(con, db, HttpConfig("127.0.0.1", 0, token, max_connections=40, request_timeout=5.0,
                                      limits=limits or Limits(max_bytes=1 << 20, max_timeout=5.0)), ui=mount)
    url = svc.start()
    svc.ready = True
    return svc, url, con


@pytest.fixture()
def served(base: Path, tmp_path: Path) -> Iterator[tuple[object, str, Service]]:
    db = tmp_path / "fleet.duckdb"
    shutil.copy(base, db)
    svc, url, con = serve(db)
    try:
        yield con, url, svc
    finally:
        svc.stop()
        con.close()  # type: ignore[attr-defined]


def call(url: str, path: str, body: object = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_findings_with_null_or_odd_evidence_cost_only_themselves(served) -> None:
    """A findings row with NULL evidence (an older writer, a hand-made row) made
    /api/v1/fleet a 500 for everyone."""
    con, url, _ = served
    jobs = con.execute("SELECT job FROM jobs ORDER BY job LIMIT 1").fetchone()
    job = jobs[0] if jobs else "golden-job"
    for kind, ev in (("gpu_idle", None), ("straggler", "[1, 2]"), ("ps_bound", '"text"'), ("gpu_idle", "{}")):
        con.execute("""INSERT INTO findings (kind, job, severity, confidence, window_start, window_end, summary,
                           evidence, first_detected, detected_at)
                           VALUES (?, ?, 'warning', 0.5, now() - INTERVAL 1 HOUR, now(), 'odd row', ?::JSON,
                                   now(), now())""", [kind, job, ev])
    for path in ("/api/v1/fleet", "/api/v1/findings", "/api/v1/goodput", f"/api/v1/jobs/{job}/goodput",
                 f"/api/v1/jobs/{job}", "/ui", f"/ui/jobs/{job}"):
        code, body = call(url, path)
        assert code == 200, (path, body[:300])
