"""The spool: write-ahead log semantics, torn lines, bounds with counted drops, cursors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cmdare.agent.sinks.shipper import pack
from cmdare.agent.sinks.spool import Spool
from cmdare.wire.spool import Position, list_segments, read_lines, seg_name


def lines(n: int, start: int = 0, width: int = 100) -> bytes:
    return b"".join(f'{{"n":{i}}}'.ljust(width).encode() + b"\n" for i in range(start, start + n))


def all_read(d: Path, pos: Position = Position(0, 0)) -> list[bytes]:
    out = []
    while True:
        chunks, nxt, _ = read_lines(d, pos, 1000)
        if not chunks:
            return out
        for data, _ in chunks:
            out += data.splitlines()
        pos = nxt


def test_append_and_read_back_in_order_across_segments(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=4096, fsync=False)
    sp.open()
    for i in range(10):
        sp.append(lines(10, i * 10), 10)
    assert len(list_segments(tmp_path)) > 2
    got = all_read(tmp_path)
    assert [int(x.split(b":")[1].split(b"}")[0]) for x in got] == list(range(100))
    assert sp.pending == 100 and sp.spooled_total == 100


def test_fsyncs_are_grouped_by_the_interval_and_a_closed_segment_is_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    every = Spool(tmp_path / "a", segment_bytes=1 << 20, fsync=True, fsync_interval=0.0)
    every.open()
    for i in range(5):
        every.append(lines(1, i), 1)
    assert len(synced) == 5
    every.close()
    synced.clear()
    grouped = Spool(tmp_path / "b", segment_bytes=4096, fsync=True, fsync_interval=3600.0)
    grouped.open()
    grouped.append(lines(10), 10)  # the first write syncs
    grouped.append(lines(10, 10), 10)  # within the interval: no sync ...
    assert len(synced) == 1
    grouped.append(lines(30, 20), 30)  # ... until the segment is sealed by a rotation
    assert len(synced) == 2 and len(list_segments(tmp_path / "b")) == 2
    grouped.close()  # and on close
    assert len(synced) == 3


def test_partial_line_is_not_read_until_complete(tmp_path: Path) -> None:
    (tmp_path / seg_name(1)).write_bytes(b'{"a":1}\n{"b":')
    chunks, nxt, skipped = read_lines(tmp_path, Position(0, 0), 1 << 20)
    assert [c for c, _ in chunks] == [b'{"a":1}\n'] and nxt == Position(1, 8) and skipped == 0


def test_torn_tail_is_cut_when_reopened_after_a_crash(tmp_path: Path) -> None:
    (tmp_path / seg_name(1)).write_bytes(b'{"a":1}\n{"b":')
    sp = Spool(tmp_path, fsync=False)
    sp.open()
    # cut on disk at open, not merely skipped by readers: the segment ends at a line again
    assert (tmp_path / seg_name(1)).read_bytes() == b'{"a":1}\n'
    assert sp.pending == 1 and sp.size_bytes() == 8
    sp.append(b'{"c":3}\n', 1)
    assert all_read(tmp_path) == [b'{"a":1}', b'{"c":3}']
    chunks, _, skipped = read_lines(tmp_path, Position(0, 0), 1 << 20)
    assert skipped == 0  # nothing torn left for a reader to count as damage


def test_a_segment_that_is_all_torn_line_is_emptied_and_whole_lines_are_kept(tmp_path: Path) -> None:
    (tmp_path / seg_name(1)).write_bytes(b'{"a":1}\n{"b":2}\n')
    (tmp_path / seg_name(2)).write_bytes(b'{"half":')  # the crash came before any newline
    sp = Spool(tmp_path, fsync=False)
    sp.open()
    assert (tmp_path / seg_name(1)).read_bytes() == b'{"a":1}\n{"b":2}\n'  # only the last segment
    assert (tmp_path / seg_name(2)).read_bytes() == b""
    assert sp.pending == 2


def test_torn_tail_in_a_sealed_segment_is_skipped_and_counted(tmp_path: Path) -> None:
    (tmp_path / seg_name(1)).write_bytes(b'{"a":1}\n{"b":')
    (tmp_path / seg_name(2)).write_bytes(b'{"c":3}\n')
    chunks, nxt, skipped = read_lines(tmp_path, Position(1, 8), 1 << 20)
    assert [c for c, _ in chunks] == [b'{"c":3}\n'] and skipped == 1


def test_size_bound_drops_oldest_and_counts_the_unshipped(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_bytes=3 * 4096, segment_bytes=4096, fsync=False)
    sp.open()
    for i in range(20):
        sp.append(lines(10, i * 10), 10)  # 200 events of 101 bytes: ~20 KB into a 12 KB bound
    assert sp.size_bytes() <= 3 * 4096 + 1010
    kept = all_read(tmp_path)
    assert sp.dropped_total + len(kept) == 200
    assert sp.dropped_total > 0
    # the oldest went first: what is kept is the newest, contiguous
    nums = [int(x.split(b":")[1].split(b"}")[0]) for x in kept]
    assert nums == list(range(200 - len(kept), 200))
    assert sp.pending == len(kept)


def test_size_bound_never_drops_notices_or_lifecycle(tmp_path: Path) -> None:
    """Past the size bound the oldest samples go, but a revocation notice and the agent's
    lifecycle events in a dropped segment are written again at the end: however much comes
    after, each is on disk exactly once, and every other event is on disk or counted."""
    sp = Spool(tmp_path, max_bytes=3 * 4096, segment_bytes=4096, fsync=False)
    sp.open()
    start = b'{"id":"s-1","type":"lifecycle","event":"agent_start"}\n'
    notice = b'{"id":"n-1","type":"revocation","pad":"%s"}\n' % (b"x" * 200)
    sp.append(start, 1)
    sp.append(lines(10), 10)
    sp.append(notice, 1)
    for i in range(1, 100):  # ~10,000 events of 101 bytes through a 12 KB bound
        sp.append(lines(10, i * 10), 10)
    kept = all_read(tmp_path)
    assert kept.count(start.rstrip()) == 1 and kept.count(notice.rstrip()) == 1
    assert sp.dropped_total + len(kept) == sp.spooled_total == 1002
    assert sp.pending == len(kept)
    assert sp.size_bytes() <= 3 * 4096 + 4096
    # past the age bound they are as stale as the rest: dropped and counted
    old = Spool(tmp_path / "old", max_age=60, segment_bytes=4096, fsync=False)
    old.open()
    old.append(notice + lines(30), 31)
    old.append(lines(20, 30), 20)  # rotates
    os.utime(tmp_path / "old" / seg_name(list_segments(tmp_path / "old")[0]), (1, 1))
    old.gc()
    assert old.dropped_total == 31 and notice.rstrip() not in all_read(tmp_path / "old")


def test_age_bound(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_age=60, segment_bytes=4096, fsync=False)
    sp.open()
    sp.append(lines(40), 40)
    sp.append(lines(40, 40), 40)  # rotates
    old = tmp_path / seg_name(list_segments(tmp_path)[0])
    os.utime(old, (1, 1))
    sp.append(lines(1, 80), 1)
    sp.gc()  # ages are looked at once a second on the append path; gc() looks now
    assert not old.exists() and sp.dropped_total == 40


def test_consumed_segments_are_deleted_without_counting_drops(tmp_path: Path) -> None:
    sp = Spool(tmp_path, segment_bytes=4096, fsync=False)
    sp.open()
    for i in range(5):
        sp.append(lines(20, i * 20), 20)
    chunks, nxt, _ = read_lines(tmp_path, sp.cursor(), 1 << 20)
    sp.commit(nxt, 100)
    sp.append(lines(1, 100), 1)
    assert sp.dropped_total == 0 and sp.pending == 1
    assert len(list_segments(tmp_path)) == 1


def test_restart_resumes_pending_count_from_the_cursor(tmp_path: Path) -> None:
    sp = Spool(tmp_path, segment_bytes=4096, fsync=False)
    sp.open()
    sp.append(lines(30), 30)
    chunks, _, _ = read_lines(tmp_path, Position(0, 0), 1010)  # 10 lines
    sp.commit(chunks[-1][1], 10)
    sp.close()
    sp2 = Spool(tmp_path, segment_bytes=4096, fsync=False)
    sp2.open()
    assert sp2.pending == 20


def test_one_agent_per_spool(tmp_path: Path) -> None:
    a = Spool(tmp_path)
    a.open()
    with pytest.raises(RuntimeError, match="in use by another cmdare-agent"):
        Spool(tmp_path).open()


def test_pack_cuts_messages_at_line_boundaries() -> None:
    data = lines(10, width=99)  # 100 bytes a line
    msgs = pack([(data, Position(3, 5000))], 350)
    assert [c for _, c, _ in msgs] == [3, 3, 3, 1]
    assert b"".join(m for m, _, _ in msgs) == data
    assert msgs[-1][2] == Position(3, 5000) and msgs[0][2] == Position(3, 5000 - 1000 + 300)
    big = pack([(b"x" * 500 + b"\n", Position(1, 501))], 100)
    assert [c for _, c, _ in big] == [1]  # a single event longer than a message travels alone


def test_the_documented_defaults(tmp_path: Path) -> None:
    """docs/sources.md [spool]: 1 GiB, 7 days, 8 MiB segments, fsync on every write."""
    sp = Spool(tmp_path / "a" / "b")  # parents made
    assert (sp.max_bytes, sp.max_age, sp.segment_bytes, sp.fsync, sp.fsync_interval) == (
        1 << 30, 7 * 86400, 8 << 20, True, 0.0)
    sp.open()
    assert (sp.pending, sp.dropped_total, sp.spooled_total, sp.size_bytes(), sp.problem) == (0, 0, 0, 0, None)
    assert list_segments(tmp_path / "a" / "b") == [1]


def test_every_write_is_fsynced_by_default_and_grouped_with_an_interval(tmp_path: Path, monkeypatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    sp = Spool(tmp_path / "a")
    sp.open()
    for i in range(3):
        sp.append(lines(1, i), 1)
    assert len(synced) == 3
    sp2 = Spool(tmp_path / "b", fsync_interval=3600)
    sp2.open()
    for i in range(3):
        sp2.append(lines(1, i), 1)
    assert len(synced) == 4  # the first write, then none within the hour


def test_reopening_continues_after_the_last_segment_numbering_without_gaps(tmp_path: Path) -> None:
    sp = Spool(tmp_path, segment_bytes=250, fsync=False)
    sp.open()
    for i in range(5):
        sp.append(lines(1, i), 1)  # 101 bytes: two lines fit a 250-byte segment
    assert list_segments(tmp_path) == [1, 2, 3]
    assert [len(all_read(tmp_path, Position(s, 0))) for s in (1, 2, 3)] == [5, 3, 1]
    sp.close()
    sp = Spool(tmp_path, segment_bytes=250, fsync=False)
    sp.open()
    sp.append(lines(1, 5), 1)
    assert list_segments(tmp_path) == [1, 2, 3, 4] and sp.pending == 6
    assert all_read(tmp_path)[-1].startswith(b'{"n":5}')


def test_a_segment_fills_to_exactly_its_size_before_rotating(tmp_path: Path) -> None:
    sp = Spool(tmp_path, segment_bytes=202, fsync=False)
    sp.open()
    sp.append(lines(1), 1)
    sp.append(lines(1, 1), 1)  # 202 bytes: exactly full, same segment
    assert list_segments(tmp_path) == [1] and sp.size_bytes() == 202
    sp.append(lines(1, 2), 1)
    assert list_segments(tmp_path) == [1, 2]


@pytest.mark.parametrize("content, kept", [
    (b"", b""),
    (b'\n{"b":', b"\n"),  # the only newline is the first byte
    (b"x" * (1 << 20), b""),  # a torn line of exactly the 1 MiB looked at: cut whole
    (b"x" * ((1 << 20) + 1), b"x" * ((1 << 20) + 1)),  # its start is further back: left as it is
    (b'{"a":1}\n' + b"x" * ((1 << 20) + 100), b'{"a":1}\n' + b"x" * ((1 << 20) + 100)),
    (b'{"a":1}\n' + b"y" * (3 << 18), b'{"a":1}\n'),  # 0.75 MiB torn: found and cut
])
def test_the_torn_line_repair_looks_at_the_last_mebibyte(tmp_path: Path, content: bytes, kept: bytes) -> None:
    (tmp_path / seg_name(1)).write_bytes(content)
    sp = Spool(tmp_path, fsync=False)
    sp.open()
    assert (tmp_path / seg_name(1)).read_bytes() == kept
    assert sp.size_bytes() == len(kept)


def test_a_cursor_moved_by_another_process_updates_pending_and_frees_segments(tmp_path: Path) -> None:
    """Embedded mode: the collector reading the directory moves the cursor itself."""
    from cmdare.wire.spool import write_cursor

    sp = Spool(tmp_path, segment_bytes=4096, fsync=False)
    sp.open()
    for i in range(4):
        sp.append(lines(30, i * 30), 30)
    assert sp.pending == 120 and len(list_segments(tmp_path)) >= 3
    chunks, nxt, _ = read_lines(tmp_path, Position(0, 0), 6000)
    write_cursor(tmp_path, "shipped", nxt, fsync=False)
    sp.gc()
    left = sum(1 for _ in all_read(tmp_path, nxt))
    assert sp.pending == left < 120 and sp.dropped_total == 0
    assert min(list_segments(tmp_path)) == nxt.segment  # wholly consumed ones went


def test_the_age_bound_drops_only_old_unconsumed_segments_and_does_not_carry_notices(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_age=60, segment_bytes=4096, fsync=False)
    sp.open()
    notice = b'{"type":"revocation","n":1}\n'
    sp.append(notice + lines(30), 31)
    sp.append(lines(30, 30), 30)  # rotates: segment 1 sealed
    sp.append(lines(30, 60), 30)
    segs = list_segments(tmp_path)
    os.utime(tmp_path / seg_name(segs[0]), (time.time() - 59, time.time() - 59))  # not yet too old
    sp.gc()
    assert list_segments(tmp_path) == segs and sp.dropped_total == 0
    os.utime(tmp_path / seg_name(segs[0]), (time.time() - 61, time.time() - 61))
    sp.gc()
    assert list_segments(tmp_path) == segs[1:]
    assert sp.dropped_total == 31 and sp.pending == 60  # a stale notice goes with its segment
    assert notice.strip() not in b"".join(all_read(tmp_path))


def test_closing_writes_carried_notices_and_counts_what_it_cannot(tmp_path: Path) -> None:
    sp = Spool(tmp_path, fsync=False)
    sp.open()
    sp._carry = [b'{"type":"lifecycle","n":1}\n']
    sp.pending = 1
    sp.close()
    assert all_read(tmp_path) == [b'{"type":"lifecycle","n":1}'] and sp.dropped_total == 0


def test_a_write_the_disk_refuses_counts_the_events_and_any_carried_notices_as_dropped(tmp_path: Path, monkeypatch) -> None:
    """Not a full disk (a read-only remount): nothing can be dropped to make room, so the
    write and the urgent lines carried from a dropped segment are lost, and counted."""
    import errno

    sp = Spool(tmp_path, fsync=False)
    sp.open()
    sp.append(lines(3), 3)
    sp._carry = [b'{"type":"lifecycle","n":1}\n']  # carried, and still counted as pending
    sp.pending += 1

    def refuse(data: bytes) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(sp, "_write", refuse)
    assert sp.append(lines(2, 3), 2) is False
    assert (sp.dropped_total, sp.pending, sp._carry) == (3, 3, [])
    assert sp.problem is not None and sp.problem.startswith("Read-only file system") and not sp._no_room
    sp._carry = [b'{"type":"lifecycle","n":2}\n']  # carried but no longer pending: never below 0
    sp.pending = 0
    assert sp.append(lines(1, 5), 1) is False
    assert (sp.dropped_total, sp.pending) == (5, 0)


@pytest.mark.parametrize("free_segments, recovered", [(2, True), (1.99, False)])
def test_a_full_disk_counts_as_recovered_once_two_segments_are_free(tmp_path: Path, monkeypatch, caplog,
                                                                   free_segments: float, recovered: bool) -> None:
    import errno
    import logging

    sp = Spool(tmp_path, segment_bytes=1 << 20, fsync=False)
    sp.open()
    sp._trouble(OSError(errno.ENOSPC, "No space left on device"))
    assert sp._no_room

    class Vfs:
        f_frsize = 4096
        f_bavail = int(free_segments * (1 << 20)) // 4096

    monkeypatch.setattr(os, "statvfs", lambda p: Vfs())
    caplog.set_level(logging.WARNING, logger="cmdare.agent.spool")
    assert sp.append(lines(1), 1) is True
    assert (sp.problem is None) is recovered
    assert any("writing again after" in r.getMessage() for r in caplog.records) is recovered
    monkeypatch.setattr(os, "statvfs", lambda p: (_ for _ in ()).throw(OSError(errno.EIO, "gone")))
    sp._trouble(OSError(errno.ENOSPC, "No space left on device"))
    assert sp.append(lines(1, 1), 1) is True and sp.problem is not None  # cannot tell: still in trouble


def test_closing_survives_a_disk_that_fails_fsync_and_close(tmp_path: Path, monkeypatch, caplog) -> None:
    import errno
    import logging

    sp = Spool(tmp_path)  # fsync on
    sp.open()
    sp.append(lines(1), 1)
    caplog.set_level(logging.WARNING, logger="cmdare.agent.spool")

    def eio(*a):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", eio)
    sp._carry = [b'{"type":"lifecycle","n":1}\n']
    monkeypatch.setattr(sp, "_write", eio)
    sp.pending = 1  # the carried line is the only one pending

    class Failing:  # a file whose close fails (NFS, a yanked disk)
        def __init__(self, f) -> None:
            self.f = f

        def close(self) -> None:
            self.f.close()
            eio()

        def __getattr__(self, name):
            return getattr(self.f, name)

    sp._f, sp._lockf = Failing(sp._f), Failing(sp._lockf)
    sp.close()  # must not raise
    said = [r.getMessage() for r in caplog.records]
    assert any("1 urgent events (notices, lifecycle) could not be written: dropped" in m for m in said)
    assert any(m.startswith("spool: the last writes may not be on disk") for m in said)
    assert any(m.startswith("spool: closing the active segment: [Errno 5]") for m in said)
    assert sp.dropped_total == 1 and sp.pending == 0 and sp._f is None


def _enospc(*a) -> None:
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_with_nothing_to_drop_drops_the_write_and_never_spins(tmp_path: Path, monkeypatch) -> None:
    sp = Spool(tmp_path, fsync=False)
    sp.open()
    monkeypatch.setattr(sp, "_write", _enospc)
    assert sp.append(lines(2), 2) is False  # an empty spool: nothing older to make room with
    assert (sp.dropped_total, sp.spooled_total, sp._no_room) == (2, 0, True)
    # sealing the active segment to make room fails too: the write is dropped, append does not raise
    monkeypatch.undo()
    sp.append(lines(3), 3)
    monkeypatch.setattr(sp, "_write", _enospc)
    monkeypatch.setattr(sp, "_rotate", _enospc)
    assert sp.append(lines(1, 3), 1) is False
    assert sp.dropped_total == 3 and list_segments(tmp_path) == [1]


def test_a_full_disk_with_only_the_active_segment_seals_it_and_drops_it_for_the_new_write(
        tmp_path: Path, monkeypatch) -> None:
    sp = Spool(tmp_path, fsync=False)
    sp.open()
    sp.append(lines(4), 4)
    real, calls = sp._write, []

    def full_once(data: bytes) -> None:
        calls.append(len(data))
        if len(calls) == 1:
            _enospc()
        real(data)

    monkeypatch.setattr(sp, "_write", full_once)
    assert sp.append(lines(2, 4), 2) is True
    assert list_segments(tmp_path) == [2] and sp._active == 2  # segment 1 sealed and dropped
    assert [int(x.split(b":")[1].split(b"}")[0]) for x in all_read(tmp_path)] == [4, 5]
    assert (sp.dropped_total, sp.pending, sp.problem is not None) == (4, 2, True)


def test_a_failed_write_whose_undo_fails_too_still_reports_the_disk_full(tmp_path: Path, monkeypatch) -> None:
    """The partial line cannot be cut (ftruncate fails): the write's own error decides, so a
    full disk still makes room rather than dropping the events as if the disk were gone."""
    sp = Spool(tmp_path, fsync=False)
    sp.open()
    sp.append(lines(2), 2)

    class Full:
        def __init__(self, f) -> None:
            self.f = f

        def write(self, b) -> int:
            _enospc()

        def __getattr__(self, name):
            return getattr(self.f, name)

    sp._f = Full(sp._f)

    def eio(*a) -> None:
        import errno

        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "ftruncate", eio)
    assert sp.append(lines(1, 2), 1) is True  # room made (segment 1 dropped), written to segment 2
    assert sp.dropped_total == 2 and list_segments(tmp_path) == [2]


def test_a_segment_the_disk_will_not_delete_stays_and_nothing_is_counted(tmp_path: Path, monkeypatch) -> None:
    sp = Spool(tmp_path, max_age=60, segment_bytes=4096, fsync=False)
    sp.open()
    for i in range(3):
        sp.append(lines(30, i * 30), 30)
    segs = list_segments(tmp_path)
    for s in segs[:-1]:
        os.utime(tmp_path / seg_name(s), (time.time() - 120, time.time() - 120))
    real = os.unlink

    def refuse(p, *a, **kw):
        if str(p).startswith(str(tmp_path)):
            raise PermissionError(13, "Permission denied")
        return real(p, *a, **kw)

    monkeypatch.setattr(os, "unlink", refuse)
    sp.gc()
    assert list_segments(tmp_path) == segs and (sp.dropped_total, sp.pending) == (0, 90)
    assert sp.size_bytes() == sum((tmp_path / seg_name(s)).stat().st_size for s in segs)
    monkeypatch.undo()
    sp.gc()  # both old segments go in one pass, counted once
    assert list_segments(tmp_path) == segs[-1:] and sp.dropped_total + sp.pending == 90 and sp.pending < 90


def test_a_segment_deleted_behind_the_spools_back_is_forgotten(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_age=3600, segment_bytes=4096, fsync=False)
    sp.open()
    for i in range(3):
        sp.append(lines(30, i * 30), 30)
    segs = list_segments(tmp_path)
    (tmp_path / seg_name(segs[0])).unlink()
    sp.gc()  # must not raise
    assert segs[0] not in sp._sizes
    assert sp.size_bytes() == sum((tmp_path / seg_name(s)).stat().st_size for s in segs[1:])


def test_pending_counts_from_a_cursor_inside_a_segment_and_never_goes_below_zero(tmp_path: Path) -> None:
    from cmdare.wire.spool import write_cursor

    sp = Spool(tmp_path, fsync=False)
    sp.open()
    sp.append(lines(10), 10)
    write_cursor(tmp_path, "shipped", Position(sp._active, 3 * 101), fsync=False)  # 3 lines of 101 bytes read
    sp.gc()
    assert sp.pending == 7
    sp.commit(Position(sp._active, 10 * 101), 9)  # told more than was pending
    assert sp.pending == 0


def test_at_exactly_the_size_bound_nothing_is_dropped(tmp_path: Path) -> None:
    sp = Spool(tmp_path, max_bytes=3 * 1010, segment_bytes=1010, fsync=False)
    sp.open()
    for i in range(3):
        sp.append(lines(10, i * 10), 10)  # 1010 bytes a segment: three segments, 3030 bytes
    assert sp.size_bytes() == 3030 and sp.dropped_total == 0 and len(list_segments(tmp_path)) == 3
    sp.gc()
    assert sp.dropped_total == 0 and len(list_segments(tmp_path)) == 3
    sp.append(lines(1, 30), 1)
    assert sp.dropped_total == 10  # one byte past: the oldest goes


def test_the_recovery_log_says_how_many_events_were_dropped_meanwhile(tmp_path: Path, monkeypatch, caplog) -> None:
    import errno
    import logging

    sp = Spool(tmp_path, fsync=False)
    sp.open()
    sp.append(lines(1), 1)
    sp.dropped_total = 5  # dropped before this trouble: not this episode's
    caplog.set_level(logging.WARNING, logger="cmdare.agent.spool")
    monkeypatch.setattr(sp, "_write", lambda d: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only file system")))
    assert sp.append(lines(2, 1), 2) is False and sp.append(lines(1, 3), 1) is False
    monkeypatch.undo()
    assert sp.append(lines(1, 4), 1) is True and sp.problem is None
    said = [r.getMessage() for r in caplog.records if "writing again" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("; 3 events dropped meanwhile")


def test_group_commit_syncs_again_at_exactly_the_interval(tmp_path: Path, monkeypatch) -> None:
    import types

    import cmdare.agent.sinks.spool as mod

    clock = [100.0]
    monkeypatch.setattr(mod, "time", types.SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(clock[0]))
    sp = Spool(tmp_path, fsync=True, fsync_interval=0.5)
    sp.open()
    for t in (100.0, 100.25, 100.5, 100.75, 101.0):
        clock[0] = t
        sp.append(lines(1), 1)
    assert synced == [100.0, 100.5, 101.0]


def test_a_full_disk_that_will_not_delete_drops_the_write_instead_of_spinning(tmp_path: Path, monkeypatch) -> None:
    sp = Spool(tmp_path, segment_bytes=1010, fsync=False)
    sp.open()
    sp.append(lines(10), 10)
    sp.append(lines(10, 10), 10)  # two segments
    monkeypatch.setattr(sp, "_write", _enospc)
    monkeypatch.setattr(os, "unlink", lambda *a, **kw: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    assert sp.append(lines(1, 20), 1) is False
    assert sp.dropped_total == 1 and sp.pending == 20 and len(list_segments(tmp_path)) >= 2
