"""The embedded default, no Kafka: agent -> spool dir -> cmdare-collector spool -> DuckDB
-> analyze.  Loading twice stores nothing twice; the collector marks what it loaded so the
agent can prune it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import duckdb

from tests.conftest import BIN, agent_env


def test_agent_spool_collector_analyze(tmp_path: Path) -> None:
    spool, db = tmp_path / "spool", tmp_path / "c.duckdb"
    r = subprocess.run(
        [
            str(BIN / "cmdare-agent"),
            "--spool-dir",
            str(spool),
            "--interval",
            "0.2s",
            "--duration",
            "2",
            "--node",
            "emb-1",
            "--set",
            "sources.gpu.backend=python:tests.fakes.nvml",
        ],
        env=agent_env(CMDARE_FAKE_NVML="gpus=2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    for _ in range(2):  # a second load finds nothing new
        r = subprocess.run(
            [str(BIN / "cmdare-collector"), "spool", str(spool), "--db", str(db)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
    assert "0 events stored" in r.stderr
    con = duckdb.connect(str(db), read_only=True)
    hosts, gpus = con.execute(
        "SELECT (SELECT count(*) FROM host_samples), (SELECT count(*) FROM gpu_samples)"
    ).fetchone()
    con.close()
    assert hosts >= 8 and gpus == 2 * hosts
    assert (spool / "cursor.collected").exists()
    r = subprocess.run(
        [str(BIN / "analyze"), "host", "--db", str(db), "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0 and json.loads(r.stdout)[0]["node"] == "emb-1"
    r = subprocess.run([str(BIN / "analyze"), "nodes", "--db", str(db)], capture_output=True, text=True)
    assert r.returncode == 0 and "emb-1" in r.stdout


def test_collector_errors_are_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            str(BIN / "cmdare-collector"),
            "spool",
            str(tmp_path / "missing"),
            "--db",
            str(tmp_path / "c.duckdb"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "missing" in r.stderr
    r = subprocess.run(
        [str(BIN / "cmdare-collector"), "kafka", "http://x:1/t", "--db", str(tmp_path / "c.duckdb")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "URL: 'http://x:1/t' is not a kafka:// URL" in r.stderr
