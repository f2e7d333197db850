"""Several collectors in one Kafka consumer group writing one Iceberg lake: 20 real agents
(fake NVML) into a 6-partition topic, three collectors, one SIGKILLed mid-stream and
another added later; every event the agents sent is stored exactly once."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from cmdare.analytics.lakedb import LakeDatabase
from tests.conftest import BIN, KafkaBroker, wait_for
from tests.integration.test_pipeline import check_rows, start_agents

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def collector(url: str, lake: Path, group: str, log: Path, idle_exit: str = "10s") -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "cmdare-collector"), "kafka", url, "--lake", str(lake), "--group", group,
         "--commit-every", "1s", "--max-wait", "0.5s", "--idle-exit", idle_exit, "--progress-every", "2s"],
        stderr=open(log, "a"), stdout=subprocess.DEVNULL,
    )


def committers(lake: Path) -> set[int]:
    """The processes (pids) that have committed a round to the lake."""
    from cmdare.collector.lake import Lake

    try:
        t = Lake(str(lake), create=False).table("lake_commits")
    except Exception:
        return set()
    if t.current_snapshot() is None:
        return set()
    return {int(w.split(":")[1]) for w in t.scan(selected_fields=("writer",)).to_arrow()["writer"].to_pylist()}


def test_three_collectors_one_killed_one_added_store_every_event_once(
        kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"lake-group-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    admin.create_topics([NewTopic(topic, 6, 1)])
    admin.close()
    url, lake, group = kafka_broker.url(topic), tmp_path / "lake", f"g-{uuid.uuid4().hex[:6]}"
    logs = [tmp_path / f"collector-{i}.log" for i in range(4)]
    procs = [collector(url, lake, group, logs[i]) for i in range(3)]
    # the agents send until the collector added later has committed a round of its own
    # (then SIGTERM), not for a fixed time: under load the first commit can come late
    agents = start_agents(tmp_path, url, n=20, duration=120, interval="1s")
    try:
        # mid-stream: once the first has committed a round (and staged more since)
        wait_for(lambda: procs[0].pid in committers(lake), 40, what="the first collector's first commit")
        time.sleep(2)
        assert all(p.poll() is None for p in procs), [log.read_text()[-1500:] for log in logs if log.exists()]
        procs[0].send_signal(signal.SIGKILL)  # its staged round is lost: the lake's positions replay it
        procs[0].wait(timeout=10)
        time.sleep(4)
        procs.append(collector(url, lake, group, logs[3]))
        wait_for(lambda: procs[3].pid in committers(lake), 90, what="the added collector's first commit")
        for a in agents:
            a.proc.send_signal(signal.SIGTERM)
        for a in agents:
            assert a.proc.wait(timeout=120) == 0, a.log.read_text()[-2000:]
        for p, log in zip(procs[1:], logs[1:], strict=True):
            assert p.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        for p in procs + [a.proc for a in agents]:
            p.kill()
    text = "".join(log.read_text() for log in logs)
    assert "lake commits" in text
    with LakeDatabase(str(lake)).read() as con:
        check_rows(con, agents)
    assert procs[3].pid in committers(lake)  # the one added later took partitions over (and kept them)
