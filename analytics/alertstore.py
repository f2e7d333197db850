"""The alert state of a lake's ruler (analytics/server/lakeruler.py), kept in the lake catalog's
own database (SQLAlchemy: SQLite or PostgreSQL): the ``cmdare_alerts`` and
``cmdare_alert_rules`` tables, a row per alert and per rule as a database file's
``alerts`` and ``alert_rules`` hold them. Read by every server and by ``analyze --lake``;
written by the ruler only, each save fenced by its lease on PostgreSQL (``pg_fence``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class LeaseLost(Exception):
    """This server no longer holds the ruler's lease."""


class AlertStore:
    """The ruler's alert state in the lake catalog's own database (SQLAlchemy: SQLite or
    PostgreSQL), a row per alert and per rule as a database file keeps them."""

    ALERTS, RULES = "cmdare_alerts", "cmdare_alert_rules"

    def __init__(self, engine: Any, fence: Callable[[Any], bool] | None = None) -> None:
        from sqlalchemy import Boolean, Column, DateTime, Float, Integer, MetaData, String, Table, Text

        self.engine = engine
        self.fence = fence  # (a connection in the save's transaction) -> whether the lease is still held
        md = MetaData()
        self.alerts = Table(
            self.ALERTS, md,
            Column("rule", String(512), primary_key=True), Column("fingerprint", String(64), primary_key=True),
            Column("labels", Text, nullable=False), Column("annotations", Text), Column("state", String(16), nullable=False),
            Column("value", Float), Column("active_at", DateTime, nullable=False), Column("fired_at", DateTime),
            Column("last_seen", DateTime), Column("resolved_at", DateTime), Column("last_sent", DateTime),
            Column("sent_resolved", Boolean, nullable=False), Column("inhibited_by", Text),
            Column("updated_at", DateTime, nullable=False), Column("notified", Boolean))
        self.rules = Table(
            self.RULES, md,
            Column("rule", String(512), primary_key=True), Column("group_name", String(512), nullable=False),
            Column("file", Text), Column("health", String(16), nullable=False), Column("last_error", Text),
            Column("last_eval", DateTime), Column("eval_seconds", Float), Column("instances", Integer))
        self.md = md

    def ensure(self) -> None:
        """Create the two tables where they are not (two servers at once: one makes them)."""
        from sqlalchemy.exc import SQLAlchemyError

        for _ in range(3):
            try:
                self.md.create_all(self.engine, checkfirst=True)
                return
            except SQLAlchemyError:  # (the other server's CREATE won the race)
                time.sleep(0.2)
        self.md.create_all(self.engine, checkfirst=True)

    def save(self, ids: list[str], rows: list[tuple[Any, ...]], health: list[tuple[Any, ...]]) -> None:
        """Replace these rules' alerts and health in one transaction (LeaseLost: the lease
        is no longer this server's; nothing was written)."""
        from sqlalchemy import delete, insert

        ac = [c.name for c in self.alerts.columns]
        rc = [c.name for c in self.rules.columns]
        with self.engine.begin() as c:
            if self.fence is not None and not self.fence(c):
                raise LeaseLost("the ruler's lease is no longer held: nothing saved, nothing sent")
            if ids:
                c.execute(delete(self.alerts).where(self.alerts.c.rule.in_(ids)))
                c.execute(delete(self.rules).where(self.rules.c.rule.in_(ids)))
            if rows:
                c.execute(insert(self.alerts), [dict(zip(ac, _alert_row(r), strict=True)) for r in rows])
            if health:
                c.execute(insert(self.rules), [dict(zip(rc, r, strict=True)) for r in health])

    def load(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Every alert and rule health row, as ``alerts`` and ``alert_rules`` take them."""
        from sqlalchemy import select

        with self.engine.connect() as c:
            alerts = [tuple(r) for r in c.execute(select(self.alerts).order_by(self.alerts.c.rule,
                                                                              self.alerts.c.fingerprint))]
            rules = [tuple(r) for r in c.execute(select(self.rules).order_by(self.rules.c.rule))]
        return alerts, rules

    def stamp(self) -> tuple[Any, ...]:
        """What changes whenever a round saves (a standby copies the state when it does)."""
        from sqlalchemy import func, select

        with self.engine.connect() as c:
            a = c.execute(select(func.count(), func.max(self.alerts.c.updated_at))).one()
            r = c.execute(select(func.count(), func.max(self.rules.c.last_eval))).one()
        return (*a, *r)


def _alert_row(r: tuple[Any, ...]) -> tuple[Any, ...]:
    """An ``alerts`` row with its flags as booleans and its value finite (SQL has no NaN)."""
    import math

    out = list(r)
    out[5] = out[5] if isinstance(out[5], (int, float)) and math.isfinite(out[5]) else None
    out[11], out[14] = bool(out[11]), bool(out[14])
    return tuple(out)


def pg_fence(lease: Any) -> Callable[[Any], bool]:
    """A PostgreSQL lease's fence: the lease's session still holds the advisory lock (read
    in the save's own transaction)."""
    from sqlalchemy import text

    from cmdare.collector.lease import _halves, lease_key

    def fence(c: Any) -> bool:
        pid = lease.backend_pid
        if pid is None:
            return False
        return bool(c.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
                                   "pid = :pid AND classid = :hi AND objid = :lo"),
                              {"pid": pid, **_halves(lease_key(lease.lake, lease.name))}).scalar())

    return fence
