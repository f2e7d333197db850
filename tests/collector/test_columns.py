"""Column blocks (sink.message_format = "columns"): the shipper's binary packing of row-form
samples.  What users rely on: the same events land exactly as from the lines, values the
encoder cannot carry exactly stay text (same verdict), and a damaged message is
dead-lettered with a reason while the messages after it land."""

from __future__ import annotations

import json
import struct
import zlib
from array import array
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cmdare.agent.sinks.shipper import pack
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire import columns
from cmdare.wire.columns import CRC, HEAD, MAGIC, MAGIC_V1, encode
from cmdare.wire.events import EventFactory, decode_line
from cmdare.wire.spool import Position
from tests.collector.test_writer import ODD, ROW_SAMPLES, _table_rows
from tests.conftest import examples


def _header(msg: bytes) -> dict:
    assert msg.startswith(MAGIC)
    (n,) = HEAD.unpack_from(msg, len(MAGIC))
    return json.loads(msg[len(MAGIC) + 4 : len(MAGIC) + 4 + n])


def _lines(factory: EventFactory) -> bytes:
    data = {t: list(ds) for t, ds in ROW_SAMPLES.items()}
    data["gpu"].append({"index": 2, "name": "ok", "util_gpu_ratio": 1e300, "ecc_corrected_total": -3})
    data["host"].append({"procs": 2**62})
    out = []
    for t, ds in data.items():
        for i, d in enumerate(ds):
            out.append(factory.line(t, d, 1.75e9 + i))
        out.append(factory.line("heartbeat", {"seq": len(out)}, 1.75e9))
    return b"".join(out)


TABLES = ("gpu_samples", "host_samples", "tpu_samples", "heartbeats", "nodes", "dead_letters")


def test_column_blocks_land_exactly_as_the_lines(tmp_path: Path) -> None:
    f = EventFactory("node\tb", "ps", ODD, {"team": "x\ty", "ünï": "ok"}, rows=True)
    text = _lines(f)
    msg = encode(text)
    head = _header(msg)
    assert sorted(b["type"] for b in head["blocks"]) == ["gpu", "host", "tpu"]
    assert sum(b["rows"] for b in head["blocks"]) == 7
    ca, cb = connect(tmp_path / "a.duckdb"), connect(tmp_path / "b.duckdb")
    ra, rb = Writer(ca).write([("m:1", text)]), Writer(cb).write([("m:1", msg)])
    assert ra.rows == rb.rows and rb.dead == 0 and rb.inserted == 10
    for table in TABLES:
        assert _table_rows(ca, table) == _table_rows(cb, table), table
    # a replay stores nothing twice
    again = Writer(cb).write([("m:2", msg)])
    assert again.inserted == 0 and again.duplicates == 10


def test_a_field_no_row_of_a_block_carries_is_left_out_and_lands_as_absent(tmp_path: Path) -> None:
    """The row form is positional: a GPU without GPM metrics sends their empty places before
    the fields it has.  The block leaves such columns out (no presence mask and 8 bytes a
    row each for nothing); a field one row carries is kept, absent in the others."""
    f = EventFactory("n", "worker", "j", rows=True)
    text = b"".join([
        f.line("gpu", {"index": 0, "util_gpu_ratio": 0.5, "energy_joules_total": 10.0}, 1.75e9),
        f.line("gpu", {"index": 1, "util_gpu_ratio": 0.25, "energy_joules_total": 20.0,
                       "mig_profile": "1g.10gb"}, 1.75e9),
    ])
    msg = encode(text)
    (block,) = _header(msg)["blocks"]
    carried = [c for c, _ in block["columns"]]
    assert "energy_joules_total" in carried and "mig_profile" in carried and "util_gpu_ratio" in carried
    assert "sm_active_ratio" not in carried and "uuid" not in carried and "processes" not in carried
    assert dict(block["columns"])["mig_profile"] == 1 and dict(block["columns"])["energy_joules_total"] == 0
    ca, cb = connect(tmp_path / "a.duckdb"), connect(tmp_path / "b.duckdb")
    assert Writer(ca).write([("m", text)]).inserted == Writer(cb).write([("m", msg)]).inserted == 2
    assert _table_rows(ca, "gpu_samples") == _table_rows(cb, "gpu_samples")
    assert cb.execute("SELECT \"index\", sm_active_ratio, energy_joules_total, mig_profile FROM gpu_samples "
                      "ORDER BY 1").fetchall() == [(0, None, 10.0, None), (1, None, 20.0, "1g.10gb")]
    assert columns.decode(msg) == [decode_line(x) for x in text.decode().splitlines()]


def test_other_consumers_read_the_same_events_from_blocks_and_lines() -> None:
    f = EventFactory("node\tb", "ps", ODD, {"team": "x\ty"}, rows=True)
    text = _lines(f)
    want = sorted((decode_line(x) for x in text.splitlines()), key=lambda e: e["id"])
    got = sorted(columns.decode(encode(text)), key=lambda e: e["id"])
    assert got == want and len(got) == 10
    assert columns.decode(text) == [decode_line(x) for x in text.splitlines()]


def test_pack_with_columns_keeps_the_counts_and_spool_positions() -> None:
    f = EventFactory("n", "worker", "j", rows=True)
    data = b"".join(f.line("gpu", {"index": i % 8, "util_gpu_ratio": 0.5}, 1.75e9 + i) for i in range(3000))
    plain = pack([(data, Position(1, len(data)))], 16 << 10)
    cols = pack([(data, Position(1, len(data)))], 16 << 10, columns=True)
    assert [(c, p) for _, c, p in plain] == [(c, p) for _, c, p in cols] and len(cols) > 5
    assert all(
        m.startswith(MAGIC) and len(m) < len(t) for (m, _, _), (t, _, _) in zip(cols, plain, strict=True)
    )
    # JSON events (not rows) stay lines: such a message is not re-packed at all
    js = EventFactory("n", "worker", "j").line("gpu", {"index": 1}, 1.75e9)
    assert pack([(js, Position(1, len(js)))], 16 << 10, columns=True)[0][0] == js


# rows the encoder must leave as text (it carries only what the agent writes); with the
# good row after each, the collector's verdict must be the one it gives the lines
NOT_CARRIED = [
    "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1.5",
    "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t007",
    "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t 7",
    "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t99999999999999999999",
    "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\tu\tn\tnan",
    "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\tu\tn\t1e400",
    "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\tu\tn\t+0.5",
    'r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\t"unterminated',
    'r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\t"\\ud800"',
    "r1\tgpu\tx\tnoon\tn\tworker\t\t{}\t1",
    "r1\tgpu\tx\t\tn\tworker\t\t{}\t1",
    "r1\ttpu\tx\t5.0\tn\tworker\t\t{}" + "\t1" * 6,
]
# rows it carries, whose values the collector refuses (row by row, in DuckDB)
CARRIED_BAD = [
    (
        "r1\tgpu\tx\t5.0\tn\tboss\t\t{}\t1",
        "field 'role' must be one of worker, ps, chief, data, client, got 'boss'",
    ),
    ("r1\tgpu\tx\t5.0\tn\tworker\t\t[1]\t1", "field 'labels' must be an object of string values"),
    ("r1\tgpu\t\t5.0\tn\tworker\t\t{}\t1", "field 'id' must be a non-empty string of at most 64 characters"),
    (
        "r1\tgpu\tx\t5.0\t\tworker\t\t{}\t1",
        "field 'node' must be a non-empty string of at most 256 characters",
    ),
    ("r1\tgpu\tx\t0\tn\tworker\t\t{}\t1", "field 'ts' must be unix seconds, got '0.0'"),
    (
        "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1" + "\t" * 15 + "[1]",
        "gpu.throttle_reasons must be str[], got [1]",
    ),
    ("r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1" + "\t" * 18 + "[{]", "gpu.processes must be object[], got [{]"),
    (
        'r1\thost\tx\t5.0\tn\tworker\t\t{}\t\t[0.5,"a"]',
        'host.cpu_per_core_ratio must be float[], got [0.5,"a"]',
    ),
]
GOOD = EventFactory("node-a", "worker", "job-1", {"team": "x"}, rows=True)


@pytest.mark.parametrize("line", NOT_CARRIED)
def test_rows_the_encoder_cannot_carry_stay_text_with_the_same_verdict(tmp_path: Path, line: str) -> None:
    text = line.encode() + b"\n" + GOOD.line("gpu", {"index": 1}, 1.75e9)
    msg = encode(text)
    head = _header(msg)
    assert [b["rows"] for b in head["blocks"]] == [1] and head["text"] == len(line) + 1
    ca, cb = connect(tmp_path / "a.duckdb"), connect(tmp_path / "b.duckdb")
    ra, rb = Writer(ca).write([("m:1", text)]), Writer(cb).write([("m:1", msg)])
    assert (ra.dead, ra.rows["gpu_samples"]) == (rb.dead, rb.rows["gpu_samples"])
    assert _table_rows(ca, "gpu_samples") == _table_rows(cb, "gpu_samples")
    assert _table_rows(ca, "dead_letters") == _table_rows(cb, "dead_letters")


@pytest.mark.parametrize("line, reason", CARRIED_BAD, ids=[r[:30] for _, r in CARRIED_BAD])
def test_bad_values_in_a_block_are_dead_lettered_row_by_row(db, line: str, reason: str) -> None:
    from cmdare.wire.events import InvalidEvent

    good = GOOD.line("gpu", {"index": 1}, 1.75e9)
    msg = encode(line.encode() + b"\n" + good)
    assert _header(msg)["text"] == 0  # both rows carried as columns
    r = Writer(db).write([("t:1", msg)])
    assert r.dead == 1 and r.rows["gpu_samples"] + r.rows["host_samples"] == 1
    got_reason, raw = db.execute("SELECT reason, raw FROM dead_letters").fetchone()
    assert got_reason == reason
    # the dead letter holds the row re-made as text: the agent library refuses it the same way
    with pytest.raises(InvalidEvent) as e:
        decode_line(bytes(raw))
    assert str(e.value).startswith(reason.split(", got")[0])
    assert Writer(db).write([("t:1", msg)]).dead == 0  # a replay: dead-lettered once


def test_list_texts_repeated_across_a_block_are_checked_once_each_and_kept_per_row(db) -> None:
    """A GPU block's throttle reasons and processes are checked once per distinct text in
    the batch: every row still gets its own value, and only the rows holding a bad text
    are dead-lettered (none dropped, none doubled by the lookup)."""
    procs = ['[{"pid":1,"used_bytes":5}]', '[{"pid":2}]', "[{]", ""]  # "": absent
    reasons = ['["sw_power_cap"]', "[]", "[1]"]
    lines = [
        f"r1\tgpu\tid-{i}\t{1.75e9 + i}\tn\tworker\t\t{{}}\t{i % 8}"
        + "\t" * 15
        + reasons[i % 3]
        + "\t" * 3
        + procs[i % 4]
        for i in range(60)
    ]
    msg = encode(("\n".join(lines) + "\n").encode())
    assert _header(msg)["text"] == 0  # all carried as columns
    r = Writer(db).write([("t:1", msg)])
    bad = {i for i in range(60) if i % 3 == 2 or i % 4 == 2}
    assert (r.dead, r.rows["gpu_samples"]) == (len(bad), 60 - len(bad))
    got = {
        i: (t, p)
        for i, t, p in db.execute(
            "SELECT CAST(substr(id, 4) AS INT), throttle_reasons, processes::VARCHAR FROM gpu_samples"
        ).fetchall()
    }
    assert set(got) == set(range(60)) - bad
    for i, (t, p) in got.items():
        assert t == json.loads(reasons[i % 3])
        assert p == (procs[i % 4] or None)
    dead = dict(db.execute("SELECT line, reason FROM dead_letters").fetchall())
    assert len(dead) == len(bad)
    assert {v for v in dead.values()} == {
        "gpu.processes must be object[], got [{]",
        "gpu.throttle_reasons must be str[], got [1]",
    }


def test_batches_mixing_clean_blocks_refused_rows_and_a_redelivery(tmp_path: Path, monkeypatch) -> None:
    """Clean column blocks go straight into their tables; a type with one refused row, or
    an id twice in the batch, goes through the row-by-row checks.  Either way a batch
    lands exactly as the same lines do: every good row once, the bad row dead-lettered,
    the nodes table from both."""
    fast: list[str] = []
    real = Writer._fast

    def spy(self, type_, lean, registered, blocks):
        got = real(self, type_, lean, registered, blocks)
        if got is not None:
            fast.append(type_)
        return got

    monkeypatch.setattr(Writer, "_fast", spy)
    a = EventFactory("node-a", "worker", "job-1", {"team": "x"}, rows=True)
    b = EventFactory("node-b", "ps", "job-2", rows=True)

    def gpu(f, t0, n, d):
        return b"".join(f.line("gpu", {"index": i % 8, **d}, t0 + i) for i in range(n))

    def host(f, t0, n):
        d = {"cpu_util_ratio": 0.25, "cpu_per_core_ratio": [0.5, 0.1]}
        return b"".join(f.line("host", d, t0 + i) for i in range(n))

    tpu = b"".join(b.line("tpu", {"device": i, "duty_cycle_ratio": 0.5}, 1.75e9 + 400) for i in range(4))
    bad = b'r1\thost\tbad-1\t1750000200.0\tnode-b\tps\t\t{}\t\t[0.5,"a"]\n'
    gpu_a = gpu(a, 1.75e9, 40, {"util_gpu_ratio": 0.5, "throttle_reasons": ["idle"]})
    gpu_b = gpu(b, 1.75e9 + 300, 3, {"processes": [{"pid": 7}]})
    batches = [
        # gpu and tpu clean, host with one refused row
        [gpu_a + host(b, 1.75e9 + 100, 5), bad + tpu],
        # host clean; gpu_b twice in the batch, and the first batch's gpu rows again
        [host(a, 1.75e9 + 500, 3) + gpu_b, gpu_b, gpu_a],
    ]
    ca, cb = connect(tmp_path / "a.duckdb"), connect(tmp_path / "b.duckdb")
    results = []
    for i, texts in enumerate(batches):
        msgs = [encode(t) for t in texts]
        assert all(_header(m)["text"] == 0 for m in msgs)  # every row carried as columns
        ra = Writer(ca).write([(f"m{i}:{j}", t) for j, t in enumerate(texts)])
        rb = Writer(cb).write([(f"m{i}:{j}", m) for j, m in enumerate(msgs)])
        assert (ra.rows, ra.dead, ra.duplicates, ra.lines) == (rb.rows, rb.dead, rb.duplicates, rb.lines)
        results.append(
            (rb.rows["gpu_samples"], rb.rows["host_samples"], rb.rows["tpu_samples"], rb.dead, rb.duplicates)
        )
    assert results == [(40, 5, 4, 1, 0), (3, 3, 0, 0, 43)]
    assert fast == ["gpu", "tpu", "host"]  # the rest took the checked path
    for table in ("gpu_samples", "host_samples", "tpu_samples", "nodes"):
        assert _table_rows(ca, table) == _table_rows(cb, table), table
    assert cb.execute("SELECT origin, reason FROM dead_letters").fetchall() == [
        ("m0:1", 'host.cpu_per_core_ratio must be float[], got [0.5,"a"]')
    ]
    nodes = cb.execute(
        "SELECT node, role, job, labels::VARCHAR, epoch(first_seen), epoch(last_seen) FROM nodes ORDER BY 1"
    ).fetchall()
    assert nodes == [
        ("node-a", "worker", "job-1", '{"team":"x"}', 1.75e9, 1.75e9 + 502),
        ("node-b", "ps", "job-2", "{}", 1.75e9 + 100, 1.75e9 + 400),
    ]
    # the first batch again (a replay after a crash): nothing new, nothing dead-lettered twice
    again = Writer(cb).write([(f"m0:{j}", encode(t)) for j, t in enumerate(batches[0])])
    assert (again.inserted, again.dead, again.duplicates) == (0, 0, 49)


@pytest.fixture()
def db(tmp_path: Path):
    con = connect(tmp_path / "t.duckdb")
    yield con
    con.close()


def _sample() -> bytes:
    f = EventFactory("n", "worker", "", rows=True)
    lines = [
        f.line("gpu", {"index": i, "uuid": f"GPU-{i}", "util_gpu_ratio": 0.5}, 1.75e9 + i) for i in range(3)
    ]
    lines.append(f.line("gpu", {"index": 3, "util_gpu_ratio": 0.5}, 1.75e9 + 3))  # uuid absent: masked
    return encode(b"".join(lines))


def _with_header(msg: bytes, edit) -> bytes:
    (n,) = HEAD.unpack_from(msg, len(MAGIC))
    start = len(MAGIC) + 4
    head = json.loads(msg[start : start + n])
    edit(head["blocks"][0])
    h = json.dumps(head).encode()
    h += b" " * (-(start + len(h)) % 8)
    return MAGIC + HEAD.pack(len(h)) + h + msg[start + n :]


def _sealed(msg: bytes) -> bytes:
    """``msg`` with its checksum made right again: a message an agent with a bug could
    send, as opposed to one damaged on the way (which its checksum catches)."""
    return msg[:-4] + CRC.pack(zlib.crc32(msg[:-4]))


def _v1(msg: bytes) -> bytes:
    """The same message as an agent before checksums sent it."""
    return MAGIC_V1 + msg[len(MAGIC) : -4]


def _replace(msg: bytes, old: bytes, new: bytes) -> bytes:
    assert msg.count(old) == 1, old
    return msg.replace(old, new)


def _set(key, value):
    return lambda b: b.__setitem__(key, value)


DAMAGED = [
    ("truncated", lambda m: m[:-8], "runs past the message"),
    ("trailing bytes", lambda m: m + b"\0" * 8, "8 bytes after its last block"),
    ("header length", lambda m: m[: len(MAGIC)] + HEAD.pack(1 << 30) + m[len(MAGIC) + 4 :], "header of"),
    ("header not JSON", lambda m: _replace(m, b'"blocks"', b'"blocks"}'), "header is not valid JSON"),
    (
        "unknown type",
        lambda m: _with_header(m, _set("type", "foo")),
        "type 'foo', which this collector does not know",
    ),
    ("no rows", lambda m: _with_header(m, _set("rows", 0)), "'rows' must be an integer"),
    (
        "unknown column",
        lambda m: _with_header(m, lambda b: b["columns"][2].__setitem__(0, "indexx")),
        "'indexx' is not a gpu field this collector knows (a newer agent?)",
    ),
    (
        "no id first",
        lambda m: _with_header(m, lambda b: b["columns"].reverse()),
        "'columns' must be a list starting with id and ts",
    ),
    ("role not a string", lambda m: _with_header(m, _set("role", 5)), "'role' must be a string"),
    (
        "mask byte",
        lambda m: _replace(m, b"\x01\x01\x01\x00", b"\x01\x02\x01\x00"),
        "presence mask bytes must be 0 or 1",
    ),
    (
        "offsets",
        lambda m: _replace(
            m, array("I", [0, 5, 10, 15, 15]).tobytes(), array("I", [0, 10, 5, 15, 15]).tobytes()
        ),
        "string offsets must start at 0 and not decrease",
    ),
    ("not UTF-8", lambda m: _replace(m, b"GPU-1", b"GPU\xff1"), "column uuid is not UTF-8 text"),
]


@pytest.mark.parametrize("name, damage, reason", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_a_damaged_block_message_is_dead_lettered_and_the_next_lands(db, name, damage, reason) -> None:
    msg = _sample()
    bad = _sealed(damage(msg))
    r = Writer(db).write([("t:1", bad), ("t:2", msg)])
    assert r.dead == 1 and r.rows["gpu_samples"] == 4
    got, raw, size = db.execute("SELECT reason, raw, raw_bytes FROM dead_letters").fetchone()
    assert reason in got and got.count("\n") == 0
    assert bytes(raw) == bad[: len(raw)] and size == len(bad)


_N = len(_sample())


# every region of a message for sure (magic, header length, header, values, checksum), then
# random bytes (each example opens two fresh databases: kept to 100 for the suite's time)
@settings(max_examples=examples(100), deadline=None)
@given(at=st.integers(min_value=0), xor=st.integers(min_value=1, max_value=255))
@example(at=0, xor=1)
@example(at=len(MAGIC) + 1, xor=0x80)
@example(at=len(MAGIC) + 12, xor=0x20)
@example(at=_N - 40, xor=0xFF)
@example(at=_N - 1, xor=1)
def test_any_byte_changed_on_the_way_fails_the_checksum(tmp_path_factory, at: int, xor: int) -> None:
    """A flipped byte anywhere (header, text, values, the checksum itself): the message is
    dead-lettered whole with its reason, never stored with a mutated value; the next
    message lands."""
    msg = _sample()
    bad = bytearray(msg)
    bad[at % len(bad)] ^= xor
    con = connect(tmp_path_factory.mktemp("flip") / "c.duckdb")
    r = Writer(con).write([("t:1", bytes(bad)), ("t:2", msg)])
    assert r.rows["gpu_samples"] == 4  # the good message's rows, nothing from the bad one
    got = con.execute("SELECT origin, line, reason FROM dead_letters").fetchall()
    if at % len(bad) >= len(MAGIC):
        assert got == [("t:1", 0, f"column block message of {len(bad)} bytes fails its checksum "
                                  "(damaged in transit or on disk)")]
    else:  # a damaged magic: not a block at all, so its lines are judged as lines
        assert r.dead >= 1 and {o for o, _, _ in got} == {"t:1"}
    con.close()


def test_a_message_from_an_agent_before_checksums_is_read(db) -> None:
    msg = _v1(_sample())
    assert columns.is_block(msg)
    r = Writer(db).write([("t:1", msg)])
    assert r.dead == 0 and r.rows["gpu_samples"] == 4
    assert len(columns.decode(msg)) == 4 == len(columns.decode(_sample()))


def test_a_nan_in_a_float_column_is_refused_for_its_row_only(db) -> None:
    msg = _sample()
    nan = _sealed(_replace(msg, struct.pack("<d", 1.75e9 + 1), struct.pack("<d", float("nan"))))
    r = Writer(db).write([("t:1", nan)])
    assert r.dead == 1 and r.rows["gpu_samples"] == 3
    assert (
        db.execute("SELECT reason FROM dead_letters").fetchone()[0]
        == "field 'ts' must be unix seconds, got 'nan'"
    )


@settings(max_examples=examples(80), deadline=None)
@given(
    name=st.text(max_size=30),
    node=st.text(min_size=1, max_size=20),
    job=st.text(max_size=20),
    value=st.floats(allow_nan=False, allow_infinity=False),
    count=st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
def test_any_strings_and_numbers_land_as_from_the_lines(
    tmp_path_factory, name, node, job, value, count
) -> None:
    f = EventFactory(node, "worker", job, {"k": name}, rows=True)
    text = f.line(
        "gpu", {"index": 0, "name": name, "util_gpu_ratio": value, "ecc_corrected_total": count}, 1.75e9
    )
    d = tmp_path_factory.mktemp("c")
    ca, cb = connect(d / "a.duckdb"), connect(d / "b.duckdb")
    Writer(ca).write([("m:1", text)])
    Writer(cb).write([("m:1", encode(text))])
    for table in ("gpu_samples", "nodes", "dead_letters"):
        assert _table_rows(ca, table) == _table_rows(cb, table), table
    ca.close()
    cb.close()
