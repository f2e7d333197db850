"""Within one detector run each table's has-rows check runs once (on a lake each check
opens a Parquet file); outside a run every check asks the database again."""

from __future__ import annotations

import duckdb

from cmdare.analytics import findings
from cmdare.analytics.units import Scope, remembered, table_missing
from cmdare.wire.plugin import Requirement


class Counting:
    """A connection that counts the has-rows statements per table."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con, self.asked = con, {}

    def execute(self, sql: str, *a):
        if sql.startswith("SELECT count(*) FROM (SELECT 1 FROM"):
            name = sql.split('"')[1]
            self.asked[name] = self.asked.get(name, 0) + 1
        return self.con.execute(sql, *a)

    def __getattr__(self, n: str):
        return getattr(self.con, n)


def test_a_run_checks_each_table_once_and_the_next_run_asks_again() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (x INT)")
    r = Requirement("table", "t")
    with remembered():
        assert table_missing(con, r) == "no rows in t yet"
        con.execute("INSERT INTO t VALUES (1)")
        assert table_missing(con, r) == "no rows in t yet"  # one answer for the whole run
    assert table_missing(con, r) is None  # the next run sees the row


def test_every_detector_over_one_database_asks_each_table_once(tmp_path) -> None:
    from tests.analytics.test_golden_output import build

    con = duckdb.connect(str(build(tmp_path / "f.duckdb")), read_only=True)
    c = Counting(con)
    out = findings.run(c, Scope())
    assert out.findings and len(out.ran) == 12
    assert c.asked and set(c.asked.values()) == {1}, c.asked
    findings.run(c, Scope())
    assert set(c.asked.values()) == {2}
