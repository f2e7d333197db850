"""``analyze`` on real database files: exact table output, --json, --since, read-only
SQL, clear errors, and every command documented with an example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC


def ev(id_: str, ts: float, node: str, type_: str, data: dict, role: str = "worker") -> dict:
    return {
        "v": 1,
        "id": id_,
        "ts": ts,
        "node": node,
        "role": role,
        "job": "resnet",
        "labels": {},
        "type": type_,
        "data": data,
    }


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    p = tmp_path / "fleet.duckdb"
    evs = []
    for i in range(3):
        t = T0 + 10 * i
        evs.append(
            ev(
                f"h{i}",
                t,
                "gpu-1",
                "host",
                {
                    "cpu_util_ratio": 0.2 + 0.1 * i,
                    "load1": 1.5,
                    "mem_total_bytes": 64 << 30,
                    "mem_used_bytes": (8 + i) << 30,
                    "procs": 300,
                    "net": [{"nic": "eth0", "rx_bytes_total": 1_000_000 * i, "tx_bytes_total": 500_000 * i}],
                    "disk": [{"disk": "nvme0n1", "read_bytes_total": 0, "write_bytes_total": 2_000_000 * i}],
                },
            )
        )
        for g in range(2):
            evs.append(
                ev(
                    f"g{i}{g}",
                    t,
                    "gpu-1",
                    "gpu",
                    {
                        "index": g,
                        "uuid": f"GPU-{g}",
                        "name": "Tesla V100-SXM2-16GB",
                        "util_gpu_ratio": 0.9 - 0.1 * g,
                        "mem_used_bytes": 4 << 30,
                        "mem_total_bytes": 16 << 30,
                        "power_watts": 250.0,
                        "temp_celsius": 60.0 + i,
                        "throttle_mask": 4 if i == 2 else 0,
                    },
                )
            )
        evs.append(
            ev(
                f"b{i}",
                t,
                "gpu-1",
                "heartbeat",
                {"seq": i + 1, "agent_version": "0.1.0", "spool_pending": 0, "dropped_total": 0},
            )
        )
    evs.append(
        ev(
            "x1",
            T0 + 15,
            "gpu-1",
            "gpu_event",
            {"index": 1, "uuid": "GPU-1", "kind": "xid", "count": 1, "xid": 79},
        )
    )
    evs.append(
        ev("s1", T0, "ps-0", "status", {"source": "gpu", "ok": False, "state": "unavailable"}, role="ps")
    )
    con = connect(p)
    Writer(con).write([("fixture", encode_many(evs))])
    con.close()
    return p


def run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.output


def test_nodes_table(db: Path) -> None:
    code, out = run("nodes", "--db", str(db))
    assert code == 0
    assert out.splitlines()[:4] == [  # the default columns (--wide: all)
        "node   role    job     state    lives  last_seen            gpus  dropped  not_ok",
        "-----  ------  ------  -------  -----  -------------------  ----  -------  ---------------",
        "gpu-1  worker  resnet  unknown      0  2026-09-21 14:13:40     2        0",
        "ps-0   ps      resnet  unknown      0  2026-09-21 14:13:20     0           gpu=unavailable",
    ]
    code, out = run("nodes", "--db", str(db), "--wide")
    assert out.splitlines() == [  # no lifecycle events (agents before 0.1's cloud source): state unknown
        "node   role    job     cloud  zone  instance_type  spot  state    lives  first_seen           last_seen            agent_version  heartbeats  gpus  spool_pending  dropped  not_ok           clock_skew_s  skewed_events",
        "-----  ------  ------  -----  ----  -------------  ----  -------  -----  -------------------  -------------------  -------------  ----------  ----  -------------  -------  ---------------  ------------  -------------",
        "gpu-1  worker  resnet                                    unknown      0  2026-09-21 14:13:20  2026-09-21 14:13:40  0.1.0                   3     2              0        0                                             0",
        "ps-0   ps      resnet                                    unknown      0  2026-09-21 14:13:20  2026-09-21 14:13:20                                0                          gpu=unavailable                            0",
        # a file no collector is writing (its newest event months ago): judged as of its end
        "note: this database ends at 2026-09-21 14:13:40 UTC (no collector is writing it): nodes and runs are judged as of then,",
        "  never lost for the time after it",
    ]


def test_gpu_summary_json(db: Path) -> None:
    code, out = run("gpu", "--db", str(db), "--node", "gpu-1", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [(r["gpu"], r["samples"], r["util_pct"], r["xid_events"], r["throttled_pct"]) for r in rows] == [
        (0, 3, 90.0, 0, 33.3),
        (1, 3, 80.0, 1, 33.3),
    ]
    assert rows[0]["mem_total_gib"] == 16.0 and rows[0]["temp_max_c"] == 62.0


def test_host_rates_from_counters(db: Path) -> None:
    code, out = run("host", "--db", str(db), "--json")
    r = json.loads(out)[0]
    assert code == 0 and r["samples"] == 3 and r["cpu_pct"] == 30.0 and r["cpu_max_pct"] == 40.0
    assert r["net_rx_mb_s"] == 0.1 and r["net_tx_mb_s"] == 0.05 and r["disk_write_mb_s"] == 0.2
    assert r["mem_used_gib"] == 10.0


def test_since_filters_old_samples(db: Path) -> None:
    code, out = run("gpu", "--db", str(db), "--since", "10m")
    assert code == 0 and out == "(no rows)\n"  # the fixture is from 2026-09


def test_bad_since_is_a_one_line_usage_error(db: Path) -> None:
    code, out = run("host", "--db", str(db), "--since", "5 years")
    assert (
        code == 2
        and "Invalid value for --since: expected a duration like 30s, 10m, 2h or 7d, got '5 years'" in out
    )


def test_sql_is_read_only(db: Path) -> None:
    code, out = run("sql", "DELETE FROM gpu_samples", "--db", str(db))
    assert code == 1 and out.startswith("Error: only SELECT queries may run here") and len(out.strip().splitlines()) == 1
    code, out = run("sql", "SELECT count(*) AS n FROM gpu_samples", "--db", str(db), "--json")
    assert code == 0 and json.loads(out) == [{"n": 6}]


def test_missing_database(tmp_path: Path) -> None:
    code, out = run("nodes", "--db", str(tmp_path / "nope.duckdb"))
    assert (
        code == 1
        and out
        == f"Error: {tmp_path / 'nope.duckdb'}: no such database (load one with cmdare-collector, or pass --db)\n"
    )


def test_db_from_environment(db: Path) -> None:
    r = CliRunner().invoke(cli, ["sql", "SELECT 1 AS one", "--json"], env={"CMDARE_DB": str(db)})
    assert r.exit_code == 0 and json.loads(r.output) == [{"one": 1}]


def test_db_before_the_command(db: Path, tmp_path: Path) -> None:
    """`analyze --db X nodes` works as `analyze nodes --db X`, nested commands too; a --db
    after the command wins, and $CMDARE_DB gives way to either."""
    env = {"CMDARE_DB": str(tmp_path / "other.duckdb")}
    r = CliRunner().invoke(
        cli, ["--db", str(db), "sql", "SELECT count(*) AS n FROM nodes", "--json"], env=env
    )
    assert r.exit_code == 0 and json.loads(r.output) == [{"n": 2}]
    missing = tmp_path / "nope.duckdb"
    r = CliRunner().invoke(cli, ["--db", str(missing), "sql", "SELECT 1", "--db", str(db), "--json"], env=env)
    assert r.exit_code == 0 and json.loads(r.output) == [{"1": 1}]
    r = CliRunner().invoke(cli, ["--db", str(missing), "fit", "speed"])
    assert (
        r.exit_code == 1
        and r.output == f"Error: {missing}: no such database (load one with cmdare-collector, or pass --db)\n"
    )
    (tmp_path / "runs").mkdir()
    nested = tmp_path / "no-such-dir" / "x.duckdb"  # import opens it for writing: a clear error
    r = CliRunner().invoke(
        cli, ["--db", str(nested), "import", "tensorboard", str(tmp_path / "runs"), "--job", "j"]
    )
    assert r.exit_code == 1 and r.output.startswith(f"Error: {nested}: cannot open"), r.output


def test_every_command_is_documented_with_an_example() -> None:
    readme = (ROOT / "README.md").read_text()
    names = []
    for name, cmd in cli.commands.items():
        names.append([name])
        names += [[name, sub] for sub in getattr(cmd, "commands", {})]  # groups: each subcommand too
    for args in names:
        help_text = CliRunner().invoke(cli, [*args, "--help"]).output
        assert "Example" in help_text, f"analyze {' '.join(args)} --help has no example"
        assert f"analyze {' '.join(args)}" in readme, f"README does not mention analyze {' '.join(args)}"
    assert ["import", "tensorboard"] in names


def test_help_paragraphs_are_wrapped_as_prose() -> None:
    """A help text edited after click read it (the import formats' column lists) kept its
    docstring's indent, and click wrapped it into 'a row,   with' (issue 66: help texts that
    read right). The opening paragraph of every command's help is prose: no run of spaces."""
    import re

    names = [[n] for n in cli.commands] + [[n, s] for n, c in cli.commands.items() for s in getattr(c, "commands", {})]
    bad = []
    for args in names:
        out = CliRunner().invoke(cli, [*args, "--help"]).output.split("\n\n")
        first = out[1] if len(out) > 1 else ""
        if re.search(r"\S {2,}\S", first):
            bad.append((args, first[:120]))
    assert bad == []
