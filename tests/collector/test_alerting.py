"""Rules evaluated inside a real collector process (--rules): alerts reach `analyze alerts`
through the collector's API while it ingests; a firing alert survives SIGKILL and restart
with its start time and is not announced again as new; a bad rule file stops the collector
before it consumes anything, with one line."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, agent_env, wait_for

RULES = """
groups:
  - name: live
    interval: 1s
    rules:
      - alert: AgentSeen
        expr: SELECT node, count(*) AS value FROM heartbeats WHERE ts <= eval_time() GROUP BY node
        labels: {severity: info}
        annotations: {summary: "{{ $labels.node }} heartbeats: {{ $value }}"}
      - alert: NeverTrue
        expr: SELECT node FROM heartbeats WHERE false
"""


def collector(spool: Path, db: Path, rules: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "cmdare-collector"), "spool", str(spool), "--follow", "--interval", "0.3s", "--db", str(db),
         "--rules", str(rules)],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"),
    )


def alerts(db: Path) -> dict:
    r = subprocess.run([str(BIN / "analyze"), "alerts", "--db", str(db), "--json"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow  # an agent and two collectors for seconds
@pytest.mark.serial
def test_alerts_live_and_across_a_sigkill(tmp_path: Path) -> None:
    spool, db, rules = tmp_path / "spool", tmp_path / "a.duckdb", tmp_path / "rules.yml"
    rules.write_text(RULES)
    agent = subprocess.run(
        [str(BIN / "cmdare-agent"), "--config", "/dev/null", "--spool-dir", str(spool), "--interval", "0.3s",
         "--node", "n-1", "--duration", "2", "--set", "sources.gpu.enabled=false"],
        env=agent_env(), capture_output=True, text=True, timeout=60,
    )
    assert agent.returncode == 0, agent.stderr
    col = collector(spool, db, rules, tmp_path / "c1.log")
    service = db.with_name(db.name + ".service.json")
    try:
        wait_for(service.exists, 60, what="the collector's API")
        def firing() -> list[dict]:
            return [a for a in alerts(db)["alerts"] if a["state"] == "firing"]

        [a] = wait_for(firing, 60, what="the alert firing")
        assert a["rule"] == "live/AgentSeen" and a["labels"] == {"node": "n-1", "alertname": "AgentSeen",
                                                                  "severity": "info"}
        assert a["summary"].startswith("n-1 heartbeats: ")
        since = a["since"]
        assert {r["rule"]: r["health"] for r in alerts(db)["rules"]} == {"live/AgentSeen": "ok", "live/NeverTrue": "ok"}
    finally:
        col.send_signal(signal.SIGKILL)
        col.wait(timeout=30)
    first_log = (tmp_path / "c1.log").read_text()
    assert "alert live/AgentSeen firing{node=n-1,severity=info}" in first_log
    # restarted: the same alert, the same start, evaluated on; not announced as new
    col = collector(spool, db, rules, tmp_path / "c2.log")
    try:
        wait_for(lambda: service.exists() and json.loads(service.read_text())["pid"] == col.pid, 60,
                 what="the restarted collector's API")
        wait_for(lambda: "(1 alerts restored)" in (tmp_path / "c2.log").read_text(), 60, what="state restored")
        st = alerts(db)
        evals = [r["last_eval"] for r in st["rules"]]
        wait_for(lambda: [r["last_eval"] for r in alerts(db)["rules"]] != evals, 30, what="a new evaluation")
        [a] = [x for x in alerts(db)["alerts"] if x["rule"] == "live/AgentSeen"]
        assert a["state"] == "firing" and a["since"] == since
    finally:
        col.send_signal(signal.SIGTERM)
        col.wait(timeout=30)
    assert "firing{" not in (tmp_path / "c2.log").read_text()


def test_a_bad_rule_file_stops_the_collector_with_one_line(tmp_path: Path) -> None:
    rules = tmp_path / "bad.yml"
    rules.write_text(RULES.replace("FROM heartbeats WHERE false", "FROM heartbeat WHERE false"))
    (tmp_path / "spool").mkdir()
    r = subprocess.run(
        [str(BIN / "cmdare-collector"), "spool", str(tmp_path / "spool"), "--follow", "--db", str(tmp_path / "b.duckdb"),
         "--rules", str(rules)], capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.startswith("Error:")]
    assert lines == [f"Error: {rules}: group 'live': rule 'NeverTrue': expr: Catalog Error: Table with name "
                     "heartbeat does not exist!"], r.stderr


def test_receiver_names_never_carry_secrets() -> None:
    from cmdare.analytics.alerting.notify import receiver_label

    assert receiver_label("https://hooks.example/services/T0/B0/s3cr3t") == (
        "hooks.example", "https://hooks.example/services/T0/B0/s3cr3t", "")
    name, url, basic = receiver_label("http://user:pa%3Ass@am.example:9093")
    assert name == "am.example:9093" and url == "http://am.example:9093" and "pass" not in name + url
    import base64

    assert base64.b64decode(basic) == b"user:pa:ss"
    assert receiver_label("oncall=https://hooks.example/x?token=abc")[0] == "oncall"


SLOW = """
groups:
  - name: slow
    interval: 1s
    rules:
      - alert: Slow
        expr: SELECT 'a' AS k, count(*) AS value FROM range(300000) a, range(300000) b
"""


def _slow_collector(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    spool, rules, log = tmp_path / "spool", tmp_path / "slow.yml", tmp_path / "c.log"
    spool.mkdir()
    rules.write_text(SLOW)
    p = subprocess.Popen(
        [str(BIN / "cmdare-collector"), "spool", str(spool), "--follow", "--interval", "0.3s",
         "--db", str(tmp_path / "a.duckdb"), "--rules", str(rules), *extra],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"),
    )
    return p, log


@pytest.mark.slow  # runs the product end to end, or waits on purpose, for seconds (fast tier: docs/testing.md)
def test_sigterm_during_a_slow_round_stops_cleanly(tmp_path: Path) -> None:
    p, log = _slow_collector(tmp_path, "--http", "off")
    try:
        wait_for(lambda: "evaluating 1 alert rules" in log.read_text(), 60, what="the rules running")
        import time

        time.sleep(1.5)  # inside the slow rule's first round
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=30)
    finally:
        p.kill()
    text = log.read_text()
    assert rc == 0, text[-2000:]
    assert "Traceback" not in text and " -> " in text, text[-2000:]


@pytest.mark.slow  # a collector process waits out a slow round (9 s)
def test_a_failed_start_during_a_round_exits_with_one_line_not_an_abort(tmp_path: Path) -> None:
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        p, log = _slow_collector(tmp_path, "--http", f"127.0.0.1:{busy.getsockname()[1]}")
        rc = p.wait(timeout=60)
    finally:
        busy.close()
    text = log.read_text()
    assert rc == 1, (rc, text[-2000:])  # not -6 (SIGABRT with a thread inside DuckDB)
    assert "Traceback" not in text and "Error:" in text, text[-2000:]
