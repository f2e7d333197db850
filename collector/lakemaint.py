"""Lake maintenance (``cmdare-collector maintain --lake URI``), safe while collectors write:

- **rollups**: the 1- and 5-minute rollups of every day of GPU / host samples and steps
  that changed since they were built (collector/lakerollup.py);
- **retention**: raw samples (``RAW_TABLES``) older than ``retain_raw`` are deleted (whole
  day partitions: a metadata-only commit), a day only once its rollups hold it; rollup rows
  older than ``retain_rollups`` (before their newest day) likewise;
- **compaction**: a day partition held in more than ``compact_files`` files is rewritten
  as one file per partition in one commit (the same rows);
- **snapshot expiry**: snapshots older than ``expire_after`` are dropped from the
  metadata (the current one is always kept), then, for a local lake, data files no kept
  snapshot references and older than an hour are deleted.

Every commit carries the table's source positions forward, and is optimistic like the
collectors' appends: one that loses to a collector's commit is skipped (the next run
does it), never merged blindly.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .lake import (
    APPENDED,
    MARKER,
    NAMESPACE,
    POSITIONS,
    WRITER,
    Lake,
    _path,
    day_partitions,
    in_range,
    time_column,
)
from .lake import before as older_than

log = logging.getLogger("cmdare.collector")
RAW_TABLES = ("gpu_samples", "host_samples", "tpu_samples")
ORPHAN_AGE = 3600.0  # seconds: a newer unreferenced file may belong to a commit in flight


@dataclass
class Report:
    deleted_partitions: dict[str, int] = field(default_factory=dict)  # table -> days dropped
    compacted: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (files before, after)
    expired_snapshots: int = 0
    orphans_deleted: int = 0
    skipped: list[str] = field(default_factory=list)  # commits lost to a collector: next run
    rolled: dict[str, int] = field(default_factory=dict)  # rollup table -> days (re)built
    kept_unrolled: dict[str, int] = field(default_factory=dict)  # table -> old days kept: not rolled up
    rollup_days_deleted: dict[str, int] = field(default_factory=dict)  # rollup table -> days dropped
    goodput_hours: int | None = None  # whole hours of goodput (re)computed; None: not kept here
    findings: int | None = None  # findings stored by --findings; None: not run

    def lines(self) -> list[str]:
        out = [f"rollups: {t}: {n} day(s) built" for t, n in self.rolled.items()]
        out += [f"retention: {t}: {n} day partition(s) deleted" for t, n in self.deleted_partitions.items()]
        out += [f"retention: {t}: {n} old day(s) kept: not rolled up yet (the next run)"
                for t, n in self.kept_unrolled.items()]
        out += [f"retention: {t}: {n} day(s) of rollups deleted" for t, n in self.rollup_days_deleted.items()]
        out += [f"compaction: {t}: {a} files -> {b}" for t, (a, b) in self.compacted.items()]
        if self.goodput_hours is not None:
            out.append(f"goodput hours: {self.goodput_hours} whole hour(s) computed")
        if self.findings is not None:
            out.append(f"findings: {self.findings} stored")
        out.append(f"snapshots expired: {self.expired_snapshots}; unreferenced data files deleted: "
                   f"{self.orphans_deleted}")
        out += [f"skipped (a collector committed meanwhile; the next run does it): {s}" for s in self.skipped]
        return out


def _props(t: Any) -> dict[str, str]:
    snap = t.current_snapshot()
    pos = snap.summary[POSITIONS] if snap is not None else None
    return {POSITIONS: pos, WRITER: "maintenance"} if pos else {WRITER: "maintenance"}


def maintain(lake: Lake, retain_raw: float | None = 7 * 86400, compact_files: int | None = 8,
             expire_after: float | None = 86400, now: dt.datetime | None = None,
             retain_rollups: float | None = 400 * 86400, rollups: bool = True,
             derive: Callable[[Lake], int] | None = None, findings: Callable[[Lake], int] | None = None) -> Report:
    """Compaction, then the rollups of every day that changed, then ``derive`` (goodput by
    the hour: the collector's root passes analytics/goodhours.refresh_lake) and ``findings``
    (the detectors over a recent window: analytics/findings.keep_lake), then retention
    (a raw day only once its rollups hold it), then snapshot expiry; ``None`` for a step's
    setting (or ``rollups`` False) leaves it out (collector/lakespark.py runs those steps
    on Spark)."""
    from pyiceberg.exceptions import CommitFailedException

    from . import lakerollup, rollup

    now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    rep = Report()
    tables = [n for n in (*APPENDED, MARKER) if lake.exists(n)]
    for name in tables:
        t = lake.table(name)
        col = time_column(name) if name != MARKER else "committed_at"
        if compact_files is not None and col is not None:
            before = after = 0
            for day, files in sorted(day_partitions(t).items()):
                if len(files) <= compact_files:
                    continue
                lo = dt.datetime.combine(day, dt.time())
                filt = in_range(col, lo, lo + dt.timedelta(days=1))
                rows = t.scan(row_filter=filt).to_arrow()
                try:
                    t.overwrite(rows, overwrite_filter=filt, snapshot_properties=_props(t))
                except CommitFailedException:
                    rep.skipped.append(f"compaction of {name} {day}")
                    continue
                finally:
                    t = lake.table(name)
                before += len(files)
                after += len(day_partitions(t).get(day, []))
            if before:
                rep.compacted[name] = (before, after)
    if rollups:
        rep.rolled = lakerollup.build(lake, rep.skipped)
    if derive is not None:
        rep.goodput_hours = derive(lake)
    if findings is not None:
        rep.findings = findings(lake)
    for name in tables:
        if retain_raw is None or name not in RAW_TABLES:
            continue
        t = lake.table(name)
        col = time_column(name)
        assert col is not None  # (raw samples are timed)
        cut = (now - dt.timedelta(seconds=retain_raw)).date()  # whole days before the cut's day
        if name in rollup.SOURCES:  # only days every rollup of the table holds as they are
            _, pending = lakerollup.pending_days(lake, name)
            early = [d for d in map(dt.date.fromisoformat, pending) if d < cut]
            if early:
                rep.kept_unrolled[name] = len(early)
                cut = min(early)
        old = [d for d in day_partitions(t) if d < cut]
        if old:
            try:
                t.delete(older_than(col, dt.datetime.combine(cut, dt.time())),
                         snapshot_properties=_props(t))
                rep.deleted_partitions[name] = len(old)
            except CommitFailedException:
                rep.skipped.append(f"retention of {name}")
    if retain_rollups is not None:
        rep.rollup_days_deleted = lakerollup.retain(lake, retain_rollups, rep.skipped)
    if expire_after is not None:
        wall = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)  # snapshots are stamped when committed
        for name in (*tables, *(r.table for r in rollup.ROLLUPS)):
            if lake.exists(name):
                rep.expired_snapshots += _expire(lake, name, wall - dt.timedelta(seconds=expire_after), rep)
    return rep


def _expire(lake: Lake, name: str, older: dt.datetime, rep: Report) -> int:
    from pyiceberg.exceptions import CommitFailedException

    t = lake.table(name)
    cur = t.current_snapshot()
    ms = int(older.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
    old = [s.snapshot_id for s in t.snapshots() if s.timestamp_ms < ms and (cur is None or s.snapshot_id != cur.snapshot_id)]
    if not old:
        return 0
    try:
        t.maintenance.expire_snapshots().by_ids(old).commit()
    except CommitFailedException:
        rep.skipped.append(f"snapshot expiry of {name}")
        return 0
    if lake.location.local is not None:
        rep.orphans_deleted += _orphans(lake, name)
    return len(old)


def _orphans(lake: Lake, name: str) -> int:
    """Delete the table's data files no kept snapshot references (older than ORPHAN_AGE)."""
    t = lake.table(name)
    kept = set()
    for snap in t.snapshots():
        for m in snap.manifests(t.io):
            for entry in m.fetch_manifest_entry(t.io, discard_deleted=True):
                kept.add(_path(entry.data_file.file_path))
    assert lake.location.local is not None  # the caller's condition: a local lake
    root = lake.location.local / NAMESPACE / name / "data"  # (a table with no data yet has none: walks nothing)
    n = 0
    limit = dt.datetime.now().timestamp() - ORPHAN_AGE
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            if f.endswith(".parquet") and p not in kept and os.path.getmtime(p) < limit:
                os.unlink(p)
                n += 1
    return n

