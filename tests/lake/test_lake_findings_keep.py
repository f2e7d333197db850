"""``cmdare-collector maintain --findings 1d``: in lake mode no collector keeps the findings
current, so maintenance runs every detector over every job of the window and stores what
they find in the lake: the same findings ``analyze --lake bottlenecks`` finds over it, stored
once however often it runs; a bad window fails in one line."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics import findings
from cmdare.analytics.cli import cli as analyze
from cmdare.analytics.lakedb import LakeDatabase
from cmdare.analytics.units import Scope
from cmdare.collector.cli import cli as collector
from tests.lake.test_lake_spark_maintain import _load

WINDOW = "400d"  # the recording's fleet ran in 2026-09


def key(f: findings.Finding) -> tuple:
    return (f.kind, f.job, f.node, f.rank, f.subject, f.severity, round(f.confidence, 9), f.summary)


@pytest.mark.slow  # a 1,000-node day kept in a lake (27 s): the full run
def test_maintain_keeps_the_fleets_findings_in_the_lake(tmp_path: Path) -> None:
    _load(tmp_path, None)
    where = str(tmp_path / "lake")
    since = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(days=400)
    with LakeDatabase(where).read() as con:
        want = sorted(key(f) for f in findings.run(con, Scope(None, since, None)).findings)
    assert len({k[0] for k in want}) >= 3  # several kinds of problem in the demo fleet
    for _ in range(2):  # the second run replaces the first's rows: stored once
        r = CliRunner().invoke(collector, ["maintain", "--lake", where, "--findings", WINDOW, "--retain-raw", "off",
                                           "--expire-snapshots", "off"])
        assert r.exit_code == 0, r.output
        assert f"findings: {len(want)} stored" in r.output, r.output
    r = CliRunner().invoke(analyze, ["--lake", where, "sql", "SELECT kind, job, node, subject FROM findings", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert sorted((x["kind"], x["job"], x["node"], x["subject"]) for x in got) == sorted(
        (k[0], k[1], k[2], k[4]) for k in want)
    # off (the default) runs no detector; a window under a minute or not a duration: one line
    r = CliRunner().invoke(collector, ["maintain", "--lake", where, "--retain-raw", "off", "--expire-snapshots", "off"])
    assert r.exit_code == 0 and "findings:" not in r.output
    for bad in ("10s", "soon", "-1d"):
        r = CliRunner().invoke(collector, ["maintain", "--lake", where, "--findings", bad])
        assert r.exit_code == 2 and "--findings" in r.output, (bad, r.output)
