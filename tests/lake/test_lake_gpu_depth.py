"""A lake made before migration 017 (no GPU-depth columns) takes the new fields: the next
collector's ``ensure`` adds the columns to the Iceberg schema, files written before read
them as null, the rollups build over old and new files alike, and the detectors that read
the new fields work on the lake."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from cmdare.analytics import api
from cmdare.analytics.detectors import detect
from cmdare.analytics.lakedb import LakeDatabase
from cmdare.analytics.units import Scope
from cmdare.collector import lake as lakemod
from cmdare.collector import rollup
from cmdare.collector.db import connect
from cmdare.collector.lake import Lake, load_database
from cmdare.collector.lakemaint import maintain
from cmdare.collector.writer import Writer
from tests.analytics.detectors.conftest import T0, agent_gpus
from tests.collector.test_rollups_wide import gpu
from tests.fakes.nvml import FakeNvml
from tests.lake.test_lake_rollups import views

NEW = ("gr_engine_active_ratio", "tensor_active_ratio", "energy_joules_total", "nvlink", "parent_index")


def test_a_lake_from_before_the_gpu_depth_fields_takes_them(tmp_path: Path, monkeypatch) -> None:
    real = lakemod._schemas()
    first = real["gpu_samples"].names.index("gr_engine_active_ratio")
    old = dict(real)
    old["gpu_samples"] = pa.schema(list(real["gpu_samples"])[:first])
    for t in ("gpu_rollup_1m", "gpu_rollup_5m"):
        old[t] = pa.schema(list(real[t])[: real[t].names.index("gr_sum")])
    monkeypatch.setattr(lakemod, "_schemas", lambda: old)
    db = tmp_path / "old.duckdb"
    con = connect(db)
    assert Writer(con, max_skew=None, rollup_every=None).write([("m", gpu("old", T0 - 3600, 120))]).dead == 0
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    load_database(lk, con, str(db))
    con.close()
    lk.ensure(rollup.TABLES)  # the rollup tables as an older maintain made them
    assert "tensor_active_ratio" not in lk.table("gpu_samples").schema().column_names
    assert "gr_sum" not in lk.table("gpu_rollup_5m").schema().column_names
    monkeypatch.setattr(lakemod, "_schemas", lambda: real)

    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()  # what the next collector does when it starts
    have = lk.table("gpu_samples").schema().column_names
    assert all(c in have for c in NEW)
    new = agent_gpus(tmp_path, FakeNvml(gpus=2, model="h100", scenario="no_tensor"), node="hopper")
    load_database(lk, new, str(tmp_path / "agent-j.duckdb"))
    new.close()

    db_ = LakeDatabase(str(tmp_path / "lake"))
    rows = {(r[0], r[1]): r for r in api.gpu(db_).rows}
    cols = api.gpu(db_).columns
    t = cols.index("tensor_pct")
    assert rows[("old", 0)][t] is None and rows[("hopper", 0)][t] == 0.0
    with db_.read() as c:
        assert [f.kind for f in detect("tensor_idle", c, Scope())] == ["tensor_idle"]
    maintain(lk, retain_raw=None, compact_files=None, expire_after=None)  # rollups over old and new files
    assert "gr_sum" in lk.table("gpu_rollup_5m").schema().column_names
    for v, (rolled, raw) in views(lk).items():
        if v.startswith("gpu"):  # the GPU rollups' new sums over old files (null) and new ones
            assert rolled == raw and raw, v
    with LakeDatabase(str(tmp_path / "lake")).read() as c:
        assert c.execute("SELECT count(*) FROM rollup_dirty").fetchone() == (0,)
        assert [f.job for f in detect("tensor_idle", c, Scope())] == ["j"]


@pytest.mark.parametrize("column", ["tensor_active_ratio", "nvlink"])
def test_a_new_lake_has_the_gpu_depth_columns(tmp_path: Path, column: str) -> None:
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    assert column in lk.table("gpu_samples").schema().column_names
