"""The collector's HTTP API server: cmdare.analytics.server.http's app on uvicorn, in a thread of
the collector's process, over the collector's own database connection.

On ``127.0.0.1`` by default; off loopback it needs a bearer token (``--http-token-file`` or
``$CMDARE_HTTP_TOKEN``) and can serve TLS. The server itself is bounded so that nothing a
client does reaches ingest: at most ``max_connections`` open connections (more are closed
at once), a request must arrive whole (headers and body) within ``request_timeout`` seconds
of its connection or of the previous response, idle keep-alive connections close after 5 s.
``DB.service.json`` (mode 0644, beside the database) tells ``analyze`` where the API is.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from ..db import Database
from ..resources import TOKEN_ENV, service_file
from .http import UI, Limits, create_app
from .sessions import SESSION_TTL
from .throttle import HOW, Throttle
from .tokens import TokenError, Tokens

log = logging.getLogger("cmdare.analytics.server.service")
MAX_CONNECTIONS = 256
CONCLUSIONS_TTL = 30.0  # seconds a scrape reuses the last findings / goodput figures
REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True)
class HttpConfig:
    host: str
    port: int
    token: Tokens | str | None = None  # analytics/server/tokens.py (a file's, re-read when it changes), or one token
    tls_cert: str | None = None
    tls_key: str | None = None
    max_connections: int = MAX_CONNECTIONS
    request_timeout: float = REQUEST_TIMEOUT
    limits: Limits = Limits()
    ui_url: str | None = None  # where people open the pages, when a proxy stands in front
    session_ttl: float = SESSION_TTL  # how long a page sign-in lasts

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


def parse_http(value: str, token_file: str | None = None, tls_cert: str | None = None,
               tls_key: str | None = None, ui_url: str | None = None,
               session_ttl: float = SESSION_TTL) -> HttpConfig | None:
    """``--http ADDR:PORT`` (or ``off``); a one-line ValueError for anything else, or for an
    address off loopback without a token."""
    if ui_url is not None:
        import urllib.parse

        u = urllib.parse.urlsplit(ui_url)
        if u.username or u.password:  # never quoted: it would print the secret
            raise ValueError("--ui-url: a URL with credentials is refused (alerts would carry them)")
        if u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
            raise ValueError(f"--ui-url: expected http(s)://HOST[:PORT][/PATH], got {ui_url[:60]!r}")
        ui_url = ui_url.rstrip("/")
    if value.strip().lower() == "off":
        return None
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--http: expected ADDR:PORT (e.g. 127.0.0.1:8765) or off, got {value!r}")
    token: Tokens | str | None = None
    if token_file:
        try:
            token = Tokens.load(token_file)
        except TokenError as e:
            raise ValueError(f"--http-token-file {e}") from None
    elif os.environ.get(TOKEN_ENV):
        token = os.environ[TOKEN_ENV].strip()
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("--http-tls-cert and --http-tls-key go together")
    cfg = HttpConfig(host, int(port), token, tls_cert, tls_key, ui_url=ui_url, session_ttl=session_ttl)
    if not cfg.loopback and not token:
        raise ValueError(
            f"--http {value}: off loopback the API needs a bearer token (--http-token-file or ${TOKEN_ENV})"
        )
    return cfg


class Service:
    """The API of one collector process over its database connection ``con``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, db: str | Path, cfg: HttpConfig,
                 totals: Callable[[], Any] | None = None, database: Database | None = None,
                 ui: UI | None = None) -> None:
        """``database``: what the requests read when it is not ``con``'s file (a lake's
        replica, analytics/server/lakeserve.py: no service file is written for it); ``ui``:
        mounts the pages (cmdare.dashboards.pages.mount, given by the front ends), none without."""
        self.db = str(db)
        self.announce = database is None  # DB.service.json: analyze finds a file's collector by it
        self.cfg = cfg
        self.ui = ui
        self.totals = totals
        self.ready = False
        # user SQL, rule SQL and every read: no file, network or extension access, no Python
        # objects, for the whole instance (ingest reads only its own tables)
        for k in ("enable_external_access", "autoinstall_known_extensions", "autoload_known_extensions",
                  "python_enable_replacements"):
            con.execute(f"SET {k} = false")
        con.execute(f"SET memory_limit = '{_memory_limit()}'")
        from .. import safesql

        safesql.BUDGET.total = safesql.total_budget()  # user SQL's memory, all queries together
        # made here, in the caller's (ingest) thread
        self.database = database if database is not None else Database.served(con, db)
        self.server: Any = None
        self.thread: threading.Thread | None = None
        self.url = ""
        self.requests = 0
        self.throttle = Throttle()  # failed sign-ins, per address and overall (the API and the login form)
        self.alerting: Any = None  # the rule evaluation (Alerting), when --rules
        self.extra_metrics: Callable[[], Iterator[Any]] | None = None  # a lake server's own series
        self._conclusions: tuple[float, dict[str, Any]] | None = None

    def app(self) -> Any:
        def count() -> None:
            self.requests += 1

        from .http import Guard
        from .sessions import Sessions

        sessions = Sessions(self.cfg.session_ttl)  # one store: the pages open sessions, the Guard checks them
        app = create_app(self.database, self.cfg.token, self.cfg.limits, lambda: self.ready, self.metrics_text,
                         sessions=sessions, throttle=self.throttle, ui=self.ui)
        return Guard(app, self.cfg.token, self.cfg.limits, count, sessions, self.throttle)

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
                    if t.caught_up_at is not None:
                        yield GaugeMetricFamily("cmdare_collector_caught_up_timestamp_seconds",
                                                "when ingest last held everything its source had (the liveness "
                                                "horizon)", value=t.caught_up_at)
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
                yield from svc.conclusion_metrics()
                yield CounterMetricFamily("cmdare_collector_http_requests", "API requests served", value=svc.requests)
                fails = CounterMetricFamily("cmdare_collector_auth_failures",
                                            "failed sign-ins by what failed (a bearer token, the login form, a "
                                            "page cookie)", labels=("how",))
                for how in HOW:
                    fails.add_metric([how], svc.throttle.failures[how])
                yield fails
                yield CounterMetricFamily("cmdare_collector_auth_throttled",
                                          "sign-in attempts answered 429 without being checked",
                                          value=svc.throttle.throttled)
                yield GaugeMetricFamily("cmdare_collector_ready", "1 once ingest runs", value=1.0 if svc.ready else 0.0)

        class Extra:
            def collect(self) -> Iterator[Any]:
                yield from (svc.extra_metrics() if svc.extra_metrics else ())

        reg = CollectorRegistry(auto_describe=False)
        reg.register(Totals())  # type: ignore[arg-type]
        reg.register(Extra())  # type: ignore[arg-type]
        return generate_latest(reg)

    def conclusion_metrics(self) -> Iterator[Any]:
        """cmdare's conclusions as series (cmdare.analytics.api.fleet.conclusions), computed at
        most every CONCLUSIONS_TTL seconds: a scrape does not re-run goodput for every job."""
        from prometheus_client.core import GaugeMetricFamily

        now = time.monotonic()
        if self._conclusions is None or now - self._conclusions[0] >= CONCLUSIONS_TTL:
            from ..api.fleet import conclusions

            try:
                with self.database.read() as con:
                    self._conclusions = (now, conclusions(con))
            except Exception as e:  # noqa: BLE001  (a scrape must answer: the rest of the metrics stand)
                log.warning("metrics: conclusions unavailable: %s", str(e).splitlines()[0][:200])
                return
        c = self._conclusions[1]
        f = GaugeMetricFamily("cmdare_finding_active", "stored findings not resolved whose window ended within the last hour",
                              labels=("job", "kind", "severity"))
        for job, kind, sev, n in c["findings"]:
            f.add_metric([job, kind, sev], n)
        yield f
        g = GaugeMetricFamily("cmdare_job_goodput_ratio", "productive share of a running job's accelerator time",
                              labels=("job",))
        b = GaugeMetricFamily("cmdare_job_badput_seconds", "a running job's accelerator-seconds lost, by cause",
                              labels=("job", "category"))
        for job, parts in sorted(c["goodput"].items()):
            wall = parts.get("wall", 0.0)
            if wall > 0:
                g.add_metric([job], parts.get("productive", 0.0) / wall)
            for cat, sec in sorted(parts.items()):
                if cat not in ("wall", "productive"):
                    b.add_metric([job, cat], sec)
        yield g
        yield b

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> str:
        """Serve in a thread; the URL it listens on (the real port for port 0), written to
        the service file beside the database."""
        import uvicorn

        cap = _connection_cap(_raise_nofile(), self.cfg.max_connections)
        cfg = uvicorn.Config(
            self.app(), host=self.cfg.host, port=self.cfg.port, log_level="warning", access_log=False,
            ssl_certfile=self.cfg.tls_cert, ssl_keyfile=self.cfg.tls_key, lifespan="off",
            http=_guarded(cap, self.cfg.request_timeout), timeout_keep_alive=5,
            h11_max_incomplete_event_size=64 * 1024,
            # asyncio accepts up to `backlog` connections per wake-up before any is closed:
            # the burst is bounded as the open connections are
            backlog=cap,
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
        if not self.announce:
            return self.url
        f = service_file(self.db)
        tmp = f.with_name(f.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(json.dumps({"url": self.url, "pid": os.getpid(), "db": str(Path(self.db).resolve()),
                                 "token": bool(self.cfg.token)}) + "\n")
        tmp.replace(f)
        return self.url

    def pages_url(self) -> str:
        """The base URL alerts link to (URL/ui/alerts?rule=...): --ui-url, else the API's
        address (this host's name when it listens on every address)."""
        if self.cfg.ui_url:
            return self.cfg.ui_url
        if self.cfg.host in ("0.0.0.0", "::"):
            import socket

            scheme, _, rest = self.url.partition("://")
            return f"{scheme}://{socket.getfqdn()}:{rest.rsplit(':', 1)[1]}"
        return self.url

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            f = service_file(self.db)
            if self.announce and f.exists() and json.loads(f.read_text()).get("pid") == os.getpid():
                f.unlink()
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=5)
        self.database.close()


def _memory_limit() -> str:
    """DuckDB's memory limit for the collector: $CMDARE_MEMORY_LIMIT, else half the machine
    up to 4 GiB (ingest needs far less; a query past it spills or stops with one line, so
    one query cannot take the machine: the API's SQL also has a per-query budget)."""
    v = os.environ.get("CMDARE_MEMORY_LIMIT", "").strip()
    if v:
        if not v.replace(".", "", 1).rstrip("KMGTiBkmgtb ").isdigit():
            raise ValueError(f"$CMDARE_MEMORY_LIMIT: expected a size like 4GB, got {v[:40]!r}")
        return v
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return "4GB"
    return f"{max(1, min(total // 2, 4 << 30) // (1 << 20))}MB"


def _raise_nofile() -> int:
    """The soft open-file limit up to the hard one (the unit sets LimitNOFILE): the limit
    now in force."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ValueError, OSError):
        return 1024
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


FD_RESERVE = 256  # descriptors kept for ingest, DuckDB, Kafka and alert delivery


def _connection_cap(nofile: int, wanted: int) -> int:
    """The API's connection cap within the open-file limit: open connections plus one
    accept burst (each at most the cap) leave FD_RESERVE descriptors to ingest."""
    cap = max(8, min(wanted, (nofile - FD_RESERVE) // 2))
    if cap < wanted:
        logging.getLogger("cmdare.service").warning(
            "API: at most %d connections (not %d): the open-file limit is %d (raise LimitNOFILE)", cap, wanted, nofile)
    return cap


def _guarded(max_connections: int, request_timeout: float) -> type:
    """uvicorn's h11 protocol with fair connections: at most ``max_connections`` open, at
    most a quarter of them from one address (an IPv6 host: its /64), a deadline for each
    request to arrive whole. A connection past a cap takes the place of the one that has
    waited longest without a request (still sending its headers, or idle between
    requests: a slow-header attack's, or a keep-alive nobody uses); with none such it is
    closed at once (no file descriptor held). So connections that trickle their headers
    cannot lock out clients whose requests arrive whole, from another address or their own."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from .throttle import Throttle

    per_address = max(4, max_connections // 4)

    def waiting(c: Any) -> bool:  # no request being answered: only headers, or nothing, arrived
        return c.conn.their_state == h11.IDLE and (c.cycle is None or c.cycle.response_complete)

    class Guarded(H11Protocol):  # type: ignore[misc]
        refused = 0
        timed_out = 0
        evicted = 0

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            peer = transport.get_extra_info("peername")
            self._who = Throttle.key(peer[0] if isinstance(peer, tuple) and peer else None)
            others: list[Any] = list(self.connections)  # (each one of this class)
            mine = [c for c in others if getattr(c, "_who", None) == self._who]
            for pool, cap in ((mine, per_address), (others, max_connections)):
                if len(pool) >= cap:
                    old = min((c for c in pool if waiting(c)), key=lambda c: c._waiting_since, default=None)
                    if old is None:
                        Guarded.refused += 1
                        transport.abort()
                        return
                    Guarded.evicted += 1
                    old.transport.abort()
                    old._gone()
            super().connection_made(transport)
            self._waiting_since = self.loop.time()
            self._deadline: Any = self.loop.call_later(request_timeout, self._too_slow)

        def _gone(self) -> None:  # out of the count now (connection_lost comes later)
            self.connections.discard(self)
            self._stop_deadline()

        def _too_slow(self) -> None:
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and (self.cycle is None or not self.cycle.response_started):
                Guarded.timed_out += 1
                self.transport.abort()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
                self._stop_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._stop_deadline()
            self._waiting_since = self.loop.time()
            if not self.transport.is_closing():
                self._deadline = self.loop.call_later(request_timeout, self._too_slow)

        def _stop_deadline(self) -> None:
            d = getattr(self, "_deadline", None)
            if d is not None:
                d.cancel()
                self._deadline = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_deadline()
            if self in self.connections or getattr(self, "transport", None) is not None:
                super().connection_lost(exc)

    return Guarded
