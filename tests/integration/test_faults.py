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
from tests.integration.test_pipeline import check_database, start_agents, start_collector

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.fault]


def test_three_agents_through_a_broker_killed_for_30s(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    url = kafka_broker.url(f"it-kill-{uuid.uuid4().hex[:6]}")
    db = tmp_path / "fleet.duckdb"
    agents = start_agents(tmp_path, url, n=3, duration=65, interval="0.2s")
    collector = start_collector(url, db, idle_exit="60s", log=tmp_path / "collector.log")
    try:
        time.sleep(6)
        kafka_broker.kill()
        time.sleep(30)
        kafka_broker.start()
        for a in agents:
            assert a.proc.wait(timeout=90) == 0, a.log.read_text()[-2000:]
        assert collector.wait(timeout=120) == 0, (tmp_path / "collector.log").read_text()[-3000:]
    finally:
        for p in [collector] + [a.proc for a in agents]:
            p.kill()
    check_database(db, agents)  # every event spooled is stored, once; heartbeats without gaps
    assert any("kafka sink failing" in a.log.read_text() for a in agents)


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
