"""The ruler of a lake's servers (``cmdare-collector serve --lake ... --rules``): of all
the servers of one lake, exactly one at a time evaluates the alert rules and runs the
scheduled detectors, as Grafana Mimir and Thanos run one ruler beside their queriers.

- **The lease** (collector/lease.py): a PostgreSQL advisory lock in the catalog, or a
  ``flock`` beside a SQLite catalog; whoever holds it rules. Every server with rules or
  detectors asks for it every ``RETRY`` seconds; the holder checks each second that it
  still holds it and, if not, stops at once (the process exits: its supervisor starts it
  again, as a standby). SIGKILL of the ruler frees the lease at once; another server
  takes it within ``RETRY`` seconds and restores the state.
- **The alert state in the catalog** (``AlertStore``: the ``cmdare_alerts`` and
  ``cmdare_alert_rules`` tables of the catalog's database, the columns of a database
  file's ``alerts`` and ``alert_rules``): each group's round saves its alerts there before
  anything is sent (a firing episode handed to a receiver is marked first, so its
  resolution stays owed), as a collector saves them in its file. A new ruler restores
  them, and a receiver re-sends at once only what it cannot know was delivered within
  ``--alert-resend`` (Alertmanager takes a re-sent alert as the same one): a failover
  sends no episode twice as new and loses none. Every other server copies the state
  into its replica when it changes, so every server's pages and API show the same alerts.
  On PostgreSQL the save checks, in its own transaction, that the lease's session still
  holds the lock: a ruler cut off from the catalog saves nothing and so sends nothing.
- **Findings**: the ruler's detector rounds store into the lake's ``findings`` (every
  replica reads them at its next refresh).
- **The fast path** (``FastPath``): revocation notices and lifecycle events read from the
  Kafka topic by the ruler's own consumer group, ahead of the ingest collectors' lake
  commits, into the replica (``lakeserve.FAST``); rules that read them are evaluated at
  once. Its broker ends, set against the positions the lake has stored, also say when the
  lake holds everything sent (``caught_up_at``: the liveness horizon's input).
"""

from __future__ import annotations

import calendar
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..alertstore import AlertStore, LeaseLost, pg_fence  # noqa: F401  (the ruler's state; re-exported)

log = logging.getLogger("cmdare.analytics.ruler")
RETRY = 2.0  # seconds between a standby's asks for the lease (failover: within this of the holder's death)
CHECK = 1.0  # seconds between the ruler's checks that it still holds the lease
FAST_TYPES = (b"revocation", b"lifecycle")  # what a message must name for the fast path to decode it


class FastPath:
    """The ruler's own consumer group on the events topic: messages that name a revocation
    or a lifecycle event are decoded (as ingest decodes them, into a staging database) and
    their rows of ``lakeserve.FAST`` added to the replica; ``on_rows`` is called with the
    tables that got rows. Everything else is skipped unread."""

    def __init__(self, replica: Any, url: Any, group: str,
                 on_rows: Callable[[set[str]], None] = lambda tables: None) -> None:
        self.replica, self.url, self.group, self.on_rows = replica, url, group, on_rows
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cmdare-ruler-fast", daemon=True)
        self.consumer: Any = None
        self.caught_up_at: float | None = None  # when the lake last held everything on the topic
        self.read = self.decoded = self.added = 0  # messages read, decoded, rows added
        self.last_error = ""

    def open(self) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        from cmdare.wire.kafka import explain

        try:
            self.consumer = KafkaConsumer(
                self.url.topic, bootstrap_servers=self.url.bootstrap, group_id=self.group,
                enable_auto_commit=True, auto_commit_interval_ms=1000,
                # a new group starts at the end: what came before is in the lake
                auto_offset_reset="latest", session_timeout_ms=10000, heartbeat_interval_ms=3000,
                max_partition_fetch_bytes=16 << 20, client_id="cmdare-ruler", **self.url.client_options())
        except KafkaError as e:
            raise ConnectionError(f"{self.url.text}: {explain(e)}") from None

    def start(self) -> None:
        if self.consumer is None:
            self.open()
        self.thread.start()

    def _run(self) -> None:
        import duckdb

        from cmdare.collector.db import migrate
        from cmdare.collector.ingest import storage
        from cmdare.collector.ingest.batch import Batch
        from cmdare.collector.lake import APPENDED
        from cmdare.collector.writer import Writer

        from .lakeserve import FAST

        STAGED = [storage.stored(t) for t in (*APPENDED, "rollup_dirty", "ingest_positions")]  # as the lake's stager

        staging = duckdb.connect(":memory:")
        migrate(staging)
        writer = Writer(staging, None, rollup_every=None)
        last_check = 0.0
        try:
            while not self.stop_event.is_set():
                try:
                    polled = self.consumer.poll(timeout_ms=200, max_records=2000)
                    batch = Batch()
                    for records in polled.values():
                        for rec in records:
                            self.read += 1
                            v = rec.value
                            if v and any(t in v for t in FAST_TYPES):
                                batch.add(f"kafka:{rec.topic}/{rec.partition}@{rec.offset}", v)
                    got: set[str] = set()
                    if batch:
                        self.decoded += len(batch)
                        writer.write_batch(batch)
                        for t in FAST:
                            rows = staging.sql(f"SELECT * FROM {t}").to_arrow_table()
                            if rows.num_rows:
                                n = self.replica.add_fast(t, rows)
                                self.added += n
                                if n:
                                    got.add(t)
                        staging.execute("BEGIN")
                        for t in STAGED:
                            staging.execute(f"DELETE FROM {t}")
                        staging.execute("COMMIT")
                    if got:
                        self.on_rows(got)
                    if time.monotonic() - last_check >= RETRY:
                        last_check = time.monotonic()
                        self._check_caught_up()
                    self.last_error = ""
                except Exception as e:  # noqa: BLE001  (the lake still brings them; say why once)
                    msg = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                    if msg != self.last_error:
                        log.warning("ruler fast path: %s (revocations wait for the lake's commits meanwhile)", msg)
                    self.last_error = msg
                    self.stop_event.wait(1.0)
        finally:
            staging.close()

    def _check_caught_up(self) -> None:
        """The broker's ends against what the lake has stored (``lake_commits``' positions):
        all reached, the lake holds everything sent as of the ask."""
        t = time.time()
        parts = self.consumer.partitions_for_topic(self.url.topic) or set()
        if not parts:
            return
        from kafka import TopicPartition

        tps = [TopicPartition(self.url.topic, p) for p in parts]
        ends = self.consumer.end_offsets(tps, timeout_ms=2000)
        stored = self.replica.positions()
        if all(stored.get(f"{tp.topic}/{tp.partition}", 0) >= ends.get(tp, 0) for tp in tps):
            self.caught_up_at = t

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        if self.consumer is not None:
            with contextlib.suppress(Exception):
                self.consumer.close(autocommit=True)


def lake_detectors(served: Any, every: float, window: float) -> Any:
    """The detector schedule of a lake's ruler, started: rounds read the replica and store
    their findings into the lake's ``findings`` (``served.write()``: as ``analyze --lake``
    stores them), which every replica reads at its next refresh."""
    from ..findings.current import DetectorSchedule

    class LakeDetectors(DetectorSchedule):
        def keep(self, store: Callable[[Any], tuple[int, int, int]]) -> tuple[int, int, int]:
            with served.write() as cur:
                return store(cur)

    d = LakeDetectors(served.replica.con, every, window)
    d.start()
    return d


class Ruler:
    """One server's part in ruling its lake: a standby asking for the lease (and copying
    the alert state into its replica when it changes), or the ruler.

    ``alerting`` (analytics/server/schedule.Alerting, validated against the replica,
    not started), ``detectors`` (a factory of a started detector schedule), ``fast`` (a
    FastPath, not started): what ruling runs; with neither rules nor detectors, the server
    never asks for the lease and only copies the state."""

    def __init__(self, served: Any, lease: Any, store: AlertStore, alerting: Any = None,
                 detectors: Callable[[], Any] | None = None, fast: FastPath | None = None,
                 say: Callable[[str], None] | None = None, on_lost: Callable[[str], None] | None = None,
                 gap: float | None = None) -> None:
        self.served, self.lease, self.store = served, lease, store
        self.replica = served.replica
        self.alerting, self.make_detectors, self.fast = alerting, detectors, fast
        self.say = say or (lambda line: log.warning("%s", line))
        self.on_lost = on_lost or (lambda why: None)
        self.gap = gap
        self.leading = False
        self.led_since: float | None = None
        self.detectors: Any = None
        self.stop_event = threading.Event()
        self._stamp: Any = None
        self._last_error = ""
        self.thread = threading.Thread(target=self._run, name="cmdare-ruler", daemon=True)
        self.wants = alerting is not None or detectors is not None
        self.service: Any = None  # the HTTP service (its /metrics read the ruling engine)

    def start(self) -> None:
        self.copy_state()
        self.thread.start()

    # -- standby ---------------------------------------------------------------------------
    def copy_state(self) -> bool:
        """The catalog's alert state into this replica, when it changed: whether it did."""
        from ..alerting.state import write_rows

        stamp = self.store.stamp()
        if stamp == self._stamp:
            return False
        alerts, rules = self.store.load()
        with self.replica.cursor() as cur:
            write_rows(cur, None, alerts, rules)
        self._stamp = stamp
        return True

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                if self.leading:
                    if not self.lease.held():
                        self._lost("the lease is no longer held (the catalog's session ended)")
                        return
                    self.stop_event.wait(CHECK)
                    continue
                self.copy_state()
                if self.wants and self.lease.try_acquire():
                    self._lead()
                    continue
                self._last_error = ""
            except Exception as e:  # noqa: BLE001  (the catalog away: ask again; say why once)
                msg = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                if msg != self._last_error:
                    self.say(f"cmdare-collector: ruler: {msg}")
                self._last_error = msg
            self.stop_event.wait(RETRY)

    # -- ruling ----------------------------------------------------------------------------
    def _lead(self) -> None:
        t0 = time.monotonic()
        self.copy_state()  # the last ruler's state, restored from here
        self.leading, self.led_since = True, time.monotonic()
        parts = []
        al = self.alerting
        if al is not None:
            al.store = self.store
            if self.gap is not None:
                al.gap = self.gap
            al.caught_up = self._caught_up
            n = al.start()
            if self.service is not None:
                self.service.alerting = al
            nr = sum(len(g.rules) for g in al.engine.groups)
            parts.append(f"{nr} alert rules in {len(al.engine.groups)} groups" + (f" ({n} alerts restored)" if n else ""))
        if self.fast is not None:
            self.fast.on_rows = self._fast_rows
            self.fast.start()
            parts.append(f"revocations read ahead from {self.fast.url.text} (group {self.fast.group})")
        if self.make_detectors is not None:
            self.detectors = self.make_detectors()
            parts.append(f"detectors every {self.detectors.every:g} s")
        self.say(f"cmdare-collector: ruling the lake ({self.lease.describe()}; took over in "
                 f"{time.monotonic() - t0:.1f} s): {'; '.join(parts)}")

    def _caught_up(self) -> float | None:
        """When the lake last held everything sent: the fast path's ask of the broker, else
        the lake's horizon (its collectors' newest commits)."""
        h = self.replica.horizon
        lake = None if h is None else calendar.timegm(h.timetuple()) + h.microsecond / 1e6
        fast = self.fast.caught_up_at if self.fast is not None else None
        return lake if fast is None else max(fast, lake or 0.0)

    def _fast_rows(self, tables: set[str]) -> None:
        if self.alerting is not None:
            self.alerting.on_batch(_Rows({t: 1 for t in tables}))

    def on_refresh(self, changed: set[str]) -> None:
        """A refresh read new rows: rules reading urgent tables that changed run now."""
        if self.leading and self.alerting is not None and changed:
            self.alerting.on_batch(_Rows({t: 1 for t in changed}))

    def _lost(self, why: str) -> None:
        self.say(f"cmdare-collector: ruler: {why}; stopping (a standby takes over)")
        self._stop_ruling()
        self.on_lost(why)

    def _stop_ruling(self) -> None:
        if self.detectors is not None:
            self.detectors.stop()
            self.detectors = None
        if self.fast is not None and self.leading:
            self.fast.stop()
        if self.alerting is not None and self.leading:
            self.alerting.stop()
        self.leading = False

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        self._stop_ruling()
        self.lease.release()


class _Rows:
    """What ``Alerting.on_batch`` reads of an ingest result: rows per table."""

    def __init__(self, rows: dict[str, int]) -> None:
        self.rows = rows

