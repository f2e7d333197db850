"""The lake's edges (collector/lake.py): days at their boundaries, a lake's own start racing
another collector's, what a copy into the lake skips, and the one-line errors of locations
and catalogs (mutation testing found each untested)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cmdare.collector import lake as lake_mod
from cmdare.collector.lake import NAMESPACE, Lake, LakeError, Location, day_partitions, schema
from tests.lake.test_lake_unit import count, samples


def at(first: int, when: dt.datetime) -> pa.Table:
    return samples(first, 1).set_column(1, "ts", pa.array([when], pa.timestamp("us")))


def test_the_last_instant_of_a_day_and_the_epoch_land_in_their_own_days(lake: Lake) -> None:
    lake.append("gpu_samples", pa.concat_tables([at(0, dt.datetime(2026, 9, 1, 23, 59, 59, 999000)),
                                                 at(1, dt.datetime(1970, 1, 1))]), {"t/0": ([0], [1])}, "a")
    assert {Path(f).parent.name for f in lake.files("gpu_samples")} == {"ts_day=2026-09-01", "ts_day=1970-01-01"}
    days = day_partitions(lake.table("gpu_samples"))
    assert sorted(days) == [dt.date(1970, 1, 1), dt.date(2026, 9, 1)]
    assert day_partitions(lake.table("heartbeats")) == {}  # no snapshot yet
    nodes = pa.table({f.name: pa.nulls(1, f.type) for f in schema("nodes")}).set_column(
        0, "node", pa.array(["n1"]))
    lake.append("nodes", nodes.cast(schema("nodes")), {"t/0": ([0], [1])}, "a")
    assert day_partitions(lake.table("nodes")) == {}  # files, but no day partition


def test_ensure_makes_every_missing_table_and_leaves_nodes_unpartitioned(lake: Lake) -> None:
    lake.catalog.drop_table(f"{NAMESPACE}.steps")  # a later table than partitioned ones before it
    lake.catalog.drop_table(f"{NAMESPACE}.findings")
    lake.ensure()
    assert lake.exists("steps") and lake.exists("findings")
    assert lake.table("nodes").spec().is_unpartitioned() and not lake.partition_missing("nodes", "last_seen")
    assert lake.partition_missing("gpu_samples", None) is False


def test_a_partitioning_lost_to_a_race_is_tried_again(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lake_mod.time, "sleep", lambda s: None)
    lake.catalog.drop_table(f"{NAMESPACE}.gpu_samples")
    lake.catalog.create_table(f"{NAMESPACE}.gpu_samples", schema=schema("gpu_samples"))
    real, calls = Lake._partition, []

    def flaky(self: Lake, name: str, col: str) -> None:
        calls.append(name)
        if len(calls) == 1:
            raise RuntimeError("CommitFailedException: another collector's commit")
        real(self, name, col)

    monkeypatch.setattr(Lake, "_partition", flaky)
    lake.ensure()
    assert calls == ["gpu_samples", "gpu_samples"] and not lake.partition_missing("gpu_samples", "ts")


def test_a_table_another_collector_made_first_is_taken(lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.exceptions import TableAlreadyExistsError

    lake.catalog.drop_table(f"{NAMESPACE}.scalars")
    real = lake.catalog.create_table

    def raced(ident: str, **kw: Any) -> Any:
        real(ident, **kw)  # the other collector's, a moment before ours
        raise TableAlreadyExistsError(ident)

    monkeypatch.setattr(lake.catalog, "create_table", raced)
    monkeypatch.setattr(lake_mod.time, "sleep", lambda s: None)
    lake.ensure()
    assert lake.exists("scalars") and not lake.partition_missing("scalars", "ts")


def test_a_table_from_an_older_cmdare_takes_the_new_columns(lake: Lake) -> None:
    lake.catalog.drop_table(f"{NAMESPACE}.host_samples")
    old = pa.schema([f for f in schema("host_samples") if f.name != "procs"])
    lake.catalog.create_table(f"{NAMESPACE}.host_samples", schema=old)
    lake.ensure()
    assert "procs" in lake.table("host_samples").schema().column_names
    before = lake.table("gpu_samples").metadata.current_schema_id
    lake.ensure()  # nothing to add: the schema is left as it is
    assert lake.table("gpu_samples").metadata.current_schema_id == before


def test_a_missing_table_and_a_bad_catalog_are_one_line(tmp_path: Path, lake: Lake) -> None:
    with pytest.raises(LakeError, match=rf"^{lake.location.local}: no table nope \(is this a cmdare lake\?\)$"):
        lake.table("nope")
    bad = "sqlite:///" + str(tmp_path / "no" / "such" / ("d" * 130) / "catalog.db")
    with pytest.raises(LakeError) as e:
        Lake(str(tmp_path / "other"), bad)
    msg = str(e.value)
    assert msg.startswith(f"lake catalog {bad[:120]}: ") and bad[:121] not in msg and "\n" not in msg
    assert len(msg.split(": ", 1)[1]) <= 200


def test_positions_a_commit_summary_cannot_parse_are_none() -> None:
    from types import SimpleNamespace

    from cmdare.collector.lake import POSITIONS, _positions

    assert _positions(SimpleNamespace(summary={POSITIONS: "{not json"})) == {}
    assert _positions(SimpleNamespace(summary={POSITIONS: '{"t/0": [3, 4], "bad": 7}'})) == {"t/0": [3, 4]}
    assert _positions(None) == {} and _positions(SimpleNamespace(summary=None)) == {}


def test_a_directory_without_a_catalog_is_not_a_lake_unless_one_is_named(tmp_path: Path) -> None:
    from cmdare.collector.lake import sqlite_url

    d = tmp_path / "plain"
    d.mkdir()
    with pytest.raises(LakeError, match=rf"^{d}: not a lake \(no catalog.db; write one with cmdare-collector --lake\)$"):
        Lake(str(d), create=False)
    other = Lake(str(tmp_path / "made"))  # a lake whose catalog lives elsewhere is named with --catalog
    other.ensure()
    assert Lake(str(d), sqlite_url(tmp_path / "made" / "catalog.db"), create=False).exists("gpu_samples")


def test_lake_mode_without_pyiceberg_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyiceberg.catalog.sql", None)  # an import of it fails
    with pytest.raises(LakeError, match=r"^lake mode needs pyiceberg: pip install 'cmdare\[lake\]'$"):
        Lake(str(tmp_path / "x"))


def test_settling_asks_again_when_asking_whether_done_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lake_mod.time, "sleep", lambda s: None)
    tries: list[int] = []

    def act() -> None:
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError("busy")

    def done() -> bool:
        raise OSError("the catalog did not answer")

    lake_mod._settle(act, done, tries=5)
    assert len(tries) == 3


def test_a_catalog_error_quotes_its_first_line_cut_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyiceberg.catalog.sql as sql

    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("e" * 300 + "\nsecond line")

    monkeypatch.setattr(sql, "SqlCatalog", broken)
    monkeypatch.setattr(lake_mod.time, "sleep", lambda s: None)
    with pytest.raises(LakeError) as e:
        Lake(str(tmp_path / "x"))
    assert str(e.value).endswith(": " + "e" * 200) and "second" not in str(e.value)


def test_a_directory_that_cannot_be_made_says_why(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    where = f / ("l" * 100)
    with pytest.raises(LakeError) as e:
        Lake(str(where))
    assert str(e.value) == f"--lake {str(where)[:80]}: cannot make the directory: Not a directory"


@pytest.mark.parametrize(("uri", "words"), [
    ("s3://key@bucket/x", "credentials do not belong"),  # a user name alone is a credential too
    ("s3://:secret@bucket/x", "credentials do not belong"),
    ("ftp" + "p" * 30 + "://host/x", "unknown scheme '" + ("ftp" + "p" * 30)[:20] + "' (a directory"),
    ("/tmp/a\x1fb", "give a directory"),
])
def test_locations_refused_in_one_line(uri: str, words: str) -> None:
    with pytest.raises(LakeError) as e:
        Location.parse(uri, "postgresql://h/db")
    assert words in str(e.value) and "secret" not in str(e.value)


def test_file_uris_and_object_store_paths(tmp_path: Path) -> None:
    assert Location.parse(f"file://{tmp_path}/a").local == tmp_path / "a"
    assert lake_mod._path(f"file://{tmp_path}/sp%20ace/x.parquet") == f"{tmp_path}/sp ace/x.parquet"
    assert lake_mod._path("s3://bucket/a%20b/x.parquet") == "s3://bucket/a%20b/x.parquet"
    loc = Location.parse("s3://bucket/lake/", "postgresql://h/db")
    assert loc.warehouse == "s3://bucket/lake" and loc.local is None


def test_a_lake_names_itself_by_its_directory_or_warehouse(lake: Lake, tmp_path: Path) -> None:
    from cmdare.collector.lake import sqlite_url

    assert lake.name == str(lake.location.local)
    remote = Lake("s3://bucket/lake", sqlite_url(tmp_path / "remote-catalog.db"))  # nothing written to s3
    assert remote.name == "s3://bucket/lake"
    with pytest.raises(LakeError, match=r"^s3://bucket/lake: no table nope"):
        remote.table("nope")


def test_to_lake_skips_a_table_the_file_lacks_and_copies_the_rest(tmp_path: Path) -> None:
    from cmdare.collector.db import connect
    from cmdare.collector.lake import load_database
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import encode_many

    db = tmp_path / "f.duckdb"
    ev = [{"v": 1, "id": f"hb-{i}", "ts": 1.79e9 + i, "node": "n0", "role": "worker", "job": "j",
           "labels": {}, "type": "heartbeat", "data": {"seq": i + 1}} for i in range(3)]
    con = connect(db)
    Writer(con, max_skew=None).write([("x", encode_many(ev))])
    con.execute("DROP TABLE clock_skew")  # a table before heartbeats in the list, absent from an old file
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    out, _ = load_database(lk, con, str(db))
    con.close()
    assert out.get("heartbeats") == 3 and count(lk, "heartbeats") == (3, 3)
