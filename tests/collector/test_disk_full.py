"""Fault suite, the collector's own disk: its DuckDB file on a full filesystem fails the
batch, nothing is acknowledged past what was stored, the cause is said in one line, and
when space returns every event arrives once.

Needs a small tmpfs mounted by the test (root, and a sandbox that allows mounting);
skipped, saying why, where it cannot mount.  Run alone with ``pytest -m fault``."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from cmdare.collector.consumer import SpoolIngest
from cmdare.collector.db import connect, cursor
from cmdare.wire.events import EventFactory
from cmdare.wire.spool import seg_name
from tests.conftest import fill

pytestmark = pytest.mark.fault


def test_a_full_disk_stops_the_batch_says_why_once_and_everything_arrives_once_later(
    tmpfs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    small_fs = tmpfs("16m")
    spool = tmp_path / "spool"
    spool.mkdir()
    f = EventFactory("node-x", "worker", "j")
    n_per, segs = 5000, 4
    for s in range(segs):
        lines = (
            f.line("host", {"cpu_util_ratio": 0.5, "procs": i, "net": [{"nic": "eth0", "rx_bytes_total": i * 977}]},
                   1.75e9 + s * n_per + i)
            for i in range(n_per)
        )
        (spool / seg_name(s + 1)).write_bytes(b"".join(lines))
    db = small_fs / "c.duckdb"
    con = connect(db)
    ballast = fill(small_fs, leave=1 << 20)
    ing = SpoolIngest(con, spool, batch_bytes=512 << 10)
    ing.retry.first = 0.2
    reader = cursor(con)
    caplog.set_level(logging.WARNING, logger="cmdare.collector")
    done = threading.Thread(target=ing.load_available)
    done.start()
    deadline = time.monotonic() + 60
    while not ing.retry.failures and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ing.retry.failures, "the disk never filled"
    # while full: what is acknowledged (the stored position) matches what is stored
    stored = reader.execute("SELECT count(*) FROM host_samples").fetchall()[0][0]
    pos = reader.execute('SELECT segment, "offset" FROM ingest_positions').fetchall()
    assert 0 < stored < n_per * segs
    seg, off = pos[0]
    assert stored == sum(n_per for s in range(1, seg)) + (spool / seg_name(seg)).read_bytes()[:off].count(b"\n")
    time.sleep(1.0)  # a few more failed tries
    ballast.unlink()
    done.join(timeout=60)
    assert not done.is_alive()
    assert reader.execute("SELECT count(*), count(DISTINCT id) FROM host_samples").fetchall() == [
        (n_per * segs, n_per * segs)
    ]
    said = [r.getMessage() for r in caplog.records]
    full = [m for m in said if m.startswith("cannot store a batch")]
    assert len(full) == 1 and "No space left on device" in full[0] and "\n" not in full[0]
    assert len([m for m in said if m.startswith("storing works again")]) == 1
    con.close()
