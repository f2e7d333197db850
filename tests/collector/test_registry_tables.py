"""Each event type is one declaration in wire/registry.py; what follows from it must follow:
its table holds a column for every field once the migrations ran (a field declared without
its migration would be dropped at ingest, silently), and the published JSON Schema and
docs/wire-format.md are checked in tests/wire/test_events.py and tests/test_docs.py."""

from __future__ import annotations

from pathlib import Path

from cmdare.collector.db import connect
from cmdare.wire.registry import TYPES


def _missing(con, types) -> list[str]:
    out = []
    for t in types.values():
        have = {r[0] for r in con.execute(f'DESCRIBE "{t.table}"').fetchall()}
        out += [f"{t.name}.{f}: no column in {t.table} (add it in a collector/schema migration)"
                for f in t.fields if f not in have]
    return out


def test_every_declared_field_has_its_column_after_the_migrations(tmp_path: Path) -> None:
    con = connect(tmp_path / "r.duckdb")
    try:
        assert _missing(con, TYPES) == []
    finally:
        con.close()


def test_a_field_declared_without_its_migration_is_named(tmp_path: Path) -> None:
    from dataclasses import replace

    from cmdare.wire.kinds import INT

    gpu = TYPES["gpu"]
    planted = {"gpu": replace(gpu, fields={**gpu.fields, "fan_speed_rpm": (INT, "a new field")})}
    con = connect(tmp_path / "r.duckdb")
    try:
        assert _missing(con, planted) == ["gpu.fan_speed_rpm: no column in gpu_samples (add it in a collector/schema "
                                          "migration)"]
    finally:
        con.close()
