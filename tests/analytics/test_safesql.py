"""The safe-SQL guard's own contract, on a real read-only DuckDB file, at its documented
bounds (docs/service.md, docs/database.md): exactly one SELECT that modifies nothing, the
text at most 100,000 characters, rows and bytes cut where they say with the cut said, the
time limit said, errors in one line. (tests/analytics/test_sql_safety.py drives the same
guard through ``analyze sql`` with hostile queries.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import pytest

from cmdare.analytics import safesql
from cmdare.analytics.safesql import SqlRefused, check, interrupt_after, run


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("safesql") / "s.duckdb"
    c = duckdb.connect(str(p))
    c.execute("CREATE TABLE t AS SELECT range AS i, repeat('x', 10) AS s FROM range(5000)")
    c.close()
    return p


@pytest.fixture()
def con(path: Path):
    c = duckdb.connect(str(path), read_only=True, config=safesql.CONFIG)
    yield c
    c.close()


def test_the_documented_defaults() -> None:
    assert (safesql.MAX_ROWS, safesql.TIMEOUT, safesql.MAX_BYTES, safesql.MAX_QUERY) == (10_000, 30.0, 64 << 20, 100_000)
    assert {k: safesql.CONFIG[k] for k in ("threads", "memory_limit")} == {"threads": 2, "memory_limit": "2GB"}
    assert all(safesql.CONFIG[k] is False for k in ("enable_external_access", "autoinstall_known_extensions",
                                                   "autoload_known_extensions", "python_enable_replacements"))
    assert safesql.CONFIG["lock_configuration"] is True


def test_the_connection_is_locked_and_bounded(con) -> None:
    assert con.execute("SELECT current_setting('threads'), current_setting('memory_limit')").fetchone()[0] == 2
    with pytest.raises(duckdb.Error, match="lock"):
        con.execute("SET threads = 8")
    with pytest.raises(duckdb.Error):
        con.execute("SELECT * FROM read_csv('/etc/hostname')")


@pytest.mark.parametrize("n, max_rows, want, truncated", [
    (3, 3, 3, False), (4, 3, 3, True), (0, 3, 0, False),
    (5000, 4999, 4999, True), (5000, 5000, 5000, False),  # past one 2,048-row chunk
    (2049, 2048, 2048, True), (2048, 2048, 2048, False),
])
def test_rows_are_cut_at_max_rows_and_the_cut_is_said(con, n: int, max_rows: int, want: int, truncated: bool) -> None:
    r = run(con, f"SELECT i FROM t WHERE i < {n} ORDER BY i", max_rows=max_rows)
    assert len(r.rows) == want and r.truncated is truncated and r.cut_by == ("rows" if truncated else "")
    assert [x[0] for x in r.rows] == list(range(want)) and r.columns == ["i"]


def test_bytes_count_strings_by_length_and_other_values_as_eight(con) -> None:
    # a row is 8 (i) + 10 (s) = 18 bytes
    q = "SELECT i, s FROM t ORDER BY i LIMIT 10"
    r = run(con, q, max_bytes=18 * 10)
    assert (len(r.rows), r.truncated, r.cut_by) == (10, False, "")
    r = run(con, q, max_bytes=18 * 10 - 1)
    assert (len(r.rows), r.truncated, r.cut_by) == (9, True, "bytes")
    r = run(con, "SELECT NULL AS a, 1.5::DOUBLE AS b LIMIT 1", max_bytes=16)
    assert (len(r.rows), r.truncated) == (1, False)
    r = run(con, "SELECT NULL AS a, 1.5::DOUBLE AS b LIMIT 1", max_bytes=15)
    assert (len(r.rows), r.cut_by) == (0, "bytes")
    r = run(con, "SELECT 'abc'::BLOB AS b", max_bytes=6)  # sent as hex
    assert (len(r.rows), r.truncated) == (1, False)
    r = run(con, "SELECT 'abc'::BLOB AS b", max_bytes=5)
    assert (len(r.rows), r.cut_by) == (0, "bytes")


@pytest.mark.parametrize(("value", "sent"), [
    ("abc", 3), ("", 0), (chr(1), 6), ('a"b', 4), ("a\\b", 4), ("\n", 2), ("é", 2), ("😀", 4), (b"\x00\xff", 4),
    (1, 8), (None, 8), (1.5, 8),
])
def test_a_value_costs_what_the_json_answer_writes(value, sent: int) -> None:
    import json

    assert safesql.sent_size(value) == sent
    if isinstance(value, str):
        assert len(json.dumps(value, ensure_ascii=False).encode()) - 2 == sent


def test_control_characters_are_cut_at_the_bytes_sent_not_at_their_count(con) -> None:
    # the attack: 600 chr(1) a row is 600 characters and 3,600 bytes of JSON
    r = run(con, "SELECT repeat(chr(1), 600) AS s FROM range(100000)", max_rows=100_000, max_bytes=1 << 20)
    assert r.cut_by == "bytes" and len(r.rows) == (1 << 20) // 3600
    assert sum(safesql.sent_size(x[0]) for x in r.rows) <= 1 << 20


def test_the_text_is_bounded_at_max_query(con) -> None:
    q = "SELECT 1 AS x"
    pad = safesql.MAX_QUERY - len(q)
    assert run(con, q + " " * pad).rows == [(1,)]  # exactly the bound: runs
    with pytest.raises(SqlRefused) as e:
        check(con, q + " " * (pad + 1))
    assert str(e.value) == "the query is 100,001 characters: at most 100,000"


@pytest.mark.parametrize("query, message", [
    ("", "empty query"), ("  \n ", "empty query"), (";", "empty query"), ("-- nothing\n;", "empty query"),
    ("SELECT 1; SELECT 2; SELECT 3", "one statement at a time: the query has 3"),
    ("UPDATE t SET i = 0", "not UPDATE"),
    ("WITH x AS (DELETE FROM t RETURNING 1) SELECT * FROM x", "not DELETE inside a SELECT"),
    ("WITH x AS (INSERT INTO t VALUES (1, 'a') RETURNING 1) SELECT * FROM x", "not INSERT inside a SELECT"),
    ("WITH x AS (UPDATE t SET i = 1 RETURNING 1) SELECT * FROM (SELECT * FROM x)", "not UPDATE inside a SELECT"),
    ("SELECT FROM WHERE", "query does not parse"),
])
def test_refusals_name_what_they_refused_in_one_line(con, query: str, message: str) -> None:
    with pytest.raises(SqlRefused) as e:
        check(con, query)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("query", [
    "SELECT 1 UNION ALL SELECT 2",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
    "WITH a AS (SELECT 1 AS x), b AS (SELECT x FROM a) SELECT * FROM b",
    "FROM t SELECT count(*)",
    "SELECT (SELECT max(i) FROM t) AS m",
])
def test_reads_of_every_shape_pass(con, query: str) -> None:
    check(con, query)
    assert run(con, query).rows


def test_failures_and_permission_errors_are_one_line(con) -> None:
    with pytest.raises(SqlRefused) as e:
        run(con, "SELECT * FROM tt")
    assert str(e.value).startswith("query failed: Catalog Error: Table with name tt does not exist!")
    assert 'Did you mean "t"' in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SqlRefused) as e:
        run(con, "SELECT * FROM read_text('/etc/hostname')")
    assert str(e.value).startswith("the query may read the database only: file, network and extension access are off (")
    assert "\n" not in str(e.value)


def test_the_time_limit_interrupts_and_says_so(con) -> None:
    t0 = time.monotonic()
    with pytest.raises(SqlRefused) as e:
        run(con, "SELECT count(*) FROM range(1000000000000) a", timeout=0.3)
    assert time.monotonic() - t0 < 10
    assert str(e.value) == "query stopped after 0.3 s (the time limit; narrow it with WHERE or LIMIT)"


def test_interrupt_after_fires_only_past_its_timeout() -> None:
    class Con:
        interrupted = 0

        def interrupt(self) -> None:
            self.interrupted += 1

    c = Con()
    with interrupt_after(c, 5.0) as fired:  # type: ignore[arg-type]
        time.sleep(0.05)
    assert not fired.is_set() and c.interrupted == 0
    time.sleep(0.05)
    assert c.interrupted == 0  # cancelled on leaving: never fires later
    with interrupt_after(c, 0.05) as fired:  # type: ignore[arg-type]
        fired.wait(5)
    assert fired.is_set() and c.interrupted == 1
    assert not any(t.name.startswith("Timer") and t.is_alive() for t in threading.enumerate() if t.daemon is False)


@pytest.mark.parametrize("query, name", [
    ("INSTALL httpfs", "INSTALL"), ("RESET threads", "RESET"), ("CHECKPOINT", "CHECKPOINT"),
    ("/* a comment */ DELETE FROM t", "DELETE"), ("  -- a comment\nUPDATE t SET i = 1", "UPDATE"),
    ("WITH a AS (SELECT 1) DELETE FROM t", "DELETE"), ("WITH a AS (SELECT 1) UPDATE t SET i = 1", "UPDATE"),
])
def test_a_refused_statement_is_named_as_the_user_wrote_it_or_by_what_it_does(con, query: str, name: str) -> None:
    with pytest.raises(SqlRefused) as e:
        check(con, query)
    assert str(e.value) == f"only SELECT queries may run here (read-only, database only), not {name}"


def test_a_query_too_deep_to_check_is_refused_saying_so(con) -> None:
    check(con, "SELECT " + "abs(" * 100 + "1" + ")" * 100)
    with pytest.raises(SqlRefused) as e:
        check(con, "SELECT " + "abs(" * 600 + "1" + ")" * 600)
    assert str(e.value) == "the query nests too deeply to be checked: write it flatter (a CTE per level)"


def test_the_permission_error_keeps_duckdbs_reason_without_its_prefix(con) -> None:
    with pytest.raises(SqlRefused) as e:
        run(con, "SELECT * FROM read_text('/etc/hostname')")
    assert str(e.value) == ("the query may read the database only: file, network and extension access are off "
                            '(Cannot access file "/etc/hostname" - file system operations are disabled by configuration)')


@pytest.mark.parametrize("text, first", [
    ("one line", "one line"),
    ("Catalog Error: no x\nDid you mean \"y\"?", 'Catalog Error: no x Did you mean "y"?'),
    ("Catalog Error: no x\n\nDid you mean \"y\"?\nLINE 1: ...", 'Catalog Error: no x Did you mean "y"?'),
    ("Parser Error: bad\nLINE 1: SELECT\n        ^", "Parser Error: bad"),
    ("", "ValueError"),
])
def test_errors_are_cut_to_their_first_line_and_duckdbs_hint(text: str, first: str) -> None:
    assert safesql._first(ValueError(text)) == first


class _Serialised:
    """A connection whose ``json_serialize_sql`` answers ``text`` (None: no row): the tree
    reader's defensive paths, which a healthy DuckDB does not take."""

    def __init__(self, text: str | None) -> None:
        self.text = text

    def execute(self, sql: str, params: dict) -> _Serialised:
        assert sql.startswith("SELECT json_serialize_sql(") and set(params) == {"q"}
        return self

    def fetchone(self) -> tuple[str] | None:
        return None if self.text is None else (self.text,)


@pytest.mark.parametrize("text", ['{"statements": [', "", None, "[1, 2"])
def test_a_parse_tree_that_cannot_be_read_is_refused_not_a_crash(text: str | None) -> None:
    with pytest.raises(SqlRefused, match=r"^query does not parse: \S"):
        safesql._writing_node(_Serialised(text), "SELECT 1")


def test_a_serialiser_error_is_refused_with_its_message_cut_at_200_characters() -> None:
    import json

    tree = json.dumps({"error": True, "error_message": "Not implemented: " + "x" * 500})
    with pytest.raises(SqlRefused) as e:
        safesql._writing_node(_Serialised(tree), "SELECT 1")
    assert str(e.value) == "query does not parse: " + ("Not implemented: " + "x" * 500)[:200]
    assert safesql._writing_node(_Serialised(json.dumps({"statements": [{"node": {"type": "SELECT_NODE"}}]})),
                                 "SELECT 1") == (None, None)
    assert safesql._writing_node(_Serialised(json.dumps({"statements": [{"node": {"type": "DELETE_QUERY_NODE"}}]})),
                                 "SELECT 1") == ("DELETE", None)


def test_a_giant_value_is_stopped_inside_duckdb_before_python_holds_it() -> None:
    import psutil

    from cmdare.analytics import safesql

    con = duckdb.connect(config=safesql.CONFIG)
    rss = psutil.Process().memory_info().rss
    with pytest.raises(safesql.SqlRefused) as e:
        safesql.run(con, "SELECT string_agg(repeat('x', 10000000), '') AS s FROM range(20)", max_bytes=1 << 20)
    assert str(e.value) == ("a row of the result is over 1,048,576 bytes (the size limit): select less of it "
                            "(left(), substr(), fewer columns)")
    assert psutil.Process().memory_info().rss - rss < 600 << 20
    # a row at the limit passes; nested and binary values count too
    ok = safesql.run(con, "SELECT repeat('y', 1000) AS s, 1 AS n", max_bytes=1008)  # a number: 8 bytes
    assert ok.rows == [("y" * 1000, 1)]
    for q in ("SELECT [repeat('z', 600), repeat('z', 600)] AS l", "SELECT repeat('z', 1200)::BLOB AS b",
              "SELECT {'a': repeat('z', 1200)} AS s"):
        with pytest.raises(safesql.SqlRefused, match="over 1,000 bytes"):
            safesql.run(con, q, max_bytes=1000)


def test_the_size_guard_keeps_the_querys_order_and_its_repeated_names() -> None:
    from cmdare.analytics import safesql

    con = duckdb.connect(config=safesql.CONFIG)
    r = safesql.run(con, "SELECT i, 'v' || i AS s FROM range(5000) t(i) ORDER BY i DESC")
    assert [x[0] for x in r.rows] == list(range(4999, -1, -1))
    r = safesql.run(con, "SELECT 'a' AS x, 'b' AS x")  # repeated names: not wrapped, still answered
    assert r.columns == ["x", "x"] and r.rows == [("a", "b")]
    assert safesql.sized(con, "SELECT 1 AS n, 2.5 AS d", 10) == "SELECT 1 AS n, 2.5 AS d"  # fixed-size only


def test_a_query_that_grows_the_process_past_its_memory_budget_is_stopped() -> None:
    from cmdare.analytics import safesql

    con = duckdb.connect(config=safesql.CONFIG)
    with pytest.raises(safesql.SqlRefused) as e:
        safesql.run(con, "SELECT list(repeat('m', 1000)) AS l FROM range(2000000)", memory=64 << 20,
                    max_bytes=1 << 40)
    assert str(e.value) == ("query stopped: it needed more than 64 MiB of memory (narrow it with WHERE, LIMIT "
                            "or fewer columns)")


@pytest.mark.parametrize(("query", "rows"), [
    ("SELECT 'a' AS s;", [("a",)]), ("SELECT 'a' AS s -- a comment", [("a",)]),
    ("SELECT 'a' AS s /* c */ ;  ", [("a",)]), ("SELECT ';' AS s; -- c", [(";",)]),
    ("SELECT 'a;' AS s", [("a;",)]), ("SELECT 1 AS n, 'x' AS s -- c;", [(1, "x")]),
])
def test_the_size_guard_takes_any_ending_a_statement_may_have(query: str, rows: list) -> None:
    from cmdare.analytics import safesql

    con = duckdb.connect(config=safesql.CONFIG)
    assert safesql.run(con, query).rows == rows
