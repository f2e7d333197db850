"""``analyze import tensorboard``: event files and CSV exports as step telemetry of a job,
all or nothing, idempotent, with one-line errors naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

pytest.importorskip("tensorboard", reason="TensorBoard's own writer makes the event files")

from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402

from cmdare.analytics.cli import cli  # noqa: E402

T0 = 1_790_000_000.0


def logdir(root: Path, runs: dict[str, float], points: int = 40) -> Path:
    """One event file per run: global_step/sec = rate every 100 steps, loss alongside."""
    for run, rate in runs.items():
        w = EventFileWriter(str(root / run))
        for i in range(1, points + 1):
            vals = [
                summary_pb2.Summary.Value(tag="global_step/sec", simple_value=rate),
                summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / i),
            ]
            w.add_event(
                event_pb2.Event(
                    wall_time=T0 + i * 100 / rate, step=i * 100, summary=summary_pb2.Summary(value=vals)
                )
            )
        w.close()
    return root


def run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.output


def counts(db: Path) -> tuple[int, int, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return tuple(
            con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("jobs", "steps", "scalars")
        )
    finally:
        con.close()


def test_event_files_become_the_jobs_step_telemetry_and_a_second_import_stores_nothing(
    tmp_path: Path,
) -> None:
    logs = logdir(tmp_path / "logs", {"worker0": 4.0, "worker1": 5.0})
    db = tmp_path / "t.duckdb"
    flags = [
        "--job",
        "resnet50-k80x2",
        "--gpu-type",
        "k80",
        "--workers",
        "2",
        "--ps",
        "1",
        "--model",
        "resnet50",
        "--params",
        "25557032",
        "--tensors",
        "161",
        "--batch-size",
        "32",
        "--db",
        str(db),
    ]
    code, out = run("import", "tensorboard", str(logs), *flags, "--json")
    assert code == 0, out
    res = json.loads(out.splitlines()[-1])
    assert res["runs"] == ["worker0", "worker1"] and res["files"] == 2 and res["points"] == 160
    assert res["steps"] == 80 and res["scalars"] == 80 and res["duplicates"] == 0
    assert counts(db) == (2, 80, 80)

    code, out = run("jobs", "--db", str(db), "--json")
    (job,) = json.loads(out)
    assert job["job"] == "resnet50-k80x2" and job["accelerator"] == "k80" and job["world_size"] == 2
    assert job["model"] == "resnet50" and job["params"] == 25557032 and job["batch_size"] == 32
    assert job["steps"] == 2 * 3900  # 39 intervals of 100 steps per run (the first point has none)
    code, out = run("steps", "--job", "resnet50-k80x2", "--db", str(db), "--json")
    rows = {r["run"]: r for r in json.loads(out)}
    assert rows["worker0"]["steps_per_s"] == pytest.approx(4.0) and rows["worker1"][
        "steps_per_s"
    ] == pytest.approx(5.0)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT DISTINCT ps, tensors FROM jobs").fetchall() == [(1, 161)]
    con.close()

    code, out = run("import", "tensorboard", str(logs), *flags, "--json")
    again = json.loads(out.splitlines()[-1])
    assert code == 0 and again["steps"] == 0 and again["scalars"] == 0 and again["duplicates"] == 162
    assert counts(db) == (2, 80, 80)


def test_csv_exports_import_with_the_tag_from_the_file_name(tmp_path: Path) -> None:
    f = tmp_path / "run-chief-tag-global_step_sec.csv"
    f.write_text("Wall time,Step,Value\n" + "".join(f"{T0 + i * 10},{i * 50},{5.0}\n" for i in range(1, 11)))
    loss = tmp_path / "run-chief-tag-loss.csv"
    loss.write_text(
        "Wall time,Step,Value\n" + "".join(f"{T0 + i * 10},{i * 50},{1 / i}\n" for i in range(1, 11))
    )
    db = tmp_path / "c.duckdb"
    code, out = run("import", "tensorboard", str(f), str(loss), "--job", "vgg", "--db", str(db))
    assert code == 0, out
    assert "imported job vgg: 2 file(s), runs chief: 10 step intervals, 10 scalars stored" in out
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT sum(steps), min(run), max(run) FROM steps").fetchone() == (
        450,
        "chief",
        "chief",
    )
    assert con.execute("SELECT DISTINCT tag FROM scalars").fetchall() == [("loss",)]
    con.close()


def test_a_malformed_file_stops_the_import_with_file_and_line_and_nothing_is_stored(tmp_path: Path) -> None:
    logs = logdir(tmp_path / "logs", {"w0": 4.0})
    db = tmp_path / "t.duckdb"
    assert run("import", "tensorboard", str(logs), "--job", "before", "--db", str(db))[0] == 0
    before = counts(db)
    good = tmp_path / "good.csv"
    good.write_text("Wall time,Step,Value\n1790000000,100,4\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("Wall time,Step,Value\n1790000000,100,4\n1790000010,200,fast\n")
    code, out = run("import", "tensorboard", str(good), str(logs), str(bad), "--job", "j", "--db", str(db))
    assert code == 1
    assert out.strip().splitlines()[-1] == f"Error: {bad}: line 3: not numbers: '1790000010,200,fast'"
    assert counts(db) == before  # nothing of good.csv or the log dir either

    cut = tmp_path / "cut" / "events.out.tfevents.1.h"
    cut.parent.mkdir()
    (src,) = (logs / "w0").glob("*tfevents*")
    cut.write_bytes(src.read_bytes()[:-3])
    code, out = run("import", "tensorboard", str(cut), "--job", "j", "--db", str(db))
    assert code == 1 and f"Error: {cut}: record 40: truncated" in out
    assert counts(db) == before


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope"], "nope: no such file or directory"),
        (
            ["{tmp}/notes.txt"],
            "notes.txt: not a TensorBoard event file (events.out.tfevents.*) or CSV export (*.csv)",
        ),
        (["{tmp}/empty"], "empty: no TensorBoard event files (events.out.tfevents.*) or CSV exports"),
        # a FIFO nothing writes (the import must not wait on it), a device
        (["{tmp}/events.out.tfevents.fifo"], "events.out.tfevents.fifo: a FIFO, not a regular file"),
        (["{tmp}/zero.csv"], "zero.csv: a device or socket, not a regular file"),
        (["{tmp}/big.csv"], "big.csv: larger than 1 KiB: not a TensorBoard event file or CSV export"),
    ],
)
def test_bad_paths_get_one_line_errors(tmp_path: Path, args: list[str], message: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from cmdare.analytics.imports import tbimport

    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "empty").mkdir()
    os.mkfifo(tmp_path / "events.out.tfevents.fifo")
    (tmp_path / "zero.csv").symlink_to("/dev/zero")
    (tmp_path / "big.csv").write_text("Wall time,Step,Value\n" + "1790000000,1,2\n" * 100)
    monkeypatch.setattr(tbimport, "MAX_FILE", 1024)
    code, out = run(
        "import",
        "tensorboard",
        *[a.format(tmp=tmp_path) for a in args],
        "--job",
        "j",
        "--db",
        str(tmp_path / "x.duckdb"),
    )
    assert code == 1 and out.strip().endswith(message) and len(out.strip().splitlines()) == 1


def test_the_points_one_import_holds_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cmdare.analytics.imports import tbimport

    monkeypatch.setattr(tbimport, "MAX_POINTS", 50)
    root = logdir(tmp_path / "logs", {"a": 2.0})  # 40 points of each of two tags: 80
    code, out = run("import", "tensorboard", str(root), "--job", "j", "--db", str(tmp_path / "x.duckdb"))
    assert code == 1 and out.strip().endswith("import: more than 50 scalar points: import fewer files at once"), out


def test_an_import_skips_the_points_its_job_already_has_from_any_node(tmp_path: Path) -> None:
    """Import ids are derived from the points: the agent's tensorboard source (its node) and
    an import of the same file (the ``import`` node) make the same events. Identity is
    (node, id) in the writer; within the importing job an import's id alone finds them."""
    from cmdare.analytics.imports.tbimport import drop_stored
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import EventFactory

    con = connect(str(tmp_path / "d.duckdb"))
    agent, importer = EventFactory("tb-1", "worker", "j"), EventFactory("import", "worker", "j")
    other = EventFactory("tb-2", "worker", "k")
    step = {"run": "r", "rank": 0, "steps": 10, "interval_seconds": 1.0}
    Writer(con).write([("a", agent.line("train_steps", step, 100.0, id="tb-p1")
                        + other.line("train_steps", step, 100.0, id="tb-p2"))])
    lines = [importer.line("train_steps", step, 100.0, id=i) for i in ("tb-p1", "tb-p2", "tb-p3")]
    kept, dropped = drop_stored(con, "j", lines)
    assert dropped == 1 and [json.loads(x)["id"] for x in kept] == ["tb-p2", "tb-p3"]  # p2 is job k's
    con.close()
