"""The HTTP API: resources over the analytics library (cmdare.analytics.api), built with
FastAPI (typed parameters and bodies, validation, an OpenAPI document at ``/openapi.json``).

Every request works on the one database the collector serves: no parameter names a path.
Reads run concurrently, each on its own cursor in a read-only transaction; fits, imports and
stored findings take the write lock one at a time. Bodies, result rows and bytes and query
time are bounded (``Limits``; docs/service.md). Errors are ``{"error": "one line"}``.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Body, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import api, codec
from ..db import AnalyticsError, Database
from ..resources import RESOURCES, Resource, Since, Stamp, Until
from ..scoping import Scope, active
from .routing import RawNames, named
from .throttle import Throttle
from .tokens import Tokens, needs_admin

ARROW = "application/vnd.apache.arrow.stream"
EXCERPT = 200  # characters of client input an error may quote


@dataclass(frozen=True)
class Limits:
    """What one request may cost (defaults documented in docs/service.md)."""

    max_body: int = 1 << 20  # bytes of a request body
    max_import_body: int = 64 << 20  # ... of POST /api/v1/imports
    max_rows: int = 100_000  # rows of a SQL result, whatever the client asks
    max_bytes: int = 64 << 20  # bytes of a SQL result
    default_timeout: float = 30.0  # seconds of a SQL query when the client names none
    max_timeout: float = 120.0  # ... at most, whatever the client asks
    max_rule_files: int = 64


from ..output import one_line  # noqa: E402  (re-exported: the pages and the service use it from here)

# -- bodies -----------------------------------------------------------------------------------

class SqlBody(BaseModel):
    query: str = Field(max_length=100_000, description="one SELECT statement")
    max_rows: int | None = Field(None, ge=1, description="rows at most (capped by the server's limit)")
    timeout: float | None = Field(None, gt=0, le=3600, description="seconds (capped by the server's limit)")


class FindingsRun(BaseModel):
    job: str | None = Field(None, max_length=512)
    since: Stamp | None = None
    kinds: list[str] = Field(default_factory=list, max_length=64)
    options: dict[str, dict[str, Any]] = Field(default_factory=dict, max_length=64)
    store: bool = True


class RuleFile(BaseModel):
    name: str = Field(max_length=512)
    text: str = Field(max_length=1 << 20)


class RulesCheck(BaseModel):
    files: list[RuleFile] = Field(max_length=64)


class FitBody(BaseModel):
    lost_after: float = Field(3.0, ge=1, le=1e6)


class ImportBody(BaseModel):
    job: str = Field(min_length=1, max_length=512)
    events: list[str] = Field(max_length=2_000_000)


class TraceRankBody(BaseModel):
    job: str = Field(min_length=1, max_length=512)
    rank: dict[str, Any] = Field(description="one rank of a profiler trace as analyze import trace reduced it: "
                                 "rank, world_size, source, sha256, kernels {step, ts, dur, kind, stream} and "
                                 "steps {step, ts, dur} as lists (checked whole: analytics/imports/traces.py from_payload)")


class OverheadBody(BaseModel):
    records: list[dict[str, str | int | float | None]] = Field(
        max_length=100_000, description="checkpoint or start-up records: the CSV format's columns as keys, and "
        "optionally source, line, file and repeat (a large file is sent in parts of at most 100,000)")


class TableOut(BaseModel):
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    notes: list[str] | None = None


class SqlOut(TableOut):
    truncated: bool
    cut_by: str


# -- middleware -------------------------------------------------------------------------------

FLEET_PATHS = frozenset({"/metrics"})  # answered from the whole fleet, not reads a scope filters
OPEN_PATHS = frozenset({"/healthz", "/ui/login", "/ui/logout"})  # answered without a token (logout ends
# only the session its own cookie names)


class Guard:
    """Bearer token (scheme case-insensitive, RFC 7235) and the body limit, before any
    route runs. Pure ASGI: a refused request costs no body read."""

    def __init__(self, app: Any, token: Tokens | str | None, limits: Limits, counter: Callable[[], None],
                 sessions: Any = None, throttle: Throttle | None = None) -> None:
        from .sessions import Sessions

        self.app, self.limits, self.counter = app, limits, counter
        self.token = Tokens.of(token)
        self.sessions = sessions if sessions is not None else Sessions()
        self.throttle = throttle if throttle is not None else Throttle()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        path = scope["path"]
        send = _no_store(send)
        limited: Scope | None = None
        if self.token and path not in OPEN_PATHS and not path.startswith("/ui/static/"):
            from .sessions import login_redirect, session_id

            presented = headers.get(b"authorization", b"").strip()
            address = (scope.get("client") or (None,))[0]
            scheme, _, got = presented.decode("latin-1").partition(" ")
            got = got.strip()
            wait = self.throttle.wait(address, got) if presented else 0.0
            if wait > 0:  # failed too often: not even looked at
                secs = str(math.ceil(wait))
                await JSONResponse({"error": f"too many failed sign-ins from this address: try again in {secs} s"},
                                   429, {"Retry-After": secs})(scope, receive, send)
                return
            bearer = self.token.match(got) if scheme.lower() == "bearer" else None
            sid = session_id(headers)
            who = bearer
            if bearer:
                self.throttle.succeeded(address, got)
                if bearer.scope != "admin" and needs_admin(scope["method"], path):
                    await JSONResponse({"error": f"token {bearer.name}: its scope is {bearer.scope}; "
                                                 f"{scope['method']} {path[:80]} needs an admin token"},
                                       403)(scope, receive, send)
                    return
            # the pages' session cookie reads (GET, HEAD) and never writes
            elif not (scope["method"] in ("GET", "HEAD") and (who := self.sessions.token(sid, self.token))):
                if presented:
                    self.throttle.failed(address, "bearer")
                elif sid:
                    self.throttle.failed(address, "cookie")
                if path == "/ui" or path.startswith("/ui/"):
                    where = login_redirect(path, scope.get("query_string", b"").decode("latin-1"))
                    await Response(b"", 303, {"Location": where})(scope, receive, send)
                    return
                await JSONResponse({"error": "unauthorized"}, 401, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
            if who is not None and who.labels:
                if path in FLEET_PATHS:
                    await JSONResponse({"error": f"token {who.name} sees only its labels' nodes and jobs: "
                                                 f"{path} is the whole fleet's"}, 403)(scope, receive, send)
                    return
                limited = Scope(who.name, who.labels)
        self.counter()
        ctype = headers.get(b"content-type", b"")
        if scope["method"] == "POST" and (not ctype or ctype.startswith(b"application/x-www-form-urlencoded")):
            # every body here is JSON: a client that did not say so (curl -d) is read as JSON
            scope = dict(scope, headers=[(k, v) for k, v in scope["headers"] if k != b"content-type"]
                         + [(b"content-type", b"application/json")])
        limit = self.limits.max_import_body if scope["path"].startswith("/api/v1/imports") else self.limits.max_body
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            await _too_large(limit)(scope, receive, send)
            return
        seen = 0

        async def bounded() -> Any:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge()
            return msg

        try:
            with active(limited):  # every read of this request sees the token's labels only
                await self.app(scope, bounded, send)
        except _BodyTooLarge:
            await _too_large(limit)(scope, receive, send)


def _no_store(send: Any) -> Any:
    """``send`` with ``Cache-Control: no-store`` on every answer that does not say its own
    caching: answers are a database's contents, no browser or proxy keeps them (the pages'
    static files say theirs)."""

    async def wrapped(msg: Any) -> None:
        if msg["type"] == "http.response.start" and not any(k.lower() == b"cache-control"
                                                             for k, _ in msg.get("headers", ())):
            msg = dict(msg, headers=[*msg.get("headers", ()), (b"cache-control", b"no-store")])
        await send(msg)

    return wrapped


class _BodyTooLarge(BaseException):  # noqa: N818  (not an Exception: no handler on the way may turn it into a 400)
    pass


def _too_large(limit: int) -> Response:
    return JSONResponse({"error": f"request body over {limit:,} bytes"}, 413)


# -- the app ----------------------------------------------------------------------------------

UI = Callable[[FastAPI, "Tokens | None", Any, "Throttle | None"], None]  # mounts pages on the app


def create_app(db: Database, token: Tokens | str | None = None, limits: Limits | None = None,
               ready: Callable[[], bool] = lambda: True, metrics: Callable[[], bytes] | None = None,
               count: Callable[[], None] = lambda: None, sessions: Any = None,
               throttle: Throttle | None = None, ui: UI | None = None) -> FastAPI:
    """The collector's API over ``db``: the service routes, every resource of the table
    (cmdare.analytics.resources), and the pages when ``ui`` is given (the front ends give
    cmdare.dashboards.pages.mount; the server layer never imports the pages)."""
    token = Tokens.of(token)
    lim = limits or Limits()
    app = FastAPI(title="cmdare collector API", version="1", docs_url=None, redoc_url=None,
                  description="Telemetry, findings, recommendations, models and alerts of one cmdare database.")
    app.add_middleware(RawNames)
    _error_handlers(app)
    _service_routes(app, ready, metrics)
    for r in RESOURCES:
        if not r.custom:
            _route(app, db, r)
    _custom_routes(app, db, lim)
    _model_routes(app, db)
    if ui is not None:
        ui(app, token, sessions, throttle)
    return app


def _error_handlers(app: FastAPI) -> None:
    from ..safesql import SqlBusy

    @app.exception_handler(SqlBusy)
    async def _busy(_: Request, e: SqlBusy) -> Response:
        return JSONResponse({"error": one_line(str(e))}, 503, {"Retry-After": str(e.retry_after)})

    @app.exception_handler(AnalyticsError)
    async def _analytics(_: Request, e: AnalyticsError) -> Response:
        return JSONResponse({"error": one_line(str(e))}, 400)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> Response:
        errs = e.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "body"
        msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")  # a validator's own words
        return JSONResponse({"error": one_line(f"{where}: {msg}", EXCERPT)}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> Response:
        return JSONResponse({"error": one_line(str(e.detail), EXCERPT)}, e.status_code)

    @app.exception_handler(Exception)
    async def _bug(_: Request, e: Exception) -> Response:
        import logging

        logging.getLogger("cmdare.analytics.server.http").error("internal error: %s", type(e).__name__, exc_info=True)
        return JSONResponse({"error": f"internal error ({type(e).__name__}): see the collector's log"}, 500)


def _service_routes(app: FastAPI, ready: Callable[[], bool], metrics: Callable[[], bytes] | None) -> None:
    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["service"])
    def readyz() -> Response:
        ok = ready()
        return JSONResponse({"ready": ok}, 200 if ok else 503)

    @app.get("/metrics", tags=["service"], response_class=Response)
    def metrics_() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics() if metrics else b"", media_type=CONTENT_TYPE_LATEST)


def table(t: api.Table) -> dict[str, Any]:
    return codec.table_json(t.columns, t.rows) | ({"notes": t.notes} if t.notes else {})


def _route(app: FastAPI, db: Database, r: Resource) -> None:
    """One resource of the table as a route: its parameters typed and bounded (FastAPI
    reads the signature made here), the library call, the answer in its shape."""
    fn = getattr(api, r.name)
    naive = [p.name for p in r.params if p.naive]

    def endpoint(**kw: Any) -> Any:
        for k in naive:
            kw[k] = _naive(kw[k])
        out = fn(db, **kw)
        return table(out) if r.answer == "table" else codec.plain(out)

    sig = []
    for p in r.params:
        if p.name in r.path_params:
            default = Path(**p.bounds)
        else:
            default = Query(p.default, description=p.description, alias=p.alias, **p.bounds)
        sig.append(inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=p.type))
    endpoint.__signature__ = inspect.Signature(sig)  # type: ignore[attr-defined]
    endpoint.__name__ = r.name
    app.add_api_route(named(r.route), endpoint, methods=[r.method], tags=[r.tag], name=r.name,
                      response_model=TableOut if r.answer == "table" else None)


def _custom_routes(app: FastAPI, db: Database, lim: Limits) -> None:
    """The resources with a request or answer of their own shape (``custom`` in the table)."""

    @app.get(named("/api/v1/jobs/{job}"), tags=["jobs"])
    def job_detail(job: str = Path(max_length=512)) -> Any:
        d = api.job_detail(db, job)
        return {"job": job, **{k: table(v) for k, v in d.items()}}

    @app.get("/api/v1/fleet/heatmap", tags=["fleet"])
    def heatmap(since: Stamp | None = Query(None, description=Since),
                until: Stamp | None = Query(None, description=Until),
                columns: int = Query(120, ge=1, le=1440, description="time buckets across the window"),
                label: str | None = Query(None, max_length=330),
                group: Literal["auto", "gpu", "node", "job"] = Query(
                    "auto", description="a row per GPU, node or job; auto: per GPU up to 10,000 GPUs, else per job"),
                job: str | None = Query(None, max_length=512, description="only this job's GPUs (a drill-down)"),
                node: str | None = Query(None, max_length=256, description="only this node's GPUs")) -> Any:
        # up to 2,000,000 cells of whole percents: serialised at once (no per-value encoder walk)
        body = json.dumps(api.gpu_heatmap(db, _naive(since), _naive(until), columns, label, group, job, node),
                          separators=(",", ":"))
        return Response(body, media_type="application/json")

    @app.get("/api/v1/fits", tags=["models"])
    def fits() -> Any:
        return {"fits": codec.plain(api.stored_fits(db))}

    @app.post("/api/v1/sql", tags=["sql"], responses={200: {"content": {ARROW: {}}}})
    def sql(request: Request, body: SqlBody) -> Any:
        rows = min(body.max_rows or 10_000, lim.max_rows)
        timeout = min(body.timeout or lim.default_timeout, lim.max_timeout)
        r = api.sql(db, body.query, rows, timeout, lim.max_bytes)
        if ARROW in request.headers.get("accept", ""):
            return Response(_arrow(r), media_type=ARROW)
        return {**codec.table_json(r.columns, r.rows), "truncated": r.truncated, "cut_by": r.cut_by}

    @app.post("/api/v1/findings/run", tags=["findings"])
    def findings_run(body: FindingsRun) -> Any:
        since = body.since.replace(tzinfo=None) if body.since and body.since.tzinfo else body.since
        out = api.bottlenecks(db, body.job, since, body.kinds, body.options, body.store)
        return {"findings": [codec.finding_json(f) for f in out.findings], "skipped": out.skipped, "ran": out.ran,
                "stored": out.stored, "not_stored": out.not_stored, "next": [n.to_json() for n in out.next]}

    # alerts
    @app.get("/api/v1/alerts", tags=["alerts"])
    def alerts(rule: str | None = Query(None, max_length=512)) -> Any:
        a = api.alerts(db, rule)
        health_cols = ["rule", "health", "last_error", "last_eval", "eval_seconds", "instances"]
        return {"alerts": codec.table_json(a.columns, a.rows), "rules": codec.table_json(health_cols, a.health)}

    @app.post("/api/v1/alerts/check", tags=["alerts"])
    def alerts_check(body: RulesCheck) -> Any:
        r = api.check_rules(db, [(f.name, f.text) for f in body.files])
        return {"files": r.files, "groups": r.groups, "rules": r.rules}



def _model_routes(app: FastAPI, db: Database) -> None:
    """The custom resources of models, recommendations and imports."""

    @app.post("/api/v1/fits/{kind}", tags=["models"])
    def fit(kind: Literal["speed", "cluster", "overhead", "lifetime"],
            body: FitBody = Body(default_factory=FitBody)) -> Any:  # type: ignore[arg-type]  # (fields all default)
        f = api.fit(db, kind, body.lost_after)
        return codec.plain({"kind": f.kind, "summary": f.summary, "cv": f.cv, "model": f.model})

    def model(flops_per_step: float | None, params: float | None, tensors: int | None,
              batch_size: int | None, from_job: str | None) -> api.ModelSpec | None:
        if from_job:
            return None
        if flops_per_step is None or params is None:
            raise AnalyticsError("give flops_per_step and params, or from_job")
        return api.ModelSpec.of(flops_per_step, params, tensors, batch_size)

    def Pos() -> Any:
        return Query(None, gt=0, lt=1e30)

    @app.get("/api/v1/predictions/speed", tags=["models"])
    def predict_speed(gpu_type: str = Query(max_length=128), from_job: str | None = Query(None, max_length=512),
                      flops_per_step: float | None = Pos(), params: float | None = Pos(),
                      tensors: int | None = Query(None, ge=1, le=1 << 31),
                      batch_size: int | None = Query(None, ge=1, le=1 << 31)) -> Any:
        m = model(flops_per_step, params, tensors, batch_size, from_job)
        return codec.plain(api.predict_speed(db, gpu_type, m, from_job, batch_size))

    @app.get("/api/v1/predictions/cluster", tags=["models"])
    def predict_cluster(gpus: str = Query(max_length=1024, description="TYPE:COUNT,... ('-': the job's)"),
                        ps: int = Query(ge=1, le=4096), from_job: str | None = Query(None, max_length=512),
                        flops_per_step: float | None = Pos(), params: float | None = Pos(),
                        tensors: int | None = Query(None, ge=1, le=1 << 31),
                        batch_size: int | None = Query(None, ge=1, le=1 << 31)) -> Any:
        spec: list[tuple[str, int]] = []
        for part in gpus.split(","):
            name, _, n = part.strip().rpartition(":")
            if not name or not n.isdigit() or not 1 <= int(n) <= 65536:
                raise AnalyticsError(f"gpus: expected TYPE:COUNT[,TYPE:COUNT...], got {one_line(part, 40)!r}")
            spec.append(("" if name == "-" else name, int(n)))
        m = model(flops_per_step, params, tensors, batch_size, from_job)
        return codec.plain(api.predict_cluster(db, spec, ps, m, from_job, batch_size))

    # recommendations: the options are the recommender's own option table, as query parameters
    @app.get("/api/v1/recommendations/{kind}", tags=["recommendations"])
    def recommendations(request: Request, kind: str = Path(max_length=64)) -> Any:
        try:
            table_ = api.recommender_options(kind)
        except Exception:
            raise AnalyticsError(f"no recommender {one_line(kind, 40)!r}") from None
        opts: dict[str, Any] = {}
        for k in request.query_params:
            o = table_.get(k)
            if o is not None and o.kind == "str" and k in api.PATH_OPTIONS and f"{k}_text" not in request.query_params:
                raise AnalyticsError(f"{k}: names a file, which the API does not read (send the data instead)")
            vals = request.query_params.getlist(k)
            opts[k] = vals if o is not None and o.kind == "list" else vals[-1]
        return [codec.recommendation_json(r) for r in api.recommend(db, kind, **opts)]

    # imports (the trace route first: /imports/{kind} would take "trace" as a kind)
    @app.post("/api/v1/imports/trace", tags=["imports"])
    def import_trace_rank(body: TraceRankBody) -> Any:
        return api.import_trace_rank(db, body.job, body.rank)

    @app.post("/api/v1/imports/{kind}", tags=["imports"])
    def import_overheads(body: OverheadBody, kind: Literal["checkpoints", "startups", "lives"] = Path()) -> Any:
        return api.import_overheads(db, kind, body.records)

    @app.post("/api/v1/imports", tags=["imports"])
    def imports(body: ImportBody) -> Any:
        return api.import_events(db, body.job, [e.encode() for e in body.events])


def _naive(t: dt.datetime | None) -> dt.datetime | None:
    """A time with a zone as naive UTC (the database's timestamps)."""
    if t is None or t.tzinfo is None:
        return t
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None)


def _arrow(r: Any) -> bytes:
    import pyarrow as pa

    cols = {c: [row[i] for row in r.rows] for i, c in enumerate(r.columns)}
    t = pa.table(cols) if r.columns else pa.table({})
    t = t.replace_schema_metadata({"truncated": str(r.truncated).lower()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()
