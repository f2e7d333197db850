"""The pages of a running collector fed by real agents (the fake NVML under the agent's GPU
source): the fleet page shows their GPUs as they arrive, and an alert's link opens its
alert."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from cmdare.analytics.cli.client import service_file
from tests.conftest import BIN, agent_env, wait_for
from tests.integration.test_alert_delivery import RULES  # AgentRunning: heartbeats in the last 3 s


@pytest.mark.slow  # runs the product end to end, or waits on purpose, for seconds (fast tier: docs/testing.md)
def test_a_live_collectors_pages_show_its_agents_and_an_alert_link_opens_the_alert(page, tmp_path: Path) -> None:
    spool, db, rules = tmp_path / "spool", tmp_path / "live.duckdb", tmp_path / "rules.yml"
    rules.write_text(RULES)
    agents = [subprocess.Popen(
        [str(BIN / "cmdare-agent"), "--config", "/dev/null", "--spool-dir", str(spool / node), "--interval", "0.5s",
         "--node", node, "--duration", "60", "--set", "sources.gpu.backend=python:tests.fakes.nvml"],
        env=agent_env(CMDARE_FAKE_NVML="gpus=2"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for node in ("live-a", "live-b")]
    wait_for(lambda: (spool / "live-a").exists(), 30, what="the spool")
    # one collector per spool is the embedded mode; here the first agent's, with the API and rules
    col = subprocess.Popen(
        [str(BIN / "cmdare-collector"), "spool", str(spool / "live-a"), "--follow", "--interval", "0.2s", "--db",
         str(db), "--rules", str(rules)], stdout=subprocess.DEVNULL, stderr=open(tmp_path / "collector.log", "w"))
    try:
        wait_for(lambda: service_file(db).exists(), 30, what="the API")
        url = json.loads(service_file(db).read_text())["url"]
        p = page.open(url + "/ui?range=15m")
        wait_for(lambda: (page.page.reload(), page.page.wait_for_selector("main[data-ready]"),
                          page.page.get_attribute(".heat", "data-rows") == "2")[-1], 30, interval=1,
                 what="the agent's 2 GPUs on the heatmap")
        assert "live-a" in p.inner_text("section:has(h2:text-matches('^Nodes'))")
        page.shot("fleet-live")
        # the alert fires; its row links to the rule, as its generatorURL does
        p = page.open(url + "/ui/alerts")
        wait_for(lambda: (page.page.reload(), page.page.wait_for_selector("main[data-ready]"),
                          page.page.locator("section:has(h2:text-is('Alerts')) tr.hl").count() >= 1)[-1], 30, interval=1, what="the firing alert")
        p.click("a:text('live/AgentRunning')")
        p.wait_for_selector("main[data-ready]")
        assert "rule=live%2FAgentRunning" in p.url and "live-a is sending heartbeats" in p.inner_text("main")
        assert page.problems == []
    finally:
        col.send_signal(signal.SIGTERM)
        col.wait(timeout=30)
        for a in agents:
            a.terminate()
            a.wait(timeout=30)
