"""Alert rules evaluated inside the collector (``--rules FILE...``): a thread beside the
ingest loop, on its own cursor of the collector's connection, reading what was committed;
state restored from the ``alerts`` table at start and saved after every group's round.

Receivers: the log (each change of state, one line); the others are in
docs/alerts.md.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import duckdb

from cmdare.analytics import alerts

log = logging.getLogger("cmdare.alerts")


def rule_paths(given: tuple[str, ...]) -> list[Path]:
    return alerts.resolve_paths(given)


class LogReceiver:
    """One log line per change of an alert's state."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], str] = {}

    def round(self, engine: alerts.Engine) -> None:
        now = {(a.rule, a.fingerprint): a for a in engine.snapshot()}
        for key, a in now.items():
            if self.last.get(key) != a.state:
                labels = ",".join(f"{k}={v}" for k, v in sorted(a.labels.items()) if k != "alertname")
                extra = f" ({a.inhibited_by})" if a.inhibited_by else ""
                log.warning("alert %s %s{%s} value=%g%s: %s", a.rule, a.state, labels, a.value, extra,
                            a.annotations.get("summary", ""))
        self.last = {k: a.state for k, a in now.items()}


class Alerting:
    def __init__(self, con: duckdb.DuckDBPyConnection, groups: list[alerts.Group], inhibit_window: float) -> None:
        from .db import cursor

        self.con = con
        # made here, on the thread that owns con: DuckDB refuses a connection used by two
        # threads at once (cursor() runs a statement on it)
        self._cur = cursor(con)
        self.cursor = lambda: self._cur
        self.engine = alerts.Engine(groups, inhibit_window)
        self.receivers: list[Any] = [LogReceiver()]
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> int:
        restored = self.engine.restore(self.cursor())
        for r in self.receivers:  # what was already known is not a change
            if isinstance(r, LogReceiver):
                r.last = {(a.rule, a.fingerprint): a.state for a in self.engine.snapshot()}
        self.thread = threading.Thread(
            target=alerts.run_forever, args=(self.engine, self.cursor, self.stop_event, self._round),
            name="cmdare-alerts", daemon=True,
        )
        self.thread.start()
        return restored

    def _round(self, group: alerts.Group, at: Any) -> None:
        for r in self.receivers:
            try:
                r.round(self.engine)
            except Exception as e:  # a receiver never stops evaluation
                log.error("alert receiver %s: %s: %s", type(r).__name__, type(e).__name__, e)

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread:
            self.thread.join(timeout=30)


def load(con: duckdb.DuckDBPyConnection, given: tuple[str, ...], inhibit_window: float) -> Alerting:
    """Load and validate the rule files against the collector's database (RuleError: one
    line) and build the evaluation; ``start()`` runs it."""
    from .db import cursor

    groups = alerts.load_files(rule_paths(given))
    c = cursor(con)
    try:
        alerts.validate(c, groups)
    finally:
        c.close()
    return Alerting(con, groups, inhibit_window)
