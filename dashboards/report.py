"""``analyze report --html FILE``: the pages as one self-contained file. The data are the
HTTP API's own answers (the same routes the pages read: through the collector that holds
the database, or in-process on the file), inlined with the scripts and styles: the file
makes no request, for a postmortem or a CI artefact."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cmdare.analytics.db import AnalyticsError, Database
from cmdare.analytics.resources import BY_NAME, RESOURCES

from .pages import PAGES, shell

MAX_JOBS = 50  # job pages in one report (the jobs with findings first, then the most recent)
COLUMNS = 120  # time buckets across, as the pages ask
WORKERS = 2  # jobs read at once

Get = Callable[[str, dict[str, Any]], Any]


def local_get(db: Database) -> Get:
    """GET a route of the collector's API app in-process (no socket, no server)."""
    from cmdare.analytics.server.http import create_app

    app = create_app(db)

    def get(route: str, params: dict[str, Any]) -> Any:
        q = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        status, body = _run(lambda: _asgi_get(app, route, q))
        doc = json.loads(body) if body else {}
        if status != 200:
            raise AnalyticsError(doc.get("error") if isinstance(doc, dict) and doc.get("error") else f"HTTP {status}")
        return doc

    return get


def _run(make: Callable[[], Any]) -> Any:
    """Run a coroutine to its end; on a thread of its own when this thread already runs an
    event loop (an embedding program's, a notebook's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    import threading

    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = asyncio.run(make())
        except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
            out["error"] = e

    t = threading.Thread(target=target, name="cmdare-report")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def js_segment(name: str) -> str:
    """A name as one path segment, encoded as the pages' script encodes it
    (``encodeURIComponent``): the report's data are keyed by the routes the script asks for."""
    return urllib.parse.quote(name, safe="!*'()")


async def _asgi_get(app: Any, route: str, query: str) -> tuple[int, bytes]:
    """``route``: percent-encoded, as on the wire (a name's ``/`` is ``%2F``)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": urllib.parse.unquote(route), "raw_path": route.encode("ascii"), "query_string": query.encode(),
             "root_path": "", "headers": [(b"host", b"report"), (b"accept", b"application/json")],
             "client": ("127.0.0.1", 0), "server": ("report", 80)}
    out: dict[str, Any] = {"status": 500, "body": b""}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(m: dict[str, Any]) -> None:
        if m["type"] == "http.response.start":
            out["status"] = m["status"]
        elif m["type"] == "http.response.body":
            out["body"] += m.get("body", b"")

    await app(scope, receive, send)
    return out["status"], out["body"]


def gather(get: Get, job: str | None = None, since: dt.datetime | None = None,
           progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every answer the report's pages read, keyed by route (the window is fixed: ``since``)."""
    s = since.strftime("%Y-%m-%dT%H:%M:%S") if since else None
    data: dict[str, Any] = {}

    def answer(route: str, params: dict[str, Any]) -> Any:
        try:
            return get(route, params)
        except AnalyticsError as e:
            return {"error": str(e)}

    def put(route: str, **params: Any) -> Any:
        data[route] = answer(route, params)
        return data[route]

    values = {"since": s, "columns": COLUMNS}
    progress("fleet, jobs, findings, alerts")
    for r in RESOURCES:  # what the pages read once (cmdare.analytics.resources: report = fleet)
        if r.report == "fleet":
            put(r.route, **{k: values[k] for k in r.report_params})
    jobs, findings = data[BY_NAME["jobs"].route], data[BY_NAME["stored_findings"].route]
    if job:
        chosen = [job]
    else:
        flagged = [] if "error" in findings else [r[findings["columns"].index("job")] for r in findings["rows"]]
        listed = [] if "error" in jobs else sorted(
            jobs["rows"], key=lambda r: r[jobs["columns"].index("last_step")] or "", reverse=True)
        names = [r[jobs["columns"].index("job")] for r in listed] if listed else []
        chosen = list(dict.fromkeys([j for j in flagged if j] + names))[:MAX_JOBS]
    def one(j: str) -> list[tuple[str, Any]]:
        routes = [(r.route.replace("{job}", js_segment(j)), r) for r in RESOURCES if r.report == "job"]
        return [(route, answer(route, {k: values[k] for k in r.report_params})) for route, r in routes]  # ... once per job

    # the jobs on WORKERS threads (the reads wait on DuckDB, which runs beside Python), their
    # answers stored in the jobs' order
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(WORKERS, thread_name_prefix="cmdare-report") as pool:
        for i, (j, answers) in enumerate(zip(chosen, pool.map(one, chosen), strict=True), 1):
            progress(f"job {i}/{len(chosen)}: {j}")
            data.update(answers)
    data["$report"] = {"jobs": chosen, "since": s, "made": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                       "jobs_left_out": max(0, (len(jobs.get("rows", [])) if not job else 1) - len(chosen))}
    return data


def render(data: dict[str, Any]) -> str:
    return shell(PAGES["report"], "cmdare report", None, {"data": data})


def write(path: str, text: str) -> int:
    """Written whole or not at all (a temporary file renamed over ``path``)."""
    p = Path(path)
    if p.is_dir():
        raise AnalyticsError(f"--html {path}: is a directory")
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise AnalyticsError(f"--html {path}: cannot write: {e.strerror}") from None
    return len(text.encode())
