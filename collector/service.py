"""The collector's HTTP API: the database read (and fitted, imported) while it is written.

Served from the collector's own process (Starlette on uvicorn, in a thread beside the ingest
loop), on ``127.0.0.1`` by default. Every request works on its own DuckDB cursor of the
collector's connection, so queries see committed batches while the next one is written.

- ``GET /healthz``: the process answers. ``GET /readyz``: 200 once ingest runs, else 503.
- ``POST /api/v1/analyze`` ``{"argv": ["nodes", "--json"]}``: any ``analyze`` command, run
  in this process on the live database; ``{"exit_code", "stdout", "stderr"}``, the same
  output the command prints locally. ``analyze`` does this by itself when the database it
  is pointed at is held by a running collector (the service file beside the database).
- ``POST /api/v1/sql`` ``{"query": ..., "max_rows": ..., "timeout": ...}``: one read-only
  SELECT (analytics/safesql.py's rules), JSON rows, or an Arrow IPC stream with
  ``Accept: application/vnd.apache.arrow.stream``.
- ``GET /metrics``: the collector's own metrics in the Prometheus text format.

Off loopback the API needs a bearer token (``--http-token-file`` or ``$CMDARE_HTTP_TOKEN``)
and can serve TLS; a request without it gets 401 and nothing else.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import ipaddress
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

log = logging.getLogger("cmdare.collector.service")
SERVICE_SUFFIX = ".service.json"
TOKEN_ENV = "CMDARE_HTTP_TOKEN"
ARROW = "application/vnd.apache.arrow.stream"


def service_file(db: str | Path) -> Path:
    """Where a collector holding ``db`` writes how to reach its API."""
    p = Path(db)
    return p.with_name(p.name + SERVICE_SUFFIX)


@dataclass(frozen=True)
class HttpConfig:
    host: str
    port: int
    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


def parse_http(value: str, token_file: str | None = None, tls_cert: str | None = None,
               tls_key: str | None = None) -> HttpConfig | None:
    """``--http ADDR:PORT`` (or ``off``); a one-line ValueError for anything else, or for an
    address off loopback without a token."""
    if value.strip().lower() == "off":
        return None
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--http: expected ADDR:PORT (e.g. 127.0.0.1:8765) or off, got {value!r}")
    token = None
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            raise ValueError(f"--http-token-file {token_file}: cannot read: {e.strerror}") from None
        if not token:
            raise ValueError(f"--http-token-file {token_file}: the file is empty")
    elif os.environ.get(TOKEN_ENV):
        token = os.environ[TOKEN_ENV].strip()
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("--http-tls-cert and --http-tls-key go together")
    cfg = HttpConfig(host, int(port), token, tls_cert, tls_key)
    if not cfg.loopback and not token:
        raise ValueError(
            f"--http {value}: off loopback the API needs a bearer token (--http-token-file or ${TOKEN_ENV})"
        )
    return cfg


class _Streams:
    """sys.stdout / sys.stderr for the whole process, sending a thread's writes to its
    capture buffer while it runs an analyze command and everything else where it went."""

    def __init__(self, real: Any, which: str) -> None:
        self.real, self.which = real, which
        self.local = threading.local()

    def write(self, s: str) -> int:
        buf = getattr(self.local, "buf", None)
        return (buf or self.real).write(s)

    def flush(self) -> None:
        buf = getattr(self.local, "buf", None)
        (buf or self.real).flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(getattr(self.local, "buf", None) or self.real, name)


_STREAMS: dict[str, _Streams] = {}
_STREAMS_LOCK = threading.Lock()


@contextlib.contextmanager
def _captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    with _STREAMS_LOCK:
        if not _STREAMS:
            _STREAMS["out"], _STREAMS["err"] = _Streams(sys.stdout, "out"), _Streams(sys.stderr, "err")
            sys.stdout, sys.stderr = _STREAMS["out"], _STREAMS["err"]  # type: ignore[assignment]
    out, err = io.StringIO(), io.StringIO()
    _STREAMS["out"].local.buf, _STREAMS["err"].local.buf = out, err
    try:
        yield out, err
    finally:
        _STREAMS["out"].local.buf = _STREAMS["err"].local.buf = None


class Service:
    """The API of one collector process over its database connection ``con``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, db: str | Path, cfg: HttpConfig,
                 totals: Callable[[], Any] | None = None) -> None:
        self.db = str(db)
        self.cfg = cfg
        self.totals = totals
        self.ready = False
        # the service's own connection to the same database, made here in the caller's
        # (ingest) thread; each request takes a cursor of it
        con.execute("SET enable_external_access = false")  # user SQL reads the database only
        self.base = con.cursor()
        self.base_lock = threading.Lock()
        self.analyze_lock = threading.Lock()  # analyze commands that write (fit, import) one at a time
        self.server: Any = None
        self.thread: threading.Thread | None = None
        self.url = ""
        self.requests = 0
        self.alerting: Any = None  # the rule evaluation (collector.alerting.Alerting), when --rules

    # -- connections ----------------------------------------------------------------------
    def cursor(self) -> duckdb.DuckDBPyConnection:
        with self.base_lock:
            c = self.base.cursor()
        c.execute("USE cmdare")
        c.execute("SET python_enable_replacements = false")
        return c

    # -- the app ----------------------------------------------------------------------------
    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.middleware import Middleware
        from starlette.requests import Request
        from starlette.responses import JSONResponse, PlainTextResponse, Response
        from starlette.routing import Route

        svc = self

        class Auth:
            def __init__(self, app: Any) -> None:
                self.app = app

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                if scope["type"] == "http" and svc.cfg.token and scope["path"] != "/healthz":
                    got = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
                    want = f"Bearer {svc.cfg.token}"
                    if not hmac.compare_digest(got.encode(), want.encode()):
                        await PlainTextResponse("unauthorized\n", status_code=401,
                                                headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                        return
                svc.requests += 1
                await self.app(scope, receive, send)

        async def healthz(_: Request) -> Response:
            return JSONResponse({"status": "ok"})

        async def readyz(_: Request) -> Response:
            return JSONResponse({"ready": svc.ready}, status_code=200 if svc.ready else 503)

        async def body(request: Request) -> dict[str, Any]:
            try:
                b = await request.json()
            except (ValueError, UnicodeDecodeError):
                raise _BadRequest("the body must be a JSON object") from None
            if not isinstance(b, dict):
                raise _BadRequest("the body must be a JSON object")
            return b

        async def analyze(request: Request) -> Response:
            from starlette.concurrency import run_in_threadpool

            try:
                b = await body(request)
                argv = b.get("argv")
                if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not argv:
                    raise _BadRequest('"argv" must be a non-empty list of strings, e.g. ["nodes", "--json"]')
            except _BadRequest as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            code, out, err = await run_in_threadpool(svc.run_analyze, argv)
            return JSONResponse({"exit_code": code, "stdout": out, "stderr": err})

        async def sql(request: Request) -> Response:
            from starlette.concurrency import run_in_threadpool

            try:
                b = await body(request)
                q = b.get("query")
                if not isinstance(q, str):
                    raise _BadRequest('"query" must be a string')
                max_rows = b.get("max_rows", 10_000)
                timeout = b.get("timeout", 30.0)
                if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
                    raise _BadRequest('"max_rows" must be a whole number >= 1')
                if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
                    raise _BadRequest('"timeout" must be a number of seconds above 0')
            except _BadRequest as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            arrow = ARROW in request.headers.get("accept", "")
            try:
                payload = await run_in_threadpool(svc.run_sql, q, max_rows, float(timeout), arrow)
            except _SqlError as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            if arrow:
                return Response(payload, media_type=ARROW)
            return Response(payload, media_type="application/json")

        async def metrics(_: Request) -> Response:
            from prometheus_client import CONTENT_TYPE_LATEST

            return Response(svc.metrics_text(), media_type=CONTENT_TYPE_LATEST)

        routes = [
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/api/v1/analyze", analyze, methods=["POST"]),
            Route("/api/v1/sql", sql, methods=["POST"]),
            Route("/metrics", metrics),
        ]
        return Starlette(routes=routes, middleware=[Middleware(Auth)])

    # -- work -------------------------------------------------------------------------------
    def run_analyze(self, argv: list[str]) -> tuple[int, str, str]:
        """One ``analyze`` command in this process on the live database: exit code, stdout,
        stderr, as the command would print them."""
        import click

        from cmdare.analytics import db as adb
        from cmdare.analytics.cli import cli

        with self.analyze_lock, _captured() as (out, err), adb.live(self.cursor, self.db):
            try:
                rv = cli.main(args=["--db", self.db, *argv], prog_name="analyze", standalone_mode=False)
                code = rv if isinstance(rv, int) else 0
            except click.exceptions.Exit as e:
                code = e.exit_code
            except click.ClickException as e:
                e.show()
                code = e.exit_code
            except click.exceptions.Abort:
                err.write("Aborted!\n")
                code = 1
            except Exception as e:  # a bug: said, not a dead API
                log.exception("analyze %s failed", argv)
                err.write(f"Error: internal error: {type(e).__name__}: {e}\n")
                code = 1
            return code, out.getvalue(), err.getvalue()

    def run_sql(self, query: str, max_rows: int, timeout: float, arrow: bool) -> bytes:
        from cmdare.analytics import safesql

        con = self.cursor()
        try:
            r = safesql.run(con, query, max_rows, timeout)
        except safesql.SqlRefused as e:
            raise _SqlError(str(e)) from None
        finally:
            con.close()
        if arrow:
            import pyarrow as pa

            cols = {c: [row[i] for row in r.rows] for i, c in enumerate(r.columns)}
            t = pa.table(cols) if r.columns else pa.table({})
            t = t.replace_schema_metadata({"truncated": str(r.truncated).lower()})
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, t.schema) as w:
                w.write_table(t)
            return sink.getvalue().to_pybytes()
        from cmdare.analytics.output import as_json

        rows = json.loads(as_json(r.columns, r.rows))
        return json.dumps({"columns": r.columns, "rows": rows, "truncated": r.truncated}).encode()

    def metrics_text(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        svc = self

        class Totals:
            def collect(self) -> Iterator[Any]:
                t = svc.totals() if svc.totals else None
                if t is not None:
                    for name, v, doc in (
                        ("cmdare_collector_events_stored", t.events, "events stored in the database"),
                        ("cmdare_collector_duplicates", t.duplicates, "events delivered again and skipped"),
                        ("cmdare_collector_dead_letters", t.dead, "messages stored as dead letters"),
                        ("cmdare_collector_batches", t.batches, "write transactions committed"),
                        ("cmdare_collector_messages", t.messages, "messages read"),
                    ):
                        yield CounterMetricFamily(name, doc, value=v)
                    dt = max(1e-9, time.monotonic() - t.started)
                    yield GaugeMetricFamily("cmdare_collector_ingest_rate_events_per_second",
                                            "events stored per second since start", value=t.events / dt)
                    if t.last_stored:
                        yield GaugeMetricFamily("cmdare_collector_last_batch_age_seconds",
                                                "seconds since the last batch was committed",
                                                value=time.monotonic() - t.last_stored)
                    yield SummaryMetricFamily("cmdare_collector_batch_seconds",
                                              "write transactions' wall time (count: batches)",
                                              count_value=t.batches, sum_value=t.batch_seconds)
                    yield GaugeMetricFamily("cmdare_collector_last_batch_seconds",
                                            "the last write transaction's wall time", value=t.last_batch_seconds)
                    lag = GaugeMetricFamily("cmdare_collector_kafka_lag_messages",
                                            "records behind the partition's end at the last fetch",
                                            labels=("topic", "partition"))
                    for (topic, part), n in sorted(dict(t.lag).items()):
                        lag.add_metric([topic, str(part)], n)
                    yield lag
                    if t.lag_seconds is not None:
                        yield GaugeMetricFamily("cmdare_collector_kafka_lag_seconds",
                                                "age of the newest record fetched (its Kafka timestamp) when fetched",
                                                value=t.lag_seconds)
                al = getattr(svc, "alerting", None)
                if al is not None:
                    states = GaugeMetricFamily("cmdare_collector_alerts", "alert instances by state", labels=("state",))
                    snap = al.engine.snapshot()
                    for st in ("pending", "firing", "inhibited", "resolved"):
                        states.add_metric([st], sum(a.state == st for a in snap))
                    yield states
                    bad = GaugeMetricFamily("cmdare_collector_alert_rules_unhealthy",
                                            "rules whose last evaluation failed")
                    bad.add_metric([], sum(h.health == "error" for h in al.engine.health.values()))
                    yield bad
                    sent = CounterMetricFamily("cmdare_collector_alert_notifications",
                                               "deliveries to a receiver", labels=("receiver",))
                    failed = CounterMetricFamily("cmdare_collector_alert_notification_failures",
                                                 "failed delivery attempts (retried)", labels=("receiver",))
                    for r in al.receivers:
                        if hasattr(r, "sent_total"):
                            sent.add_metric([r.name], r.sent_total)
                            failed.add_metric([r.name], r.failed_total)
                    yield sent
                    yield failed
                yield CounterMetricFamily("cmdare_collector_http_requests", "API requests served", value=svc.requests)
                yield GaugeMetricFamily("cmdare_collector_ready", "1 once ingest runs", value=1.0 if svc.ready else 0.0)

        reg = CollectorRegistry(auto_describe=False)
        reg.register(Totals())  # type: ignore[arg-type]
        return generate_latest(reg)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> str:
        """Serve in a thread; the URL it listens on (the real port for port 0), written to
        the service file beside the database."""
        import uvicorn

        cfg = uvicorn.Config(
            self.app(), host=self.cfg.host, port=self.cfg.port, log_level="warning", access_log=False,
            ssl_certfile=self.cfg.tls_cert, ssl_keyfile=self.cfg.tls_key, lifespan="off",
        )
        self.server = uvicorn.Server(cfg)
        self.server.install_signal_handlers = lambda: None  # the collector owns SIGTERM / SIGINT
        self.thread = threading.Thread(target=self.server.run, name="cmdare-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"cannot serve the API on {self.cfg.host}:{self.cfg.port} (address in use?)")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        host = self.cfg.host if ":" not in self.cfg.host else f"[{self.cfg.host}]"
        scheme = "https" if self.cfg.tls_cert else "http"
        if self.cfg.host in ("0.0.0.0", "::"):
            host = "127.0.0.1" if self.cfg.host == "0.0.0.0" else "[::1]"
        self.url = f"{scheme}://{host}:{port}"
        f = service_file(self.db)
        tmp = f.with_name(f.name + ".tmp")
        tmp.write_text(json.dumps({"url": self.url, "pid": os.getpid(), "db": str(Path(self.db).resolve()),
                                   "token": bool(self.cfg.token)}) + "\n")
        tmp.replace(f)
        return self.url

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            f = service_file(self.db)
            if f.exists() and json.loads(f.read_text()).get("pid") == os.getpid():
                f.unlink()
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=5)
        with contextlib.suppress(duckdb.Error):
            self.base.close()


class _BadRequest(Exception):
    pass


class _SqlError(Exception):
    pass
