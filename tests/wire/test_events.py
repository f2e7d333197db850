"""Wire format v1: round trip, ids, validation, and the published JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmdare.wire import events
from cmdare.wire.events import EventFactory, InvalidEvent, decode_line, encode, validate
from tests.conftest import examples

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "wire" / "schema" / "event-v1.schema.json"

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def gpu_data(draw):
    return {
        "index": draw(st.integers(0, 15)),
        "uuid": draw(names),
        "name": draw(names),
        "util_gpu_ratio": draw(st.floats(0, 1)),
        "mem_used_bytes": draw(st.integers(0, 2**40)),
        "power_watts": draw(finite),
        "throttle_reasons": draw(st.lists(names, max_size=3)),
        "processes": draw(st.lists(st.fixed_dictionaries({"pid": st.integers(1, 2**22)}), max_size=3)),
    }


@given(
    node=names,
    job=st.text(max_size=30),
    labels=st.dictionaries(names, st.text(max_size=20), max_size=3),
    data=gpu_data(),
    role=st.sampled_from(events.ROLES),
)
@settings(max_examples=examples(200), deadline=None)
def test_round_trip(node, job, labels, data, role) -> None:
    ev = EventFactory(node, role, job, labels).make("gpu", data)
    line = encode(ev)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_line(line) == ev


# an event's envelope and gpu data, any strings: both line encoders must agree on them
ENVELOPE = dict(
    node=names,
    job=st.text(max_size=30),
    labels=st.dictionaries(names, st.text(max_size=20), max_size=3),
    data=gpu_data(),
    ts=st.one_of(st.floats(1.0, 4e9), st.integers(1, 4 * 10**9)),
)


@given(**ENVELOPE)
@settings(max_examples=examples(200), deadline=None)
def test_fast_line_is_byte_identical_to_encoding_the_event(node, job, labels, data, ts) -> None:
    a, b = EventFactory(node, "ps", job, labels), EventFactory(node, "ps", job, labels)
    b.ids = a.ids.__class__()
    b.ids._head, b.ids._seq = a.ids._head, a.ids._seq  # same next id
    assert a.line("gpu", data, ts) == encode(b.make("gpu", data, ts))
    assert a.line("train_steps", {}, ts, job=node) == encode(b.make("train_steps", {}, ts, job=node))


@given(**ENVELOPE, id=st.one_of(st.none(), st.text(min_size=1, max_size=64)))
@settings(max_examples=examples(300), deadline=None)
def test_row_form_decodes_to_the_same_event_as_the_json_form(node, job, labels, data, ts, id) -> None:
    """Any strings (tabs, newlines, quotes, empty, non-ASCII) survive the row form."""
    rows, js = EventFactory(node, "worker", job, labels, rows=True), EventFactory(node, "worker", job, labels)
    r, j = rows.line("gpu", data, ts, id=id or "i-1"), js.line("gpu", data, ts, id=id or "i-1")
    assert r.startswith(b"r1\tgpu\t") and r.count(b"\n") == 1 and r.endswith(b"\n")
    assert decode_line(r) == decode_line(j)


def test_row_form_only_for_row_types_and_declared_fields() -> None:
    f = EventFactory("n", "worker", rows=True)
    assert f.line("gpu", {"index": 1}, 5.0).startswith(b"r1\t")
    assert f.line("heartbeat", {"seq": 1}, 5.0).startswith(b"{")  # not a row type
    assert f.line("gpu", {"index": 1, "extra": 2}, 5.0).startswith(b"{")  # undeclared field: JSON keeps it
    line = f.line("host", {"load1": 0.5, "procs": 7}, 5.0).decode()
    assert line.split("\t")[8:] == ["", "", "0.5"] + [""] * 9 + ["7\n"]  # absent: empty


@pytest.mark.parametrize(
    "line, reason",
    [
        ("r2\tgpu\tx\t5.0\tn\tworker\t\t{}\t1", "unsupported row format 'r2' (this collector reads r1)"),
        ("r1\tgpu\tx\t5.0\tn\tworker", "row has 6 fields, fewer than the 8 of the envelope"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1.5", "gpu.index must be int, got 1.5"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t007", "gpu.index must be int, got 007"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\tu\tn\tnan", "gpu.util_gpu_ratio must be float, got nan"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\tu\tn\thigh", "gpu.util_gpu_ratio must be float, got high"),
        ("r1\tgpu\tx\t5.0\tn\tboss\t\t{}\t1", "field 'role' must be one of"),
        ("r1\tgpu\tx\tnoon\tn\tworker\t\t{}\t1", "field 'ts' must be unix seconds, got 'noon'"),
        ("r1\tgpu\tx\t5.0\tn\tworker\t\t[1]\t1", "field 'labels' must be an object of string values"),
        ("r1\tgpu\t\t5.0\tn\tworker\t\t{}\t1", "field 'id' must be a non-empty string"),
        ("r1\tfoo\tx\t5.0\tn\tworker\t\t{}\t1", "row of type 'foo', which this collector does not know"),
        ("r1\ttpu\tx\t5.0\tn\tworker\t\t{}" + "\t1" * 6, "tpu row has 6 data fields; this collector knows 5"),
        (
            "r1\tgpu\tx\t5.0\tn\tworker\t\t{}\t1\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t[1]",
            "gpu.throttle_reasons must be str[], got [1]",
        ),
    ],
)
def test_invalid_rows_are_refused_with_a_reason(line, reason) -> None:
    with pytest.raises(InvalidEvent) as e:
        decode_line(line)
    assert reason in str(e.value)


def test_fast_line_refuses_a_non_finite_timestamp() -> None:
    with pytest.raises(ValueError, match="finite"):
        EventFactory("n", "worker").line("gpu", {}, float("nan"))


def test_ids_are_unique_and_uuid_shaped() -> None:
    f = EventFactory("n", "worker")
    ids = {f.make("heartbeat", {"seq": i})["id"] for i in range(10000)}
    assert len(ids) == 10000
    other = EventFactory("n", "worker").make("heartbeat", {})["id"]
    assert other not in ids  # a second agent start draws a new random prefix
    import uuid

    uuid.UUID(other)


def test_counter_wrap_draws_a_new_prefix() -> None:
    g = events.IdGenerator()
    g._seq = 0xFFFFFFFF
    first_instance = g.instance
    new = g.next()
    assert g.instance != first_instance and new.endswith("00000001")


@pytest.mark.parametrize(
    "mutate,reason",
    [
        (lambda e: e.update(v=2), "unsupported wire format version 2"),
        (lambda e: e.pop("id"), "field 'id'"),
        (lambda e: e.update(ts="yesterday"), "field 'ts' must be unix seconds"),
        (lambda e: e.update(role="boss"), "field 'role'"),
        (lambda e: e.update(labels={"a": 1}), "field 'labels'"),
        (lambda e: e.update(data=[1]), "field 'data' must be an object"),
        (lambda e: e["data"].update(util_gpu_ratio="0.5"), "gpu.util_gpu_ratio must be float"),
        (lambda e: e["data"].update(index=1.5), "gpu.index must be int"),
        (lambda e: e["data"].update(throttle_reasons=[1]), "gpu.throttle_reasons must be str[]"),
    ],
)
def test_invalid_events_are_rejected_with_a_reason(mutate, reason) -> None:
    ev = EventFactory("n", "worker").make("gpu", {"index": 0, "util_gpu_ratio": 0.5})
    mutate(ev)
    with pytest.raises(InvalidEvent, match=reason.replace("(", r"\(").replace("[", r"\[")):
        validate(ev)


def test_unknown_type_is_valid() -> None:
    validate(EventFactory("n", "worker").make("from_the_future", {"anything": [1, {"x": 2}]}))


def test_not_json() -> None:
    with pytest.raises(InvalidEvent, match="not valid JSON"):
        decode_line(b'{"v":1,')


def test_published_schema_file_is_current() -> None:
    """docs reference wire/schema/event-v1.schema.json: it must equal what the code generates."""
    assert json.loads(SCHEMA_FILE.read_text()) == events.json_schema()


def test_agent_events_validate_against_the_json_schema() -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    f = EventFactory("n", "ps", "job", {"team": "x"})
    for t, data in [
        ("gpu", {"index": 0, "util_gpu_ratio": 0.5, "processes": [{"pid": 1}]}),
        ("host", {"cpu_util_ratio": 0.1, "cpu_per_core_ratio": [0.1, 0.2], "net": []}),
        ("heartbeat", {"seq": 1, "agent_version": "0.1.0"}),
        ("status", {"source": "gpu", "ok": False, "state": "unavailable", "message": "no"}),
    ]:
        jsonschema.validate(f.make(t, data), schema)
    bad = f.make("gpu", {"util_gpu_ratio": "high"})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_the_documented_row_example_is_the_documented_json_example() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "wire-format.md").read_text()
    block = doc.split("The same `gpu` sample in both forms:")[1].split("```")[1]
    js, row = block.strip().splitlines()
    assert row.startswith("r1\tgpu\t") and decode_line(row) == decode_line(js)


def test_a_tick_shared_timestamp_is_written_as_each_event_alone_would_be() -> None:
    """``line`` reuses the text of the last timestamp it wrote (a tick's events share one):
    repeats, changes, an int equal to the float before it: each line as a fresh factory
    (nothing to reuse) writes it."""
    for rows in (False, True):
        f = EventFactory("n", "worker", rows=rows)
        for ts in (1.25, 1.25, 1.2500001, 1.25, 2.0, 2, 2.0, 1e-7, 1234567890.123456789):
            for type_, data in (("gpu", {"index": 1}), ("heartbeat", {"seq": 1})):
                fresh = EventFactory("n", "worker", rows=rows)
                assert f.line(type_, data, ts, id="x") == fresh.line(type_, data, ts, id="x"), (rows, ts)
