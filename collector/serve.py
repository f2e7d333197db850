"""``cmdare-collector serve --lake``: the server tier over a lake (analytics/lakeserve.py).

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


class ServeError(Exception):
    """A failure at run time; str() is one line."""


@dataclass(frozen=True)
class ServeConfig:
    lake: str
    catalog: str | None
    http: Any  # analytics.service.HttpConfig
    refresh: float = REFRESH
    cache_dir: Path | None = None
    sql_workers: int = 2  # user SQL's worker processes (analytics/sqlpool.py)
    sql_memory: int | None = None  # each one's address-space cap (default: sqlpool.memory_cap())


def http_config(http: str, token_file: str | None, tls_cert: str | None, tls_key: str | None,
                ui_url: str | None, session_ttl: float) -> Any:
    """The API's settings, one-line ConfigError; a server without an API is refused."""
    from cmdare.analytics.service import parse_http

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
    from cmdare.analytics.lakeserve import LakeReplica, LakeServed, Refresher
    from cmdare.analytics.service import Service
    from cmdare.analytics.sqlpool import SqlPool

    from .lake import Lake, LakeError

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
    svc = refresher = None
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
        svc = Service(replica.con, lk.name, cfg.http, database=served)
        svc.extra_metrics = lambda: _metrics(replica, served.sql_pool)
        try:
            url = svc.start()
        except OSError as e:
            raise ServeError(str(e)) from None
        svc.ready = True
        refresher = Refresher(replica, cfg.refresh, say)
        refresher.start()
        say(f"cmdare-collector: serving the lake {lk.name} on {url} (pages on {url}/ui; analyze --server {url}); "
            f"reading new commits every {cfg.refresh:g} s")
        stop.wait()
    finally:
        if refresher is not None:
            refresher.stop()
        if svc is not None:
            svc.stop()
        replica.close()


def _metrics(replica: Any, pool: Any) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if replica.refreshed_at is not None:
        yield GaugeMetricFamily("cmdare_server_lake_refresh_age_seconds",
                                "seconds since the lake's catalog was last read whole",
                                value=time.monotonic() - replica.refreshed_at)
    yield CounterMetricFamily("cmdare_server_sql_workers_stopped", "user SQL workers stopped past a memory, CPU or "
                              "time cap", value=pool.killed)
    yield CounterMetricFamily("cmdare_server_lake_files_read", "data files read from the lake since start",
                              value=replica.loaded_files)
    if replica.horizon is not None:
        import calendar

        yield GaugeMetricFamily("cmdare_server_lake_horizon_timestamp_seconds",
                                "up to when the lake holds everything sent (its newest commits; liveness is "
                                "judged as of it)", value=calendar.timegm(replica.horizon.timetuple()))
