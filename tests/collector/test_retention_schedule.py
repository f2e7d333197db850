"""Retention and rollups on their own schedule: a collector whose input has gone quiet still
deletes what its retention says is old, instead of waiting for the next write (issue 66)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cmdare.collector.consumer import SpoolIngest
from cmdare.collector.db import connect
from cmdare.collector.writer import Retention
from cmdare.wire.events import EventFactory
from cmdare.wire.spool import seg_name

T0 = time.time() - 3 * 86400


def _host(f: EventFactory, ts: float) -> bytes:
    return f.line("host", {"cpu_util_ratio": 0.5, "mem_used_bytes": 1 << 30}, ts)


def _count(path: Path) -> tuple[int, int]:
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT count(*), count(*) FILTER (WHERE ts < to_timestamp(?)) FROM host_samples",
                           [T0 + 3600]).fetchone()
    finally:
        con.close()


def test_an_idle_spool_collector_applies_retention_on_schedule(tmp_path: Path) -> None:
    f = EventFactory("n0", "worker", "")
    d = tmp_path / "spool"
    d.mkdir()
    # a first segment of old samples: stored, and retention (due at the first write) keeps them:
    # they are the newest rows then
    (d / seg_name(1)).write_bytes(b"".join(_host(f, T0 + 10 * i) for i in range(30)))
    db = tmp_path / "c.duckdb"
    con = connect(db)
    ing = SpoolIngest(con, d, retention=Retention(raw=86400.0, rollups=None, every=1.0))
    t = threading.Thread(target=ing.follow, kwargs={"interval": 0.2}, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while ing.totals.events < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        # then a day later, within the same retention interval: the old ones are now past it
        (d / seg_name(2)).write_bytes(b"".join(_host(f, T0 + 2 * 86400 + 10 * i) for i in range(5)))
        while ing.totals.events < 35 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.5)  # nothing more arrives; retention's interval (1 s) passes twice
    finally:
        ing.stop()
        t.join(10)
        con.close()
    # the 30 old samples went on schedule with nothing written after them (before: they
    # stayed until the next write came, however long the fleet stayed quiet)
    assert _count(db) == (5, 0)
