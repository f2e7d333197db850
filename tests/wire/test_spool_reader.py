"""The spool's reader side (cmdare.wire.spool: what the Kafka shipper and an embedded
collector read), byte for byte: positions, the read budget, torn and partial lines, segments
deleted under it, cursors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cmdare.wire import spool
from cmdare.wire.spool import START, Position, list_segments, read_cursor, read_lines, seg_name, write_cursor


def _segs(d: Path, *contents: bytes, first: int = 1) -> None:
    for i, c in enumerate(contents):
        (d / seg_name(first + i)).write_bytes(c)


def test_lines_are_read_in_order_with_the_position_after_each_chunk(tmp_path: Path) -> None:
    _segs(tmp_path, b"a\nbb\n", b"", b"ccc\n")  # an empty segment between
    assert read_lines(tmp_path, START, 1000) == (
        [(b"a\nbb\n", Position(1, 5)), (b"ccc\n", Position(3, 4))], Position(3, 4), 0)
    # from the middle of a segment, and from its end
    assert read_lines(tmp_path, Position(1, 2), 1000)[0] == [(b"bb\n", Position(1, 5)), (b"ccc\n", Position(3, 4))]
    assert read_lines(tmp_path, Position(3, 4), 1000) == ([], Position(3, 4), 0)


def test_the_budget_stops_at_the_end_of_the_line_it_cuts_into(tmp_path: Path) -> None:
    _segs(tmp_path, b"a\nbb\nccc\n", b"dd\n")
    assert read_lines(tmp_path, START, 3) == ([(b"a\nbb\n", Position(1, 5))], Position(1, 5), 0)
    assert read_lines(tmp_path, START, 2) == ([(b"a\n", Position(1, 2))], Position(1, 2), 0)
    # a budget spent exactly at a segment's end: the next segment waits for the next read
    assert read_lines(tmp_path, START, 9) == ([(b"a\nbb\nccc\n", Position(1, 9))], Position(1, 9), 0)
    assert read_lines(tmp_path, START, 10) == (
        [(b"a\nbb\nccc\n", Position(1, 9)), (b"dd\n", Position(2, 3))], Position(2, 3), 0)


def test_a_partial_line_waits_in_the_newest_segment_and_is_skipped_as_torn_once_sealed(tmp_path: Path) -> None:
    _segs(tmp_path, b"x\nhalf")
    assert read_lines(tmp_path, START, 1000) == ([(b"x\n", Position(1, 2))], Position(1, 2), 0)
    assert read_lines(tmp_path, Position(1, 2), 1000) == ([], Position(1, 2), 0)
    _segs(tmp_path, b"y\n", first=2)  # a newer segment: the half line will never be finished
    assert read_lines(tmp_path, Position(1, 2), 1000) == ([(b"y\n", Position(2, 2))], Position(2, 2), 1)
    _segs(tmp_path, b"torn", b"z\n", first=3)
    assert read_lines(tmp_path, Position(2, 2), 1000) == ([(b"z\n", Position(4, 2))], Position(4, 2), 1)


def test_segments_deleted_by_the_bounds_are_skipped(tmp_path: Path, monkeypatch) -> None:
    _segs(tmp_path, b"a\n", b"b\n", b"c\n", first=5)
    # the cursor's segment is gone (dropped by the size bound): reading starts at the next
    assert read_lines(tmp_path, Position(2, 40), 1000)[0] == [
        (b"a\n", Position(5, 2)), (b"b\n", Position(6, 2)), (b"c\n", Position(7, 2))]
    # one deleted between listing and opening
    monkeypatch.setattr(spool, "list_segments", lambda d: [5, 6, 7, 8])
    (tmp_path / seg_name(6)).unlink()
    assert read_lines(tmp_path, Position(5, 0), 1000) == (
        [(b"a\n", Position(5, 2)), (b"c\n", Position(7, 2))], Position(8, 0), 0)


def test_only_segment_files_are_listed_in_numeric_order(tmp_path: Path) -> None:
    for name in (seg_name(10), seg_name(9), "cursor.shipped", "1.ndjson", seg_name(3) + ".tmp", ".x"):
        (tmp_path / name).write_bytes(b"")
    assert list_segments(tmp_path) == [9, 10]
    assert list_segments(tmp_path / "missing") == []
    assert seg_name(42) == "0000000000000042.ndjson" and str(Position(3, 17)) == "3 17"
    assert Position(2, 900) < Position(3, 0) < Position(3, 1)
    # positions are values: hashable (kept in sets and as keys) and never changed in place
    assert {Position(3, 1), Position(3, 1)} == {Position(3, 1)}
    with pytest.raises(AttributeError):
        Position(3, 1).offset = 5  # type: ignore[misc]


def test_cursors_round_trip_atomically_and_a_bad_one_reads_as_none(tmp_path: Path, monkeypatch) -> None:
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    write_cursor(tmp_path, "shipped", Position(3, 17))
    assert read_cursor(tmp_path, "shipped") == Position(3, 17) and len(synced) == 1
    assert (tmp_path / "cursor.shipped").read_text() == "3 17\n"
    assert not list(tmp_path.glob(".cursor.*"))  # the temporary file was renamed over it
    write_cursor(tmp_path, "collected", Position(4, 0), fsync=False)
    assert read_cursor(tmp_path, "collected") == Position(4, 0) and len(synced) == 1
    assert read_cursor(tmp_path, "missing") is None
    for text in ("", "3", "3 x", "3 4 5"):
        (tmp_path / "cursor.bad").write_text(text)
        assert read_cursor(tmp_path, "bad") is None, text


@pytest.mark.parametrize("budget", [1, 4, 7, 100])
def test_every_budget_reads_every_line_exactly_once(tmp_path: Path, budget: int) -> None:
    lines = [b"%d\n" % i * (i % 3 + 1) for i in range(30)]
    _segs(tmp_path, b"".join(lines[:10]), b"".join(lines[10:25]), b"".join(lines[25:]))
    got, pos = b"", START
    for _ in range(200):
        chunks, nxt, skipped = read_lines(tmp_path, pos, budget)
        assert skipped == 0 and all(c.endswith(b"\n") for c, _ in chunks)
        got += b"".join(c for c, _ in chunks)
        if nxt == pos:
            break
        pos = nxt
    assert got == b"".join(lines) and pos == Position(3, len(b"".join(lines[25:])))
