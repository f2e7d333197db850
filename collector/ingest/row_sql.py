"""Row-form lines -> typed rows with a reason column.

A row of a known type (its line starts with ``r1<TAB>type<TAB>``) is split and cast in one
pass per type, straight into typed columns (``_r_<type>``); row lines of no known type are
all rejects, and a generic pass finds their reason (``_rows``).  Labels repeat on every line
of one agent, so each distinct text is checked once (``_lab``).
"""

from __future__ import annotations

from cmdare.wire.kinds import BOOL, FLOAT, FLOATS, INT, OBJS, STR, STRS
from cmdare.wire.registry import DATA_FIELDS, MAX_ID_LEN, MAX_NAME_LEN, ROLES, ROW_PREFIX, TABLES
from cmdare.wire.validation import MAX_EVENT_BYTES, TS_MAX
from cmdare.wire.validation import sql_reason as R

from .json_sql import IS_ROW
from .sql import NENV, Q, all_of, is_num, q, values_and_checks

# -- the row form ---------------------------------------------------------------------------
# r1<TAB>type<TAB>id<TAB>ts<TAB>node<TAB>role<TAB>job<TAB>labels<TAB>data fields... (see
# cmdare.wire.rowform).  A row of a known type (its line starts with "r1<TAB>type<TAB>") is split and
# cast in one pass per type, straight into typed columns: materialising the split text is
# what costs (measured: most of the time), so it never is.  Row lines of no known type are
# all rejects; a generic pass finds their reason.  A text field starting with a quote is a
# JSON string literal.


def _row_str(x: str) -> tuple[str, str]:
    """(validity, value) of a row text field ``x`` (non-NULL)."""
    # json_type() raises on invalid JSON and AND does not short-circuit: guard with CASE
    lit = (
        f"(CASE WHEN left({x}, 1) = '\"' AND json_valid({x}) THEN json_type({x}) = 'VARCHAR' ELSE false END)"
    )
    return (
        f"(left({x}, 1) <> '\"' OR {lit})",
        f"CASE WHEN left({x}, 1) <> '\"' THEN {x} WHEN {lit} THEN {x}->>'$' END",
    )


def row_field_sql(kind: str, x: str) -> tuple[str, str]:
    """(validity, value) of the text ``x`` (non-NULL: empty fields are NULL) of one field."""
    if kind == FLOAT:
        return f"coalesce(isfinite(TRY_CAST({x} AS DOUBLE)), false)", f"TRY_CAST({x} AS DOUBLE)"
    if kind == INT:  # TRY_CAST alone would take '1.5', ' 7', '1e3', '+5': the text must be the number
        return f"coalesce(TRY_CAST({x} AS BIGINT)::VARCHAR = {x}, false)", f"TRY_CAST({x} AS BIGINT)"
    if kind == STR:
        return _row_str(x)
    if kind == BOOL:
        return f"{x} IN ('true', 'false')", f"{x} = 'true'"
    pred = {FLOATS: is_num("e"), STRS: "left(e, 1) = '\"'", OBJS: "left(e, 1) = '{'"}[kind]
    ok = f"(CASE WHEN left({x}, 1) = '[' AND json_valid({x}) THEN {all_of(x, pred)} ELSE false END)"
    typed = {FLOATS: "'[\"DOUBLE\"]'", STRS: "'[\"VARCHAR\"]'"}.get(kind)
    val = (
        f"CASE WHEN {ok} THEN from_json({x}, {typed}) END" if typed else f"CASE WHEN {ok} THEN {x}::JSON END"
    )
    return ok, val


def _row_envelope(type_: str | None) -> tuple[str, str]:
    """(select list, reason CASE) of the envelope of row lines split into ``l``, joined to
    ``_lab``; ``type_``: the lines are known to be rows of that type."""
    id_ok, id_val = _row_str("l[3]")
    node_ok, node_val = _row_str("l[5]")
    job_ok, job_val = _row_str("l[7]")
    cols = f"""CASE WHEN {id_ok} THEN {id_val} END AS id,
        make_timestamp(TRY_CAST(round(TRY_CAST(l[4] AS DOUBLE) * 1e6) AS BIGINT)) AS ts,
        CASE WHEN {node_ok} THEN {node_val} END AS node,
        l[6] AS role,
        CASE WHEN l[7] = '' THEN '' WHEN {job_ok} THEN {job_val} END AS job,
        _lab.labels::JSON AS labels"""
    def quoted(x: str) -> str:  # the offending text, in quotes as Python's repr puts it
        return f"'{Q}' || {x} || '{Q}'"

    def too_long(t: str, nf: int) -> str:
        return R("row_long", f"(len(l) - {NENV})", type=t, known=nf)

    if type_ is None:
        kinds = [f"WHEN l[2] = {q(t)} AND len(l) > {NENV + len(f)} THEN {too_long(t, len(f))}" for t, f in DATA_FIELDS.items()]
        head = f"""WHEN l[1] <> '{ROW_PREFIX}' THEN {R("row_format", quoted("left(l[1], 20)"))}
      WHEN len(l) < {NENV} THEN {R("row_short", "len(l)")}"""
        tail = f"""WHEN l[2] NOT IN ({", ".join(q(t) for t in TABLES)}) THEN {R("row_type", quoted("left(l[2], 60)"))}
      {" ".join(kinds)}"""
    else:
        nf = len(DATA_FIELDS[type_])
        head = f"""WHEN len(l) < {NENV} THEN {R("row_short", "len(l)")}
      WHEN len(l) > {NENV + nf} THEN {too_long(type_, nf)}"""
        tail = ""
    tsf = "TRY_CAST(l[4] AS DOUBLE)"
    reason = f"""CASE
      WHEN n > {MAX_EVENT_BYTES} THEN {R("size", "n")}
      {head}
      WHEN NOT coalesce({id_ok} AND strlen({id_val}) BETWEEN 1 AND {MAX_ID_LEN}, false) THEN {R("id")}
      WHEN NOT coalesce(isfinite({tsf}) AND {tsf} > 0 AND {tsf} < {TS_MAX:g}, false) THEN {R("ts", quoted("left(l[4], 40)"))}
      WHEN NOT coalesce({node_ok} AND strlen({node_val}) BETWEEN 1 AND {MAX_NAME_LEN}, false) THEN {R("node")}
      WHEN l[6] NOT IN ({", ".join(map(q, ROLES))}) THEN {R("role", quoted("left(l[6], 40)"))}
      WHEN NOT (l[7] = '' OR {job_ok}) THEN {R("job")}
      WHEN NOT coalesce(_lab.lok, false) THEN {R("labels")}
      {tail}
    END"""
    return cols, reason


def _split(where: str) -> str:
    return f"""(SELECT origin, line_no, strlen(line) AS n, string_split(line, chr(9)) AS l
        FROM _batch WHERE {where}) p LEFT JOIN _lab ON _lab.lraw = p.l[8]"""


def _row_prefix(type_: str) -> str:
    return f"starts_with(line, '{ROW_PREFIX}' || chr(9) || {q(type_)} || chr(9))"


# one agent's labels repeat on every line: each distinct text is checked once
LABELS_SQL = """
CREATE OR REPLACE TEMP TABLE _lab AS
SELECT lraw, labels,
    labels IS NOT NULL AND coalesce(list_bool_and(
        list_transform(json_extract(labels, '$.*'), lambda x: json_type(x) = 'VARCHAR')), true) AS lok
FROM (SELECT lraw, CASE WHEN lraw = '' THEN '{}' WHEN left(lraw, 1) = '{' AND json_valid(lraw) THEN lraw END AS labels
      FROM (SELECT DISTINCT lraw FROM _kinds))
"""
# the (type, labels) pairs of the batch's row lines, one pass
KINDS_SQL = f"""
CREATE OR REPLACE TEMP TABLE _kinds AS
SELECT DISTINCT l[2] AS type, coalesce(l[8], '') AS lraw
FROM (SELECT string_split(line, chr(9)) AS l FROM _batch WHERE {IS_ROW})
"""


def _other_rows_sql() -> str:
    """Row lines that are no known type's rows: every one a reject, with its reason."""
    cols, reason = _row_envelope(None)
    known = " OR ".join(_row_prefix(t) for t in TABLES)
    return f"""
CREATE OR REPLACE TEMP TABLE _rows AS
SELECT origin, line_no, n, {cols}, coalesce(l[2], '') AS type, coalesce({reason}, {R('row')}) AS reason
FROM {_split(f"{IS_ROW} AND NOT ({known})")}
"""


def _row_type_sql(type_: str) -> str:
    """The SELECT of ``_r_<type>`` from that type's row lines: split, checked and cast in
    one pass.  ``ereason`` is the envelope's problem, ``reason`` the first problem of the
    line; ``raw`` (the line as text, for dead letters) is NULL: it is in ``_batch``."""
    fields = DATA_FIELDS[type_]
    cols, ereason = _row_envelope(type_)
    texts = ", ".join(f"nullif(l[{NENV + 1 + i}], '') AS \"{n}\"" for i, n in enumerate(fields))
    values, checks = values_and_checks(type_, row_field_sql, lambda x: f"{x} IS NOT NULL")
    return f"""
SELECT origin, line_no, n, id, ts, node, role, job, labels, {", ".join(values)}, ereason,
       coalesce(ereason, CASE {" ".join(checks)} END) AS reason, NULL::VARCHAR AS raw
FROM (SELECT origin, line_no, n, {cols}, {ereason} AS ereason, {texts} FROM {_split(_row_prefix(type_))}) d
"""



OTHER_ROWS_SQL = _other_rows_sql()
ROW_TYPE_SQL = {t: _row_type_sql(t) for t in TABLES}
