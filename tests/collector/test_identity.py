"""An event's identity is its sender's (node, id): senders whose ids collide (30 simulated
fleets with one id scheme, or a hostile sender reusing another node's ids) lose nothing,
and a real redelivery is still stored once, in every form the writer takes (JSON lines,
rows, column blocks), in a database file and in a lake."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire import columns
from cmdare.wire.events import EventFactory

T0 = 1_790_000_000.0


def fleet_lines(node: str, n: int, rows: bool, same_ts: bool = False) -> bytes:
    """``n`` GPU, host and step events from ``node`` with ids e0.. (the same for every node)."""
    f = EventFactory(node, "worker", "j", rows=rows)
    out = []
    for i in range(n):
        t = T0 + i + (0.0 if same_ts else 0.001 * (sum(map(ord, node)) % 97))
        out.append(f.line("gpu", {"index": 0, "util_gpu_ratio": 0.5}, t, id=f"g{i}"))
        out.append(f.line("host", {"cpu_util_ratio": 0.25}, t, id=f"h{i}"))
        out.append(f.line("train_steps", {"run": "r", "rank": 0, "steps": 10, "interval_seconds": 1.0}, t, id=f"s{i}"))
    return b"".join(out)


def counts(con) -> tuple[int, int, int]:
    return tuple(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                 for t in ("gpu_samples", "host_samples", "steps"))


@pytest.mark.parametrize("form", [pytest.param("json", marks=pytest.mark.slow),
                                  pytest.param("rows", marks=pytest.mark.slow), "blocks"])  # the fast tier: one form
@pytest.mark.parametrize("same_ts", [False, True])
def test_thirty_fleets_with_one_id_scheme_lose_nothing(tmp_path: Path, form: str, same_ts: bool) -> None:
    con = connect(tmp_path / "f.duckdb")
    w = Writer(con, max_skew=None)
    nodes = [f"fleet{k}-node" for k in range(30)]

    def msg(node: str) -> bytes:
        text = fleet_lines(node, 20, rows=form != "json", same_ts=same_ts)
        return columns.encode(text) if form == "blocks" else text

    # half the fleets in one batch (ids repeat inside it), the rest one batch each
    r = w.write([(f"t:{k}", msg(n)) for k, n in enumerate(nodes[:15])])
    for k, n in enumerate(nodes[15:]):
        w.write([(f"u:{k}", msg(n))])
    assert counts(con) == (600, 600, 600) and r.dead == 0
    # a real redelivery of every fleet: stored once, counted as duplicates
    again = w.write([(f"v:{k}", msg(n)) for k, n in enumerate(nodes)])
    assert counts(con) == (600, 600, 600) and again.duplicates == 30 * 60
    assert con.execute("SELECT count(DISTINCT (node, id)) FROM gpu_samples").fetchone()[0] == 600
    con.close()


def test_a_sender_reusing_another_nodes_ids_drops_nothing_of_either(tmp_path: Path) -> None:
    con = connect(tmp_path / "h.duckdb")
    w = Writer(con, max_skew=None)
    victim = fleet_lines("victim", 10, rows=True, same_ts=True)
    w.write([("a", victim)])
    hostile = fleet_lines("mallory", 10, rows=True, same_ts=True)  # the victim's ids and times, its own node
    w.write([("b", hostile)])
    w.write([("c", victim)])  # the victim's next delivery of the same events: not stored again
    assert counts(con) == (20, 20, 20)
    by = dict(con.execute("SELECT node, count(*) FROM steps GROUP BY node").fetchall())
    assert by == {"victim": 10, "mallory": 10}
    con.close()


@pytest.mark.slow  # two lakes' worth of appends (3 s): the full run
def test_a_lake_keeps_both_senders_events(tmp_path: Path) -> None:
    from cmdare.collector.lake import Lake, load_database
    from tests.lake.test_lake_unit import count

    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    for node in ("a", "b"):
        p = tmp_path / f"{node}.duckdb"
        con = connect(p)
        Writer(con, max_skew=None, rollup_every=None).write([("m", fleet_lines(node, 5, rows=True, same_ts=True))])
        load_database(lk, con, str(p))
        load_database(lk, con, str(p))  # twice: nothing new
        con.close()
    assert count(lk) == (10, 5)  # ten rows, five ids: each id once per node
