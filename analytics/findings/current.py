"""Findings kept current (issue 51): the collector runs every detector on a schedule over a
sliding window, as Prometheus evaluates recording rules, and keeps the ``findings`` table
true without anyone running ``analyze bottlenecks``.

- ``track``: one scheduled round's findings stored as intervals. A finding found again
  (same kind, job, node, rank and subject, its stored window reaching into this round's)
  has its window extended to now and its numbers replaced by the latest; a new one is
  inserted; one not found now (or found again only after a gap: a new row) is resolved
  (``resolved_at``) and its window ends where it was last found. So a job PS-bound for two hours holds one
  finding two hours long, which goodput reads as such.
- ``record_coverage``: which stretch of time and which kinds the detectors looked at, for
  one job or every job (``finding_coverage``); consecutive scheduled rounds extend one row.
- ``uncovered``: the jobs of a range whose time no detector run covered: goodput runs the
  detectors for them on first read (an offline database, one no collector keeps current).
- ``DetectorSchedule``: the collector's thread (``--detect-every``, ``--detect-window``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import duckdb

from .. import findings
from ..db import has_view, retry_conflicts
from ..detectors.evidence import bucket_start, split
from ..units import Finding, Scope
from . import record_coverage

log = logging.getLogger("cmdare.findings")

SAVE_TRIES = 5  # a write conflict with the ingest's transaction: again


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def window_start(now: dt.datetime, window: float) -> dt.datetime:
    """Where a scheduled round's window starts: ``window`` seconds before ``now``, moved back
    to the 5-minute boundary at or before it. The settled buckets of the window are then
    read whole from the rollups the collector keeps as data arrive; raw rows are read only
    for the bucket in progress and for pending ranges (late data): the windows that changed
    since the last round. Unaligned, every round also re-read the raw samples of a partial
    bucket at the window's start (bench/detect_rounds.py)."""
    return bucket_start(now - dt.timedelta(seconds=window))


def _key(f: Finding) -> tuple[Any, ...]:
    return (f.kind, f.job, f.node, f.rank, f.subject)


def track(con: duckdb.DuckDBPyConnection, kinds: list[str], found: list[Finding], scope: Scope,
          now: dt.datetime) -> tuple[int, int, int]:
    """Store one scheduled round (see the module doc): (extended, new, resolved)."""
    assert scope.since is not None and scope.until is not None
    con.execute("BEGIN")
    try:
        unresolved = con.execute(
            """SELECT rowid, kind, job, node, rank, subject, coalesce(window_end, detected_at) >= $since FROM findings
               WHERE kind IN (SELECT unnest($kinds)) AND resolved_at IS NULL""",
            {"kinds": kinds, "since": scope.since}).fetchall()
        open_ = {tuple(r[1:6]): r[0] for r in unresolved if r[6]}  # reaching into this window: extended
        extended = new = 0
        seen: set[tuple[Any, ...]] = set()
        for f in found:
            k = _key(f)
            if k in seen:
                continue
            seen.add(k)
            vals = {"sev": f.severity, "conf": f.confidence, "summary": f.summary, "ev": json.dumps(f.evidence),
                    "fits": json.dumps(list(f.fit_ids)), "sug": json.dumps(list(f.suggests)), "now": now,
                    "end": f.window_end or now}
            if k in open_:
                con.execute(
                    """UPDATE findings SET severity = $sev, confidence = $conf, summary = $summary, evidence = $ev,
                              fit_ids = $fits, suggests = $sug, detected_at = $now,
                              window_end = greatest(coalesce(window_end, $end), $end)
                       WHERE rowid = $r""", {**vals, "r": open_[k]})
                extended += 1
            else:
                con.execute(
                    """INSERT INTO findings (kind, job, node, rank, subject, severity, confidence, window_start,
                                             window_end, summary, evidence, fit_ids, suggests, first_detected,
                                             detected_at)
                       VALUES ($kind, $job, $node, $rank, $subject, $sev, $conf, $start, $end, $summary, $ev,
                               $fits, $sug, $now, $now)""",
                    {**vals, "kind": f.kind, "job": f.job, "node": f.node, "rank": f.rank, "subject": f.subject,
                     "start": f.window_start or scope.since})
                new += 1
        kept = {open_[k] for k in seen if k in open_}
        gone = [r[0] for r in unresolved if r[0] not in kept]
        if gone:
            con.execute("UPDATE findings SET resolved_at = $now WHERE rowid IN (SELECT unnest($r))",
                        {"now": now, "r": gone})
        record_coverage(con, kinds, None, scope.since, scope.until, now, extend=True)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return extended, new, len(gone)


def uncovered(con: duckdb.DuckDBPyConnection, jobs: list[str], t0: dt.datetime, t1: dt.datetime,
              kinds: list[str]) -> list[str]:
    """The ``jobs`` whose time in [t0, t1] no run of all ``kinds`` covered (for them, or for
    every job), allowing a minute of slack at each end."""
    if not jobs:
        return []
    # each job's first and last step record in [t0, t1]: whole 5-minute buckets from the
    # steps rollup (a fleet-week's raw intervals cost a third of a second to scan), the
    # range's edges from the records
    stamps = "SELECT job, ts AS a, ts AS b FROM steps WHERE job IN (SELECT unnest($jobs)) AND {where}"
    if has_view(con, "steps_5m"):
        whole, edge, params = split(Scope(None, t0, t1))
        stamps = (f"SELECT job, first_ts AS a, last_ts AS b FROM steps_5m WHERE job IN (SELECT unnest($jobs)) AND {whole} "
                  f"UNION ALL {stamps.format(where=edge)}")
    else:
        stamps, params = stamps.format(where="ts BETWEEN $t0 AND $t1"), {}
    rows = con.execute(
        f"""WITH j AS (
               SELECT job, greatest(min(a), $t0) AS a, least(max(b), $t1) AS b FROM ({stamps}) GROUP BY job)
           SELECT j.job FROM j WHERE NOT EXISTS (
               SELECT 1 FROM finding_coverage c
               WHERE (c.job IS NULL OR c.job = j.job) AND list_has_all(c.kinds, $kinds::VARCHAR[])
                 AND c.window_start <= j.a + INTERVAL 1 MINUTE AND c.window_end >= j.b - INTERVAL 1 MINUTE)""",
        {**params, "jobs": jobs, "t0": t0, "t1": t1, "kinds": kinds}).fetchall()
    return sorted(j for (j,) in rows)


class DetectorSchedule:
    """Every detector over the last ``window`` seconds, every ``every`` seconds, on its own
    cursor and thread; each round stored by ``track``. A round that fails is logged (once
    per distinct error) and the next runs: never the collector."""

    def __init__(self, con: duckdb.DuckDBPyConnection, every: float, window: float,
                 clock: Callable[[], dt.datetime] = utcnow) -> None:
        from cmdare.collector.db import cursor

        self.every, self.window, self.clock = every, window, clock
        self.cur = cursor(con)  # made on the thread that owns con
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="cmdare-detectors", daemon=True)
        self.rounds = self.failures = 0
        self.last: tuple[int, int, int] | None = None
        self.last_seconds = 0.0
        self._last_error = ""

    def start(self) -> None:
        self.thread.start()

    def round(self) -> tuple[int, int, int]:
        """One round now (the thread calls it; tests too)."""
        now = self.clock()
        scope = Scope(None, window_start(now, self.window), now)
        t0 = time.perf_counter()
        out = findings.run(self.cur, scope)
        res = self.keep(lambda cur: track(cur, out.ran, out.findings, scope, now))
        self.rounds += 1
        self.last, self.last_seconds = res, time.perf_counter() - t0
        return res

    def keep(self, store: Callable[[duckdb.DuckDBPyConnection], tuple[int, int, int]]) -> tuple[int, int, int]:
        """Store a round's findings (a lake's ruler: into the lake, lakeruler.LakeDetectors)."""
        return retry_conflicts(lambda: store(self.cur), SAVE_TRIES)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.round()
                self._last_error = ""
            except Exception as e:  # noqa: BLE001 - the next round runs
                self.failures += 1
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                if msg != self._last_error:
                    log.warning("detector round failed (the next runs in %g s): %s", self.every, msg)
                self._last_error = msg
            self.stop_event.wait(self.every)

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)
            if self.thread.is_alive():
                self.cur.interrupt()
                self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.cur.close()
