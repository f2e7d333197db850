"""TensorBoard event files and CSV exports: the reader, the step converter and the agent
source that tails log dirs.  Event files are written by TensorBoard's own writer."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

pytest.importorskip("tensorboard", reason="TensorBoard's own writer makes the event files")

from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.compat.proto.tensor_pb2 import TensorProto  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402

from cmdare.agent.runtime import SourceRunner  # noqa: E402
from cmdare.agent.sources.tensorboard import TensorBoardSource  # noqa: E402
from cmdare.wire.tbevents import (  # noqa: E402
    Point,
    StepConverter,
    TensorBoardError,
    crc32c,
    csv_tag,
    read_csv,
    read_event_file,
)


def scalar(tag: str, v: float, tf2: bool = False) -> summary_pb2.Summary.Value:
    if tf2:  # TF2 writes scalars as 0-d tensors
        return summary_pb2.Summary.Value(tag=tag, tensor=TensorProto(dtype=1, float_val=[v]))
    return summary_pb2.Summary.Value(tag=tag, simple_value=v)


def write(w: EventFileWriter, step: int, wall: float, **tags: float) -> None:
    vals = [scalar(k.replace("__", "/"), v, tf2=(k == "loss")) for k, v in tags.items()]
    w.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(value=vals)))


def test_crc32c_matches_the_castagnoli_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_reads_tf1_and_tf2_scalars_written_by_tensorboard(tmp_path: Path) -> None:
    w = EventFileWriter(str(tmp_path))
    for s in range(1, 301):
        write(w, s * 10, 1.7e9 + s, global_step__sec=8.0 + s % 5, loss=1.0 / s)
    w.close()
    (f,) = tmp_path.glob("events.out.tfevents.*")
    pts = read_event_file(f)
    rate = [p for p in pts if p.tag == "global_step/sec"]
    loss = [p for p in pts if p.tag == "loss"]
    assert [p.step for p in rate] == [s * 10 for s in range(1, 301)]
    assert [p.value for p in rate] == [8.0 + s % 5 for s in range(1, 301)]
    assert [p.value for p in loss] == pytest.approx([1.0 / s for s in range(1, 301)], rel=1e-6)
    assert rate[0].wall == 1.7e9 + 1


def test_malformed_event_files_name_the_file_and_record(tmp_path: Path) -> None:
    w = EventFileWriter(str(tmp_path))
    for s in range(5):
        write(w, s, 1.7e9 + s, global_step__sec=1.0)
    w.close()
    (f,) = tmp_path.glob("events.out.tfevents.*")
    data = f.read_bytes()
    cut = tmp_path / "cut.tfevents"
    cut.write_bytes(data[:-7])
    with pytest.raises(TensorBoardError, match=r"cut.tfevents: record 5: truncated"):
        read_event_file(cut)
    flipped = bytearray(data)
    flipped[-6] ^= 0xFF  # inside the last record's data
    bad = tmp_path / "bad.tfevents"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(TensorBoardError, match=r"bad.tfevents: record 5: data checksum mismatch"):
        read_event_file(bad)
    junk = tmp_path / "junk.tfevents"
    junk.write_bytes(b"Wall time,Step,Value\n1,2,3\n")
    with pytest.raises(TensorBoardError, match=r"junk.tfevents: record 0: length checksum mismatch"):
        read_event_file(junk)


def test_csv_exports_parse_and_bad_lines_are_named(tmp_path: Path) -> None:
    good = tmp_path / "run-w0-tag-global_step_sec.csv"
    good.write_text("Wall time,Step,Value\n1700000000.25,100,4.5\n1700000010.5,200,4.75\n")
    assert csv_tag(good) == "global_step/sec"
    assert read_csv(good, "global_step/sec") == [
        Point(1700000000.25, 100, "global_step/sec", 4.5, "line 2"),
        Point(1700000010.5, 200, "global_step/sec", 4.75, "line 3"),
    ]
    cases = {
        "Step,Value\n1,2\n": "line 1: expected the header 'Wall time,Step,Value'",
        "Wall time,Step,Value\n1700000000,1,2\n1700000001,2\n": "line 3: expected 3 columns, got 2",
        "Wall time,Step,Value\n1700000000,1.5,2\n": "line 2: step '1.5' is not a whole number",
        "Wall time,Step,Value\n1700000000,1,nan\n": "line 2: value 'nan' is not finite",
        "Wall time,Step,Value\n17e20,1,2\n": "line 2: wall time '17e20' is not unix seconds",
        "": "line 1: empty file",
    }
    for text, msg in cases.items():
        f = tmp_path / "x.csv"
        f.write_text(text)
        with pytest.raises(TensorBoardError) as e:
            read_csv(f, "global_step/sec")
        assert str(e.value) == f"{f}: {msg}" or str(e.value).startswith(f"{f}: {msg}")


def test_step_rates_become_intervals_since_the_previous_point() -> None:
    conv = StepConverter("train", 0)
    pts = [
        Point(100.0, 100, "global_step/sec", 5.0, ""),
        Point(100.0, 100, "examples/sec", 160.0, ""),
        Point(120.0, 200, "global_step/sec", 5.0, ""),
        Point(120.0, 200, "examples/sec", 160.0, ""),
        Point(130.0, 250, "global_step/sec", 5.0, ""),
    ]
    out = [d for _, d, _ in conv.feed(pts)]
    assert "steps" not in out[0] and out[0]["steps_per_second"] == 5.0  # no previous point
    assert out[1]["steps"] == 100 and out[1]["first_step"] == 101 and out[1]["last_step"] == 200
    assert out[1]["interval_seconds"] == 20.0 and out[1]["step_mean_seconds"] == 0.2
    assert out[1]["examples_per_second"] == 160.0 and out[1]["examples"] == pytest.approx(3200.0)
    assert out[2]["steps"] == 50 and "examples_per_second" not in out[2]


def tb_source(logdir: Path, **kw) -> TensorBoardSource:
    return TensorBoardSource(
        TensorBoardSource.parse_config(
            "sources.tensorboard", {"logdirs": [str(logdir)], "scalars": ["loss"], **kw}
        )
    )


def collect(src: TensorBoardSource) -> list[tuple[str, dict, float, str, str]]:
    out: list = []
    src.collect(lambda t, d, ts=None, job=None, id=None: out.append((t, d, ts, job, id)))
    return out


def test_source_tails_growing_files_and_waits_for_incomplete_records(tmp_path: Path) -> None:
    logdir = tmp_path / "resnet-job"
    w = EventFileWriter(str(logdir / "train"))
    for s in range(1, 4):
        write(w, s * 100, 1.7e9 + s * 10, global_step__sec=10.0, loss=0.5)
    w.flush()
    src = tb_source(logdir)
    src.start()
    first = collect(src)
    steps = [e for e in first if e[0] == "train_steps"]
    assert [e[1]["last_step"] for e in steps] == [100, 200, 300]
    assert all(e[3] == "resnet-job" and e[1]["run"] == "train" for e in steps)  # job = log dir name
    assert [e[1]["tag"] for e in first if e[0] == "train_scalar"] == ["loss"] * 3
    assert collect(src) == []  # nothing new
    write(w, 400, 1.7e9 + 40, global_step__sec=10.0)
    w.flush()
    (f,) = (logdir / "train").glob("*tfevents*")
    whole = f.read_bytes()
    # a writer caught mid-record: the new bytes stop half-way through a record
    f.write_bytes(whole[:-5])
    assert collect(src) == []
    f.write_bytes(whole)
    more = collect(src)
    assert [e[1]["last_step"] for e in more] == [400] and more[0][1]["steps"] == 100
    # ids are derived from the points: a restarted agent reading from the start sends the same ones
    again = tb_source(logdir)
    again.start()
    ids = [e[4] for e in collect(again)]
    assert len(ids) == 7 and sorted(ids) == sorted(e[4] for e in first + more)
    w.close()


def test_a_corrupt_file_is_reported_and_skipped_while_others_are_read(tmp_path: Path) -> None:
    logdir = tmp_path / "job"
    good = EventFileWriter(str(logdir / "a"))
    write(good, 1, 1.7e9, global_step__sec=2.0)
    good.flush()
    (logdir / "b").mkdir()
    (logdir / "b" / "events.out.tfevents.1.host").write_bytes(struct.pack("<Q", 5) + b"garbage-garbage")
    src = tb_source(logdir, job="j")
    runner, statuses, got = SourceRunner(src), [], []
    runner.tick(lambda t, d, ts=None, job=None, id=None: got.append((t, job)), lambda *a: statuses.append(a))
    assert got == [("train_steps", "j")]
    assert statuses[0][1] == "error" and "b/events.out.tfevents.1.host" in statuses[0][3]
    assert "length checksum mismatch" in statuses[0][3]
    good.close()


def test_no_logdirs_is_unavailable_with_the_key_to_set() -> None:
    src = TensorBoardSource(TensorBoardSource.parse_config("sources.tensorboard", {}))
    runner, statuses = SourceRunner(src), []
    runner.tick(lambda *a, **k: None, lambda *a: statuses.append(a))
    assert statuses[0][1] == "unavailable" and "sources.tensorboard.logdirs" in statuses[0][3]
