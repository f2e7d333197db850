"""JSON lines -> typed rows with a reason column.

DuckDB parses and checks the JSON itself: one ``json_transform`` per line reads every
envelope key and every data field of the high-volume types as raw JSON text (``_evj``), the
checks are string operations on that text, and each type's values are cast from it.  The
reasons come from ``cmdare.wire.validation.RULES``.
"""

from __future__ import annotations

from cmdare.wire.kinds import BOOL, FLOAT, FLOATS, INT, OBJS, STR, STRS
from cmdare.wire.registry import DATA_FIELDS, HOT_TYPES, MAX_ID_LEN, MAX_NAME_LEN, ROLES, VERSION
from cmdare.wire.validation import MAX_EVENT_BYTES, TS_MAX
from cmdare.wire.validation import sql_reason as R

from .sql import all_of, is_num, present, q, struct

# Every known data field, across types (a name has one kind everywhere).  Some names are
# the writer's own working columns and cannot be data fields.
_RESERVED = {"id", "ts", "node", "job", "origin", "line_no", "n", "reason", "type", "d", "data"}
_ALL_FIELDS: dict[str, str] = {}
for _t, _fields in DATA_FIELDS.items():
    for _n, (_k, _) in _fields.items():
        assert _ALL_FIELDS.setdefault(_n, _k) == _k, f"data field {_n} has two kinds"
        assert _n not in _RESERVED, f"data field {_t}.{_n}: the name is reserved by the collector"

# One json_transform per line: every envelope key and every data field of the high-volume
# types as raw JSON text, so a sample is parsed once and types are checked on the text
# (first character).  The struct's width is paid on every line, so the rare types (job
# declarations, checkpoints, lifecycle, notices...) are not in it: their few lines have
# their data parsed a second time, with a struct of their own fields (see _type_sql).
_HOT_FIELDS = [n for n in _ALL_FIELDS if any(n in DATA_FIELDS[t] for t in HOT_TYPES)]


STRUCT = (
    "{"
    + ", ".join(
        [f'"{k}":"JSON"' for k in ("v", "id", "ts", "node", "role", "job", "labels", "type")]
        + ['"data":' + struct(_HOT_FIELDS)]
    )
    + "}"
)


def field_sql(kind: str, x: str) -> tuple[str, str]:
    """(validity predicate, value expression) for raw JSON text ``x`` of one field.
    Checks are string operations on the text (no JSON re-parse); numbers are cast from
    the text."""
    if kind == FLOAT:
        return is_num(x), f"TRY_CAST({x}::VARCHAR AS DOUBLE)"
    if kind == INT:
        return (
            f"{is_num(x)} AND strpos({x}, '.') = 0 AND strpos(lower({x}), 'e') = 0 "
            f"AND TRY_CAST({x}::VARCHAR AS BIGINT) IS NOT NULL",
            f"TRY_CAST({x}::VARCHAR AS BIGINT)",
        )
    if kind == STR:
        return f"left({x}, 1) = '\"'", f"{x}->>'$'"
    if kind == BOOL:
        return f"{x} IN ('true', 'false')", f"{x} = 'true'"
    if kind == FLOATS:
        return f"left({x}, 1) = '[' AND {all_of(x, is_num('e'))}", f"from_json({x}, '[\"DOUBLE\"]')"
    if kind == STRS:
        is_str = "left(e, 1) = '\"'"
        return f"left({x}, 1) = '[' AND {all_of(x, is_str)}", f"from_json({x}, '[\"VARCHAR\"]')"
    if kind == OBJS:
        is_obj = "left(e, 1) = '{'"
        return f"left({x}, 1) = '[' AND {all_of(x, is_obj)}", x
    raise AssertionError(kind)


# a row-form line (events.ROW_PREFIX and friends); every other line is read as JSON
IS_ROW = "(left(line, 1) = 'r' AND regexp_matches(line, '^r[0-9]+\t'))"

ENVELOPE_SQL = f"""
CREATE OR REPLACE TEMP TABLE _evj AS
WITH p AS (
    SELECT origin, line_no, line, strlen(line) AS n,
           CASE WHEN strlen(line) <= {MAX_EVENT_BYTES} AND json_valid(line) THEN left(ltrim(line), 1) END AS c0,
           CASE WHEN c0 = '{{' THEN json_transform(line, '{STRUCT}') END AS r
    FROM _batch WHERE line <> '' AND NOT {IS_ROW}
)
SELECT origin, line_no, n,
    r.id->>'$' AS id,
    make_timestamp(TRY_CAST(round(TRY_CAST(r.ts AS DOUBLE) * 1e6) AS BIGINT)) AS ts,
    r.node->>'$' AS node, r.role->>'$' AS role, coalesce(r.job->>'$', '') AS job, r.labels AS labels,
    r.type->>'$' AS type, r.data AS d,
    CASE
      WHEN n > {MAX_EVENT_BYTES} THEN {R("size", "n")}
      WHEN c0 IS NULL THEN {R("json")}
      WHEN c0 <> '{{' THEN {R("object", "lower(json_type(line))")}
      WHEN r.v IS DISTINCT FROM '{VERSION}' THEN {R("version", "coalesce(left(r.v, 40), 'missing')")}
      WHEN left(r.id, 1) IS DISTINCT FROM '"' OR strlen(r.id->>'$') NOT BETWEEN 1 AND {MAX_ID_LEN} THEN {R("id")}
      WHEN NOT coalesce({is_num("r.ts")} AND TRY_CAST(r.ts AS DOUBLE) > 0 AND TRY_CAST(r.ts AS DOUBLE) < {TS_MAX:g}, false)
        THEN {R("ts", "coalesce(left(r.ts, 40), 'nothing')")}
      WHEN left(r.node, 1) IS DISTINCT FROM '"' OR strlen(r.node->>'$') NOT BETWEEN 1 AND {MAX_NAME_LEN} THEN {R("node")}
      WHEN left(r.type, 1) IS DISTINCT FROM '"' OR strlen(r.type->>'$') NOT BETWEEN 1 AND {MAX_NAME_LEN} THEN {R("type")}
      WHEN left(r.role, 1) IS DISTINCT FROM '"' OR (r.role->>'$') NOT IN ({", ".join(map(q, ROLES))})
        THEN {R("role", "coalesce(left(r.role, 40), 'nothing')")}
      WHEN {present("r.job")} AND left(r.job, 1) <> '"' THEN {R("job")}
      WHEN {present("r.labels")} AND (left(r.labels, 1) <> '{{' OR NOT coalesce(list_bool_and(
             list_transform(json_extract(r.labels, '$.*'), lambda x: json_type(x) = 'VARCHAR')), true))
        THEN {R("labels")}
      WHEN r.data IS NULL OR ({" AND ".join(f'r.data."{n}" IS NULL' for n in _HOT_FIELDS)}
                             AND json_type(line, '$.data') IS DISTINCT FROM 'OBJECT')
        THEN {R("data")}
    END AS reason
FROM p
"""

