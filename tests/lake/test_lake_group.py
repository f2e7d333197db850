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
from tests.conftest import BIN, KafkaBroker
from tests.integration.test_pipeline import check_rows, start_agents

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def collector(url: str, lake: Path, group: str, log: Path, idle_exit: str = "10s") -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "cmdare-collector"), "kafka", url, "--lake", str(lake), "--group", group,
         "--commit-every", "1s", "--max-wait", "0.5s", "--idle-exit", idle_exit, "--progress-every", "2s"],
        stderr=open(log, "a"), stdout=subprocess.DEVNULL,
    )


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
    agents = start_agents(tmp_path, url, n=20, duration=24, interval="1s")
    try:
        time.sleep(10)
        assert all(p.poll() is None for p in procs), [log.read_text()[-1500:] for log in logs if log.exists()]
        procs[0].send_signal(signal.SIGKILL)  # its staged round is lost: the lake's positions replay it
        procs[0].wait(timeout=10)
        time.sleep(4)
        procs.append(collector(url, lake, group, logs[3]))
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
        writers = con.execute("SELECT count(DISTINCT writer) FROM read_parquet("
                              f"'{lake}/cmdare/lake_commits/data/*/*.parquet')").fetchall()[0][0]
    assert writers == 4  # every collector committed something, the killed one before it died
