"""A collector keeps findings current by itself (issue 51): following a spool with the
default detector schedule, the simulated fleet's PS-bound and idle jobs are found, stored,
exported on /metrics and split in goodput, without anyone running analyze bottlenecks."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import BIN, ROOT, wait_for

pytestmark = pytest.mark.slow  # a collector for some seconds


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def test_the_collector_finds_stores_and_exports_without_analyze(tmp_path: Path) -> None:
    db, spool, log = tmp_path / "f.duckdb", tmp_path / "spool", tmp_path / "c.log"
    spool.mkdir()
    subprocess.run([sys.executable, "-m", "tests.fakes.fleet", "demo", "--db", str(db)], cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    col = subprocess.Popen([str(BIN / "cmdare-collector"), "spool", str(spool), "--follow", "--db", str(db),
                            "--detect-every", "5s", "--detect-window", "20m", "--http", "127.0.0.1:0"],
                           stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    service = db.with_name(db.name + ".service.json")
    try:
        wait_for(service.exists, 60, what="the collector's API")
        url = json.loads(service.read_text())["url"]

        def stored() -> set[tuple[str, str]]:
            t = json.loads(get(url + "/api/v1/findings"))
            c = t["columns"]
            return {(r[c.index("kind")], r[c.index("job")]) for r in t["rows"]}

        got = wait_for(lambda: {("ps_bound", "sim-ps-5"), ("gpu_idle", "sim-idle-8")} <= stored() and stored(), 90,
                       what="the schedule's findings")
        assert ("ps_bound", "sim-healthy-1") not in got
        metrics = get(url + "/metrics").decode()
        assert 'cmdare_finding_active{job="sim-ps-5",kind="ps_bound"' in metrics
        t = json.loads(get(url + "/api/v1/goodput?by=job&detect=false"))  # stored findings only
        c = t["columns"]
        ps5 = next(r for r in t["rows"] if r[c.index("job")] == "sim-ps-5")
        assert ps5[c.index("ps_wait_gpu_hours")] > 0
    finally:
        col.send_signal(signal.SIGTERM)
        rc = col.wait(timeout=60)
    text = log.read_text()
    assert rc == 0, text[-2000:]
    assert "detectors every 5 s over the last 1200 s" in text and "detector round failed" not in text
