"""Fault suite, damaged bytes: whatever bytes are changed in a spool segment or a Kafka
message, every line they do not touch is stored exactly once, and nothing is stored twice.

Run alone with ``pytest -m fault``."""

from __future__ import annotations

import uuid
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmdare.collector.consumer import SpoolIngest
from cmdare.collector.db import connect, migrate
from cmdare.collector.writer import Writer
from cmdare.wire.events import EventFactory, decode_line
from cmdare.wire.spool import seg_name
from tests.conftest import examples

pytestmark = pytest.mark.fault

TABLES = ("host_samples", "gpu_samples", "heartbeats", "unknown_events")


def _lines(n: int = 60) -> list[bytes]:
    """Events as an agent spools them: host and gpu samples in the row form, heartbeats as
    JSON; random ids, so that a changed id never equals another line's."""
    rows = EventFactory("node-f", "worker", "job", {"team": "t"}, rows=True)
    out = []
    for i in range(n):
        ts, id_ = 1.75e9 + i, uuid.uuid4().hex
        if i % 3 == 0:
            out.append(rows.line("host", {"cpu_util_ratio": 0.25, "procs": 100 + i}, ts, id=id_))
        elif i % 3 == 1:
            out.append(rows.line("gpu", {"index": i % 8, "uuid": f"GPU-{i % 8}", "util_gpu_ratio": 0.5}, ts, id=id_))
        else:
            out.append(rows.line("heartbeat", {"seq": i, "interval_seconds": 1.0}, ts, id=id_))
    return out


def _damage(lines: list[bytes], flips: list[tuple[int, int]]) -> tuple[bytes, set[int]]:
    """The lines' bytes with each (position, xor) applied, and the lines a flip touched (a
    flip on a newline touches the lines on both sides of it)."""
    text = bytearray(b"".join(lines))
    starts = _starts(lines)
    touched = set()
    for pos, xor in flips:
        pos %= len(text)
        text[pos] ^= xor
        i = max(k for k, s in enumerate(starts) if s <= pos)
        touched.add(i)
        if pos == starts[i] + len(lines[i]) - 1 and i + 1 < len(lines):  # its newline
            touched.add(i + 1)
    return bytes(text), touched


def _starts(lines: list[bytes]) -> list[int]:
    out, at = [], 0
    for x in lines:
        out.append(at)
        at += len(x)
    return out


def _stored(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [i for t in TABLES for (i,) in con.execute(f"SELECT id FROM {t}").fetchall()]


def _check(con: duckdb.DuckDBPyConnection, lines: list[bytes], touched: set[int]) -> None:
    stored = _stored(con)
    assert len(stored) == len(set(stored)), "an event stored twice"
    ids = [decode_line(x)["id"] for x in lines]
    missing = [i for i, id_ in enumerate(ids) if i not in touched and id_ not in set(stored)]
    assert missing == [], f"untouched lines {missing} not stored (touched: {sorted(touched)})"


FLIPS = st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=1, max_value=255)), min_size=1, max_size=6)


@settings(max_examples=examples(200), deadline=None)
@given(flips=FLIPS)
def test_kafka_message_with_changed_bytes_loses_only_the_lines_they_touch(flips) -> None:
    lines = _lines()
    text, touched = _damage(lines, flips)
    con = duckdb.connect()
    migrate(con)
    r = Writer(con).write([("kafka:t/0@1", text)])
    _check(con, lines, touched)
    assert r.dead <= len(touched) + len(flips)  # a dead letter per damaged line, at most
    con.close()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=FLIPS)
def test_spool_segment_with_changed_bytes_loses_only_the_lines_they_touch(tmp_path: Path, flips) -> None:
    lines = _lines()
    text, touched = _damage(lines, flips)
    d = tmp_path / uuid.uuid4().hex
    d.mkdir()
    half = _starts(lines)[len(lines) // 2]  # segments hold whole lines, as the agent writes them
    (d / seg_name(1)).write_bytes(text[:half])
    (d / seg_name(2)).write_bytes(text[half:])
    con = connect(d / "c.duckdb")
    SpoolIngest(con, d).load_available()
    _check(con, lines, touched)
    con.close()

