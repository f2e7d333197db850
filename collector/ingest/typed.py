"""One type's rows from every encoding in the batch, typed and checked: what the writer
inserts (rows with no reason) and dead-letters (rows with one)."""

from __future__ import annotations

from cmdare.wire.registry import DATA_FIELDS, HOT_TYPES, TABLES

from .block_sql import BLOCK_TYPE_SQL
from .json_sql import field_sql
from .row_sql import ROW_TYPE_SQL
from .sql import present, q, struct, values_and_checks


def r_table_sql(type_: str, text: bool, blocks: bool) -> str:
    """``_r_<type>``: the type's row lines and checked column blocks, typed, with reasons."""
    parts = ([ROW_TYPE_SQL[type_]] if text else []) + ([BLOCK_TYPE_SQL[type_]] if blocks else [])
    return f"CREATE OR REPLACE TEMP TABLE _r_{type_} AS " + " UNION ALL ".join(parts)


def ev_view(row_types: list[str], other_rows: bool, json: bool = True) -> str:
    """``_ev``: every envelope of the batch, JSON and rows (a view: nothing is copied)."""
    parts = [
        "SELECT origin, line_no, n, id, ts, node, role, job, labels, type, true AS js, reason, "
        "NULL::VARCHAR AS raw FROM _evj"
    ][: 1 if json else 0]
    parts += [
        f"SELECT origin, line_no, n, id, ts, node, role, job, labels, {q(t)} AS type, false AS js, "
        f"ereason AS reason, raw FROM _r_{t}"
        for t in row_types
    ]
    if other_rows:
        parts.append(
            "SELECT origin, line_no, n, id, ts, node, role, job, labels, type, false, reason, NULL FROM _rows"
        )
    return "CREATE OR REPLACE TEMP VIEW _ev AS " + " UNION ALL ".join(parts)


def _type_sql(type_: str, dedup: bool, json: bool = True, rows: bool = False) -> tuple[str, list[str]]:
    """SQL that builds ``_t`` (rows of one type, values typed, per-row reason; with
    ``dedup`` only the first of each id in the batch) from the type's JSON lines and/or its
    row-form lines, and the list of its value columns."""
    fields = DATA_FIELDS[type_]
    parts = []
    if json:
        values, checks = values_and_checks(type_, field_sql, present)
        if type_ in HOT_TYPES:
            src = f"(SELECT * FROM _evj WHERE reason IS NULL AND type = {q(type_)})"
        else:  # a rare type: its data parsed again, with its own fields only
            src = f"""(SELECT e.origin, e.line_no, e.n, e.id, e.ts, e.node, e.job,
                       json_transform(json_extract(b.line, '$.data'), '{struct(list(fields))}') AS d
                FROM (SELECT * FROM _evj WHERE reason IS NULL AND type = {q(type_)}) e
                JOIN _batch b ON b.origin = e.origin AND b.line_no = e.line_no)"""
        parts.append(
            f"SELECT origin, line_no, n, id, ts, node, job, {', '.join(values)}, "
            f"CASE {' '.join(checks)} END AS reason, NULL::VARCHAR AS raw FROM {src}"
        )
    if rows:
        names = ", ".join(f'"{n}"' for n in fields)
        parts.append(
            f"SELECT origin, line_no, n, id, ts, node, job, {names}, reason, raw FROM _r_{type_} WHERE ereason IS NULL"
        )
    sql = f"""
CREATE OR REPLACE TEMP TABLE _t AS
SELECT * FROM ({" UNION ALL ".join(parts)})
{_FIRST_OF_ID if dedup else ""}
"""
    return sql, list(fields)


# the window is costly: used only for a batch that holds the same (node, id) twice
_FIRST_OF_ID = "QUALIFY row_number() OVER (PARTITION BY node, id ORDER BY origin, line_no) = 1"
# (type, de-duplicate in the batch, has JSON lines, has rows) -> (SQL making _t, columns)
TYPE_SQL = {
    (t, dedup, js, rows): _type_sql(t, dedup, js, rows)
    for t in TABLES
    for dedup in (False, True)
    for js, rows in ((True, False), (False, True), (True, True))
}
