"""Issue 68: goodput called the time a data-parallel job's GPUs waited on gradient all-reduce
productive. Each step interval is now split three ways: its input-wait share, then its share
of communication computation did not hide (``comm_mean_seconds``, at most what input wait
left), then productive; the parts still add up to the wall time, in a window too, and the
accounts carry a ``communication`` bucket in GPU-hours and dollars."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.analytics.goodput import goodput
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import EventFactory

T0 = 1.75e9 + 17


def intervals(job: str, n: int, wait: float | None, comm: float | None, node: str = "a",
              start: float = T0) -> bytes:
    """``n`` 10-second step intervals of 50 steps of 0.2 s, each waiting ``wait`` and
    ``comm`` seconds a step."""
    f = EventFactory(node, "worker", job, {})
    return b"".join(f.line("train_steps", {
        "run": "r1", "rank": 0, "interval_seconds": 10.0, "steps": 50, "first_step": 50 * i, "last_step": 50 * i + 50,
        "step_mean_seconds": 0.2, "steps_per_second": 5.0,
        **({"wait_mean_seconds": wait} if wait is not None else {}),
        **({"comm_mean_seconds": comm} if comm is not None else {})}, start + 10 * (i + 1)) for i in range(n))


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "c.duckdb"
    con = connect(path)
    f = EventFactory("a", "worker", "ckpt", {})
    Writer(con, max_skew=None).write([("m", b"".join([
        intervals("ddp", 30, 0.02, 0.05),  # 10 % input wait, 25 % communication
        intervals("nocomm", 30, 0.02, None),  # a job that reports none
        intervals("both", 30, 0.15, 0.1, node="b"),  # 75 % input wait: communication gets the 25 % left
        intervals("ckpt", 30, 0.02, 0.05, node="c"),
        # a 20-second save at +105..+125 over two of its intervals: those go through the sweep
        f.line("train_checkpoint", {"run": "r1", "rank": 0, "action": "save", "step": 500, "seconds": 20.0, "ok": True},
               T0 + 125),
    ]))])
    con.close()
    return path


def test_each_interval_splits_into_input_wait_communication_and_productive(db: Path) -> None:
    con = connect(db, read_only=True)
    g = goodput(con, "ddp")
    assert g.wall == pytest.approx(300.0)
    assert g.seconds["input_wait"] == pytest.approx(30.0)
    assert g.seconds["communication"] == pytest.approx(75.0)
    assert g.seconds["productive"] == pytest.approx(195.0)
    assert goodput(con, "nocomm").seconds["communication"] == 0.0
    both = goodput(con, "both").seconds
    assert both["input_wait"] == pytest.approx(225.0) and both["communication"] == pytest.approx(75.0)
    assert both["productive"] == pytest.approx(0.0, abs=1e-9)
    c = goodput(con, "ckpt").seconds
    assert c["checkpoint_save"] == pytest.approx(20.0)
    # the save [+105, +125) wins over the three intervals it overlaps, each laid out as
    # input wait 1 s, communication 2.5 s, productive 6.5 s: [+100, +110) keeps its wait,
    # communication and 1.5 s; [+110, +120) keeps nothing; [+120, +130) keeps 5 s productive
    assert c["input_wait"] == pytest.approx(28.0) and c["communication"] == pytest.approx(70.0)
    assert c["productive"] == pytest.approx(182.0) and sum(c.values()) == pytest.approx(300.0)
    # a window: the part inside it
    w = goodput(con, "ddp", since=T0 + 100, until=T0 + 200)
    assert w.seconds["communication"] == pytest.approx(25.0) and w.wall == pytest.approx(100.0)
    con.close()


def test_the_accounts_carry_a_communication_bucket(db: Path) -> None:
    r = CliRunner().invoke(cli, ["goodput", "--job", "ddp", "--json", "--db", str(db)])
    assert r.exit_code == 0, r.output
    rows = {x["category"]: x for x in json.loads(r.stdout)}
    assert rows["communication"]["seconds"] == pytest.approx(75.0) and rows["communication"]["pct"] == 25.0
    fleet = CliRunner().invoke(cli, ["goodput", "--fleet", "--by", "job", "--json", "--db", str(db)])
    assert fleet.exit_code == 0, fleet.output
    text = fleet.stdout
    assert "communication" in text


@pytest.mark.parametrize("comm", [-5.0, 1e300, 7.0])
def test_a_hostile_communication_figure_costs_only_its_own_split(tmp_path: Path, comm: float) -> None:
    """A broken adapter's figure (negative, huge, longer than the step): the interval's
    communication is clamped to what input wait left, the parts add up, other jobs exact."""
    path = tmp_path / "h.duckdb"
    con = connect(path)
    Writer(con, max_skew=None).write([("m", intervals("bad", 10, 0.02, comm) + intervals("ddp", 30, 0.02, 0.05, node="b"))])
    g = goodput(con, "bad").seconds
    assert sum(g.values()) == pytest.approx(100.0)
    assert 0.0 <= g["communication"] <= 90.0 + 1e-9 and g["input_wait"] == pytest.approx(10.0)
    assert goodput(con, "ddp").seconds["communication"] == pytest.approx(75.0)
    con.close()
