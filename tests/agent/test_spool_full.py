"""Fault suite, the agent's disk: a spool that cannot grow behaves as one at its size bound
(the oldest dropped and counted, the newest kept, urgent events written), says so once,
and stops gracefully whatever the disk does.  On small tmpfs mounts made by the test
(skipped, saying why, where it cannot mount).  Run alone with ``pytest -m fault``."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cmdare.agent.sinks.spool import Spool
from cmdare.analytics import queries
from cmdare.collector.consumer import SpoolIngest
from cmdare.collector.db import connect
from cmdare.wire.events import decode_line
from cmdare.wire.spool import Position, list_segments, seg_name
from tests.conftest import BIN, fill

pytestmark = pytest.mark.fault


def _lines(first: int, n: int) -> bytes:
    return b"".join(b'{"seq":%08d,"pad":"%s"}\n' % (i, b"x" * 70) for i in range(first, first + n))


def _on_disk(d: Path) -> list[int]:
    out = []
    for s in list_segments(d):
        out += [int(x[7:15]) for x in (d / seg_name(s)).read_bytes().splitlines()]
    return out


def test_a_full_disk_drops_the_oldest_keeps_the_newest_and_counts_exactly(tmpfs, caplog) -> None:
    d = tmpfs("1m") / "spool"
    sp = Spool(d, segment_bytes=64 << 10, fsync=True, fsync_interval=0.0)
    sp.open()
    caplog.set_level(logging.WARNING, logger="cmdare.agent.spool")
    total = 0
    for _ in range(1500):  # 1,500 x 20 lines of 94 bytes: 2.8 MB into 1 MiB
        assert sp.append(_lines(total, 20), 20) is True  # never refused: older events make room
        total += 20
    seqs = _on_disk(d)
    assert seqs == list(range(total - len(seqs), total))  # a contiguous run ending with the newest
    assert sp.dropped_total == total - len(seqs) > 0  # every event either on disk or counted
    assert sp.spooled_total == total and sp.pending == len(seqs)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "No space left on device" in said[0] and "dropping the oldest" in said[0]
    assert sp.problem is not None
    sp.close()


def test_room_again_is_said_once_with_the_count(tmpfs, caplog) -> None:
    mnt = tmpfs("2m")
    sp = Spool(mnt / "spool", segment_bytes=32 << 10, fsync=False)
    sp.open()
    ballast = fill(mnt, leave=160 << 10)
    caplog.set_level(logging.WARNING, logger="cmdare.agent.spool")
    n = 0
    while sp.dropped_total == 0:
        sp.append(_lines(n, 20), 20)
        n += 20
    for _ in range(20):
        sp.append(_lines(n, 20), 20)
        n += 20
    ballast.unlink()
    sp.append(_lines(n, 20), 20)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and said[0].startswith("spool: No space left on device")
    assert said[1].startswith("spool: writing again after No space left on device")
    assert f"{sp.dropped_total} events dropped meanwhile" in said[1]
    assert sp.problem is None
    sp.close()


def test_a_notice_is_written_on_a_full_disk_and_never_pushed_out(tmpfs) -> None:
    """The disk is full to the last byte: a revocation notice is still written (older
    samples make way), and however many samples come after, it is never the one dropped."""
    mnt = tmpfs("1m")
    d = mnt / "spool"
    sp = Spool(d, segment_bytes=64 << 10, fsync=False)
    sp.open()
    for i in range(20):
        sp.append(_lines(i * 50, 50), 50)
    fill(mnt, leave=0)
    notice = b'{"v":1,"id":"n-1","type":"revocation","pad":"%s"}\n' % (b"x" * 200)
    assert sp.append(notice, 1) is True
    n = 1000
    for _ in range(1000):  # 50 more segments' worth through a full disk
        assert sp.append(_lines(n, 20), 20)
        n += 20
    on_disk = b"".join((d / seg_name(s)).read_bytes() for s in list_segments(d))
    assert on_disk.count(b'"type":"revocation"') == 1
    assert sp.spooled_total == 1000 + 1 + 20000
    assert sp.dropped_total + on_disk.count(b"\n") == sp.spooled_total  # every event on disk or counted
    sp.close()


def _read_only(d: Path) -> None:
    """``d`` read-only from now on for new files, as after a remount (files already open
    for writing keep taking writes, as the kernel lets them)."""
    subprocess.run(["mount", "--bind", str(d), str(d)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(d)], check=True)


def test_read_only_and_removed_spools_drop_and_count_and_close_cleanly(tmpfs, caplog) -> None:
    mnt = tmpfs("1m")
    sp = Spool(mnt / "spool", segment_bytes=4096, fsync=True)
    sp.open()
    assert sp.append(_lines(0, 10), 10)
    _read_only(mnt / "spool")
    caplog.set_level(logging.WARNING, logger="cmdare.agent.spool")
    landed = [sp.append(_lines(10 + 40 * i, 40), 40) for i in range(5)]  # 3.7 KB each: a new segment each
    assert landed == [False] * 5
    assert sp.dropped_total == 200 and sp.spooled_total == 10
    assert [r.levelname for r in caplog.records] == ["ERROR"]  # once, not per write
    assert "Read-only file system" in caplog.records[0].getMessage()
    sp.close()  # no exception
    subprocess.run(["umount", str(mnt / "spool")], check=True)

    consumed = Spool(mnt / "consumed", segment_bytes=4096, fsync=False)  # segments it may delete
    consumed.open()
    for i in range(5):
        consumed.append(_lines(i * 40, 40), 40)
    segs = list_segments(mnt / "consumed")
    (mnt / "consumed" / "cursor.shipped").write_text(f"{Position(segs[-1], 0)}\n")  # all but the last shipped
    _read_only(mnt / "consumed")
    consumed.gc()  # cannot delete the shipped ones: they stay, nothing raises
    assert list_segments(mnt / "consumed") == segs
    consumed.close()
    subprocess.run(["umount", str(mnt / "consumed")], check=True)

    other = Spool(mnt / "other", segment_bytes=4096, fsync=True)
    other.open()
    shutil.rmtree(mnt / "other")
    for i in range(5):  # the open segment still takes writes; a new one cannot be made
        other.append(_lines(i * 40, 40), 40)
    assert other.spooled_total + other.dropped_total == 200 and other.dropped_total > 0
    other.close()


def _agent(spool: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "cmdare-agent"), "--spool-dir", str(spool), "--interval", "0.05s",
         "--set", "sources.gpu.enabled=false", "--set", "sources.tpu.enabled=false",
         "--set", "sources.cloud.enabled=false", "--set", "sources.train.enabled=false"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "CMDARE_AGENT_SPOOL__SEGMENT_BYTES": "64KiB"},
    )


def _stop(p: subprocess.Popen) -> tuple[int, float, str]:
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    return p.returncode, time.monotonic() - t0, err


@pytest.mark.parametrize("trouble", ["full", "read-only", "removed"])
def test_sigterm_exits_0_within_5s_whatever_the_disk_does(tmpfs, tmp_path: Path, trouble: str) -> None:
    mnt = tmpfs("1m")
    p = _agent(mnt / "spool")
    try:
        deadline = time.monotonic() + 20
        while not list_segments(mnt / "spool") and time.monotonic() < deadline:
            time.sleep(0.05)
        if trouble == "full":
            fill(mnt, leave=32 << 10)
            deadline = time.monotonic() + 20
            while not _spool_status(mnt / "spool") and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1)  # ~20 ticks on a full disk
        elif trouble == "read-only":
            _read_only(mnt / "spool")
            time.sleep(2)  # new segments (64 KiB each) cannot be made
        else:
            shutil.rmtree(mnt / "spool")
            time.sleep(1)
        code, took, err = _stop(p)
    finally:
        if p.poll() is None:
            p.kill()
        if trouble == "read-only":
            subprocess.run(["umount", str(mnt / "spool")], capture_output=True)
    assert code == 0 and took < 5, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    spool_lines = [x for x in err.splitlines() if "spool:" in x]
    assert len(spool_lines) <= 3, spool_lines  # said when it began (and ended), not per tick
    if trouble == "full":  # the newest events are there: the spool's status, the clean stop
        status = _spool_status(mnt / "spool")
        assert status and status[-1]["state"] == "error" and "No space left" in status[-1]["message"]
        assert [e["data"]["event"] for e in _events(mnt / "spool") if e["type"] == "lifecycle"][-1] == "agent_stop"
        con = connect(tmp_path / "c.duckdb")  # and analyze nodes shows it, with the drops
        SpoolIngest(con, mnt / "spool").load_available()
        cols, rows = queries.nodes(con)
        row = dict(zip(cols, rows[0], strict=True))
        assert row["not_ok"] == "spool=error" and row["dropped"] > 0
        con.close()


def _events(d: Path) -> list[dict]:
    out = []
    for s in list_segments(d):
        try:
            out += [decode_line(x) for x in (d / seg_name(s)).read_bytes().splitlines()]
        except FileNotFoundError:
            pass  # dropped meanwhile
    return out


def _spool_status(d: Path) -> list[dict]:
    return [e["data"] for e in _events(d) if e["type"] == "status" and e["data"]["source"] == "spool"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
