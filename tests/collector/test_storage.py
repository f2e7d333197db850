"""GPU samples' storage (collector/ingest/storage.py): the GPU-depth fields are packed into
three columns of ``gpu_samples_packed`` and read back by name through the view
``gpu_samples``.  What a user relies on: every field reads back exactly as the agent sent
it, from each encoding; a sample without them stores nothing for them; rows a collector
stored before the packing (migration 017's columns) are kept, value for value."""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import pytest

from cmdare.agent.sources.gpu import GpuSource
from cmdare.collector.db import connect, migrate, migrations
from cmdare.collector.ingest import storage
from cmdare.collector.writer import Writer
from cmdare.wire.columns import encode
from cmdare.wire.events import EventFactory, decode_line
from cmdare.wire.kinds import OBJS, STRS
from cmdare.wire.registry import DATA_FIELDS
from tests.fakes.nvml import FakeNvml

T0 = 1.75e9
FIELDS = list(DATA_FIELDS["gpu"])
PACKED = storage.packed_in("gpu_samples")

# a sample with every packed field at the edges the checks let through: zeros and false
# (not NULL), a 63-bit counter, a profile name that needs JSON escaping
EDGES = {
    "index": 1000, "uuid": "MIG-x", "name": "A100", "util_gpu_ratio": 0.0,
    "gr_engine_active_ratio": 0.0, "sm_active_ratio": 1.0, "sm_occupancy_ratio": 0.123456789012345,
    "tensor_active_ratio": 5e-324, "fp16_active_ratio": 0.5, "fp32_active_ratio": 0.25, "fp64_active_ratio": 0.0,
    "dram_active_ratio": 1.0, "nvlink_total_rx_bytes_per_second": 1.5e300, "nvlink_total_tx_bytes_per_second": 0.0,
    "energy_joules_total": 0.0, "remapped_rows_correctable": 0, "remapped_rows_uncorrectable": 2**63 - 1,
    "row_remap_pending": False, "row_remap_failed": True, "nvlink_errors_total": 9007199254740993,
    "nvlink": [{"link": 0, "active": 1, "replay_errors_total": 3}],
    "parent_index": 0, "mig_profile": 'q"uo\\te ünï \u2028', "gpu_instance_id": 0, "compute_instance_id": 0,
    "mig_slice_ratio": 1 / 7, "retired_pages_sbe": 0, "retired_pages_dbe": 1, "retired_pages_pending": False,
    "namespace": "vision", "pod": "resnet-\"worker\"-0 ü", "container": "",
}


def _agent_lines(nvml, ticks: int = 3, rows: bool = True) -> list[bytes]:
    src = GpuSource(GpuSource.parse_config("sources.gpu", {}), nvml=nvml)
    f = EventFactory("n0", "worker", "j", rows=rows)
    lines: list[bytes] = []
    for k in range(ticks):
        src.collect(lambda t, d, ts=T0 + k: lines.append(f.line(t, d, ts)) if t == "gpu" else None)
    src.close()
    return lines


def _norm(field: str, v):
    if v is None:
        return None
    if DATA_FIELDS["gpu"][field][0] in (OBJS, STRS):
        return json.loads(v) if isinstance(v, str) else v
    if isinstance(v, list):  # throttle reasons
        return list(v)
    return v


def _stored(con: duckdb.DuckDBPyConnection) -> dict[str, dict]:
    cols = ["id", *FIELDS]
    names = ", ".join(f'"{c}"' for c in cols)
    rows = con.execute(f"SELECT {names} FROM gpu_samples").fetchall()
    return {r[0]: {f: _norm(f, v) for f, v in zip(FIELDS, r[1:], strict=True)} for r in rows}


def _sent(lines: list[bytes]) -> dict[str, dict]:
    out = {}
    for x in lines:
        ev = decode_line(x.decode().rstrip("\n"))
        out[ev["id"]] = {f: _norm(f, ev["data"].get(f)) for f in FIELDS}
    return out


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for i in a:
        for f in FIELDS:
            x, y = a[i][f], b[i][f]
            if isinstance(x, float) and isinstance(y, float):
                assert x == y or (math.isnan(x) and math.isnan(y)), (f, x, y)
            else:
                assert x == y, (i, f, x, y)


NVMLS = {
    "h100, GPM, NVLink": lambda: FakeNvml(gpus=2, model="h100", nvlinks=2, scenario="nvlink_errors"),
    "a100, MIG": lambda: FakeNvml(gpus=1, model="a100", mig=3),
    "v100, retired pages": lambda: FakeNvml(gpus=1, model="v100", scenario="retired_pages"),
    "a100, row remap": lambda: FakeNvml(gpus=1, model="a100", scenario="row_remap"),
}


@pytest.mark.parametrize("form", ["blocks", "rows", "json"])
@pytest.mark.parametrize("gpus", list(NVMLS))
def test_every_field_the_agent_sent_reads_back_by_name(tmp_path: Path, gpus: str, form: str) -> None:
    lines = _agent_lines(NVMLS[gpus](), rows=form != "json")
    msg = b"".join(lines)
    con = connect(tmp_path / "c.duckdb")
    res = Writer(con).write([("m", encode(msg) if form == "blocks" else msg)])
    assert res.dead == 0 and res.inserted == len(lines)
    sent, got = _sent(lines), _stored(con)
    _same(got, sent)
    carried = {f for d in sent.values() for f, v in d.items() if v is not None and f in PACKED}
    assert carried, "the fake sent no GPU-depth field: the test checks nothing packed"


@pytest.mark.parametrize("form", ["blocks", "rows", "json"])
def test_edge_values_read_back_exactly(tmp_path: Path, form: str) -> None:
    f = EventFactory("n0", "worker", "j", rows=form != "json")
    lines = [f.line("gpu", EDGES, T0), f.line("gpu", {"index": 1, "energy_joules_total": 7.0}, T0)]
    msg = b"".join(lines)
    con = connect(tmp_path / "c.duckdb")
    res = Writer(con).write([("m", encode(msg) if form == "blocks" else msg)])
    assert res.dead == 0 and res.inserted == 2
    _same(_stored(con), _sent(lines))
    # the view migration 018 made is what storage.py defines (its one definition)
    assert con.execute(f"SELECT * FROM ({storage.view_sql('gpu_samples')}) ORDER BY id").fetchall() == \
        con.execute("SELECT * FROM gpu_samples ORDER BY id").fetchall()


def test_a_sample_without_depth_fields_stores_nothing_packed(tmp_path: Path) -> None:
    """What keeps ingest fast for GPUs that send none of them: no list, no JSON text."""
    lines = _agent_lines(FakeNvml(gpus=2, model="t4"))
    con = connect(tmp_path / "c.duckdb")
    Writer(con).write([("m", encode(b"".join(lines)))])
    # a T4 sends retired pages (health), no GPM, no MIG: only what it carries is stored
    assert con.execute("SELECT count(*), count(gpm), count(health), count(mig) FROM gpu_samples_packed").fetchone() == (
        len(lines), 0, len(lines), 0)
    assert con.execute("SELECT count(sm_active_ratio), count(retired_pages_sbe) FROM gpu_samples").fetchone() == (
        0, len(lines))


def test_writes_go_to_the_stored_table_and_the_view_is_what_queries_read(tmp_path: Path) -> None:
    con = connect(tmp_path / "c.duckdb")
    kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                             "WHERE table_name LIKE 'gpu_samples%'").fetchall())
    assert kinds == {"gpu_samples": "VIEW", "gpu_samples_packed": "BASE TABLE"}
    view = [r[0] for r in con.execute("DESCRIBE gpu_samples").fetchall()]
    assert view == ["id", "ts", "node", "job", *FIELDS]  # every field by name, in order; nothing packed shown
    with pytest.raises(duckdb.Error):
        con.execute("INSERT INTO gpu_samples (id, ts, node) VALUES ('x', now(), 'n')")


def test_migration_018_keeps_every_value_017_stored(tmp_path: Path) -> None:
    """A database written by the collector before the packing (017's columns) reads the
    same after the upgrade, and takes new samples beside them."""
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)")
    for version, name, sql in migrations():
        if version <= 17:
            con.execute(sql)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, now()::TIMESTAMP)", [version, name])
    before = {k: v for k, v in EDGES.items() if k not in ("namespace", "pod", "container")}  # 024's fields
    sample = {**before, "nvlink": json.dumps(EDGES["nvlink"])}
    cols = ", ".join(f'"{k}"' for k in sample)
    con.execute(f"INSERT INTO gpu_samples (id, ts, node, {cols}) VALUES ('old-1', now()::TIMESTAMP, 'n0', "
                f"{', '.join('?' for _ in sample)})", list(sample.values()))
    con.execute("INSERT INTO gpu_samples (id, ts, node, \"index\", util_gpu_ratio) VALUES ('old-2', now()::TIMESTAMP, 'n0', 3, 0.5)")
    con.close()
    con = connect(path)  # migrates
    got = _stored(con)
    want = {f: _norm(f, before.get(f)) for f in FIELDS}
    _same({"old-1": got["old-1"]}, {"old-1": want})
    assert got["old-2"]["util_gpu_ratio"] == 0.5 and all(got["old-2"][f] is None for f in PACKED)
    assert con.execute("SELECT count(gpm), count(health), count(mig) FROM gpu_samples_packed").fetchone() == (1, 1, 1)
    f = EventFactory("n0", "worker", "j", rows=True)
    assert Writer(con).write([("m", f.line("gpu", {"index": 0, "sm_active_ratio": 0.5}, T0))]).inserted == 1
    assert con.execute("SELECT count(*) FROM gpu_samples WHERE sm_active_ratio = 0.5").fetchone() == (1,)
    con.close()
    assert migrate(duckdb.connect(str(path))) == []  # nothing left to apply
