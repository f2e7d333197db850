"""End to end with a real Kafka broker: agent processes (fake NVML, 2 GPUs each) ->
Kafka -> cmdare-collector -> DuckDB file.  Exact counts per node, no duplicates,
contiguous heartbeats; through a 15 s broker outage and a SIGKILLed collector."""

from __future__ import annotations

import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from tests.conftest import BIN, KafkaBroker, agent_env, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

STOPPED = re.compile(r"stopped in [\d.]+s \(spooled (\d+), shipped (\d+), pending (\d+)\)")


@dataclass
class AgentRun:
    node: str
    proc: subprocess.Popen
    log: Path

    def result(self) -> tuple[int, int, int]:
        text = self.log.read_text()
        m = STOPPED.search(text)
        assert m, f"{self.node} did not stop cleanly:\n{text[-2000:]}"
        return int(m.group(1)), int(m.group(2)), int(m.group(3))


def start_agents(tmp: Path, url: str, n: int, duration: float, interval: str = "0.5s") -> list[AgentRun]:
    runs = []
    for i in range(n):
        node = f"node-{i}"
        cfg = tmp / f"{node}.toml"
        cfg.write_text(f"""
node = "{node}"
role = "worker"
job = "it-job"
interval = "{interval}"
[spool]
dir = "{tmp / ("spool-" + node)}"
fsync = false
[sink]
url = "{url}"
linger_ms = 20
request_timeout = "5s"
retry_backoff = "0.5s"
retry_backoff_max = "2s"
[sources.gpu]
backend = "python:tests.fakes.nvml"
""")
        log = tmp / f"{node}.log"
        p = subprocess.Popen(
            [str(BIN / "cmdare-agent"), "--config", str(cfg), "--duration", str(duration)],
            env=agent_env(CMDARE_FAKE_NVML="gpus=2"),
            stderr=open(log, "w"),
            stdout=subprocess.DEVNULL,
        )
        runs.append(AgentRun(node, p, log))
    return runs


def start_collector(url: str, db: Path, idle_exit: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(BIN / "cmdare-collector"),
            "kafka",
            url,
            "--db",
            str(db),
            "--max-wait",
            "0.5s",
            "--idle-exit",
            idle_exit,
            "--progress-every",
            "2s",
        ],
        stderr=open(log, "a"),
        stdout=subprocess.DEVNULL,
    )


def check_database(db: Path, agents: list[AgentRun]) -> None:
    con = duckdb.connect(str(db), read_only=True)
    try:
        check_rows(con, agents)
    finally:
        con.close()


def check_rows(con: duckdb.DuckDBPyConnection, agents: list[AgentRun]) -> None:
    """Every event each agent sent stored exactly once (counts per node and table, ids,
    heartbeats contiguous), nothing dead-lettered."""
    assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0
    for a in agents:
        spooled, shipped, pending = a.result()
        assert shipped == spooled and pending == 0, f"{a.node}: spooled {spooled}, shipped {shipped}"
        stored = con.execute(
            """
            SELECT (SELECT count(*) FROM host_samples WHERE node = $n) + (SELECT count(*) FROM gpu_samples WHERE node = $n)
                 + (SELECT count(*) FROM gpu_events WHERE node = $n) + (SELECT count(*) FROM heartbeats WHERE node = $n)
                 + (SELECT count(*) FROM agent_status WHERE node = $n) + (SELECT count(*) FROM unknown_events WHERE node = $n)
                 + (SELECT count(*) FROM lifecycle_events WHERE node = $n)
                 + (SELECT count(*) FROM instance_identity WHERE node = $n)
        """,
            {"n": a.node},
        ).fetchone()[0]
        assert stored == spooled, f"{a.node}: {spooled} events sent, {stored} stored"
        ticks, seqs = con.execute(
            "SELECT count(*), list(seq ORDER BY seq) FROM heartbeats WHERE node = ?", [a.node]
        ).fetchone()
        assert seqs == list(range(1, ticks + 1)), f"{a.node}: heartbeat gaps or repeats"
        assert (
            con.execute("SELECT count(*) FROM host_samples WHERE node = ?", [a.node]).fetchone()[0]
            == ticks
        )
        assert (
            con.execute("SELECT count(*) FROM gpu_samples WHERE node = ?", [a.node]).fetchone()[0]
            == 2 * ticks
        )
        assert ticks >= 10
    for table in ("host_samples", "gpu_samples", "heartbeats", "agent_status"):
        n, distinct = con.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
        assert n == distinct, f"duplicates in {table}"


def broker_outage(
    broker: KafkaBroker, tmp: Path, down: float, duration: float, interval: str, kill: bool = False,
    resume_within: float | None = None,
) -> None:
    """Three agents and a collector through ``down`` seconds without the broker (stopped,
    or SIGKILLed with ``kill``): every event each agent spooled is stored exactly once.
    ``resume_within``: each agent's first message after the restart reaches the broker
    within this many seconds of the broker answering again (the topic stamps messages
    with the broker's append time)."""
    topic = f"it-outage-{uuid.uuid4().hex[:6]}"
    url = broker.url(topic)
    if resume_within is not None:
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"message.timestamp.type": "LogAppendTime"})])
        admin.close()
    db = tmp / "fleet.duckdb"
    agents = start_agents(tmp, url, n=3, duration=duration, interval=interval)
    collector = start_collector(url, db, idle_exit=f"{down + 30:.0f}s", log=tmp / "collector.log")
    try:
        time.sleep(6)
        broker.kill() if kill else broker.stop()
        time.sleep(down)
        restart = time.time()
        broker.start()
        up = time.time()  # scripts/kafka start returns once the broker answers
        for a in agents:
            assert a.proc.wait(timeout=90) == 0, a.log.read_text()[-2000:]
        assert collector.wait(timeout=120) == 0, (tmp / "collector.log").read_text()[-3000:]
    finally:
        for p in [collector] + [a.proc for a in agents]:
            p.kill()
    check_database(db, agents)
    # the outage really happened and was seen by the agents
    assert any("kafka sink failing" in a.log.read_text() for a in agents)
    if resume_within is not None:
        first = first_append_after(broker, topic, restart)  # seconds after the restart began
        resumed = {n: round(t - (up - restart), 2) for n, t in first.items()}  # after it answered
        assert set(resumed) == {a.node for a in agents}, (first, up - restart)
        assert max(resumed.values()) <= resume_within, resumed


def first_append_after(broker: KafkaBroker, topic: str, t: float) -> dict[str, float]:
    """node -> seconds from ``t`` to the broker's first append of its messages after ``t``."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    out: dict[str, float] = {}
    try:
        c.topics()  # loads the metadata partitions_for_topic reads
        parts = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or [])]
        assert parts, f"no partitions of {topic}"
        c.assign(parts)
        c.seek_to_beginning(*parts)
        ends = c.end_offsets(parts)
        deadline = time.monotonic() + 60
        while any(c.position(tp) < ends[tp] for tp in parts) and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=1000).values():
                for rec in recs:
                    node = (rec.key or b"").decode()
                    if rec.timestamp / 1000 >= t and node not in out:
                        out[node] = round(rec.timestamp / 1000 - t, 2)
    finally:
        c.close()
    return out


def test_three_agents_through_a_15s_broker_outage(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    broker_outage(kafka_broker, tmp_path, down=15, duration=30, interval="0.5s")


def test_collector_sigkilled_mid_stream(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    url = kafka_broker.url(f"it-kill-{uuid.uuid4().hex[:6]}")
    db = tmp_path / "fleet.duckdb"
    log = tmp_path / "collector.log"
    agents = start_agents(tmp_path, url, n=3, duration=14, interval="0.2s")
    first = start_collector(url, db, idle_exit="60s", log=log)
    try:
        time.sleep(6)
        assert first.poll() is None
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        second = start_collector(url, db, idle_exit="5s", log=log)
        for a in agents:
            assert a.proc.wait(timeout=60) == 0, a.log.read_text()[-2000:]
        assert second.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        for p in [first] + [a.proc for a in agents]:
            p.kill()
    check_database(db, agents)


def test_malformed_messages_are_dead_lettered_and_good_ones_after_them_land(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from kafka import KafkaProducer

    from cmdare.wire.events import EventFactory, encode

    topic = f"it-bad-{uuid.uuid4().hex[:6]}"
    f = EventFactory("good-node", "worker", "j")
    good = [f.make("gpu", {"index": i, "util_gpu_ratio": 0.5}) for i in range(3)]
    bad = [
        b'{"v":1,"id":"x","ts":1.7e9,"node":"n","role":"worker","type":"gpu","data":{"ind',  # truncated JSON
        b'{"v":1,"id":"y","ts":1.7e9,"node":"n","role":"worker","type":"gpu","data":{"util_gpu_ratio":"full"}}',
        b'{"v":9,"id":"z","ts":1.7e9,"node":"n","role":"worker","type":"gpu","data":{}}',
        b"B" * (5 << 20),
        bytes(range(128, 256)) * 16 + b"\xff",  # binary, one line: not UTF-8 (line by line now)
    ]
    prod = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, max_request_size=8 << 20, acks="all")
    prod.send(topic, encode(good[0]), key=b"k")
    for b in bad:
        prod.send(topic, b, key=b"k")
    prod.send(topic, encode(good[1]) + encode(good[2]), key=b"k")
    prod.flush()
    prod.close()
    db = tmp_path / "c.duckdb"
    r = subprocess.run(
        [
            str(BIN / "cmdare-collector"),
            "kafka",
            kafka_broker.url(topic),
            "--db",
            str(db),
            "--idle-exit",
            "3s",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    con = duckdb.connect(str(db), read_only=True)
    reasons = [x[0] for x in con.execute("SELECT reason FROM dead_letters ORDER BY origin").fetchall()]
    assert reasons == [
        "not valid JSON",
        'gpu.util_gpu_ratio must be float, got "full"',
        "unsupported wire format version 9 (this collector reads v1)",
        "event of 5242880 bytes exceeds the 1048576 byte limit",
        reasons[4],
    ] and reasons[4].startswith("not UTF-8 text")
    assert sorted(x[0] for x in con.execute('SELECT "index" FROM gpu_samples').fetchall()) == [0, 1, 2]


def test_collector_resumes_after_a_broker_restart_while_idle(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Nothing in flight when the broker goes: no commit fails, so only the collector's
    stall check (end offsets past its position) can notice a wedged consumer."""
    from kafka import KafkaProducer

    from cmdare.wire.events import EventFactory, encode_many

    topic = f"it-idle-{uuid.uuid4().hex[:6]}"
    f = EventFactory("idle-node", "worker", "j")

    def produce(n: int) -> None:
        prod = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
        prod.send(topic, encode_many(f.make("heartbeat", {"seq": i}) for i in range(n)), key=b"k")
        prod.flush()
        prod.close()

    produce(5)
    log = tmp_path / "collector.log"
    collector = start_collector(kafka_broker.url(topic), tmp_path / "c.duckdb", idle_exit="40s", log=log)
    try:
        time.sleep(6)
        kafka_broker.stop()
        time.sleep(8)
        kafka_broker.start()
        produce(7)
        assert collector.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        collector.kill()
    con = duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM heartbeats").fetchone()[0] == 12


def test_a_second_collector_without_partitions_stays_in_the_group(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Two collectors in one group on a one-partition topic: the one without a partition is
    a stable member and is left alone (no rejoin churn that would move the partition)."""
    import threading

    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    from cmdare.agent.config import parse_kafka_url
    from cmdare.collector.consumer import KafkaIngest
    from cmdare.collector.db import connect
    from cmdare.wire.events import EventFactory, encode_many

    topic = f"it-two-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    admin.close()
    prod = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
    f = EventFactory("n", "worker", "j")
    prod.send(topic, encode_many(f.make("heartbeat", {"seq": i}) for i in range(3)), key=b"k")
    prod.flush()
    url = parse_kafka_url("url", kafka_broker.url(topic))
    ings, threads = [], []
    for i in range(2):
        ing = KafkaIngest(connect(tmp_path / f"c{i}.duckdb"), url, group=f"two-{topic}", max_wait=0.2)
        ing.assign_after = 3.0
        ings.append(ing)
        threads.append(threading.Thread(target=ing.run, daemon=True))
    for t in threads:
        t.start()
        time.sleep(1.0)
    try:
        wait_for(lambda: sum(i.totals.events for i in ings) == 3, 30, what="the 3 events stored")
        time.sleep(8)  # well past assign_after for the member without a partition
        assert sorted(len(i.consumer.assignment()) for i in ings) == [0, 1]
        assert [i.rejoins for i in ings] == [0, 0]
        prod.send(topic, encode_many(f.make("heartbeat", {"seq": 10 + i}) for i in range(2)), key=b"k")
        prod.flush()
        wait_for(lambda: sum(i.totals.events for i in ings) == 5, 30, what="2 more events")
    finally:
        prod.close()
        for i in ings:
            i.stop()
        for t in threads:
            t.join(15)


def test_kafka_batches_stay_within_batch_bytes(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    """--batch-bytes bounds a transaction's message data (the collector's memory): polls
    ask for no more records than the batch has room for, so a backlog of many messages is
    not swallowed by one poll (kafka-python returns up to 256 records at once)."""
    from kafka import KafkaProducer

    from cmdare.agent.config import parse_kafka_url
    from cmdare.collector.consumer import KafkaIngest
    from cmdare.collector.db import connect
    from cmdare.wire.events import EventFactory, encode_many

    topic = f"it-batches-{uuid.uuid4().hex[:6]}"
    prod = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all", max_request_size=4 << 20)
    f = EventFactory("n", "worker", "j")
    sizes = []
    for m in range(40):  # 40 messages of ~100 KiB, 16,000 events
        value = encode_many(f.make("heartbeat", {"seq": m * 400 + i}) for i in range(400))
        sizes.append(len(value))
        prod.send(topic, value, key=b"k")
    prod.flush()
    prod.close()
    ing = KafkaIngest(
        connect(tmp_path / "c.duckdb"),
        parse_kafka_url("url", kafka_broker.url(topic)),
        group=f"b-{topic}",
        batch_bytes=1 << 20,
        max_wait=5.0,
    )
    written: list[int] = []
    write_batch = ing.writer.write_batch
    ing.writer.write_batch = lambda batch, position=None: (  # type: ignore[method-assign]
        written.append(batch.bytes) or write_batch(batch, position)
    )
    totals = ing.run(idle_exit=3.0)
    ing.close()
    assert totals.events == 16_000 and totals.dead == 0
    assert sum(written) == sum(sizes)
    assert max(written) <= (1 << 20) + max(sizes)  # at most one message past the bound
    assert len(written) >= sum(sizes) // ((1 << 20) + max(sizes))
