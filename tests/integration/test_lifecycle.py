"""VM lives end to end with a real Kafka broker: three agent processes, each on its own
fake cloud metadata server.  One VM is preempted (the notice must reach Kafka before the
VM dies, then it is killed hard), one is stopped cleanly (SIGTERM), one is SIGKILLed.
After the collector has loaded the topic into DuckDB, each life ends with the right
classification and the notice is stored once, before its deadline."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.wire import columns
from tests.conftest import BIN, KafkaBroker, agent_env, wait_for
from tests.fakes.metadata import FakeMetadata

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def start_agent(tmp: Path, node: str, url: str, srv: FakeMetadata) -> subprocess.Popen:
    cfg = tmp / f"{node}.toml"
    cfg.write_text(f"""
node = "{node}"
interval = "0.5s"
[spool]
dir = "{tmp / ("spool-" + node)}"
fsync = false
[sink]
url = "{url}"
linger_ms = 5
retry_backoff = "0.5s"
[sources.gpu]
enabled = false
[sources.cloud]
provider = "{srv.cloud}"
metadata_url = "{srv.url}"
poll_interval = "200ms"
""")
    return subprocess.Popen(
        [str(BIN / "cmdare-agent"), "--config", str(cfg)],
        env=agent_env(CMDARE_AGENT_SOURCES__CLOUD__PROVIDER=srv.cloud),
        stderr=open(tmp / f"{node}.log", "w"),
        stdout=subprocess.DEVNULL,
    )


def test_revoked_stopped_and_killed_nodes_are_classified(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    from kafka import KafkaConsumer

    topic = f"it-life-{uuid.uuid4().hex[:6]}"
    url = kafka_broker.url(topic)
    servers = {
        "vm-revoked": FakeMetadata("gce").start(),
        "vm-stopped": FakeMetadata("aws").start(),
        "vm-killed": FakeMetadata("azure", name="vm-killed").start(),
    }
    procs = {n: start_agent(tmp_path, n, url, s) for n, s in servers.items()}
    consumer = KafkaConsumer(
        topic, bootstrap_servers=kafka_broker.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=200
    )
    seen: dict[str, list[dict]] = {}

    def read_topic() -> None:
        for rec in consumer:
            for e in columns.decode(rec.value):  # lines or column blocks
                seen.setdefault(e["type"], []).append(e)

    try:

        def identified() -> bool:
            read_topic()
            return {e["node"] for e in seen.get("instance", [])} == set(servers)

        wait_for(identified, 30, what="every agent's identity on Kafka")
        time.sleep(1.0)
        deadline = servers["vm-revoked"].preempt()

        def noticed() -> bool:
            read_topic()
            return bool(seen.get("revocation"))

        wait_for(noticed, 10, interval=0.05, what="the notice on Kafka")
        on_kafka = time.time()
        assert on_kafka - servers["vm-revoked"].announced_at < 2.0 and on_kafka < deadline
        # the preempted VM dies hard after the notice; the others end as announced
        procs["vm-revoked"].send_signal(signal.SIGKILL)
        procs["vm-stopped"].send_signal(signal.SIGTERM)
        procs["vm-killed"].send_signal(signal.SIGKILL)
        assert procs["vm-stopped"].wait(timeout=10) == 0
        for p in procs.values():
            p.wait(timeout=10)
    finally:
        consumer.close()
        for p in procs.values():
            p.kill()
        for s in servers.values():
            s.stop()
    db = tmp_path / "fleet.duckdb"
    r = subprocess.run(
        [
            str(BIN / "cmdare-collector"),
            "kafka",
            url,
            "--db",
            str(db),
            "--max-wait",
            "0.5s",
            "--idle-exit",
            "3s",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    time.sleep(1.6)  # > 3 intervals of 0.5 s since the kills: the killed lives count as lost
    res = CliRunner().invoke(cli, ["instances", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    lives = {x["node"]: x for x in json.loads(res.output)}
    assert {n: (x["state"], x["end_reason"]) for n, x in lives.items()} == {
        "vm-revoked": ("ended", "revoked"),
        "vm-stopped": ("ended", "stopped"),
        "vm-killed": ("ended", "lost"),
    }
    assert {n: x["cloud"] for n, x in lives.items()} == {
        "vm-revoked": "gce",
        "vm-stopped": "aws",
        "vm-killed": "azure",
    }
    con = duckdb.connect(str(db), read_only=True)
    try:
        ((n, kind, ts, dl),) = con.execute(
            "SELECT count(*), any_value(kind), epoch(any_value(ts)), any_value(deadline) FROM revocations"
        ).fetchall()
        assert (n, kind) == (1, "preemption") and ts < dl
        events = dict(
            con.execute("SELECT node, list(event ORDER BY ts) FROM lifecycle_events GROUP BY node").fetchall()
        )
    finally:
        con.close()
    assert events["vm-stopped"][-1] == "agent_stop" and "agent_stop" not in events["vm-killed"]


def test_an_urgent_event_overtakes_the_spool_backlog(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    """A notice spooled behind a backlog (the broker was away) reaches Kafka before the
    backlog has been shipped, and again in order later; the collector stores it once."""
    from kafka import KafkaConsumer

    from cmdare.agent.config import parse_kafka_url
    from cmdare.agent.sinks.kafka import KafkaSink
    from cmdare.agent.sinks.shipper import Shipper
    from cmdare.agent.sinks.spool import Spool
    from cmdare.wire.events import EventFactory

    topic = f"it-urgent-{uuid.uuid4().hex[:6]}"
    url = parse_kafka_url("sink.url", kafka_broker.url(topic))
    f = EventFactory("vm-1", "worker")
    spool = Spool(tmp_path / "spool", 1 << 30, 86400, 1 << 20, fsync=False)
    spool.open()
    backlog = b"".join(f.line("host", {"cpu_util_ratio": 0.5, "procs": i}) for i in range(20_000))
    spool.append(backlog, 20_000)
    notice = f.line(
        "revocation", {"cloud": "gce", "kind": "preemption", "notice_id": "gce:preempted", "revokes": True}
    )
    spool.append(notice, 1)
    # small batches, as over a slow link: the backlog takes many round trips
    shipper = Shipper(spool, KafkaSink(url, "vm-1", linger_ms=0, message_bytes=4096), batch_bytes=8192)
    shipper.priority(notice)
    shipper.start()
    consumer = KafkaConsumer(
        topic, bootstrap_servers=kafka_broker.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=500
    )
    offsets: list[int] = []  # offsets of messages holding the notice
    last = -1
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and len(offsets) < 2:
            for rec in consumer:
                last = rec.offset
                if b'"revocation"' in rec.value:
                    offsets.append(rec.offset)
        shipper.stop(5.0)
    finally:
        consumer.close()
        spool.close()
    assert len(offsets) == 2, offsets
    assert offsets[0] == 0  # sent first, ahead of 20,000 spooled events
    assert offsets[1] == last  # and again in order, after them
    db = tmp_path / "u.duckdb"
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
    assert r.returncode == 0, r.stderr[-2000:]
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM revocations").fetchone()[0] == 1
        assert con.execute("SELECT count(*) FROM host_samples").fetchone()[0] == 20_000
    finally:
        con.close()
