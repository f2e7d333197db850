"""Rules evaluated inside the collector (``--rules FILE...``): each group on its own thread
and its own cursor of the collector's connection, reading what was committed, so that a
slow or failing group never delays another (a revocation rule never waits behind a slow
user rule). State is restored from the ``alerts`` table at start and saved after each
group's round; what a round hands to the receivers is saved before it is sent.

A group reading an urgent table (revocations, lifecycle or GPU events) is evaluated as soon
as ingest stores rows of it, at most every ``min_gap`` seconds, not at its next interval."""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import duckdb

from ..alerting.evaluate import utcnow, validate
from ..alerting.notify.log import LogReceiver
from ..alerting.notify.receivers import ReceiverSpec
from ..alerting.rulefmt import Group, load_files, resolve_paths
from ..alerting.state import Engine
from ..db import retry_conflicts

log = logging.getLogger("cmdare.alerts")

URGENT_TABLES = ("revocations", "lifecycle_events", "gpu_events")
GAP = 10.0  # seconds the ingest horizon may trail before it counts as a gap
DEFAULT_GRACE = 45.0  # seconds verdicts still wait after a gap ends (agents' resend backoff)


def _utc(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).replace(tzinfo=None)
STOP_GRACE = 2.0  # seconds a round may take to finish on stop before its query is interrupted
SAVE_TRIES = 3  # saves of a round's alerts tried before the round fails (write conflicts)


def urgent_tables(group: Group) -> set[str]:
    """The urgent tables the group's SQL rules read (instance_lives reads them all)."""
    out: set[str] = set()
    for r in group.rules:
        text = (r.expr or "").lower()
        for t in URGENT_TABLES:
            if re.search(rf"\b{t}\b", text) or "instance_lives" in text:
                out.add(t)
    return out


class GroupRunner:
    """One group's loop: a round every ``interval``, or sooner when poked."""

    def __init__(self, alerting: Alerting, group: Group, cur: duckdb.DuckDBPyConnection, min_gap: float) -> None:
        self.alerting, self.group, self.cur, self.min_gap = alerting, group, cur, min_gap
        self.urgent = False
        self.wake = threading.Event()
        self.busy = False
        self.rounds = 0
        self.thread = threading.Thread(target=self._run, name=f"cmdare-alerts-{group.name}"[:60], daemon=True)

    def poke(self) -> None:
        self.urgent = True
        self.wake.set()

    def _run(self) -> None:
        stop = self.alerting.stop_event
        due = last = float("-inf")  # the first round at once
        while not stop.is_set():
            now = time.monotonic()
            if now >= due or (self.urgent and now - last >= self.min_gap):
                self.urgent = False
                due, last = now + self.group.interval, now
                self.busy = True
                try:
                    self.alerting.round(self.group, self.cur)
                except Exception as e:  # never stop evaluating: next round
                    if not stop.is_set():
                        log.error("alert group %s: %s: %s", self.group.name, type(e).__name__, str(e)[:300])
                finally:
                    self.busy = False
                    self.rounds += 1
                continue
            wait = due - now
            if self.urgent:
                wait = min(wait, self.min_gap - (now - last))
            self.wake.wait(max(0.01, min(wait, 1.0)))
            self.wake.clear()


class Alerting:
    """The collector's rule evaluation: the engine, its receivers and a runner per group."""

    def __init__(self, con: duckdb.DuckDBPyConnection, groups: list[Group], inhibit_window: float,
                 clock: Callable[[], dt.datetime] = utcnow, min_gap: float = 0.2) -> None:
        from cmdare.collector.db import cursor

        self.con = con
        self.engine = Engine(groups, inhibit_window)
        self.log = LogReceiver()
        self.receivers: list[Any] = [self.log]
        self.senders: list[Any] = []  # receivers that deliver
        self.clock = clock
        self.stop_event = threading.Event()
        self._urgent_of = {g.name: urgent_tables(g) for g in groups}
        # cursors made here, on the thread that owns con: DuckDB refuses a connection used by
        # two threads at once (cursor() runs a statement on it)
        self._cur = cursor(con)
        self.runners = {g.name: GroupRunner(self, g, cursor(con), min_gap) for g in groups}
        self.started = False
        # the ingest side's caught-up time (epoch seconds, None until it first caught up);
        # before that, the newest heartbeat stored when the collector started
        self.caught_up: Callable[[], float | None] = lambda: None
        self.created = time.time()
        self.start_horizon: dt.datetime | None = None
        # after a gap (a restart, an outage, a backlog) agents re-send what they spooled,
        # each after its own backoff: the horizon stays where the gap began this long after
        # ingest caught up again
        self.grace = DEFAULT_GRACE
        self._gap_from: float | None = None  # the horizon when the gap began (epoch seconds)
        self._settle_until: float | None = None  # when the grace after a gap ends (None: not settling)
        self._hlock = threading.Lock()
        # how far the caught-up time may trail before it counts as a gap (a lake's horizon
        # trails by its collectors' commit interval)
        self.gap = GAP
        # where a round's state is kept durably before anything is sent (a lake's ruler:
        # the catalog, analytics/server/lakeruler.py); None: the connection's alerts table only
        self.store: Any = None

    def on_batch(self, result: Any) -> None:
        """Called by ingest after each committed batch (its thread: cheap)."""
        tables = {t for t, n in getattr(result, "rows", {}).items() if n}
        if not tables & set(URGENT_TABLES):
            return
        for g, ts in self._urgent_of.items():
            if ts & tables:
                self.runners[g].poke()

    def link_base(self, url: str) -> None:
        """Where the collector's pages are: every receiver's alerts link to
        ``url/ui/alerts?rule=...`` (generatorURL) from now on."""
        for r in self.receivers:
            if hasattr(r, "generator"):
                r.generator = url

    def add(self, receiver: Any) -> None:
        self.receivers.append(receiver)
        self.senders.append(receiver)
        self.engine.receivers.append(receiver)

    def start(self, run: bool = True) -> int:
        """Restore the previous run's alerts and start a runner per group (``run=False``:
        restore only, rounds called by hand): how many alerts were restored."""
        restored = self.engine.restore(self._cur)
        try:
            self.start_horizon = self._cur.execute("SELECT max(ts) FROM heartbeats").fetchone()[0]
        except duckdb.Error:
            self.start_horizon = None
        for r in self.receivers:
            r.restore(self.engine)
        if run:
            for runner in self.runners.values():
                runner.thread.start()
            self.started = True
        return restored

    def horizon(self) -> dt.datetime | None:
        """Up to when the collector holds everything sent: what ``ingest_horizon()`` gives
        rules (node-loss verdicts judge silence only up to it, never a gap of the
        collector's own making: a restart, a Kafka outage, a backlog)."""
        with self._hlock:
            return self._horizon(time.time(), self.caught_up())

    def lag(self) -> float:
        """Seconds the collector has had input it has not read: since it last found nothing
        unread (its caught-up time), or since it started when it has not yet (what
        ``ingest_lag()`` gives rules; CollectorBehind judges by it)."""
        t = self.caught_up()
        return max(0.0, time.time() - (self.created if t is None else t))

    def _horizon(self, now: float, t: float | None) -> dt.datetime | None:
        if t is None:  # not caught up since the start: the newest heartbeat stored then
            if self.start_horizon is not None and self._gap_from is None:
                self._gap_from = self.start_horizon.replace(tzinfo=dt.timezone.utc).timestamp()
            return self.start_horizon
        if now - t > self.gap:
            if self._gap_from is None:
                self._gap_from = t
            self._settle_until = None
            return _utc(t)
        if self._gap_from is not None:  # caught up after a gap: let agents re-send first
            if self._settle_until is None:
                self._settle_until = now + self.grace
            if now < self._settle_until:
                return _utc(self._gap_from)
            self._gap_from, self._settle_until = None, None
        return _utc(t)

    def round(self, group: Group, con: duckdb.DuckDBPyConnection) -> None:
        """Evaluate the group, hand what is due to the receivers (marked and saved first, so
        a resolution is owed even after SIGKILL), then send it."""
        at = self.clock()
        ids = {r.id for r in group.rules}
        self.engine.eval_group(con, group, at, self.horizon(), self.lag())
        due = [(r, r.due(self.engine, ids)) for r in self.senders]
        self.engine.mark_notified([it.key for _, items in due for it in items if not it.resolved])
        state = self.engine.rows(group, at)
        if self.store is not None:  # durable first: a failed save sends nothing (the next round does)
            self.store.save(*state)
        retry_conflicts(lambda: self.engine.save(con, group, at, state), SAVE_TRIES)  # another group's save: again
        for r, items in due:
            r.send(items)
        self.log.round(self.engine, ids)

    def stop(self) -> None:
        """Let rounds in progress finish (STOP_GRACE), interrupt the queries of those that
        do not, join every thread; then the receivers get their last chance to deliver."""
        self.stop_event.set()
        for runner in self.runners.values():
            runner.wake.set()
        if self.started:
            deadline = time.monotonic() + STOP_GRACE
            for runner in self.runners.values():
                runner.thread.join(timeout=max(0.0, deadline - time.monotonic()))
            for runner in self.runners.values():
                if runner.thread.is_alive():
                    runner.cur.interrupt()
            for runner in self.runners.values():
                runner.thread.join(timeout=10)
        for r in self.senders:
            r.stop()
        for runner in self.runners.values():
            if not runner.thread.is_alive():
                runner.cur.close()
        self._cur.close()


def load(con: duckdb.DuckDBPyConnection, given: tuple[str, ...], inhibit_window: float,
         receivers: Sequence[ReceiverSpec] = (), resend: float = 60.0, generator: str | None = None,
         security: Any = None, evaluator: Any = None) -> Alerting:
    """Load and validate the rule files against the collector's database (RuleError: one
    line) and build the evaluation with ``receivers`` (notify/receivers.py: each kind by
    name; ``security``: the Kafka settings a ``kafka`` receiver uses); ``start()`` runs it.
    ``evaluator``: where rules' SQL runs (``Engine.evaluator``), when not on ``con``."""
    from cmdare.collector.db import cursor

    from ..alerting.notify.receivers import build_all

    groups = load_files(resolve_paths(given))
    c = cursor(con)
    try:
        validate(c, groups, evaluator)
    finally:
        c.close()
    if generator is None:  # where the alert came from, as Alertmanager shows it
        import socket

        generator = f"http://{socket.gethostname()}/cmdare"
    built = build_all(receivers, resend, generator, security)
    al = Alerting(con, groups, inhibit_window)
    al.engine.evaluator = evaluator
    for r in built:
        al.add(r)
    return al
