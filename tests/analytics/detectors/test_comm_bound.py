"""comm_bound on the shared profiler traces: the sampled 128-rank job, a quarter of whose
step is exposed communication, is found; the 2-rank DDP job (under 5 %) is not."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from cmdare.analytics.units import Scope, detect
from cmdare.collector.db import connect
from tests.analytics.test_traces import HTA_DATA


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory):
    from cmdare.analytics import traces

    c = connect(tmp_path_factory.mktemp("comm") / "c.duckdb")
    for name in ("ddp-2ranks", "sampled-128ranks"):
        traces.import_files(c, [HTA_DATA / name], name)
    yield c
    c.close()


def test_exposed_communication_past_the_threshold_is_a_finding_with_its_numbers(con) -> None:
    found = detect("comm_bound", con, Scope())
    assert [f.job for f in found] == ["sampled-128ranks"]
    f = found[0]
    assert f.severity == "warning" and 20 <= f.evidence["exposed_comm_pct"] <= 30
    assert f.evidence["world_size"] == 128 and f.evidence["ranks_traced"] == 2 and f.evidence["steps"] == 1
    assert 0 < f.evidence["exposed_comm_ms"] < f.evidence["step_ms"] and "% of each step waits" in f.summary
    assert f.window_start is not None


def test_thresholds_scope_and_the_import_window(con) -> None:
    assert detect("comm_bound", con, Scope(), critical_exposed=0.2)[0].severity == "critical"
    assert [f.job for f in detect("comm_bound", con, Scope(), min_exposed=0.04)] == ["ddp-2ranks", "sampled-128ranks"]
    assert detect("comm_bound", con, Scope(job="ddp-2ranks")) == []
    later = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) + dt.timedelta(hours=1)
    assert detect("comm_bound", con, Scope(None, later, None)) == []  # imported before the window


def test_without_imported_traces_it_finds_nothing_quietly(tmp_path: Path) -> None:
    """Most jobs have no trace: no finding and no note (before migration 026 either)."""
    import duckdb

    assert detect("comm_bound", connect(tmp_path / "fresh.duckdb"), Scope()) == []
    bare = duckdb.connect(str(tmp_path / "bare.duckdb"))
    assert detect("comm_bound", bare, Scope()) == []
    bare.close()
