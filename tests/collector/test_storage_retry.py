"""What the collector does while its database's storage fails (a full disk, a read-only
remount, a quota): the same batch is tried again on a capped exponential backoff, said once
when it starts and once when it ends, and nothing is acknowledged past what is stored: not
the spool position (tests/collector/test_disk_full.py, on a real full filesystem) and not
the Kafka offsets (here, with a real broker and a database that refuses commits)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path

import duckdb
import pytest

from cmdare.collector.consumer import StorageRetry, storage_problem

FULL = duckdb.IOException('Could not write file "c.duckdb.wal": No space left on device')


class Clock(threading.Event):
    """A stop event whose waits are recorded, not slept."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


def failing(n: int, error: BaseException = FULL):
    calls = [0]

    def store():
        calls[0] += 1
        if calls[0] <= n:
            raise error
        return "stored"

    return store, calls


def test_backoff_doubles_from_one_second_to_thirty_and_the_batch_is_stored_once(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cmdare.collector")
    stop = Clock()
    store, calls = failing(8)
    assert StorageRetry(stop)(store) == "stored"
    assert stop.waits == [1, 2, 4, 8, 16, 30, 30, 30] and calls[0] == 9
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and said[0].startswith("cannot store a batch: ") and "No space left" in said[0]
    assert said[1].startswith("storing works again after") and "8 failed tries" in said[1]


def test_other_errors_and_a_stop_are_not_retried() -> None:
    stop = Clock()
    store, calls = failing(1, duckdb.ConversionException("bad value"))
    with pytest.raises(duckdb.ConversionException):
        StorageRetry(stop)(store)
    assert calls[0] == 1 and stop.waits == []
    stop.set()  # shutting down: the failure is reported, not waited out
    store, calls = failing(5)
    with pytest.raises(duckdb.IOException):
        StorageRetry(stop)(store)
    assert calls[0] == 1


@pytest.mark.parametrize("text, why", [
    ('IO Error: Could not write file "x.wal": No space left on device', 'Could not write file "x.wal": No space'),
    ("TransactionContext Error: Failed to commit: Read-only file system", "Read-only file system"),
    ("Disk quota exceeded", "Disk quota exceeded"),
    ("Conversion Error: Could not convert string 'a' to INT32", None),
])
def test_what_counts_as_storage_trouble(text: str, why: str | None) -> None:
    got = storage_problem(duckdb.IOException(text))
    assert (got is None) if why is None else (got is not None and why in got and "Failed to commit" not in got)


def test_a_batch_that_fails_for_memory_is_stored_again_not_the_end_of_the_process(tmp_path: Path) -> None:
    """The second hostile round: parallel queries took the collector's memory, an ingest
    batch failed with DuckDB's "Out of Memory Error" and the collector exited. The batch is
    now tried again (its transaction was rolled back whole) and stored once. Here DuckDB
    really runs out: its limit is 2 MB until the second wait, as if the queries ended."""
    from cmdare.collector.db import connect
    from cmdare.collector.ingest.batch import Batch
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import EventFactory, encode_many

    assert storage_problem(MemoryError()) == "out of memory (out of memory)"
    con = connect(tmp_path / "m.duckdb")
    w = Writer(con, max_skew=None)
    f = EventFactory("n", "worker", "j")
    batch = Batch()
    for m in range(20):
        batch.add(f"m{m}", encode_many(f.make("gpu", {"index": i % 8, "util_gpu_ratio": 0.5}) for i in range(5000)))

    class Freed(Clock):
        def wait(self, timeout: float | None = None) -> bool:
            if len(self.waits) == 1:
                con.execute("SET memory_limit = '2GB'")
            return super().wait(timeout)

    con.execute("SET memory_limit = '2MB'")
    stop = Freed()
    r = StorageRetry(stop)(lambda: w.write_batch(batch))
    assert r.inserted == 100_000 and stop.waits == [1, 2]
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone() == (100_000,)
    con.close()


@pytest.mark.kafka
@pytest.mark.slow  # a broker, a failing store and its retries (23 s): the full run
def test_kafka_offsets_are_not_committed_past_what_was_stored(kafka_broker, tmp_path: Path, monkeypatch) -> None:
    """The database refuses commits (as a full disk does) from the third batch on: the
    group's committed offsets never pass the rows stored; once it stores again every event
    is there once and the offsets reach the end."""
    from kafka import KafkaAdminClient, KafkaProducer

    from cmdare.collector import consumer
    from cmdare.collector.consumer import KafkaIngest
    from cmdare.collector.db import connect, cursor
    from cmdare.wire.events import EventFactory, encode_many
    from cmdare.wire.kafka import parse_kafka_url

    topic, group = f"it-full-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    prod = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
    f = EventFactory("n", "worker", "j")
    for m in range(30):  # 30 messages of 100 heartbeats, one a batch (max_wait is short)
        prod.send(topic, encode_many(f.make("heartbeat", {"seq": m * 100 + i}) for i in range(100)), key=b"n")
        prod.flush()
    prod.close()
    con = connect(tmp_path / "c.duckdb")
    ing = KafkaIngest(con, parse_kafka_url("url", kafka_broker.url(topic)), group=group, batch_bytes=4000,
                      max_wait=0.2)
    monkeypatch.setattr(consumer, "StorageRetry", lambda stop: StorageRetry(stop, first=0.05, most=0.2))
    real = ing.writer.write_batch
    full = threading.Event()
    stored_batches = [0]

    def write_batch(batch, position=None):
        if full.is_set():
            raise duckdb.IOException('Could not write file "c.duckdb.wal": No space left on device')
        r = real(batch, position)
        stored_batches[0] += 1
        if stored_batches[0] == 3:
            full.set()
        return r

    ing.writer.write_batch = write_batch  # type: ignore[method-assign]
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    reader = cursor(con)

    def committed() -> int:
        offs = admin.list_group_offsets(group).get(group, {})
        return sum(o.offset for o in offs.values() if o.offset >= 0)

    ing.open()
    t = threading.Thread(target=ing.run, kwargs={"idle_exit": 3.0})
    t.start()
    try:
        deadline = time.monotonic() + 60
        while not (getattr(ing, "_pipe", None) and ing._pipe.retry.failures >= 5) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ing._pipe.retry.failures >= 5, "the store never failed"
        time.sleep(0.5)
        stored = reader.execute("SELECT count(*) FROM heartbeats").fetchall()[0][0]
        assert stored == 300 and committed() * 100 <= stored  # 3 batches of one message each
        full.clear()
        t.join(timeout=60)
        assert not t.is_alive()
    finally:
        ing.stop()
        t.join(timeout=30)
        ing.close()
    assert reader.execute("SELECT count(*), count(DISTINCT id) FROM heartbeats").fetchall() == [(3000, 3000)]
    assert committed() == 30
    admin.close()
    con.close()


def test_a_rollback_that_fails_for_memory_costs_no_later_batch(tmp_path: Path) -> None:
    """bench/hostile_load.py found it: under six parallel memory attacks an ingest batch
    failed for memory and so did its ROLLBACK, leaving the connection in an aborted
    transaction; every later batch then failed ("Current transaction is aborted") and 334
    of 338 were lost. The next batch now ends that transaction and is stored."""
    from cmdare.collector.db import connect
    from cmdare.collector.ingest.batch import Batch
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import EventFactory, encode_many

    con = connect(tmp_path / "r.duckdb")
    f = EventFactory("n", "worker", "j")

    def batch(k: int) -> Batch:
        b = Batch()
        b.add(f"m{k}", encode_many(f.make("gpu", {"index": i % 8, "util_gpu_ratio": 0.5}) for i in range(100)))
        return b

    class Con:  # the collector's connection: its first batch fails inside DuckDB, and so does its ROLLBACK
        began = failed = False

        def execute(self, sql: str, *a):
            if sql == "BEGIN":
                Con.began = True
            elif Con.began and not Con.failed and sql != "ROLLBACK":
                con.execute("SELECT CAST('x' AS INTEGER)")  # fails inside DuckDB: the transaction is aborted
            if sql == "ROLLBACK" and not Con.failed:
                Con.failed = True
                raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")
            return con.execute(sql, *a)

        def __getattr__(self, k: str):
            return getattr(con, k)

    w = Writer(Con(), max_skew=None, rollup_every=None)  # type: ignore[arg-type]
    with pytest.raises(duckdb.ConversionException):
        w.write_batch(batch(-1))
    assert Con.failed
    for k in range(3):
        assert w.write_batch(batch(k)).inserted == 100
    assert con.execute("SELECT count(*) FROM gpu_samples").fetchone() == (300,)
    con.close()
