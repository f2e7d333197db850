"""Fault suite, clocks: an agent whose clock is years off is stored, flagged with its skew,
shown by ``analyze nodes``, and left out of liveness and lifetime verdicts.

Run alone with ``pytest -m fault``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from cmdare.analytics import queries
from cmdare.analytics.cli import cli as analyze
from cmdare.collector import views
from cmdare.collector.cli import cli as collector
from cmdare.collector.db import connect, migrate
from cmdare.collector.writer import Writer
from cmdare.wire import columns
from cmdare.wire.events import EventFactory
from cmdare.wire.spool import seg_name

pytestmark = pytest.mark.fault

YEARS3 = 3 * 365 * 86400.0
HB = 20  # heartbeats per life


def _life(node: str, t0: float, rows: bool) -> list[bytes]:
    """One clean agent life as the agent sends it, stamped by a clock that reads ``t0`` at
    its start: start, 20 heartbeats a second apart, a GPU sample each, a clean stop."""
    f = EventFactory(node, "worker", "job-1", rows=rows)
    boot = t0 - 60
    out = [f.line("lifecycle", {"event": "agent_start", "boot_time": boot, "interval_seconds": 1.0}, t0)]
    for i in range(1, HB + 1):
        out.append(f.line("heartbeat", {"seq": i, "interval_seconds": 1.0}, t0 + i))
        out.append(f.line("gpu", {"index": 0, "uuid": f"GPU-{node}", "util_gpu_ratio": 0.9}, t0 + i))
    out.append(
        f.line(
            "lifecycle", {"event": "agent_stop", "boot_time": boot, "stop_reason": "SIGTERM"}, t0 + HB + 0.5
        )
    )
    return out


def _fleet(rows: bool) -> dict[str, list[bytes]]:
    now = float(int(time.time()))  # whole seconds: a life's boot is matched on round(boot_time)
    return {
        "good": _life("good", now - 600, rows),
        "ahead": _life("ahead", now + YEARS3, rows),  # the 438,304-hour lifetime of the issue
        "behind": _life("behind", now - YEARS3, rows),  # hidden from --since, dated before its boot
    }


def _skews(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[int, float, float]]:
    return {
        n: (c, lo, hi)
        for n, c, lo, hi in con.execute(
            "SELECT node, count(*), min(skew_seconds), max(skew_seconds) FROM clock_skew GROUP BY node"
        ).fetchall()
    }


@pytest.mark.parametrize("rows", [False, True], ids=["json", "rows"])
def test_a_skewed_clock_is_stored_flagged_and_left_out_of_verdicts(rows: bool) -> None:
    fleet = _fleet(rows)
    con = duckdb.connect()
    migrate(con)
    views.apply(con)
    w = Writer(con, max_skew=86400.0)
    msg = b"".join(x for lines in fleet.values() for x in lines)
    r = w.write([("kafka:t/0@1", msg)])

    per_node = len(fleet["good"])
    assert r.inserted == 3 * per_node and r.dead == 0  # stored all the same
    assert r.skewed == 2 * per_node
    sk = _skews(con)
    assert set(sk) == {"ahead", "behind"}
    assert sk["ahead"][0] == sk["behind"][0] == per_node
    assert YEARS3 - 700 < sk["ahead"][1] <= sk["ahead"][2] < YEARS3 + 700
    assert -YEARS3 - 700 < sk["behind"][1] <= sk["behind"][2] < -YEARS3 + 700
    tables = dict(con.execute("SELECT event_table, count(*) FROM clock_skew GROUP BY ALL").fetchall())
    assert tables == {"lifecycle_events": 4, "heartbeats": 2 * HB, "gpu_samples": 2 * HB}

    # liveness and lifetimes: only the node with a good clock has a life, stopped cleanly
    lives = con.execute("SELECT node, end_reason, lifetime_seconds FROM instance_lives()").fetchall()
    assert lives == [("good", "stopped", pytest.approx(60 + HB + 0.5, abs=0.01))]
    first_last = dict(con.execute("SELECT node, last_seen IS NOT NULL FROM nodes").fetchall())
    assert first_last == {"good": True, "ahead": False, "behind": False}

    cols, out = queries.nodes(con)
    by = {row[0]: dict(zip(cols, row, strict=True)) for row in out}
    assert by["good"]["state"] == "stopped" and by["good"]["skewed_events"] == 0
    assert by["good"]["clock_skew_s"] is None
    assert by["ahead"]["state"] == by["behind"]["state"] == "clock skew"
    assert by["ahead"]["skewed_events"] == per_node and by["ahead"]["clock_skew_s"] > YEARS3 - 700
    assert by["behind"]["clock_skew_s"] < -YEARS3 + 700

    # delivered again: stored once, flagged once
    again = w.write([("kafka:t/0@1", msg)])
    assert again.inserted == 0 and again.skewed == 0 and again.duplicates == 3 * per_node
    assert (
        con.execute("SELECT count(*), count(DISTINCT id) FROM clock_skew").fetchone() == (2 * per_node,) * 2
    )


def test_column_blocks_from_a_skewed_clock_are_flagged_and_a_good_one_still_stored() -> None:
    """A column block's rows are checked one by one when any of them is out of the window
    (the fast path stores only blocks wholly inside it)."""
    now = time.time()
    ok = EventFactory("good", "worker", "j", rows=True)
    bad = EventFactory("ahead", "worker", "j", rows=True)
    good_lines = b"".join(ok.line("gpu", {"index": i % 4}, now - 5 + i * 0.01) for i in range(200))
    bad_lines = b"".join(bad.line("gpu", {"index": i % 4}, now + YEARS3 + i) for i in range(50))
    con = duckdb.connect()
    migrate(con)
    w = Writer(con, max_skew=86400.0)
    r = w.write([("t:1", columns.encode(good_lines)), ("t:2", columns.encode(bad_lines))])
    assert r.rows["gpu_samples"] == 250 and r.dead == 0 and r.skewed == 50
    assert _skews(con)["ahead"][0] == 50 and "good" not in _skews(con)
    # alone, the good block takes the fast path and flags nothing
    r2 = w.write(
        [("t:3", columns.encode(b"".join(ok.line("gpu", {"index": 1}, now + i) for i in range(10))))]
    )
    assert r2.rows["gpu_samples"] == 10 and r2.skewed == 0


def _spool(tmp_path: Path, fleet: dict[str, list[bytes]]) -> Path:
    d = tmp_path / "spool"
    d.mkdir()
    (d / seg_name(1)).write_bytes(b"".join(x for lines in fleet.values() for x in lines))
    return d


def test_the_collector_flags_skew_by_default_and_analyze_nodes_shows_it(tmp_path: Path) -> None:
    fleet = _fleet(rows=True)
    d = _spool(tmp_path, fleet)
    db = tmp_path / "c.duckdb"
    r = CliRunner().invoke(collector, ["spool", str(d), "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert f"({2 * len(fleet['good'])} with clock skew)" in r.output
    r = CliRunner().invoke(analyze, ["nodes", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    by = {x["node"]: x for x in json.loads(r.stdout)}
    assert {n: (x["state"], x["skewed_events"] > 0) for n, x in by.items()} == {
        "ahead": ("clock skew", True),
        "behind": ("clock skew", True),
        "good": ("stopped", False),
    }
    r = CliRunner().invoke(analyze, ["nodes", "--db", str(db)])
    assert "clock_skew_s" in r.output.splitlines()[0]


def test_max_clock_skew_off_and_bad_values(tmp_path: Path) -> None:
    d = _spool(tmp_path, _fleet(rows=False))
    db = tmp_path / "off.duckdb"
    r = CliRunner().invoke(collector, ["spool", str(d), "--db", str(db), "--max-clock-skew", "off"])
    assert r.exit_code == 0, r.output
    assert "clock skew" not in r.output
    con = connect(db)
    assert con.execute("SELECT count(*) FROM clock_skew").fetchone()[0] == 0
    con.close()
    for bad, says in (("soon", "--max-clock-skew"), ("0s", "more than 0")):
        for cmd in (["spool", str(d)], ["kafka", "kafka://127.0.0.1:9/t"]):
            r = CliRunner().invoke(
                collector, [*cmd, "--db", str(tmp_path / "x.duckdb"), "--max-clock-skew", bad]
            )
            assert r.exit_code == 2 and says in r.output, r.output
            assert "Traceback" not in r.output
    assert not (tmp_path / "x.duckdb").exists()  # refused before anything was opened
