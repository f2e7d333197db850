"""``cmdare-collector serve --lake``: the server tier over a lake (analytics/server/lakeserve.py).

One process: it reads the lake into its replica, serves the API, the pages and
``/metrics`` exactly as a collector serves its database file, and reads what the ingest
collectors commit every ``--refresh``. It ingests nothing and holds no state of its own:
run as many as the load needs (behind one load balancer), each beside none, some or all
of the ingest collectors. Lifecycle: lake, replica, first read, API, refresher; torn down
in reverse on SIGTERM / SIGINT."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmdare.wire.units import ConfigError

Say = Callable[[str], None]
REFRESH = 2.0  # seconds between two looks at the catalog (--refresh)
# the alert rules' SQL workers, at most (a worker per rule group up to this: groups run at once)
RULE_WORKERS = 4


class ServeError(Exception):
    """A failure at run time; str() is one line."""


@dataclass(frozen=True)
class ServeConfig:
    lake: str
    catalog: str | None
    http: Any  # analytics.server.service.HttpConfig
    refresh: float = REFRESH
    cache_dir: Path | None = None
    sql_workers: int = 2  # user SQL's worker processes (analytics/server/sqlpool.py)
    sql_memory: int | None = None  # each one's address-space cap (default: sqlpool.memory_cap())
    # the ruler's settings (rules, receivers, detectors; collector/cli/config.py, command "serve")
    settings: Any = None
    notices: Any = None  # the fast path's topic (KafkaURL), or None
    notices_group: str = "cmdare-ruler"
    commit_every: float = 10.0  # the ingest collectors' --commit-every (how far the horizon may trail)


def http_config(http: str, token_file: str | None, tls_cert: str | None, tls_key: str | None,
                ui_url: str | None, session_ttl: float) -> Any:
    """The API's settings, one-line ConfigError; a server without an API is refused."""
    from cmdare.analytics.server.service import parse_http

    try:
        cfg = parse_http(http, token_file, tls_cert, tls_key, ui_url, session_ttl)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg is None:
        raise ConfigError("--http off: a server serves the API (give ADDR:PORT)")
    return cfg


def run(cfg: ServeConfig, say: Say, stop: threading.Event | None = None) -> None:
    """Serve until ``stop`` is set (default: SIGTERM / SIGINT)."""
    from cmdare.analytics.db import AnalyticsError
    from cmdare.analytics.server.lakeserve import LakeReplica, LakeServed, Refresher
    from cmdare.analytics.server.service import Service
    from cmdare.analytics.server.sqlpool import SqlPool
    from cmdare.dashboards.pages import mount

    from ..lake import Lake, LakeError

    logging.getLogger("pyiceberg").setLevel(logging.WARNING)  # (a line per table it loads)

    try:
        lk = Lake(cfg.lake, cfg.catalog, create=False)
    except LakeError as e:
        raise ServeError(str(e)) from None
    if stop is None:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    replica = LakeReplica(lk, cfg.cache_dir)
    replica.elsewhere = {"alerts", "alert_rules"}  # the ruler's alert state: in the catalog (lakeruler.AlertStore)
    svc = refresher = ruler = None
    lost: list[str] = []
    try:
        t = time.monotonic()
        try:
            replica.refresh()
        except (AnalyticsError, LakeError, OSError) as e:
            raise ServeError(f"{lk.name}: cannot read the lake: {str(e).splitlines()[0][:200]}") from None
        say(f"cmdare-collector: read the lake {lk.name} ({replica.loaded_files} files) in "
            f"{time.monotonic() - t:.1f} s")
        served = LakeServed(replica, lk.name)
        served.sql_pool = SqlPool(cfg.lake, cfg.catalog, cfg.sql_workers, cfg.sql_memory)
        if cfg.settings is not None and cfg.settings.rules:  # rules' SQL in workers of their own
            served.rule_pool = SqlPool(cfg.lake, cfg.catalog, RULE_WORKERS, cfg.sql_memory, fast=True)
        alerting = _alerting(replica, cfg, served.rule_pool)  # (bad rule files stop every server, standbys too)
        svc = Service(replica.con, lk.name, cfg.http, database=served, ui=mount)
        try:
            url = svc.start()
        except OSError as e:
            raise ServeError(str(e)) from None
        if alerting is not None:
            alerting.link_base(svc.pages_url())

        def on_lost(why: str) -> None:
            lost.append(why)
            stop.set()

        ruler = _ruler(lk, served, alerting, cfg, say, on_lost)
        ruler.service = svc
        svc.extra_metrics = lambda: _metrics(replica, served, ruler)
        replica.after_refresh.append(ruler.on_refresh)
        ruler.start()
        svc.ready = True
        refresher = Refresher(replica, cfg.refresh, say)
        refresher.start()
        say(f"cmdare-collector: serving the lake {lk.name} on {url} (pages on {url}/ui; analyze --server {url}); "
            f"reading new commits every {cfg.refresh:g} s"
            + ("; asking to rule it" if ruler.wants else ""))
        stop.wait()
    finally:
        if refresher is not None:
            refresher.stop()
        if ruler is not None:
            ruler.stop()
        if svc is not None:
            svc.stop()
        replica.close()
    if lost:
        raise ServeError(f"lost the ruler's lease ({lost[0]}): exiting, so that another server rules and this one "
                         "starts again as a standby")


def _alerting(replica: Any, cfg: ServeConfig, pool: Any) -> Any:
    """The rule evaluation, validated against what the server has read (not started: the
    ruler starts it once it holds the lease); None without rules. Each rule's SQL runs in
    one of ``pool``'s worker processes, over the lake and the rows the ruler read ahead of
    it (analytics/server/sqlpool.py): a rule past the memory, CPU or time caps costs its worker and
    that rule's round, never the server."""
    from cmdare.analytics.alerting import RuleError
    from cmdare.analytics.server.schedule import load

    st = cfg.settings
    if st is None or not st.rules:
        return None

    def in_worker(rule: Any, at: Any, timeout: float, horizon: Any, lag: float) -> Any:
        return pool.rule(rule, at, timeout, horizon, lag, replica.read_ahead())

    try:
        al = load(replica.con, tuple(st.rules), st.inhibit_window, st.receivers, st.resend, security=st.security,
                  evaluator=in_worker)
    except RuleError as e:
        raise ConfigError(str(e)) from None
    pool.size = max(1, min(len(al.engine.groups), RULE_WORKERS))
    al.grace = st.liveness_grace
    return al


def _ruler(lk: Any, served: Any, alerting: Any, cfg: ServeConfig, say: Say, on_lost: Callable[[str], None]) -> Any:
    """This server's part in ruling the lake (analytics/server/lakeruler.py)."""
    from cmdare.analytics.server.lakeruler import AlertStore, FastPath, Ruler, lake_detectors, pg_fence
    from cmdare.analytics.server.schedule import GAP

    from ..lease import Lease

    lease = Lease(lk)
    store = AlertStore(lk.catalog.engine, pg_fence(lease) if lease.kind == "postgresql" else None)
    try:
        store.ensure()
    except Exception as e:  # noqa: BLE001
        raise ServeError(f"{lk.name}: cannot keep the alert state in the catalog: {str(e).splitlines()[0][:200]}") from None
    st = cfg.settings
    every = st.detect_every if st is not None else None
    detectors = (lambda: lake_detectors(served, every, st.detect_window)) if every is not None else None
    fast = None
    if cfg.notices is not None and alerting is not None:
        fast = FastPath(served.replica, cfg.notices, cfg.notices_group)  # (the ruler hands it its rules' poke)
    return Ruler(served, lease, store, alerting, detectors, fast, say, on_lost,
                 gap=cfg.commit_every + cfg.refresh + GAP)


def _metrics(replica: Any, served: Any, ruler: Any) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    yield GaugeMetricFamily("cmdare_server_ruler", "1 while this server holds the lake's ruler lease (evaluates "
                            "the rules, runs the detectors)", value=1 if ruler.leading else 0)
    if ruler.fast is not None:
        yield CounterMetricFamily("cmdare_server_ruler_read_ahead_rows", "revocation and lifecycle rows the ruler "
                                  "read from Kafka ahead of the lake's commits (--notices)", value=ruler.fast.added)

    if replica.refreshed_at is not None:
        yield GaugeMetricFamily("cmdare_server_lake_refresh_age_seconds",
                                "seconds since the lake's catalog was last read whole",
                                value=time.monotonic() - replica.refreshed_at)
    yield CounterMetricFamily("cmdare_server_sql_workers_stopped", "user SQL workers stopped past a memory, CPU or "
                              "time cap", value=served.sql_pool.killed)
    if served.rule_pool is not None:
        yield CounterMetricFamily("cmdare_server_rule_workers_stopped", "alert rules' SQL workers stopped past a "
                                  "memory, CPU or time cap", value=served.rule_pool.killed)
    yield CounterMetricFamily("cmdare_server_lake_files_read", "data files read from the lake since start",
                              value=replica.loaded_files)
    if replica.horizon is not None:
        import calendar

        yield GaugeMetricFamily("cmdare_server_lake_horizon_timestamp_seconds",
                                "up to when the lake holds everything sent (its newest commits; liveness is "
                                "judged as of it)", value=calendar.timegm(replica.horizon.timetuple()))
