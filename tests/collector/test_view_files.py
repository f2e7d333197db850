"""The views and table macros in collector/schema/views/: each compiles on a fresh database, every
file is applied, and a writable open replaces what an older release left in a database."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from cmdare.collector import views
from cmdare.collector.db import connect

SQL = Path(views.__file__).parent / "schema" / "views"


def test_every_sql_file_is_applied_in_order() -> None:
    assert sorted(set(views.VIEWS) - set(views.GENERATED)) == sorted(p.stem for p in SQL.glob("*.sql"))
    assert set(views.GENERATED) <= set(views.VIEWS)  # generated ones (gpu_5m) are applied too


@pytest.mark.parametrize("name", views.VIEWS)
def test_each_view_compiles_and_answers_on_a_fresh_database(tmp_path: Path, name: str) -> None:
    con = connect(tmp_path / "f.duckdb")
    con.execute(views.sql(name))  # again: CREATE OR REPLACE, no error
    rel = f"{name}()" if "MACRO" in views.sql(name) else name
    assert con.execute(f"SELECT count(*) FROM {rel}").fetchone() == (0,)
    con.close()


def _columns(con: duckdb.DuckDBPyConnection, view: str) -> list[str]:
    return [d[0] for d in con.execute(f"SELECT * FROM {view} LIMIT 0").description]


def test_a_writable_open_replaces_an_older_view(tmp_path: Path) -> None:
    """A database last written by an older release keeps its older view until a writable
    open, which brings the view of this release."""
    path = tmp_path / "old.duckdb"
    with connect(path) as con:
        con.execute("CREATE OR REPLACE VIEW step_hardware AS SELECT 1 AS stale")
    with duckdb.connect(str(path), read_only=True) as ro:
        assert _columns(ro, "step_hardware") == ["stale"]
    with connect(path) as con:
        assert _columns(con, "step_hardware")[-3:] == ["gpu_util_ratio", "gpu_mem_util_ratio", "host_cpu_util_ratio"]


def test_migrations_hold_tables_only() -> None:
    from cmdare.collector.db import migrations

    for version, name, sql in migrations():
        code = "\n".join(line.split("--")[0] for line in sql.splitlines()).upper()
        assert "CREATE VIEW" not in code and "MACRO" not in code and "OR REPLACE VIEW" not in code, (version, name)
