"""A database no collector is writing says where it ends (issue 66): with the collector
stopped, `analyze nodes --db live.duckdb` marked running agents `lost` and `analyze runs`
said `node lost`, for a gap the file cannot see. Liveness in such a file is judged as of its
newest event, with a note; an agent that went silent before the file ends is still lost."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import EventFactory


def agent(node: str, start: float, beats: int, job: str) -> list[bytes]:
    f = EventFactory(node, "worker", job)
    out = [f.line("lifecycle", {"event": "agent_start", "instance": f"a-{node}", "boot_time": start - 100,
                                "interval_seconds": 10.0}, start),
           f.line("train_job", {"run": "r", "rank": 0, "world_size": 1, "pid": 5}, start)]
    out += [f.line("heartbeat", {"seq": i + 1, "instance": f"a-{node}", "interval_seconds": 10.0}, start + 10 * i)
            for i in range(beats)]
    out += [f.line("train_steps", {"run": "r", "rank": 0, "interval_seconds": 10.0, "steps": 10,
                                   "step_mean_seconds": 1.0}, start + 10 + 10 * i) for i in range(beats - 1)]
    return out


def fleet(path: Path, ended_ago: float) -> None:
    end = time.time() - ended_ago
    lines = agent("n1", end - 300, 31, "j1")  # beating until the file's end
    lines += agent("n2", end - 600, 20, "j2")  # silent for the last 410 s before it: lost then already
    con = connect(path)
    assert Writer(con, max_skew=None).write([("x", b"".join(lines))]).dead == 0
    con.close()


def states(path: Path) -> tuple[dict, dict, str]:
    r = CliRunner().invoke(cli, ["nodes", "--json", "--db", str(path)])
    assert r.exit_code == 0, r.output
    nodes = {x["node"]: x["state"] for x in json.loads(r.stdout)}
    r2 = CliRunner().invoke(cli, ["runs", "--json", "--db", str(path)])
    assert r2.exit_code == 0, r2.output
    runs = {x["job"]: x["state"] for x in json.loads(r2.stdout)}
    return nodes, runs, r.stderr + r2.stderr


def test_a_file_the_collector_stopped_writing_is_judged_as_of_its_end(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    fleet(db, ended_ago=900)  # the collector stopped 15 minutes ago
    nodes, runs, err = states(db)
    assert nodes == {"n1": "alive", "n2": "lost"} and runs == {"j1": "running", "j2": "node lost"}
    assert err.count("note: this database ends at ") == 2 and "(no collector is writing it)" in err


def test_a_current_file_is_judged_as_of_now_with_no_note(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    fleet(db, ended_ago=5)
    nodes, runs, err = states(db)
    assert nodes == {"n1": "alive", "n2": "lost"} and runs == {"j1": "running", "j2": "node lost"}
    assert "ends at" not in err


def test_the_same_file_through_a_serving_collector_says_nothing_of_an_end(tmp_path: Path) -> None:
    from cmdare.analytics import api
    from cmdare.analytics.db import Database

    db = tmp_path / "live.duckdb"
    fleet(db, ended_ago=900)
    con = connect(db)
    try:
        served = Database.served(con, db)
        assert served.file_end() is None
        assert api.nodes(served).notes == []
    finally:
        con.close()
