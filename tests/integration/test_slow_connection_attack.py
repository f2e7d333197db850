"""Issue 31's attack on a real, ingesting collector: 1,100 slow connections (a header line
every 4 s) against its API while an agent spools, the collector held to 1,024 file
descriptors (a unit without LimitNOFILE). Ingest never depends on the API: the collector
stays up, keeps loading during the attack, and every event the agent spooled is stored."""

from __future__ import annotations

import json
import resource
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import BIN, agent_env, wait_for

# 1,100 connections held for half a minute: scripts/test-fast leaves it to the full run
pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: times what it waits for

N = 1100


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def _stored(url: str) -> int | None:
    """Events stored so far, from the collector's /metrics (None while it cannot answer)."""
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=3).read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("cmdare_collector_events_stored_total "):
            return int(float(line.split()[1]))
    return None


def test_1100_slow_connections_cost_ingest_nothing(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < N + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    spool, db = tmp_path / "spool", tmp_path / "a.duckdb"
    agent = subprocess.Popen(
        [str(BIN / "cmdare-agent"), "--config", "/dev/null", "--spool-dir", str(spool), "--interval", "0.2s",
         "--node", "n-1", "--duration", "25", "--set", "sources.gpu.enabled=false"],
        env=agent_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_for(spool.exists, 30, what="the spool")
    log = tmp_path / "collector.log"
    col = subprocess.Popen(
        [str(BIN / "cmdare-collector"), "spool", str(spool), "--follow", "--interval", "0.2s", "--db", str(db),
         "--http", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"), preexec_fn=_limit_fds,
    )
    socks: list[socket.socket] = []
    stop = threading.Event()
    try:
        service = db.with_name(db.name + ".service.json")
        wait_for(service.exists, 60, what="the collector's API")
        url = json.loads(service.read_text())["url"]
        before = wait_for(lambda: _stored(url), 30, what="a first batch stored")
        host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
        for _ in range(N):
            try:
                s = socket.create_connection((host, port), timeout=5)
                s.sendall(b"GET /api/v1/nodes HTTP/1.1\r\n")
                socks.append(s)
            except OSError:
                pass  # refused or reset: the cap doing its work

        def trickle() -> None:  # a header line every 4 s on every connection still open
            n = 0
            while not stop.wait(4):
                n += 1
                for s in list(socks):
                    try:
                        s.sendall(f"X-Slow-{n}: 1\r\n".encode())
                    except OSError:
                        pass

        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(12)  # the attack, held
        assert col.poll() is None, log.read_text()[-2000:]
        stop.set()
        for s in socks:
            s.close()
        socks.clear()
        during = wait_for(lambda: _stored(url), 30, what="the API answering after the attack")
        assert during > before  # ingest went on while the API was under attack
        assert agent.wait(timeout=60) == 0
        spooled = sum(1 for f in spool.glob("*.ndjson") for line in f.read_bytes().splitlines() if line.strip())
        wait_for(lambda: (_stored(url) or 0) >= spooled, 60, what=f"all {spooled} spooled events stored")
    finally:
        stop.set()
        for s in socks:
            s.close()
        agent.kill()
        col.send_signal(signal.SIGTERM)
        rc = col.wait(timeout=60)
    text = log.read_text()
    assert rc == 0 and "Too many open files" not in text, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
