"""The wheel users install carries the data files the code opens at run time: the event
JSON Schema, the systemd unit / sysusers / sample config, the DuckDB migrations and the
accelerator catalog, and setuptools builds it without 'package would be ignored'."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DATA = {
    "cmdare/wire/schema/event-v1.schema.json",
    "cmdare/wire/schema/dead-letters.tsv",
    "cmdare/agent/packaging/cmdare-agent.service",
    "cmdare/agent/packaging/cmdare-agent.sysusers",
    "cmdare/agent/packaging/agent.sample.toml",
    "cmdare/analytics/data/accelerators.csv",
    "cmdare/analytics/data/prices.csv",
    "cmdare/analytics/rules/cmdare.yml",
    "cmdare/analytics/rules/cmdare.test.yml",
    "cmdare/collector/packaging/cmdare-collector.service",
    "cmdare/collector/packaging/cmdare-server.service",
    "cmdare/collector/packaging/cmdare-collector.sysusers",
    "cmdare/dashboards/static/app.js",
    "cmdare/dashboards/static/style.css",
    "cmdare/dashboards/static/vendor/uPlot.iife.min.js",
    "cmdare/dashboards/static/vendor/uPlot.min.css",
    "cmdare/dashboards/static/vendor/LICENSE-uPlot",
    "cmdare/dashboards/static/vendor/VENDOR.json",
    "cmdare/dashboards/grafana/cmdare-fleet.json",
    "cmdare/dashboards/grafana/cmdare-node.json",
    "cmdare/dashboards/grafana/cmdare-job.json",
} | {f"cmdare/collector/schema/{p.name}" for p in (ROOT / "collector" / "schema").glob("*.sql")} | {
    f"cmdare/collector/schema/views/{p.name}" for p in (ROOT / "collector" / "schema" / "views").glob("*.sql")
}


def test_wheel_ships_the_data_files(tmp_path):
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)]
    if importlib.util.find_spec("setuptools") is not None:
        cmd.insert(-1, "--no-build-isolation")  # no download when the venv has setuptools
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "would be ignored" not in out.stdout + out.stderr
    (wheel,) = tmp_path.glob("cmdare-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert len(DATA) >= 10  # the migrations were found
    assert DATA - names == set()
    assert not any(n.startswith(("agent/", "collector/", "analytics/", "dashboards/")) for n in names)  # nothing bare
