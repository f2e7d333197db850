"""The collector's composition root: one lifecycle for every input. ``run(cfg)`` opens the
store (a DuckDB file, or an Iceberg lake), loads the alert rules and their receivers
(before anything is consumed: a bad rule file stops it at once), starts the API, runs the
input (Kafka or a spool directory) until it ends or is stopped, and tears down in one
order: alerting, API, input, store. Problems a user can fix are ``ConfigError``s;
failures at run time are ``CollectorError``s (one line each); the CLI only maps them."""

from __future__ import annotations

import datetime as dt
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from cmdare.wire.kafka import client_logging, parse_kafka_url
from cmdare.wire.units import ConfigError

from ..consumer import KafkaIngest, SpoolIngest, Totals
from ..db import DatabaseError, connect
from .config import CollectorConfig

Say = Callable[[str], None]


class CollectorError(Exception):
    """A failure at run time; str() is one line."""


@dataclass
class Run:
    """What one run holds, torn down in reverse order by ``close``."""

    con: Any = None
    alerting: Any = None
    service: Any = None
    ingest: Any = None
    detectors: Any = None

    def close(self) -> None:
        if self.detectors:
            self.detectors.stop()
        if self.alerting:
            self.alerting.stop()
        if self.service:
            self.service.stop()
        if self.ingest is not None and hasattr(self.ingest, "close"):
            self.ingest.close()
        if self.con is not None:
            self.con.close()


def progress(say: Say) -> Callable[[Totals], None]:
    return lambda t: say(f"cmdare-collector: {t.line()}")


def run(cfg: CollectorConfig, say: Say) -> None:
    """One collector run (blocks until the input ends or a signal stops it)."""
    if cfg.command == "kafka":
        cfg.url = parse_kafka_url("URL", cfg.target)
        cfg.url.security = cfg.security
        client_logging(secrets=(cfg.security.password,) if cfg.security else ())
    elif not Path(cfg.target).is_dir():
        raise CollectorError(f"{cfg.target}: no such spool directory")
    if cfg.lake:
        return _run_lake(cfg, say)
    serve = cfg.command == "kafka" or cfg.follow
    http = _http(cfg) if serve else None
    try:
        con = connect(cfg.db)
    except DatabaseError as e:
        raise CollectorError(str(e)) from None
    r = Run(con)
    try:
        r.alerting = _alerting(con, cfg)
        r.ingest = _ingest(cfg, con, say)
        if r.alerting:
            r.ingest.totals.on_batch = r.alerting.on_batch
            r.alerting.caught_up = lambda: r.ingest.totals.caught_up_at
        r.service = _serve(con, cfg.db, http, lambda: r.ingest.totals, say)
        _start_alerting(r.alerting, r.service, cfg.ui_url, say)
        if r.service:
            r.service.alerting = r.alerting
            r.service.database.horizon = _horizon(r)
        if cfg.command == "kafka":
            try:
                r.ingest.open()
            except ConnectionError as e:
                raise CollectorError(str(e)) from None
        _on_signals(r.ingest.stop)
        if cfg.command == "kafka":
            sec = cfg.security
            over = f" over {sec.describe()}" if sec and sec.protocol != "PLAINTEXT" else ""
            say(f"cmdare-collector: consuming {cfg.url.text}{over} (group {cfg.group}) into {cfg.db}")
        if r.service:
            r.service.ready = True
        r.detectors = _detectors(con, cfg, say) if serve else None  # (not needed to be ready)
        if r.alerting and r.detectors:  # finding rules read what the schedule keeps current
            r.alerting.engine.findings_fresh = 2 * cfg.detect_every + 30
        try:
            t = _consume(cfg, r.ingest)
        except duckdb.Error as e:
            kept = "its offsets not committed" if cfg.command == "kafka" else "the spool position kept"
            raise CollectorError(f"{cfg.db}: writing failed, the failed batch was rolled back and {kept}: "
                                 f"{str(e).splitlines()[0]}") from None
    finally:
        r.close()
    if cfg.command == "kafka":
        say(f"cmdare-collector: done: {t.line()}")
    else:
        say(f"cmdare-collector: {cfg.target} -> {cfg.db}: {r.ingest.totals.line()}")


def _ingest(cfg: CollectorConfig, con: Any, say: Say) -> Any:
    from cmdare.analytics.goodput import goodhours

    if cfg.command == "kafka":
        ing = KafkaIngest(con, cfg.url, cfg.group, cfg.batch_bytes, cfg.max_wait, progress=progress(say),
                          progress_every=cfg.progress_every, max_skew=cfg.max_clock_skew, retention=cfg.retention)
        ing.writer.derive = goodhours.refresh  # goodput by the hour, kept with the rollups
        return ing
    spool = SpoolIngest(con, Path(cfg.target), progress=progress(say), max_skew=cfg.max_clock_skew,
                        retention=cfg.retention)
    spool.writer.derive = goodhours.refresh
    return _SpoolRun(spool)


class _SpoolRun:
    """A spool ingest as the lifecycle sees every input (totals, stop; nothing to close)."""

    def __init__(self, ing: SpoolIngest) -> None:
        self.ing = ing
        self.totals = ing.totals
        self.stop = ing.stop


def _consume(cfg: CollectorConfig, ing: Any) -> Totals:
    if cfg.command == "kafka":
        return ing.run(idle_exit=cfg.idle_exit)
    if cfg.follow:
        ing.ing.follow(cfg.interval)
    else:
        ing.ing.load_available()
    return ing.totals


def _on_signals(stop: Callable[[], None]) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop())


def _http(cfg: CollectorConfig) -> Any:
    """The API's settings, checked before the database is opened (None: --http off)."""
    from cmdare.analytics.server.service import parse_http

    try:
        return parse_http(cfg.http, cfg.http_token_file, cfg.http_tls_cert, cfg.http_tls_key, cfg.ui_url,
                          cfg.session_ttl)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _alerting(con: Any, cfg: CollectorConfig) -> Any:
    """The rule evaluation, loaded and validated against this database; None without rules."""
    from cmdare.analytics.alerting import RuleError
    from cmdare.analytics.server.schedule import load

    if not cfg.rules:
        return None
    try:
        al = load(con, tuple(cfg.rules), cfg.inhibit_window, cfg.receivers, cfg.resend, security=cfg.security)
    except RuleError as e:
        raise ConfigError(str(e)) from None
    al.grace = cfg.liveness_grace
    return al


def _detectors(con: Any, cfg: CollectorConfig, say: Say) -> Any:
    """The detectors on a schedule (findings kept current), or None with --detect-every off."""
    from cmdare.analytics.findings.current import DetectorSchedule

    if cfg.detect_every is None:
        return None
    d = DetectorSchedule(con, cfg.detect_every, cfg.detect_window)
    d.start()
    say(f"cmdare-collector: detectors every {cfg.detect_every:g} s over the last {cfg.detect_window:g} s "
        "(findings kept current; --detect-every off: none)")
    return d


def _horizon(r: Run) -> Callable[[], dt.datetime | None]:
    """Up to when the served database holds everything sent: the alerting's ingest horizon
    (with its grace after a gap), else the last time ingest found nothing unread (before
    that, the collector's start). Liveness on the API and the pages is judged as of it."""
    if r.alerting is not None:
        return r.alerting.horizon
    started = time.time()

    def horizon() -> dt.datetime | None:
        t = r.ingest.totals.caught_up_at
        return dt.datetime.fromtimestamp(started if t is None else t, dt.timezone.utc).replace(tzinfo=None)

    return horizon


def _serve(con: Any, db: str, http: Any, totals: Callable[[], Totals], say: Say) -> Any:
    """The API on the collector's connection, or None with --http off."""
    from cmdare.analytics.server.service import Service
    from cmdare.dashboards.pages import mount

    if http is None:
        return None
    svc = Service(con, db, http, totals, ui=mount)
    try:
        url = svc.start()
    except OSError as e:
        svc.stop()
        raise CollectorError(str(e)) from None
    say(f"cmdare-collector: API on {url} (analyze finds it through {db}.service.json); pages on {url}/ui")
    return svc


def _start_alerting(al: Any, svc: Any, ui_url: str | None, say: Say) -> None:
    """Start the rule evaluation once the pages' address is known (every alert's
    generatorURL opens URL/ui/alerts?rule=...)."""
    if al is None:
        return
    if svc is not None:
        al.link_base(svc.pages_url())
    elif ui_url:
        al.link_base(ui_url.rstrip("/"))
    n = al.start()
    nr = sum(len(g.rules) for g in al.engine.groups)
    say(f"cmdare-collector: evaluating {nr} alert rules in {len(al.engine.groups)} groups"
        f"{f' ({n} alerts restored)' if n else ''}")


# -- lake mode: the same inputs into an Iceberg lake (ingest only) -----------------------------

def _run_lake(cfg: CollectorConfig, say: Say) -> None:
    from ..lake import Lake, LakeError
    from ..lakeingest import LakeKafkaIngest, LakeSpoolIngest

    try:
        lk = Lake(cfg.lake, cfg.catalog)
        lk.ensure()
    except LakeError as e:
        raise CollectorError(str(e)) from None
    ing: LakeKafkaIngest | LakeSpoolIngest
    if cfg.command == "kafka":
        ing = LakeKafkaIngest(lk, cfg.url, cfg.group, commit_every=cfg.commit_every, batch_bytes=cfg.batch_bytes,
                              max_wait=cfg.max_wait, progress=progress(say), progress_every=cfg.progress_every,
                              max_skew=cfg.max_clock_skew)
        try:
            ing.open()
        except ConnectionError as e:
            raise CollectorError(str(e)) from None
    else:
        ing = LakeSpoolIngest(lk, Path(cfg.target), progress=progress(say), max_skew=cfg.max_clock_skew,
                              commit_every=cfg.commit_every)
    _on_signals(ing.stop)
    try:
        if isinstance(ing, LakeKafkaIngest):
            say(f"cmdare-collector: consuming {cfg.url.text} (group {cfg.group}) into the lake {lk.name} "
                f"as {ing.stager.id}")
            t = ing.run(idle_exit=cfg.idle_exit)
        elif cfg.follow:
            ing.follow(cfg.interval)
        else:
            ing.load_available()
    finally:
        if isinstance(ing, LakeKafkaIngest):
            ing.close()
        ing.stager.close()
    if isinstance(ing, LakeKafkaIngest):
        say(f"cmdare-collector: done: {t.line()}; {ing.stager.stored} rows in {ing.stager.rounds} lake commits")
    else:
        say(f"cmdare-collector: {cfg.target} -> lake {lk.name}: {ing.totals.line()}")


def lake_goodput(spark: Any = None) -> Callable[[Any], int]:
    """``maintain``'s derived step for a lake: goodput by the hour, computed by the
    analytics library (here, or on Spark's executors when ``spark`` is given)."""
    from cmdare.analytics.goodput import goodhours

    def run(lake: Any) -> int:
        rows = None
        if spark is not None:
            from ..lakespark import distributed

            rows = distributed(spark, goodhours.compute_lake)
        return goodhours.refresh_lake(_uri(lake), lake.location.catalog, rows)

    return run


def lake_findings(since: float, spark: Any = None) -> Callable[[Any], int]:
    """``maintain --findings``: every detector over every job of the last ``since``
    seconds, stored into the lake's findings (on Spark: a task per detector)."""
    from cmdare.analytics import findings

    def run(lake: Any) -> int:
        start = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(seconds=since)
        kinds = None
        if spark is not None:
            from ..lakespark import by_detector

            kinds = by_detector(spark, findings.run_lake, findings.merge)
        return findings.keep_lake(_uri(lake), lake.location.catalog, start, kinds)

    return run


def _uri(lake: Any) -> str:
    """The URI a lake was opened with (its directory, or its object-store warehouse)."""
    return str(lake.location.local) if lake.location.local is not None else lake.location.warehouse
