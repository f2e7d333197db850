"""Rollups in a lake: the 1- and 5-minute rollups of collector/rollup.py as Iceberg tables
(``gpu_rollup_5m``, ``steps_5m``'s ``step_rollup_5m``, ...), built by ``cmdare-collector
maintain`` per day partition of their source, and read exactly at any lag.

How they stay right with collectors appending meanwhile and no coordinator:

- a day of a source table is rolled up from the data files the source's current snapshot
  holds for that day; the rollup table's commit (one overwrite of that day's partition)
  records in its snapshot properties (``cmdare.rolled``) a fingerprint of those files;
- a reader (analytics/lakedb.py) takes a day's rollup rows only where the source's files
  for that day still have that fingerprint; a day that has changed since (a late append,
  a compaction) or was never rolled is pending: its rows are aggregated from the raw files,
  exactly as a database file reads rows the rollup has not caught up with;
- retention deletes a raw day only once every rollup of its table holds it; the rollup
  rows of deleted raw days then stand alone (their fingerprints no longer match anything,
  and nothing raw is left to be pending).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import shutil
import tempfile
import warnings
from typing import Any

import duckdb
import pyarrow as pa

from . import rollup
from .lake import Lake, _list, _path, before, day_partitions, in_range, schema

log = logging.getLogger("cmdare.collector")
ROLLED = "cmdare.rolled"  # snapshot property of a rollup table: {"YYYY-MM-DD": fingerprint}
MEMORY = "2GB"  # DuckDB's memory for a day's aggregate (past it, it spills to a temporary directory)
CHUNK_ROWS = 1 << 21  # rollup rows written at a time (one commit a day: a chunk's files each)


def day_files(t: Any) -> dict[str, list[str]]:
    """A day-partitioned table's data file paths per day ("YYYY-MM-DD")."""
    return {d.isoformat(): [_path(f.file_path) for f in fs] for d, fs in day_partitions(t).items()}


def fingerprint(files: list[str], version: int = 1) -> str:
    """What a rollup day was built from: the source's files for the day, and the rollup's
    ``version`` (collector/rollup.py; past 1 a day built by an older version is pending)."""
    text = "\n".join(sorted(files)) + (f"\nversion {version}" if version > 1 else "")
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def rolled(t: Any) -> dict[str, str]:
    """Day -> fingerprint of the source files a rollup table's current rows were built from."""
    snap = t.current_snapshot()
    raw = snap.summary[ROLLED] if snap is not None else None
    try:
        out = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def pending_days(lake: Lake, src: str, names: set[str] | None = None,
                 fresh: bool = True) -> tuple[dict[str, list[str]], set[str]]:
    """(the source's files per day, the days not held by every rollup of it); ``fresh``
    False: the tables as this Lake last loaded them (one reader's consistent view)."""
    names = names if names is not None else lake.names()
    if src not in names:
        return {}, set()
    days = day_files(lake.table(src, fresh=fresh))
    todo: set[str] = set()
    for r in (r for r in rollup.ROLLUPS if r.source == src):
        state = rolled(lake.table(r.table, fresh=fresh)) if r.table in names else {}
        todo |= {d for d, fs in days.items() if state.get(d) != fingerprint(fs, r.version)}
    return days, todo


def ensure(lake: Lake) -> None:
    """The rollup tables (partitioned by day of ``bucket``, as ``Lake.ensure`` makes tables)."""
    lake.ensure(rollup.TABLES)


def build(lake: Lake, skipped: list[str]) -> dict[str, int]:
    """Roll up every day of every source that some rollup does not hold as the source now
    is; rollup table -> days rebuilt.  A commit lost to another maintenance run is skipped
    (listed in ``skipped``: the next run does it)."""
    from pyiceberg.exceptions import CommitFailedException

    ensure(lake)
    names = lake.names()
    out: dict[str, int] = {}
    spill = tempfile.mkdtemp(prefix="cmdare-rollup-")
    con = duckdb.connect(":memory:", config={"memory_limit": MEMORY, "temp_directory": spill})
    try:
        for src in rollup.SOURCES:
            if src not in names:
                continue
            days = day_files(lake.table(src))
            for r in (r for r in rollup.ROLLUPS if r.source == src):
                t = lake.table(r.table)
                state = rolled(t)
                target = schema(r.table)
                for day, files in sorted(days.items()):
                    fp = fingerprint(files, r.version)
                    if state.get(day) == fp:
                        continue
                    read = f"read_parquet({_list(files)}, union_by_name = true)"
                    have = {c[0] for c in con.execute(f"DESCRIBE SELECT * FROM {read}").fetchall()}
                    # a column no file of the day has (written before the migration that
                    # added it): null, as in the database file
                    cols = ", ".join(f'"{f.name}"' if f.name in have else f'NULL AS "{f.name}"' for f in schema(src))
                    con.execute(f"CREATE OR REPLACE VIEW {src} AS SELECT {cols} FROM {read}")
                    lo = dt.datetime.fromisoformat(day)
                    filt = in_range("bucket", lo, lo + dt.timedelta(days=1))
                    state = {**state, day: fp}
                    props = {ROLLED: json.dumps(state)}
                    try:
                        with warnings.catch_warnings():  # "Delete operation did not match": a first build
                            warnings.simplefilter("ignore", UserWarning)
                            # the day's rows in chunks, one commit: the aggregate spills past
                            # MEMORY and a chunk at a time is held (the whole day of a
                            # 10,000-node fleet's 1-minute rollup as one Arrow table took 24 GB)
                            reader = con.sql(f"{r.from_raw()} GROUP BY ALL").to_arrow_reader(CHUNK_ROWS)
                            with t.transaction() as tx:
                                first = True
                                for batch in reader:
                                    rows = pa.table({f.name: batch.column(f.name).cast(f.type) for f in target},
                                                    schema=target)
                                    if first:
                                        tx.overwrite(rows, overwrite_filter=filt, snapshot_properties=props)
                                    else:
                                        tx.append(rows, snapshot_properties=props)
                                    first = False
                                if first:  # no rows: the day's old rows go all the same
                                    tx.overwrite(target.empty_table(), overwrite_filter=filt, snapshot_properties=props)
                    except CommitFailedException:
                        skipped.append(f"rollup {r.table} {day}")
                        t = lake.table(r.table)
                        state = rolled(t)
                        continue
                    out[r.table] = out.get(r.table, 0) + 1
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    return out


def retain(lake: Lake, keep: float, skipped: list[str]) -> dict[str, int]:
    """Delete rollup rows more than ``keep`` seconds older than each table's newest (whole
    days); rollup table -> days deleted."""
    from pyiceberg.exceptions import CommitFailedException

    out: dict[str, int] = {}
    names = lake.names()
    for r in rollup.ROLLUPS:
        if r.table not in names:
            continue
        t = lake.table(r.table)
        days = sorted(day_files(t))
        if not days:
            continue
        end = dt.datetime.fromisoformat(days[-1]) + dt.timedelta(days=1)  # the newest day's end
        cut = (end - dt.timedelta(seconds=keep)).date()  # whole days before the cut's day
        old = [d for d in days if dt.date.fromisoformat(d) < cut]
        if not old:
            continue
        state = {d: f for d, f in rolled(t).items() if d not in old}
        try:
            t.delete(before("bucket", dt.datetime.combine(cut, dt.time())),
                     snapshot_properties={ROLLED: json.dumps(state)})
        except CommitFailedException:
            skipped.append(f"retention of {r.table}")
            continue
        out[r.table] = len(old)
    return out
