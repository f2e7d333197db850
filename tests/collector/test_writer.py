"""The DuckDB writer on real database files: typed rows, de-duplication, dead letters
with reasons, unknown types, migrations, and that bad input never damages what is stored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from cmdare.collector.db import ROW_GROUP_SIZE, DatabaseError, connect, migrations
from cmdare.collector.writer import RAW_CAP, Writer
from cmdare.wire import columns
from cmdare.wire.events import EventFactory, decode_line, encode, encode_many


@pytest.fixture()
def db(tmp_path: Path):
    con = connect(tmp_path / "c.duckdb")
    yield con
    con.close()


def count(con, table: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


F = EventFactory("node-a", "worker", "job-1", {"team": "x"})


def gpu(i: int = 0, **extra):
    return F.make(
        "gpu",
        {
            "index": i,
            "uuid": f"GPU-{i}",
            "name": "A100",
            "util_gpu_ratio": 0.5,
            "mem_used_bytes": 10,
            "throttle_reasons": ["sw_power_cap"],
            "processes": [{"pid": 7, "used_bytes": 3}],
            **extra,
        },
    )


def test_typed_rows_land_with_units_and_envelope(db) -> None:
    g, h = (
        gpu(),
        F.make(
            "host",
            {
                "cpu_util_ratio": 0.25,
                "cpu_per_core_ratio": [0.5, 0.0],
                "net": [{"nic": "eth0", "rx_bytes_total": 5}],
                "procs": 9,
            },
        ),
    )
    r = Writer(db).write([("t:1", encode_many([g, h]))])
    assert r.rows["gpu_samples"] == 1 and r.rows["host_samples"] == 1 and r.dead == 0
    row = db.execute(
        "SELECT id, node, job, \"index\", util_gpu_ratio, throttle_reasons, processes->>'$[0].pid', "
        "epoch(ts) FROM gpu_samples"
    ).fetchone()
    assert row[:6] == (g["id"], "node-a", "job-1", 0, 0.5, ["sw_power_cap"]) and row[6] == "7"
    assert abs(row[7] - g["ts"]) < 1e-5
    assert db.execute("SELECT cpu_per_core_ratio, procs FROM host_samples").fetchone() == ([0.5, 0.0], 9)
    assert db.execute("SELECT role, job, labels->>'team' FROM nodes").fetchone() == ("worker", "job-1", "x")


@pytest.mark.parametrize("form", ["json", "rows", "blocks"])
def test_a_node_keeps_its_agents_job_and_its_newest_role_and_labels(db, form: str) -> None:
    def batch(role: str, job: str, team: str, t: float, train: bool = True) -> bytes:
        f = EventFactory("node-a", role, job, {"team": team}, rows=form != "json")
        lines = [f.line("host", {"cpu_util_ratio": 0.5}, t), f.line("gpu", {"index": 0, "uuid": "G"}, t)]
        if train:  # the training job's id in the envelope, and the newest event of the batch
            lines.append(
                f.line("train_steps", {"run": "r", "rank": 0, "steps": 3}, t + 1, job="resnet-train")
            )
        text = b"".join(lines)
        return columns.encode(text) if form == "blocks" else text

    def node() -> tuple:
        return db.execute(
            "SELECT role, job, labels->>'team', epoch(first_seen), epoch(last_seen) FROM nodes"
        ).fetchone()

    w = Writer(db)
    assert w.write([("t:1", batch("worker", "fleet-a", "x", 100.0))]).dead == 0
    assert node() == ("worker", "fleet-a", "x", 100.0, 101.0)
    w.write([("t:2", batch("ps", "fleet-old", "old", 50.0))])  # an older spool loaded later
    assert node() == ("worker", "fleet-a", "x", 50.0, 101.0)
    w.write([("t:3", batch("ps", "fleet-b", "y", 200.0, train=False))])  # newer: replaces them
    assert node() == ("ps", "fleet-b", "y", 50.0, 200.0)
    f = EventFactory("node-a", "ps", "fleet-b", {"team": "y"}, rows=form != "json")
    w.write([("t:4", f.line("train_job", {"run": "r", "rank": 0}, 300.0, job="resnet-train"))])
    assert node() == ("ps", "fleet-b", "y", 50.0, 300.0)  # training events alone: job kept
    # a GPU a Kubernetes pod holds is sent as the pod's job's, the newest event of its batch:
    # the node's job stays the agent's (its pods come and go, several at once)
    held = [f.line("host", {"cpu_util_ratio": 0.5}, 400.0),
            f.line("gpu", {"index": 0, "uuid": "G", "namespace": "nlp", "pod": "bert-0"}, 401.0, job="nlp/bert-0")]
    w.write([("t:5", columns.encode(b"".join(held)) if form == "blocks" else b"".join(held))])
    assert node() == ("ps", "fleet-b", "y", 50.0, 401.0)
    assert db.execute("SELECT job FROM gpu_samples WHERE ts = to_timestamp(401)::TIMESTAMP").fetchone() == ("nlp/bert-0",)


def test_an_event_delivered_twice_is_stored_once(db) -> None:
    evs = [gpu(i) for i in range(4)]
    w = Writer(db)
    w.write([("t:1", encode_many(evs)), ("t:2", encode_many(evs[:2]))])  # twice in one batch
    r = w.write([("t:1", encode_many(evs))])  # and again later (a replay)
    assert r.inserted == 0 and r.duplicates == 4
    assert count(db, "gpu_samples") == 4


MALFORMED = [
    (b'{"v":1,"id":"a","ts":17', "not valid JSON"),
    (
        b'{"v":2,"id":"a","ts":1.7e9,"node":"n","role":"worker","type":"gpu","data":{}}',
        "unsupported wire format version 2 (this collector reads v1)",
    ),
    (
        b'{"v":1,"id":"a","ts":"noon","node":"n","role":"worker","type":"gpu","data":{}}',
        "field 'ts' must be unix seconds, got \"noon\"",
    ),
    (
        b'{"v":1,"id":"a","ts":1.7e9,"node":"n","role":"worker","type":"gpu","data":{"util_gpu_ratio":"high"}}',
        'gpu.util_gpu_ratio must be float, got "high"',
    ),
    (
        b'{"v":1,"id":"a","ts":1.7e9,"node":"n","role":"worker","type":"gpu","data":{"index":0.5}}',
        "gpu.index must be int, got 0.5",
    ),
    (
        b'{"v":1,"id":"a","ts":1.7e9,"node":"n","role":"worker","type":"host","data":7}',
        "field 'data' must be an object",
    ),
    (
        b'{"v":1,"id":"a","ts":1.7e9,"node":"n","role":"boss","type":"host","data":{}}',
        "field 'role' must be one of worker, ps, chief, data, client, got \"boss\"",
    ),
    (b"[1,2,3]", "event is a JSON array, expected an object"),
    (
        b'{"v":1,"ts":1.7e9,"node":"n","role":"worker","type":"host","data":{}}',
        "field 'id' must be a non-empty string of at most 64 characters",
    ),
    (
        b'{"v":1,"id":"a","ts":1.7e9,"node":"n","role":"worker","type":"host","data":{},"labels":{"a":1}}',
        "field 'labels' must be an object of string values",
    ),
    (
        b'{"v":1,"id":"a","ts":1.7e9,"node":"n","role":"worker","type":"status","data":{"ok":"yes"}}',
        'status.ok must be bool, got "yes"',
    ),
    # rare types have their data parsed with their own fields: same checks, same reasons
    (
        b'{"v":1,"id":"a","ts":1.7e9,"node":"n","role":"worker","type":"lifecycle","data":{"boot_time":"yesterday"}}',
        'lifecycle.boot_time must be float, got "yesterday"',
    ),
    (
        b'{"v":1,"id":"a","ts":1.7e9,"node":"n","role":"worker","type":"train_job","data":{"params":2.5}}',
        "train_job.params must be int, got 2.5",
    ),
    (
        b'{"v":1,"id":"a","ts":1.7e9,"node":"n","role":"worker","type":"revocation","data":["TRUE"]}',
        "field 'data' must be an object",
    ),
]


@pytest.mark.parametrize("line,reason", MALFORMED, ids=[r[:30] for _, r in MALFORMED])
def test_malformed_lines_are_dead_lettered_with_a_reason(db, line: bytes, reason: str) -> None:
    good_before, good_after = gpu(0), gpu(1)
    msg = encode(good_before) + line + b"\n" + encode(good_after)
    r = Writer(db).write([("kafka:t/0@5", msg)])
    assert r.dead == 1 and r.rows["gpu_samples"] == 2
    assert db.execute("SELECT origin, line, reason, raw FROM dead_letters").fetchone() == (
        "kafka:t/0@5",
        2,
        reason,
        line,
    )


def test_binary_garbage_and_huge_blobs(db) -> None:
    blob = b"A" * (5 << 20)  # a 5 MB message that is not an event
    garbage = b"\x00\xff\xfe binary\n\x80\x81\n" + b"\xff" * 100  # three lines, none UTF-8
    r = Writer(db).write([("k:1", garbage), ("k:2", blob), ("k:3", encode(gpu()))])
    assert r.rows["gpu_samples"] == 1 and r.dead == 4 and r.not_utf8 == 3
    rows = db.execute(
        "SELECT origin, line, reason, octet_length(raw), raw_bytes FROM dead_letters ORDER BY origin, line"
    ).fetchall()
    assert rows[:3] == [
        ("k:1", 1, "not UTF-8 text (byte 1 of the line)", 10, 10),
        ("k:1", 2, "not UTF-8 text (byte 0 of the line)", 2, 2),
        ("k:1", 3, "not UTF-8 text (byte 0 of the line)", 100, 100),
    ]
    assert rows[3] == ("k:2", 1, "event of 5242880 bytes exceeds the 1048576 byte limit", RAW_CAP, 5 << 20)


@pytest.mark.parametrize("rows", [False, True], ids=["json", "rows"])
def test_damage_costs_only_the_lines_it_touches(db, rows: bool) -> None:
    """Two runs of random bytes (not UTF-8) in the middle of a spool segment's worth of
    events: the lines they touch are dead-lettered one by one, with their bytes and the
    offset of the first bad one; every other line is stored."""
    f = EventFactory("node-d", "worker", "j", rows=rows)
    lines = [f.line("gpu", {"index": i % 8, "util_gpu_ratio": 0.5}, 1.7e9 + i) for i in range(210)]
    text = bytearray(b"".join(lines))
    starts = [sum(map(len, lines[:i])) for i in range(len(lines) + 1)]
    hit, bad_lines = set(), []
    for at in (len(text) // 3, 2 * len(text) // 3):
        text[at : at + 200] = bytes(range(128, 256)) + bytes(range(128, 200))  # no newline in it
        hit |= {i for i in range(210) if starts[i] < at + 200 and starts[i + 1] > at}  # lines it overlaps
        bad_lines.append(text.count(b"\n", 0, at) + 1)  # they are one line now: its number
    r = Writer(db).write([("spool:d/1@0", bytes(text))])
    assert r.rows["gpu_samples"] == 210 - len(hit) and r.dead == r.not_utf8 == 2
    got = db.execute("SELECT line, reason, raw_bytes FROM dead_letters ORDER BY line").fetchall()
    assert [x[0] for x in got] == bad_lines
    assert all(x[1].startswith("not UTF-8 text (byte ") and x[2] > 200 for x in got)
    stored = {x[0] for x in db.execute("SELECT id FROM gpu_samples").fetchall()}
    ids = [decode_line(x)["id"] for x in lines]
    assert stored == {ids[i] for i in range(210) if i not in hit}


def test_empty_messages_are_counted(db) -> None:
    r = Writer(db).write([("k:1", b""), ("k:2", b""), ("k:3", encode(gpu()))])
    assert (r.empty, r.dead, r.rows["gpu_samples"]) == (2, 0, 1)


def test_dead_letters_are_not_duplicated_by_a_replay(db) -> None:
    w = Writer(db)
    for _ in range(2):
        w.write([("k:9", b"{broken\n"), ("k:10", b"\xff\xfe")])
    assert count(db, "dead_letters") == 2


def test_tpu_samples_and_scalars_land_typed_and_wrong_kinds_are_dead_lettered(db) -> None:
    good = F.make(
        "tpu",
        {
            "device": 3,
            "hbm_used_bytes": 5 << 30,
            "hbm_total_bytes": 32 << 30,
            "duty_cycle_ratio": 0.75,
            "hbm_bandwidth_ratio": 0.4,
        },
    )
    bad = F.make("tpu", {"device": "3"})
    sc = F.make(
        "train_scalar", {"run": "train", "rank": 0, "tag": "loss", "step": 100, "value": 0.25}, job="j"
    )
    r = Writer(db).write([("k", encode(good) + encode(bad) + encode(sc))])
    assert r.rows["tpu_samples"] == 1 and r.rows["scalars"] == 1 and r.dead == 1
    assert db.execute(
        "SELECT device, hbm_used_bytes, duty_cycle_ratio, hbm_bandwidth_ratio FROM tpu_samples"
    ).fetchone() == (3, 5 << 30, 0.75, 0.4)
    assert db.execute("SELECT job, run, tag, step, value FROM scalars").fetchone() == (
        "j",
        "train",
        "loss",
        100,
        0.25,
    )
    assert "device" in db.execute("SELECT reason FROM dead_letters").fetchone()[0]


def test_unknown_types_are_kept_whole(db) -> None:
    ev = F.make("fpga", {"duty_cycle": 0.9, "chips": [1, 2]})
    r = Writer(db).write([("k", encode(ev))])
    assert r.rows["unknown_events"] == 1
    t, data = db.execute("SELECT type, data FROM unknown_events").fetchone()
    assert t == "fpga" and json.loads(data) == {"duty_cycle": 0.9, "chips": [1, 2]}


def test_a_failed_batch_leaves_stored_data_untouched(tmp_path: Path) -> None:
    con = connect(tmp_path / "c.duckdb")
    w = Writer(con)
    w.write([("k:1", encode(gpu()))], position=("spool:/x", 1, 100))
    con.execute("DROP TABLE heartbeats")  # make the next transaction fail half-way
    with pytest.raises(duckdb.Error):
        w.write(
            [("k:2", encode_many([gpu(5), F.make("heartbeat", {"seq": 1})]))], position=("spool:/x", 1, 200)
        )
    assert count(con, "gpu_samples") == 1  # the gpu row of the failed batch was rolled back
    assert con.execute('SELECT "offset" FROM ingest_positions').fetchone() == (100,)


def test_migrations_are_recorded_and_applied_once(tmp_path: Path) -> None:
    p = tmp_path / "c.duckdb"
    connect(p).close()
    con = connect(p)
    rows = con.execute("SELECT version, name FROM schema_migrations ORDER BY 1").fetchall()
    assert rows == [(v, n) for v, n, _ in migrations()] and rows[0] == (1, "initial")
    con.close()


def test_a_database_from_a_newer_collector_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "c.duckdb"
    con = connect(p)
    con.execute("INSERT INTO schema_migrations VALUES (999, 'future', now()::TIMESTAMP)")
    con.close()
    with pytest.raises(DatabaseError, match="schema version 999, newer than this collector knows"):
        connect(p)


def test_the_collector_writes_a_plain_duckdb_file_in_small_row_groups(tmp_path: Path) -> None:
    """The writable connection attaches the file with ROW_GROUP_SIZE (bulk batches then
    skip the WAL): what it stores is in the file, in row groups of that size, and any
    DuckDB opens the file as it is."""
    p = tmp_path / "c.duckdb"
    con = connect(p)
    f = EventFactory("n", "worker", "j", rows=True)
    lines = b"".join(f.line("gpu", {"index": i % 8}, 1.75e9 + i) for i in range(2 * ROW_GROUP_SIZE + 10))
    assert Writer(con).write([("t:1", columns.encode(lines))]).rows["gpu_samples"] == 2 * ROW_GROUP_SIZE + 10
    con.execute("CHECKPOINT")
    sizes = con.execute(
        "SELECT DISTINCT count FROM pragma_storage_info('gpu_samples_packed') WHERE column_name = 'id'"
    ).fetchall()
    assert max(n for (n,) in sizes) <= ROW_GROUP_SIZE < 122880
    con.close()
    plain = duckdb.connect(str(p), read_only=True)
    assert plain.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 2 * ROW_GROUP_SIZE + 10
    plain.close()
    holder = subprocess.Popen(  # a running collector
        [
            sys.executable,
            "-c",
            "import sys, duckdb; c = duckdb.connect(sys.argv[1]); print(1, flush=True); sys.stdin.read()",
            str(p),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"1\n"
        with pytest.raises(DatabaseError, match=f"^{p}: database is locked by another process"):
            connect(p)
    finally:
        holder.communicate(b"")
    con = connect(p)
    with pytest.raises(DatabaseError, match=f"^{p}: database is already open for writing in this process"):
        connect(p)
    con.close()


def test_not_a_database(tmp_path: Path) -> None:
    p = tmp_path / "notes.txt"
    p.write_text("hello")
    with pytest.raises(DatabaseError, match=f"^{p}: "):
        connect(p)


# -- the row form ---------------------------------------------------------------------------
R = EventFactory("node-a", "worker", "job-1", {"team": "x"}, rows=True)

ODD = 'tab\there, "quoted", new\nline, ünï'


def _table_rows(con, table: str) -> list:
    cols = [
        c
        for (c,) in con.execute(f"SELECT column_name FROM (DESCRIBE {table})").fetchall()
        if c not in ("ingested_at", "received_at")  # when it was loaded, not what
    ]
    return con.execute(
        f"SELECT {', '.join(map(repr, cols)).replace(chr(39), chr(34))} FROM {table} ORDER BY ALL"
    ).fetchall()


# the same samples in every form (tabs, quotes, newlines, huge and tiny numbers, absent fields)
ROW_SAMPLES = {
    "gpu": [
        {
            "index": 0,
            "uuid": "GPU-0",
            "name": ODD,
            "util_gpu_ratio": 0.5,
            "mem_used_bytes": 2**40,
            "throttle_reasons": ["sw_power_cap"],
            "processes": [{"pid": 7, "used_bytes": 3}],
            "ecc_corrected_total": 0,
        },
        {
            "index": 1,
            "uuid": "",
            "name": '"starts with a quote',
            "power_watts": 1e-05,
            "temp_celsius": 61,
        },
        {},
    ],
    "host": [
        {
            "cpu_util_ratio": 0.25,
            "cpu_per_core_ratio": [0.5, 0.0],
            "net": [{"nic": "eth0", "rx_bytes_total": 5}],
            "procs": 9,
            "load1": 1.5e300,
        }
    ],
    "tpu": [{"device": 3, "hbm_used_bytes": 5, "duty_cycle_ratio": 0.75}],
}


def test_row_form_lands_exactly_as_the_json_form(tmp_path: Path) -> None:
    """The same events, one database fed JSON lines and one fed row lines (mixed with JSON
    events in the same messages): every stored value is equal."""
    data = ROW_SAMPLES
    js = EventFactory("node\tb", "ps", ODD, {"team": "x\ty"})
    rows = EventFactory("node\tb", "ps", ODD, {"team": "x\ty"}, rows=True)
    rows.ids = js.ids.__class__()
    rows.ids._head, rows.ids._seq = js.ids._head, js.ids._seq  # the same ids
    a, b = [], []
    for t, ds in data.items():
        for i, d in enumerate(ds):
            a.append(js.line(t, d, 1.75e9 + i))
            b.append(rows.line(t, d, 1.75e9 + i))
        a.append(js.line("heartbeat", {"seq": len(a)}, 1.75e9))
        b.append(rows.line("heartbeat", {"seq": len(b)}, 1.75e9))
    assert sum(x.startswith(b"r1\t") for x in b) == 5
    ca, cb = connect(tmp_path / "a.duckdb"), connect(tmp_path / "b.duckdb")
    ra, rb = Writer(ca).write([("m:1", b"".join(a))]), Writer(cb).write([("m:1", b"".join(b))])
    assert ra.rows == rb.rows and rb.dead == 0 and rb.inserted == 8
    for table in ("gpu_samples", "host_samples", "tpu_samples", "heartbeats", "nodes"):
        assert _table_rows(ca, table) == _table_rows(cb, table), table
    assert cb.execute('SELECT name, job FROM gpu_samples WHERE "index" = 0').fetchone() == (ODD, ODD)
    # a replay of the row lines stores nothing twice
    again = Writer(cb).write([("m:2", b"".join(b))])
    assert again.inserted == 0 and again.duplicates == 8


@pytest.mark.parametrize(
    "line, reason",
    [
        ("r2\tgpu\tx\t5.0\tn\tworker\t\t{}\t1", "unsupported row format 'r2' (this collector reads r1)"),
        ("r1\tgpu\tx\t5.0\tn\tworker", "row has 6 fields, fewer than the 8 of the envelope"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1.5", "gpu.index must be int, got 1.5"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t007", "gpu.index must be int, got 007"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t 7", "gpu.index must be int, got  7"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\tu\tn\tnan", "gpu.util_gpu_ratio must be float, got nan"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\tu\tn\thigh", "gpu.util_gpu_ratio must be float, got high"),
        ('r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\t"unterminated', 'gpu.uuid must be str, got "unterminated'),
        (
            "r1\tgpu\tx\t5.0\tn\tboss\t\t{}\t1",
            "field 'role' must be one of worker, ps, chief, data, client, got 'boss'",
        ),
        ("r1\tgpu\tx\tnoon\tn\tworker\t\t{}\t1", "field 'ts' must be unix seconds, got 'noon'"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t[1]\t1", "field 'labels' must be an object of string values"),
        ('r1\tgpu\tx\t5.0\tn\tworker\t\t{"a":1}\t1', "field 'labels' must be an object of string values"),
        (
            "r1\tgpu\t\t5.0\tn\tworker\t\t{}\t1",
            "field 'id' must be a non-empty string of at most 64 characters",
        ),
        (
            "r1\tgpu\tx\t5.0\t\tworker\t\t{}\t1",
            "field 'node' must be a non-empty string of at most 256 characters",
        ),
        ("r1\tfoo\tx\t5.0\tn\tworker\t\t{}\t1", "row of type 'foo', which this collector does not know"),
        (
            "r1\ttpu\tx\t5.0\tn\tworker\t\t{}" + "\t1" * 6,
            "tpu row has 6 data fields; this collector knows 5 (a newer agent?)",
        ),
        (
            "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1" + "\t" * 15 + "[1]",
            "gpu.throttle_reasons must be str[], got [1]",
        ),
        (
            "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1" + "\t" * 18 + "[{]",
            "gpu.processes must be object[], got [{]",
        ),
        (
            'r1\thost\tx\t5.0\tn\tworker\t\t{}\t\t[0.5,"a"]',
            'host.cpu_per_core_ratio must be float[], got [0.5,"a"]',
        ),
        ("random words", "not valid JSON"),
    ],
)
def test_malformed_rows_are_dead_lettered_with_the_reason_the_agent_library_gives(db, line, reason) -> None:
    from cmdare.wire.events import InvalidEvent, decode_line

    good = R.line("gpu", {"index": 1}, 1.75e9)
    r = Writer(db).write([("t:1", line.encode() + b"\n" + good)])
    assert r.dead == 1 and r.rows["gpu_samples"] == 1
    got = db.execute("SELECT reason, line, raw FROM dead_letters").fetchone()
    assert got[0] == reason and got[1] == 1 and bytes(got[2]) == line.encode()
    with pytest.raises(InvalidEvent) as e:
        decode_line(line)
    assert str(e.value).startswith(reason)


def test_a_cursor_of_a_writable_connection_sees_the_tables(tmp_path: Path) -> None:
    """Another thread's cursor on the collector's connection (a reader beside the writer)."""
    from cmdare.collector.db import cursor

    con = connect(tmp_path / "c.duckdb")
    Writer(con).write([("t:1", encode(F.make("heartbeat", {"seq": 1})))])
    assert cursor(con).execute("SELECT count(*) FROM heartbeats").fetchall() == [(1,)]
    con.close()


@pytest.mark.parametrize("form", ["json", "rows", "blocks"])
def test_different_events_at_the_same_instant_are_all_stored(db, form: str) -> None:
    """De-duplication is by id: events of one tick share its timestamp (a GPU sample per
    device, a host sample, a heartbeat), and every one of them is stored whether they come
    in one batch or in several; only a true repeat (same id) is dropped."""
    f = EventFactory("node-a", "worker", "job-1", rows=form != "json")

    def msg(lines: list[bytes]) -> bytes:
        text = b"".join(lines)
        return columns.encode(text) if form == "blocks" else text

    t = 1.75e9
    first = [f.line("gpu", {"index": i, "uuid": f"G{i}", "util_gpu_ratio": 0.5}, t) for i in range(3)]
    later = [f.line("gpu", {"index": i, "uuid": f"G{i}", "util_gpu_ratio": 0.7}, t) for i in range(3, 5)]
    w = Writer(db)
    assert w.write([("t:1", msg(first))]).rows["gpu_samples"] == 3
    r = w.write([("t:2", msg(later))])  # same ts, other ids, a later batch
    assert (r.rows["gpu_samples"], r.duplicates) == (2, 0)
    r = w.write([("t:3", msg(first[:1] + later[1:]))])  # true repeats, same ts
    assert (r.inserted, r.duplicates) == (0, 2)
    assert db.execute('SELECT list("index" ORDER BY "index") FROM gpu_samples').fetchone()[0] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("form", ["json", "rows", "blocks"])
def test_every_line_of_a_batch_is_accounted_for_exactly(db, form: str) -> None:
    """What the summary line and the metrics say: every line stored, a duplicate, or dead
    (bytes that are not UTF-8 count as dead, not as lines); empty messages counted apart;
    events far off the collector's clock stored and counted as skewed."""
    import time

    f = EventFactory("n", "worker", "j", rows=form != "json")
    t = time.time()
    g = [f.line("gpu", {"index": i, "uuid": f"G{i}"}, t) for i in range(5)]
    hb = f.line("heartbeat", {"seq": 1}, t)
    old = f.line("host", {"cpu_util_ratio": 0.5}, t - 3 * 86400)  # three days off

    def m(ls: list[bytes]) -> bytes:
        x = b"".join(ls)
        return columns.encode(x) if form == "blocks" else x

    unknown = (b'{"v":1,"id":"u1","ts":%.1f,"node":"n","role":"worker","type":"futuristic","data":{"x":1}}\n' % t)
    w = Writer(db, max_skew=86400)
    r = w.write([("a", m(g)), ("b", m(g[:2] + [hb, old])), ("c", b""), ("d", b"not json\n\xff\xfe bad\n"),
                 ("e", unknown)])
    assert {k: v for k, v in r.rows.items() if v} == {"gpu_samples": 5, "heartbeats": 1, "host_samples": 1,
                                                      "unknown_events": 1}
    assert (r.inserted, r.duplicates, r.dead, r.not_utf8, r.empty, r.skewed, r.lines) == (8, 2, 2, 1, 1, 1, 11)
    assert r.lines + r.not_utf8 == r.inserted + r.duplicates + r.dead
    assert count(db, "clock_skew") == 1 and count(db, "dead_letters") == 2
    again = w.write([("a", m(g)), ("b", m([hb, old])), ("e", unknown)])  # a replay: all of it once more
    assert (again.inserted, again.duplicates, again.dead, again.skewed) == (0, 8, 0, 0)
    assert count(db, "clock_skew") == 1


@pytest.mark.parametrize("form", ["json", "rows", "blocks"])
def test_a_single_event_repeated_once_in_a_batch_is_stored_once(db, form: str) -> None:
    f = EventFactory("n", "worker", "j", rows=form != "json")
    t = 1.75e9
    one = f.line("gpu", {"index": 0, "uuid": "G0"}, t)
    other = f.line("host", {"cpu_util_ratio": 0.5}, t)
    text = one + other + one
    r = Writer(db).write([("a", columns.encode(text) if form == "blocks" else text)])
    assert (r.inserted, r.duplicates) == (2, 1) and count(db, "gpu_samples") == 1


@pytest.mark.parametrize("form", ["json", "rows", "blocks"])
def test_a_replayed_batch_counts_its_lines_and_leaves_no_scratch_behind(db, form: str) -> None:
    """A clean column block goes the fast path: a replay of it still counts every line (as a
    duplicate). After each batch its Arrow views and per-type row tables are gone (their memory freed)."""
    f = EventFactory("n", "worker", "j", rows=form != "json")
    text = b"".join(f.line("gpu", {"index": i, "uuid": f"G{i}"}, 1.75e9) for i in range(5))
    msg = columns.encode(text) if form == "blocks" else text
    w = Writer(db)
    for inserted in (5, 0):
        r = w.write([("a", msg)])
        assert (r.lines, r.inserted, r.duplicates) == (5, inserted, 5 - inserted)
        for name in ("_batch", "_cf_gpu", "_r_gpu"):
            with pytest.raises(duckdb.CatalogException):
                db.execute(f"SELECT 1 FROM {name}")


def test_a_batch_counts_its_messages_and_bytes_and_a_batch_of_nothing_counts_nothing(db) -> None:
    from cmdare.collector.ingest.batch import Batch

    b = Batch()
    for raw in (b"", None, b"x\n", b"yz\n"):
        b.add("o", raw)
    assert (len(b), b.bytes, b.empty) == (4, 5, 1)
    r = Writer(db).write([("a", b""), ("b", b"")])  # no line at all: nothing checked or stored
    assert (r.inserted, r.duplicates, r.dead, r.lines, r.empty, r.not_utf8, r.skewed, r.seconds) == \
        (0, 0, 0, 0, 2, 0, 0, 0.0)


def test_a_message_without_a_value_or_with_a_broken_block_is_dead_lettered_whole(db) -> None:
    """Line 0 (the whole message); a missing value has no bytes, a broken block keeps its
    first bytes and its size."""
    block = columns.encode(EventFactory("n", "worker", "j", rows=True).line("gpu", {"index": 0}, 1.75e9))
    broken = block[:-3]
    r = Writer(db).write([("k:1", None), ("k:2", broken)])
    assert r.dead == 2
    got = db.execute("SELECT origin, line, raw_bytes, octet_length(raw) FROM dead_letters ORDER BY origin").fetchall()
    assert got == [("k:1", 0, 0, 0), ("k:2", 0, len(broken), len(broken))]


def test_block_rows_are_numbered_after_the_messages_text_lines(tmp_path: Path) -> None:
    """A message holding text lines and a column block: a dead letter names the same line
    whichever form carried the row."""
    text_line = "r1\tgpu\tx\tnoon\tn\tworker\t\t{}\t1"  # not carried (a bad ts): stays text
    carried_bad = "r1\tgpu\ty\t5.0\tn\tboss\t\t{}\t1"  # carried, refused in DuckDB
    good = EventFactory("node-a", "worker", "job-1", rows=True).line("gpu", {"index": 1}, 1.75e9)
    text = f"{text_line}\n{carried_bad}\n".encode() + good
    msg = columns.encode(text)
    got = []
    for name, raw in (("text", text), ("block", msg)):
        con = connect(tmp_path / f"{name}.duckdb")
        Writer(con).write([("m:1", raw)])
        got.append(con.execute("SELECT line, reason FROM dead_letters ORDER BY line").fetchall())
    assert [x for x, _ in got[0]] == [1, 2] and got[0] == got[1]


def test_a_repeat_in_a_batch_drops_only_that_nodes_copy_never_another_nodes_same_id(db) -> None:
    """Identity is (node, id): ids are unique per agent, not across a fleet. A batch where
    node-a repeats one event (the in-batch de-duplication runs) and node-b sends events with
    the same ids as node-a's keeps all of node-b's (issue 67: with the check keyed on id
    alone, stored rows fell from 20 to 10)."""
    a, b = EventFactory("node-a", "worker", "j"), EventFactory("node-b", "worker", "j")
    lines = []
    for i in range(10):
        for f in (a, b):
            ev = f.make("gpu", {"index": 0, "uuid": f"G-{f.node}", "util_gpu_ratio": 0.5}, 1.75e9 + i)
            ev["id"] = f"tick-{i}"  # the same id on both nodes
            lines.append(encode(ev))
    r = Writer(db).write([("t:1", b"".join(lines + lines[:1]))])  # node-a's first event twice
    assert (r.inserted, r.duplicates) == (20, 1)
    assert db.execute("SELECT node, count(*) FROM gpu_samples GROUP BY node ORDER BY node").fetchall() == [
        ("node-a", 10), ("node-b", 10)]
