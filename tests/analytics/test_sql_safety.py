"""analyze sql reads the database and nothing else: hostile queries (file reads and
writes, ATTACH, INSTALL / LOAD, SET, PRAGMA, COPY, several statements, a Python variable
by a table's name) are refused with one line, the database is unchanged, and the row and
time limits say what they did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import MODELS, Fleet


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = Fleet(seed=1)
    f.job(MODELS[0], "v100")
    p = tmp_path_factory.mktemp("sql") / "s.duckdb"
    con = connect(p)
    Writer(con).write([("sim", encode_many(f.events))])
    con.close()
    return p


def sql(db: Path, query: str, *more: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["sql", query, "--db", str(db), *more])
    return r.exit_code, r.stdout, r.stderr


HOSTILE = [
    ("SELECT * FROM read_csv('/etc/passwd')", "file, network and extension access are off"),
    ("SELECT * FROM read_text('/etc/hostname')", "file, network and extension access are off"),
    ("SELECT * FROM '/etc/passwd'", "Table with name /etc/passwd does not exist"),  # no file scans at all
    ("SELECT * FROM glob('/etc/*')", "file, network and extension access are off"),
    ("SELECT * FROM read_parquet('https://example.com/x.parquet')", "file, network and extension access are off"),
    ("COPY (SELECT 1) TO '{tmp}/x.csv'", "not COPY"),
    ("COPY steps FROM '{tmp}/x.csv'", "not COPY"),
    ("EXPORT DATABASE '{tmp}/exp'", "not EXPORT"),
    ("ATTACH '{tmp}/other.duckdb' AS o", "not ATTACH"),
    ("DETACH s", "not DETACH"),
    ("INSTALL httpfs", "not INSTALL"),
    ("LOAD httpfs", "not LOAD"),
    ("SET enable_external_access = true", "not SET"),
    ("RESET threads", "not RESET"),
    ("PRAGMA enable_profiling", "not PRAGMA"),
    ("CALL pragma_version()", "not CALL"),
    ("CREATE TABLE x AS SELECT 1", "not CREATE"),
    ("DELETE FROM steps", "not DELETE"),
    ("DROP TABLE steps", "not DROP"),
    ("SELECT 1; DROP TABLE steps", "one statement at a time: the query has 2"),
    ("SELECT 1; SELECT 2", "one statement at a time: the query has 2"),
    ("", "empty query"),
    ("   ;  ", "empty query"),
    ("SELEC 1", "query does not parse"),
    ("SELECT * FROM host", 'Table with name host does not exist! Did you mean'),
]


@pytest.mark.parametrize(("query", "message"), HOSTILE)
def test_hostile_queries_are_refused_with_one_line(db: Path, tmp_path: Path, query: str, message: str) -> None:
    host = "a Python variable a replacement scan could find"  # noqa: F841
    code, out, err = sql(db, query.format(tmp=tmp_path))
    assert code == 1 and out == "" and message in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere


def test_the_database_is_unchanged_and_still_readable(db: Path) -> None:
    before = sql(db, "SELECT count(*) AS n FROM steps", "--json")[1]
    for q, _ in HOSTILE:
        sql(db, q.format(tmp="/tmp/never"))
    assert sql(db, "SELECT count(*) AS n FROM steps", "--json")[1] == before
    assert json.loads(before)[0]["n"] > 0


def test_reads_of_the_database_work_with_views_macros_and_ctes(db: Path) -> None:
    code, out, err = sql(db, "WITH s AS (SELECT job, count(*) AS n FROM steps GROUP BY job) SELECT * FROM s", "--json")
    assert code == 0 and json.loads(out)[0]["n"] > 0, err
    code, out, err = sql(db, "FROM instance_lives() SELECT count(*) AS n", "--json")
    assert code == 0, err
    code, out, err = sql(db, "SELECT count(*) AS n FROM step_hardware", "--json")
    assert code == 0, err


def test_row_and_time_limits_say_what_they_did(db: Path) -> None:
    code, out, err = sql(db, "SELECT * FROM range(25)", "--max-rows", "10", "--json")
    assert code == 0 and len(json.loads(out)) == 10
    assert "note: more than 10 rows: showing the first 10 (--max-rows; or add LIMIT)" in err
    code, out, err = sql(db, "SELECT count(*) FROM range(1000000000000) a", "--timeout", "0.5")
    assert code == 1 and "query stopped after 0.5 s (the time limit" in err and err.count("\n") == 1


def test_each_guard_holds_on_its_own(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth: DuckDB turns Python replacement scans off with external access, so
    a test of the whole configuration cannot tell whether the guard's own switch is set.
    Here each switch is checked with the others relaxed: a Python object in the frame that
    runs the query (safesql's globals, where DuckDB looks) is not a table, and with
    replacement scans allowed it would be."""
    import duckdb
    import pyarrow as pa

    from cmdare.analytics import safesql

    monkeypatch.setattr(safesql, "leaked_rows", pa.table({"secret": ["s3cr3t"]}), raising=False)
    relaxed = {k: v for k, v in safesql.CONFIG.items() if k != "lock_configuration"}
    relaxed["enable_external_access"] = True
    con = duckdb.connect(str(db), read_only=True, config=relaxed)
    try:
        with pytest.raises(safesql.SqlRefused, match="leaked_rows does not exist"):
            safesql.run(con, "SELECT * FROM leaked_rows")
    finally:
        con.close()
    con = duckdb.connect(str(db), read_only=True, config={**relaxed, "python_enable_replacements": True})
    try:  # the control: the same query finds the object once the switch is off
        assert safesql.run(con, "SELECT * FROM leaked_rows").rows == [("s3cr3t",)]
    finally:
        con.close()
    assert safesql.CONFIG["enable_external_access"] is False and safesql.CONFIG["lock_configuration"] is True
