"""Fault suite, killed processes: the Kafka broker SIGKILLed for 30 s with three agents
shipping every 0.2 s and a collector consuming throughout, and an agent SIGKILLed mid-run
and restarted on its spool.  Per node, every event the agents say they took is stored
exactly once.  Run alone with ``pytest -m fault``."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import duckdb
import pytest

from tests.conftest import KafkaBroker
from tests.integration.test_pipeline import broker_outage, start_agents, start_collector

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.fault]


def test_three_agents_through_a_broker_killed_for_30s(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    """Agents resume about 10 s after the restart: the broker's recovery plus their backoff."""
    broker_outage(kafka_broker, tmp_path, down=30, duration=65, interval="0.2s", kill=True, resume_within=12)


def test_an_agent_killed_and_restarted_on_its_spool_stores_each_event_once(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """SIGKILL gives the agent no chance to flush or move its cursor: on restart it ships
    again from the last acknowledged position, and the collector stores each event once.
    Nothing is lost (the kernel still has what the killed process wrote; only a power loss
    would cost what was written since the last fsync)."""
    url = kafka_broker.url(f"it-agentkill-{uuid.uuid4().hex[:6]}")
    db = tmp_path / "fleet.duckdb"
    (first,) = start_agents(tmp_path, url, n=1, duration=60, interval="0.2s")
    time.sleep(5)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    first.log.rename(tmp_path / "killed.log")
    (second,) = start_agents(tmp_path, url, n=1, duration=5, interval="0.2s")  # the same node and spool
    collector = start_collector(url, db, idle_exit="10s", log=tmp_path / "collector.log")
    try:
        assert second.proc.wait(timeout=60) == 0, second.log.read_text()[-2000:]
        assert collector.wait(timeout=90) == 0, (tmp_path / "collector.log").read_text()[-3000:]
    finally:
        for p in (collector, second.proc):
            p.kill()
    con = duckdb.connect(str(db), read_only=True)
    for table in ("host_samples", "gpu_samples", "heartbeats", "agent_status", "lifecycle_events"):
        n, distinct = con.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
        assert n == distinct, f"duplicates in {table}"
    runs = con.execute(
        "SELECT instance, list(seq ORDER BY seq) FROM heartbeats GROUP BY instance ORDER BY min(ts)"
    ).fetchall()
    assert len(runs) == 2  # the killed agent's and the restarted one's
    for _, seqs in runs:
        assert seqs == list(range(1, len(seqs) + 1)), "a heartbeat lost or stored twice"
    assert len(runs[0][1]) >= 15  # about 5 s at 0.2 s of the killed agent, all there
    assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0
    con.close()


def test_a_damaged_spool_segment_is_shipped_and_only_its_damaged_lines_are_lost(
    kafka_broker: KafkaBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes the agent did not write in a spool segment (a bad sector): the shipper says so
    once, ships the segment in column blocks and lines as usual, and the collector stores
    every line the damage does not touch and dead-letters the ones it does, with their bytes."""
    import logging
    import subprocess

    from cmdare.agent.sinks.kafka import KafkaSink
    from cmdare.agent.sinks.shipper import Shipper
    from cmdare.agent.sinks.spool import Spool
    from cmdare.wire.events import EventFactory
    from cmdare.wire.kafka import parse_kafka_url
    from cmdare.wire.spool import list_segments, seg_name
    from tests.conftest import BIN

    topic = f"it-damaged-{uuid.uuid4().hex[:6]}"
    url = parse_kafka_url("sink.url", kafka_broker.url(topic))
    f = EventFactory("vm-d", "worker", rows=True)
    spool = Spool(tmp_path / "spool", segment_bytes=1 << 20, fsync=False)
    spool.open()
    lines = [f.line("host", {"cpu_util_ratio": 0.5, "procs": i}, 1.75e9 + i) for i in range(2000)]
    spool.append(b"".join(lines), 2000)
    (seg,) = list_segments(tmp_path / "spool")
    path = tmp_path / "spool" / seg_name(seg)
    raw = bytearray(path.read_bytes())
    at = sum(map(len, lines[:1000])) + 5  # inside line 1000 (0-based 999 ends before it)
    raw[at : at + 3] = b"\xff\xfe\xfd"
    path.write_bytes(bytes(raw))
    caplog.set_level(logging.WARNING, logger="cmdare.agent.shipper")
    shipper = Shipper(spool, KafkaSink(url, "vm-d", linger_ms=0), batch_bytes=1 << 20, columns=True)
    shipper.start()
    try:
        deadline = time.monotonic() + 60
        while shipper.shipped_total < 2000 and time.monotonic() < deadline:
            time.sleep(0.1)
        shipper.stop(5.0)
    finally:
        spool.close()
    said = [r.getMessage() for r in caplog.records if "did not write" in r.getMessage()]
    assert len(said) == 1 and f"not UTF-8 at offset {at}" in said[0]
    db = tmp_path / "d.duckdb"
    r = subprocess.run(
        [str(BIN / "cmdare-collector"), "kafka", kafka_broker.url(topic), "--db", str(db), "--idle-exit", "3s"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "dead-lettered (1 damaged line)," in r.stderr
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), count(DISTINCT id) FROM host_samples").fetchone() == (1999, 1999)
    ((reason, raw_len),) = con.execute("SELECT reason, raw_bytes FROM dead_letters").fetchall()
    assert reason == "not UTF-8 text (byte 5 of the line)" and raw_len == len(lines[1000]) - 1
    con.close()
