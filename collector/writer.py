"""Batched, transactional, idempotent loading of wire-format events into DuckDB.

One ``Writer.write(messages)`` call is one transaction.  Python checks each message is
UTF-8 and splits it into lines; the lines go to DuckDB as one Arrow table (several record
batches, so both cores work), and DuckDB parses and validates the JSON itself (the SQL
is generated from ``events.DATA_FIELDS``, the same spec the agent's validator uses).
Typed rows are appended per table, rejects go to ``dead_letters`` with a reason, and the
caller's position (spool) is recorded in the same transaction.

De-duplication: an event delivered twice carries the same id *and the same ts*, so a new
row is dropped when a row with its id exists in the batch's ts range (an anti-join that
zone maps keep cheap) or earlier in the same batch.  No unbounded in-memory index.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from cmdare.agent.events import (
    _ROW_START,
    BOOL,
    DATA_FIELDS,
    FLOAT,
    FLOATS,
    INT,
    OBJS,
    ROLES,
    ROW_ENVELOPE,
    ROW_PREFIX,
    STR,
    STRS,
    VERSION,
)

from . import columns

MAX_EVENT_BYTES = 1 << 20
RAW_CAP = 64 << 10  # bytes of a rejected message kept in dead_letters.raw
CHUNK = 16384  # lines per Arrow record batch handed to DuckDB

TABLES = {
    "host": "host_samples",
    "gpu": "gpu_samples",
    "gpu_event": "gpu_events",
    "tpu": "tpu_samples",
    "heartbeat": "heartbeats",
    "status": "agent_status",
    "train_job": "jobs",
    "train_steps": "steps",
    "train_slow_step": "slow_steps",
    "train_checkpoint": "checkpoints",
    "train_scalar": "scalars",
    "instance": "instance_identity",
    "lifecycle": "lifecycle_events",
    "revocation": "revocations",
}


@dataclass
class WriteResult:
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows inserted
    duplicates: int = 0
    dead: int = 0
    lines: int = 0

    @property
    def inserted(self) -> int:
        return sum(self.rows.values())


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


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
HOT_TYPES = ("host", "gpu", "gpu_event", "tpu", "heartbeat", "status", "train_steps")
_HOT_FIELDS = [n for n in _ALL_FIELDS if any(n in DATA_FIELDS[t] for t in HOT_TYPES)]


def _struct(fields: list[str]) -> str:
    return "{" + ", ".join(f'"{n}":"JSON"' for n in fields) + "}"


_STRUCT = (
    "{"
    + ", ".join(
        [f'"{k}":"JSON"' for k in ("v", "id", "ts", "node", "role", "job", "labels", "type")]
        + ['"data":' + _struct(_HOT_FIELDS)]
    )
    + "}"
)


def _is_num(x: str) -> str:
    return f"(left({x}, 1) BETWEEN '0' AND '9' OR left({x}, 1) = '-')"


def _all(x: str, pred: str) -> str:
    return f"coalesce(list_bool_and(list_transform(from_json({x}, '[\"JSON\"]'), lambda e: {pred})), true)"


def _field_sql(kind: str, x: str) -> tuple[str, str]:
    """(validity predicate, value expression) for raw JSON text ``x`` of one field.
    Checks are string operations on the text (no JSON re-parse); numbers are cast from
    the text."""
    if kind == FLOAT:
        return _is_num(x), f"TRY_CAST({x}::VARCHAR AS DOUBLE)"
    if kind == INT:
        return (
            f"{_is_num(x)} AND strpos({x}, '.') = 0 AND strpos(lower({x}), 'e') = 0 "
            f"AND TRY_CAST({x}::VARCHAR AS BIGINT) IS NOT NULL",
            f"TRY_CAST({x}::VARCHAR AS BIGINT)",
        )
    if kind == STR:
        return f"left({x}, 1) = '\"'", f"{x}->>'$'"
    if kind == BOOL:
        return f"{x} IN ('true', 'false')", f"{x} = 'true'"
    if kind == FLOATS:
        return f"left({x}, 1) = '[' AND {_all(x, _is_num('e'))}", f"from_json({x}, '[\"DOUBLE\"]')"
    if kind == STRS:
        is_str = "left(e, 1) = '\"'"
        return f"left({x}, 1) = '[' AND {_all(x, is_str)}", f"from_json({x}, '[\"VARCHAR\"]')"
    if kind == OBJS:
        is_obj = "left(e, 1) = '{'"
        return f"left({x}, 1) = '[' AND {_all(x, is_obj)}", x
    raise AssertionError(kind)


def _present(x: str) -> str:
    return f"({x} IS NOT NULL AND {x} <> 'null')"


# a row-form line (events.ROW_PREFIX and friends); every other line is read as JSON
_IS_ROW = "(left(line, 1) = 'r' AND regexp_matches(line, '^r[0-9]+\t'))"

ENVELOPE_SQL = f"""
CREATE OR REPLACE TEMP TABLE _evj AS
WITH p AS (
    SELECT origin, line_no, line, strlen(line) AS n,
           CASE WHEN strlen(line) <= {MAX_EVENT_BYTES} AND json_valid(line) THEN left(ltrim(line), 1) END AS c0,
           CASE WHEN c0 = '{{' THEN json_transform(line, '{_STRUCT}') END AS r
    FROM _batch WHERE line <> '' AND NOT {_IS_ROW}
)
SELECT origin, line_no, n,
    r.id->>'$' AS id,
    make_timestamp(TRY_CAST(round(TRY_CAST(r.ts AS DOUBLE) * 1e6) AS BIGINT)) AS ts,
    r.node->>'$' AS node, r.role->>'$' AS role, coalesce(r.job->>'$', '') AS job, r.labels AS labels,
    r.type->>'$' AS type, r.data AS d,
    CASE
      WHEN n > {MAX_EVENT_BYTES} THEN 'event of ' || n || ' bytes exceeds the {MAX_EVENT_BYTES} byte limit'
      WHEN c0 IS NULL THEN 'not valid JSON'
      WHEN c0 <> '{{' THEN 'event is a JSON ' || lower(json_type(line)) || ', expected an object'
      WHEN r.v IS DISTINCT FROM '{VERSION}'
        THEN 'unsupported wire format version ' || coalesce(left(r.v, 40), 'missing') || ' (this collector reads v{VERSION})'
      WHEN left(r.id, 1) IS DISTINCT FROM '"' OR strlen(r.id->>'$') NOT BETWEEN 1 AND 64
        THEN 'field ''id'' must be a non-empty string of at most 64 characters'
      WHEN NOT coalesce({_is_num("r.ts")} AND TRY_CAST(r.ts AS DOUBLE) > 0 AND TRY_CAST(r.ts AS DOUBLE) < 1e11, false)
        THEN 'field ''ts'' must be unix seconds, got ' || coalesce(left(r.ts, 40), 'nothing')
      WHEN left(r.node, 1) IS DISTINCT FROM '"' OR strlen(r.node->>'$') NOT BETWEEN 1 AND 256
        THEN 'field ''node'' must be a non-empty string of at most 256 characters'
      WHEN left(r.type, 1) IS DISTINCT FROM '"' OR strlen(r.type->>'$') NOT BETWEEN 1 AND 256
        THEN 'field ''type'' must be a non-empty string of at most 256 characters'
      WHEN left(r.role, 1) IS DISTINCT FROM '"' OR (r.role->>'$') NOT IN ({", ".join(map(_q, ROLES))})
        THEN 'field ''role'' must be one of {", ".join(ROLES)}, got ' || coalesce(left(r.role, 40), 'nothing')
      WHEN {_present("r.job")} AND left(r.job, 1) <> '"' THEN 'field ''job'' must be a string'
      WHEN {_present("r.labels")} AND (left(r.labels, 1) <> '{{' OR NOT coalesce(list_bool_and(
             list_transform(json_extract(r.labels, '$.*'), lambda x: json_type(x) = 'VARCHAR')), true))
        THEN 'field ''labels'' must be an object of string values'
      WHEN r.data IS NULL OR ({" AND ".join(f'r.data."{n}" IS NULL' for n in _HOT_FIELDS)}
                             AND json_type(line, '$.data') IS DISTINCT FROM 'OBJECT')
        THEN 'field ''data'' must be an object'
    END AS reason
FROM p
"""


# -- the row form ---------------------------------------------------------------------------
# r1<TAB>type<TAB>id<TAB>ts<TAB>node<TAB>role<TAB>job<TAB>labels<TAB>data fields... (see
# events.py).  A row of a known type (its line starts with "r1<TAB>type<TAB>") is split and
# cast in one pass per type, straight into typed columns: materialising the split text is
# what costs (measured: most of the time), so it never is.  Row lines of no known type are
# all rejects; a generic pass finds their reason.  A text field starting with a quote is a
# JSON string literal.
_NENV = 1 + len(ROW_ENVELOPE)
_Q = "''"


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


def _row_field_sql(kind: str, x: str) -> tuple[str, str]:
    """(validity, value) of the text ``x`` (non-NULL: empty fields are NULL) of one field."""
    if kind == FLOAT:
        return f"coalesce(isfinite(TRY_CAST({x} AS DOUBLE)), false)", f"TRY_CAST({x} AS DOUBLE)"
    if kind == INT:  # TRY_CAST alone would take '1.5', ' 7', '1e3', '+5': the text must be the number
        return f"coalesce(TRY_CAST({x} AS BIGINT)::VARCHAR = {x}, false)", f"TRY_CAST({x} AS BIGINT)"
    if kind == STR:
        return _row_str(x)
    if kind == BOOL:
        return f"{x} IN ('true', 'false')", f"{x} = 'true'"
    pred = {FLOATS: _is_num("e"), STRS: "left(e, 1) = '\"'", OBJS: "left(e, 1) = '{'"}[kind]
    ok = f"(CASE WHEN left({x}, 1) = '[' AND json_valid({x}) THEN {_all(x, pred)} ELSE false END)"
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
    if type_ is None:
        kinds = [
            f"WHEN l[2] = {_q(t)} AND len(l) > {_NENV + len(f)} THEN {_q(f'{t} row has ')} || (len(l) - {_NENV}) || "
            + _q(f" data fields; this collector knows {len(f)} (a newer agent?)")
            for t, f in DATA_FIELDS.items()
        ]
        head = f"""WHEN l[1] <> '{ROW_PREFIX}' THEN 'unsupported row format {_Q}' || left(l[1], 20) || '{_Q} (this collector reads {ROW_PREFIX})'
      WHEN len(l) < {_NENV} THEN 'row has ' || len(l) || ' fields, fewer than the {_NENV} of the envelope'"""
        tail = f"""WHEN l[2] NOT IN ({", ".join(_q(t) for t in TABLES)})
        THEN 'row of type {_Q}' || left(l[2], 60) || '{_Q}, which this collector does not know'
      {" ".join(kinds)}"""
    else:
        nf = len(DATA_FIELDS[type_])
        head = f"""WHEN len(l) < {_NENV} THEN 'row has ' || len(l) || ' fields, fewer than the {_NENV} of the envelope'
      WHEN len(l) > {_NENV + nf} THEN {_q(f"{type_} row has ")} || (len(l) - {_NENV}) || {_q(f" data fields; this collector knows {nf} (a newer agent?)")}"""
        tail = ""
    tsf = "TRY_CAST(l[4] AS DOUBLE)"
    reason = f"""CASE
      WHEN n > {MAX_EVENT_BYTES} THEN 'event of ' || n || ' bytes exceeds the {MAX_EVENT_BYTES} byte limit'
      {head}
      WHEN NOT coalesce({id_ok} AND strlen({id_val}) BETWEEN 1 AND 64, false)
        THEN 'field {_Q}id{_Q} must be a non-empty string of at most 64 characters'
      WHEN NOT coalesce(isfinite({tsf}) AND {tsf} > 0 AND {tsf} < 1e11, false)
        THEN 'field {_Q}ts{_Q} must be unix seconds, got {_Q}' || left(l[4], 40) || '{_Q}'
      WHEN NOT coalesce({node_ok} AND strlen({node_val}) BETWEEN 1 AND 256, false)
        THEN 'field {_Q}node{_Q} must be a non-empty string of at most 256 characters'
      WHEN l[6] NOT IN ({", ".join(map(_q, ROLES))})
        THEN 'field {_Q}role{_Q} must be one of {", ".join(ROLES)}, got {_Q}' || left(l[6], 40) || '{_Q}'
      WHEN NOT (l[7] = '' OR {job_ok}) THEN 'field {_Q}job{_Q} must be a string'
      WHEN NOT coalesce(_lab.lok, false) THEN 'field {_Q}labels{_Q} must be an object of string values'
      {tail}
    END"""
    return cols, reason


def _split(where: str) -> str:
    return f"""(SELECT origin, line_no, strlen(line) AS n, string_split(line, chr(9)) AS l
        FROM _batch WHERE {where}) p LEFT JOIN _lab ON _lab.lraw = p.l[8]"""


def _row_prefix(type_: str) -> str:
    return f"starts_with(line, '{ROW_PREFIX}' || chr(9) || {_q(type_)} || chr(9))"


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
FROM (SELECT string_split(line, chr(9)) AS l FROM _batch WHERE {_IS_ROW})
"""


def _other_rows_sql() -> str:
    """Row lines that are no known type's rows: every one a reject, with its reason."""
    cols, reason = _row_envelope(None)
    known = " OR ".join(_row_prefix(t) for t in TABLES)
    return f"""
CREATE OR REPLACE TEMP TABLE _rows AS
SELECT origin, line_no, n, {cols}, coalesce(l[2], '') AS type, coalesce({reason}, 'not a valid row') AS reason
FROM {_split(f"{_IS_ROW} AND NOT ({known})")}
"""


def _values_and_checks(
    type_: str, field_sql: Callable[[str, str], tuple[str, str]], present: Callable[[str], str]
) -> tuple[list[str], list[str]]:
    """Per data field of ``type_`` (text in ``d."<field>"``): the typed value expression and
    the CASE branch naming the field when a present value is not of its kind."""
    values, checks = [], []
    for name, (kind, _) in DATA_FIELDS[type_].items():
        x = f'd."{name}"'
        ok, val = field_sql(kind, x)
        values.append(f'{val} AS "{name}"')
        checks.append(
            f"WHEN {present(x)} AND NOT ({ok}) THEN {_q(f'{type_}.{name} must be {kind}, got ')} || left({x}::VARCHAR, 60)"
        )
    return values, checks


def _row_type_sql(type_: str) -> str:
    """The SELECT of ``_r_<type>`` from that type's row lines: split, checked and cast in
    one pass.  ``ereason`` is the envelope's problem, ``reason`` the first problem of the
    line; ``raw`` (the line as text, for dead letters) is NULL: it is in ``_batch``."""
    fields = DATA_FIELDS[type_]
    cols, ereason = _row_envelope(type_)
    texts = ", ".join(f"nullif(l[{_NENV + 1 + i}], '') AS \"{n}\"" for i, n in enumerate(fields))
    values, checks = _values_and_checks(type_, _row_field_sql, lambda x: f"{x} IS NOT NULL")
    return f"""
SELECT origin, line_no, n, id, ts, node, role, job, labels, {", ".join(values)}, ereason,
       coalesce(ereason, CASE {" ".join(checks)} END) AS reason, NULL::VARCHAR AS raw
FROM (SELECT origin, line_no, n, {cols}, {ereason} AS ereason, {texts} FROM {_split(_row_prefix(type_))}) d
"""


def _block_field_sql(kind: str, x: str) -> tuple[str, str]:
    """(validity, value) of a column-block value ``x`` (non-NULL): numbers arrive typed, so
    only finiteness is left to check; the list kinds arrive as their JSON text."""
    if kind == FLOAT:
        return f"isfinite({x})", x
    if kind in (INT, BOOL, STR):
        return "true", x
    return _row_field_sql(kind, x)


def _raw_str(x: str) -> str:
    """SQL making ``events.row_str`` of a string ``x``: as is, or a JSON literal."""
    return (
        f"CASE WHEN {x} = '' OR left({x}, 1) = '\"' OR regexp_matches({x}, '[\\x00-\\x1f\\x7f]') "
        f"THEN to_json({x})::VARCHAR ELSE {x} END"
    )


def _raw_field(kind: str, x: str) -> str:
    return f"coalesce({_raw_str(x) if kind == STR else x + '::VARCHAR'}, '')"


# Block fields whose JSON text repeats across a batch (a handful of throttle masks; a GPU's
# processes change when a job starts or its memory grows): checked and parsed once per
# distinct text in the batch, not once per row (the per-row parse was a third of the GPU
# block pass).  A field whose text is mostly new each tick (host counters) is not here.
_BY_DISTINCT = {"gpu": ("throttle_reasons", "processes")}


def _block_type_sql(type_: str) -> str:
    """The SELECT of ``_r_<type>`` from the type's column blocks (``_cb_<type>``, one row per
    sample, typed by Arrow); same columns, same checks and reasons as the row lines'."""
    fields = DATA_FIELDS[type_]
    distinct = _BY_DISTINCT.get(type_, ())

    def field_sql(kind: str, x: str) -> tuple[str, str]:
        name = x[len('d."') : -1]
        if name in distinct:  # from the per-distinct-text lookup joined below
            return f'd."{name}:ok"', f'd."{name}:val"'
        return _block_field_sql(kind, x)

    values, checks = _values_and_checks(type_, field_sql, lambda x: f"{x} IS NOT NULL")
    texts = ", ".join(f'c."{n}"' for n in fields)
    joins = ""
    for i, n in enumerate(distinct):
        ok, val = _block_field_sql(fields[n][0], "v")
        texts += f', k{i}.ok AS "{n}:ok", k{i}.val AS "{n}:val"'
        joins += (
            f' LEFT JOIN (SELECT v, {ok} AS ok, {val} AS val FROM (SELECT DISTINCT "{n}" AS v FROM _cb_{type_}))'
            f' k{i} ON k{i}.v = c."{n}"'
        )
    ereason = f"""CASE
      WHEN NOT coalesce(strlen(c.id) BETWEEN 1 AND 64, false)
        THEN 'field {_Q}id{_Q} must be a non-empty string of at most 64 characters'
      WHEN NOT coalesce(isfinite(c.ts) AND c.ts > 0 AND c.ts < 1e11, false)
        THEN 'field {_Q}ts{_Q} must be unix seconds, got {_Q}' || c.ts::VARCHAR || '{_Q}'
      WHEN NOT coalesce(strlen(c.node) BETWEEN 1 AND 256, false)
        THEN 'field {_Q}node{_Q} must be a non-empty string of at most 256 characters'
      WHEN c.role NOT IN ({", ".join(map(_q, ROLES))})
        THEN 'field {_Q}role{_Q} must be one of {", ".join(ROLES)}, got {_Q}' || left(c.role, 40) || '{_Q}'
      WHEN NOT coalesce(_lab.lok, false) THEN 'field {_Q}labels{_Q} must be an object of string values'
    END"""
    # a rejected row's text for dead_letters: the row form, re-made from the columns
    raw = " || chr(9) || ".join(
        [f"'{ROW_PREFIX}'", _q(type_), _raw_str("d.id"), "d.tsd::VARCHAR", _raw_str("d.node"), "d.role"]
        + [f"CASE WHEN d.job = '' THEN '' ELSE {_raw_str('d.job')} END", "d.lraw"]
        + [_raw_field(k, f'd."{n}"') for n, (k, _) in fields.items()]
    )
    return f"""
SELECT origin, line_no, n, id, ts, node, role, job, labels, {", ".join(values)}, ereason, reason,
       CASE WHEN reason IS NOT NULL THEN {raw} END AS raw
FROM (
SELECT *, coalesce(ereason, CASE {" ".join(checks)} END) AS reason
FROM (SELECT c.origin, c.line_no, c.n, c.id, make_timestamp(TRY_CAST(round(c.ts * 1e6) AS BIGINT)) AS ts,
             c.ts AS tsd, c.node, c.role, c.job, _lab.labels::JSON AS labels, c.labels AS lraw,
             {ereason} AS ereason, {texts}
      FROM _cb_{type_} c LEFT JOIN _lab ON _lab.lraw = c.labels{joins}) d
) d
"""


def _r_table_sql(type_: str, text: bool, blocks: bool) -> str:
    parts = ([ROW_TYPE_SQL[type_]] if text else []) + ([BLOCK_TYPE_SQL[type_]] if blocks else [])
    return f"CREATE OR REPLACE TEMP TABLE _r_{type_} AS " + " UNION ALL ".join(parts)


OTHER_ROWS_SQL = _other_rows_sql()
ROW_TYPE_SQL = {t: _row_type_sql(t) for t in TABLES}
BLOCK_TYPE_SQL = {t: _block_type_sql(t) for t in TABLES}


# -- column blocks, the fast path --------------------------------------------------------------
# A type's column blocks in a batch where every row is clean (the normal case: the agent
# checked them before sending) go straight from Arrow into the table: no temp table of
# checked rows (measured: as costly as the insert itself).  The same checks decide it, as
# one aggregate over the rows (per-block envelope values are checked in Python once per
# block); a single failing row, or an id twice in the batch, sends the type to the checked
# path above, which finds each row's reason.
def _fast_sql(type_: str) -> tuple[list[str], str, str]:
    """(lookup tables to create, the check query, the insert) for ``_cf_<type>``."""
    fields = DATA_FIELDS[type_]
    distinct = [n for n in _BY_DISTINCT.get(type_, ()) if fields[n][0] in (FLOATS, STRS, OBJS)]
    lookups, joins, values = [], "", []
    oks = ["strlen(c.id) BETWEEN 1 AND 64", "isfinite(c.ts)", "c.ts > 0", "c.ts < 1e11"]
    for n, (kind, _) in fields.items():
        if n in distinct:
            i = distinct.index(n)
            ok, val = _block_field_sql(kind, "v")
            lookups.append(
                f"CREATE OR REPLACE TEMP TABLE _k_{type_}_{i} AS SELECT v, {ok} AS ok, {val} AS val "
                f'FROM (SELECT DISTINCT "{n}" AS v FROM _cf_{type_} WHERE "{n}" IS NOT NULL)'
            )
            joins += f' LEFT JOIN _k_{type_}_{i} k{i} ON k{i}.v = c."{n}"'
            values.append(f"k{i}.val")
            continue
        ok, val = _block_field_sql(kind, f'c."{n}"')
        if ok != "true":
            oks.append(f'(c."{n}" IS NULL OR {ok})')
        values.append(val)
    checks = [f"coalesce(bool_and(coalesce({' AND '.join(oks)}, false)), true)"]
    checks += [f"(SELECT coalesce(bool_and(ok), true) FROM _k_{type_}_{i})" for i in range(len(distinct))]
    check = f"""SELECT {" AND ".join(checks)}, count(*) - count(DISTINCT c.id),
        make_timestamp(TRY_CAST(round(min(c.ts) * 1e6) AS BIGINT)),
        make_timestamp(TRY_CAST(round(max(c.ts) * 1e6) AS BIGINT)), count(*)
    FROM _cf_{type_} c"""
    table = TABLES[type_]
    cols = ", ".join(f'"{n}"' for n in fields)
    insert = f"""INSERT INTO {table} (id, ts, node, job, {cols})
    SELECT c.id, make_timestamp(TRY_CAST(round(c.ts * 1e6) AS BIGINT)), c.node, c.job, {", ".join(values)}
    FROM _cf_{type_} c{joins}
    WHERE NOT EXISTS (SELECT 1 FROM {table} x WHERE x.ts BETWEEN ? AND ? AND x.id = c.id)"""
    return lookups, check, insert


FAST_SQL = {t: _fast_sql(t) for t in TABLES}


def _ev_view(row_types: list[str], other_rows: bool, json: bool = True) -> str:
    """``_ev``: every envelope of the batch, JSON and rows (a view: nothing is copied)."""
    parts = [
        "SELECT origin, line_no, n, id, ts, node, role, job, labels, type, true AS js, reason, "
        "NULL::VARCHAR AS raw FROM _evj"
    ][: 1 if json else 0]
    parts += [
        f"SELECT origin, line_no, n, id, ts, node, role, job, labels, {_q(t)} AS type, false AS js, "
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
        values, checks = _values_and_checks(type_, _field_sql, _present)
        if type_ in HOT_TYPES:
            src = f"(SELECT * FROM _evj WHERE reason IS NULL AND type = {_q(type_)})"
        else:  # a rare type: its data parsed again, with its own fields only
            src = f"""(SELECT e.origin, e.line_no, e.n, e.id, e.ts, e.node, e.job,
                       json_transform(json_extract(b.line, '$.data'), '{_struct(list(fields))}') AS d
                FROM (SELECT * FROM _evj WHERE reason IS NULL AND type = {_q(type_)}) e
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


_FIRST_OF_ID = "QUALIFY row_number() OVER (PARTITION BY id ORDER BY origin, line_no) = 1"
# the window is costly: used only for a batch that holds the same id twice
_TYPE_SQL = {
    (t, dedup, js, rows): _type_sql(t, dedup, js, rows)
    for t in TABLES
    for dedup in (False, True)
    for js, rows in ((True, False), (False, True), (True, True))
}

# the raw line comes from the input (_batch), which is joined only for the rejected rows (a
# column block's row has no line: its ``raw`` is the row re-made as text)
DEAD_SQL = f"""
INSERT INTO dead_letters
SELECT ?::TIMESTAMP, s.origin, s.line_no, s.reason, encode(left(coalesce(s.raw, b.line), {RAW_CAP})), s.n
FROM (SELECT * FROM {{src}} WHERE reason IS NOT NULL) s
LEFT JOIN _batch b ON b.origin = s.origin AND b.line_no = s.line_no
WHERE NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.origin = s.origin AND d.line = s.line_no)
"""

# A node's role, job and labels are those of its latest event, and only a batch with events
# as new as the node's latest stored one replaces them (a spool of older events loaded later
# leaves them alone).  The job is the agent's (its config): train_* events carry the
# training job's id in their envelope, so they never set it.
NODES_SQL = """
INSERT INTO nodes
SELECT node, arg_max(role, ts), arg_max(job, ts) FILTER (WHERE agent), arg_max(labels, ts)::JSON,
    min(ts), max(ts)
FROM ({src}) GROUP BY node
ON CONFLICT (node) DO UPDATE SET
    role = CASE WHEN excluded.last_seen >= nodes.last_seen THEN excluded.role ELSE nodes.role END,
    job = CASE WHEN excluded.job IS NOT NULL AND excluded.last_seen >= nodes.last_seen
               THEN excluded.job ELSE nodes.job END,
    labels = CASE WHEN excluded.last_seen >= nodes.last_seen THEN excluded.labels ELSE nodes.labels END,
    first_seen = least(nodes.first_seen, excluded.first_seen),
    last_seen = greatest(nodes.last_seen, excluded.last_seen)
"""
TRAIN_PREFIX = "train_"  # types whose envelope job is a training job's, not the agent's
_NODES_EV = (
    f"SELECT node, role, job, labels, ts, NOT starts_with(type, '{TRAIN_PREFIX}') AS agent "
    "FROM _ev WHERE reason IS NULL"
)
# a fast-path block's envelope, once at its first and once at its last ts
_NODES_BN = """SELECT b.node, b.role, b.job, _lab.labels::JSON AS labels,
    make_timestamp(TRY_CAST(round(b.ts * 1e6) AS BIGINT)) AS ts, b.agent
    FROM _bn b JOIN _lab ON _lab.lraw = b.lraw"""


_warm = False


def warm_up(con: duckdb.DuckDBPyConnection) -> None:
    """Pay DuckDB's one-time costs of reading Arrow data now, not inside the first batch.

    The first Arrow table a process hands to DuckDB makes it import pandas and
    pyarrow.compute (~0.4 s here): inside the first batch's transaction, and holding the
    GIL while the consumer is fetching the next one."""
    global _warm
    if _warm:
        return
    con.register("_warm_up", pa.table({"x": pa.array([1], pa.int64())}))
    try:
        con.execute("SELECT count(*) FROM _warm_up").fetchall()
    finally:
        con.unregister("_warm_up")
    _warm = True


class Batch:
    """Messages read for one ``Writer.write_batch``: split into lines, column blocks decoded
    into Arrow arrays over the message bytes.  Python work, so a consumer does it on its
    own thread, while the writer's thread runs the previous batch's SQL (which releases
    the GIL)."""

    def __init__(self) -> None:
        self.origins: list[str] = []
        self.line_nos: list[int] = []
        self.lines: list[str] = []
        self.py_dead: list[tuple[str, int, str, bytes, int]] = []
        self.has_rows = False
        self.blocks: dict[str, list[tuple[str, int, columns.Block]]] = {}
        self.block_labels: set[tuple[str, str]] = set()
        self.lean: dict[str, list[pa.RecordBatch]] = {}  # per type, for the fast path
        self.messages = 0
        self.bytes = 0  # message values read, the bound --batch-bytes sets

    def __len__(self) -> int:
        return self.messages

    def add(self, origin: str, raw: bytes | None) -> None:
        self.messages += 1
        if raw is None:
            self.py_dead.append((origin, 0, "message has no value", b"", 0))
            return
        self.bytes += len(raw)
        message_blocks: list[columns.Block] = []
        if columns.is_block(raw):
            try:
                text, message_blocks = columns.decode(raw, _KNOWN)
            except columns.BlockError as e:
                self.py_dead.append((origin, 0, str(e), bytes(raw[:RAW_CAP]), len(raw)))
                return
        else:
            text = raw
        try:
            parts = text.decode("utf-8").split("\n")
        except UnicodeDecodeError as e:
            reason = f"not UTF-8 text (byte {e.start}): not a cmdare event message"
            self.py_dead.append((origin, 0, reason, bytes(raw[:RAW_CAP]), len(raw)))
            return
        if parts[-1] == "":
            parts.pop()
        if not self.has_rows and (text[:1] == b"r" or b"\nr" in text):
            self.has_rows = True
        if parts:
            self.lines += parts
            self.origins += [origin] * len(parts)
            self.line_nos += range(1, len(parts) + 1)
        first = len(parts) + 1  # a block's rows are numbered after the message's lines
        for b in message_blocks:
            self.blocks.setdefault(b.type, []).append((origin, first, b))
            self.lean.setdefault(b.type, []).append(_lean_batch(b))
            self.block_labels.add((b.type, b.labels))
            first += b.rows


class Writer:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        # DuckDB appends from all threads at once (a plain Arrow insert runs 2x faster);
        # nothing reads rows in stored order: queries order, the in-batch de-dup included
        con.execute("SET preserve_insertion_order = false")
        warm_up(con)

    def _unknown_types(self) -> int:
        """Events of types this collector does not know: kept whole (data as JSON)."""
        known = ", ".join(_q(t) for t in TABLES)
        self.con.execute(f"""CREATE OR REPLACE TEMP TABLE _t AS
            SELECT e.id, e.ts, e.node, e.job, e.type, json_extract(b.line, '$.data') AS data,
                   NULL::VARCHAR AS reason
            FROM (SELECT * FROM _evj WHERE reason IS NULL AND type NOT IN ({known})) e
            JOIN _batch b ON b.origin = e.origin AND b.line_no = e.line_no
            QUALIFY row_number() OVER (PARTITION BY e.id ORDER BY e.origin, e.line_no) = 1""")
        return self._insert_dedup("unknown_events", ["type", "data"], "_t")

    def _insert_dedup(self, table: str, cols: list[str], src: str) -> int:
        lo, hi, n = self.con.execute(
            f"SELECT min(ts), max(ts), count(*) FROM {src} WHERE reason IS NULL"
        ).fetchone()
        if not n:
            return 0
        collist = ", ".join(f'"{c}"' for c in cols)
        inserted = self.con.execute(
            f"""
            INSERT INTO {table} (id, ts, node, job, {collist})
            SELECT id, ts, node, job, {collist} FROM {src} s
            WHERE reason IS NULL AND NOT EXISTS (
                SELECT 1 FROM {table} x WHERE x.ts BETWEEN ? AND ? AND x.id = s.id)""",
            [lo, hi],
        ).fetchone()[0]
        return inserted

    def _fast(self, type_: str, lean: list[pa.RecordBatch], registered: list[str]) -> tuple[int, int] | None:
        """Insert a type's column blocks straight from Arrow when every row is clean and no
        id repeats in them: (rows inserted, rows); None (nothing written) otherwise."""
        con = self.con
        con.register(f"_cf_{type_}", pa.Table.from_batches(lean, schema=_LEAN_SCHEMAS[type_]))
        registered.append(f"_cf_{type_}")
        lookups, check, insert = FAST_SQL[type_]
        for sql in lookups:
            con.execute(sql)
        clean, repeats, lo, hi, n = con.execute(check).fetchall()[0]
        if not clean or repeats:
            return None
        return con.execute(insert, [lo, hi]).fetchone()[0], n

    def write(
        self, messages: list[tuple[str, bytes | None]], position: tuple[str, int, int] | None = None
    ) -> WriteResult:
        """Load ``[(origin, raw message)]`` in one transaction; ``position`` =
        (spool source, segment, offset) is recorded in the same transaction."""
        batch = Batch()
        for origin, raw in messages:
            batch.add(origin, raw)
        return self.write_batch(batch, position)

    def write_batch(self, batch: Batch, position: tuple[str, int, int] | None = None) -> WriteResult:
        """``write`` of messages already read into a ``Batch`` (on any thread)."""
        res = WriteResult()
        now = time.time()
        origins, line_nos, lines, py_dead = batch.origins, batch.line_nos, batch.lines, batch.py_dead
        has_rows, blocks, block_labels = batch.has_rows, batch.blocks, batch.block_labels
        con = self.con
        row_types: list[str] = []
        registered: list[str] = []
        con.execute("BEGIN")
        try:
            ts_now = _ts(now)
            if lines or blocks:
                con.register("_batch", _lines_table(origins, line_nos, lines))
                registered.append("_batch")
                repeats = 0
                # the JSON pass costs ~25 ms to plan: skipped when no line needs it
                has_json = len(lines) > 4096 or any(not _ROW_START.match(x) for x in lines)
                if has_json:
                    con.execute(ENVELOPE_SQL)
                text_types: set[str] = set()
                if has_rows:
                    con.execute(KINDS_SQL)
                    text_types = {t for (t,) in con.execute("SELECT DISTINCT type FROM _kinds").fetchall()}
                fast: dict[str, list[columns.Block]] = {}
                if blocks:
                    if not has_rows:
                        con.execute("CREATE OR REPLACE TEMP TABLE _kinds (type VARCHAR, lraw VARCHAR)")
                    con.executemany("INSERT INTO _kinds VALUES (?, ?)", sorted(block_labels))
                    con.execute(LABELS_SQL)
                    bad_labels = {x for (x,) in con.execute("SELECT lraw FROM _lab WHERE NOT lok").fetchall()}
                    for t, bl in blocks.items():
                        if t not in text_types and all(_envelope_ok(b, bad_labels) for _, _, b in bl):
                            n = self._fast(t, batch.lean[t], registered)
                            if n is not None:
                                fast[t] = [b for _, _, b in bl]
                                res.rows[TABLES[t]], res.lines = n[0], res.lines + n[1]
                                continue
                        con.register(f"_cb_{t}", _block_table(bl))
                        registered.append(f"_cb_{t}")
                    if fast:
                        con.register("_bn", _block_nodes([b for bl in fast.values() for b in bl]))
                        registered.append("_bn")
                elif has_rows:
                    con.execute(LABELS_SQL)
                row_types = [t for t in TABLES if t in text_types or (t in blocks and t not in fast)]
                for t in row_types:
                    con.execute(_r_table_sql(t, t in text_types, t in blocks))
                if has_rows:
                    con.execute(OTHER_ROWS_SQL)
                env_dead = valid = 0
                if has_json or has_rows or row_types:
                    con.execute(_ev_view(row_types, has_rows, has_json))
                    lines_n, env_dead, valid, repeats = con.execute(
                        "SELECT count(*), count(reason), count(*) - count(reason), "
                        "count(id) FILTER (WHERE reason IS NULL) - count(DISTINCT id) FILTER (WHERE reason IS NULL) "
                        "FROM _ev"
                    ).fetchone()
                    res.lines += lines_n
                if env_dead:
                    res.dead += con.execute(DEAD_SQL.format(src="_ev"), [ts_now]).fetchone()[0]
                field_dead = 0
                forms = {}
                if has_json or has_rows or row_types:
                    forms = {
                        t: (js, rows)
                        for t, js, rows in con.execute(
                            "SELECT type, bool_or(js), bool_or(NOT js) FROM _ev WHERE reason IS NULL GROUP BY type"
                            if row_types
                            else "SELECT DISTINCT type, true, false FROM _ev WHERE reason IS NULL"
                        ).fetchall()
                    }
                present = set(forms)
                for type_, table in TABLES.items():
                    if type_ in fast:
                        continue
                    if type_ not in present:
                        res.rows[table] = 0
                        continue
                    if forms[type_] == (False, True) and not repeats:  # rows only: no copy
                        src, cols = (
                            f"(SELECT * FROM _r_{type_} WHERE ereason IS NULL)",
                            list(DATA_FIELDS[type_]),
                        )
                    else:
                        sql, cols = _TYPE_SQL[(type_, repeats > 0, *forms[type_])]
                        con.execute(sql)
                        src = "_t"
                    bad = con.execute(f"SELECT count(reason) FROM {src}").fetchone()[0]
                    if bad:
                        field_dead += bad
                        res.dead += con.execute(DEAD_SQL.format(src=src), [ts_now]).fetchone()[0]
                    res.rows[table] = self._insert_dedup(table, cols, src)
                res.rows["unknown_events"] = self._unknown_types() if present - set(TABLES) else 0
                nodes = ([_NODES_EV] if forms else []) + ([_NODES_BN] if fast else [])
                if nodes:
                    con.execute(NODES_SQL.format(src=" UNION ALL ".join(nodes)))
                valid += sum(b.rows for bl in fast.values() for b in bl)
                res.duplicates = max(0, valid - res.inserted - field_dead)
            for origin, line, reason, raw, size in py_dead:
                if con.execute(
                    "SELECT count(*) FROM dead_letters WHERE origin = ? AND line = ?", [origin, line]
                ).fetchone()[0]:
                    continue  # a redelivered message
                con.execute(
                    "INSERT INTO dead_letters VALUES (?, ?, ?, ?, ?, ?)",
                    [ts_now, origin, line, reason, raw, size],
                )
                res.dead += 1
            if position is not None:
                con.execute(
                    """INSERT INTO ingest_positions VALUES (?, ?, ?, ?)
                    ON CONFLICT (source) DO UPDATE SET segment = excluded.segment, "offset" = excluded."offset",
                    updated_at = excluded.updated_at""",
                    [*position, ts_now],
                )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            for name in registered:
                con.unregister(name)
            for t in row_types:  # free the batch's memory now, not at the next batch
                con.execute(f"DROP TABLE IF EXISTS _r_{t}")
        return res


_LINES = pa.schema([("origin", pa.string()), ("line_no", pa.int64()), ("line", pa.large_string())])
_KNOWN = set(TABLES)


def _block_schema(type_: str) -> pa.Schema:
    env = [("origin", pa.string()), ("line_no", pa.int64()), ("n", pa.int64()), ("id", pa.string())]
    env += [("ts", pa.float64()), ("node", pa.string()), ("role", pa.string()), ("job", pa.string())]
    env += [("labels", pa.string())]
    return pa.schema(env + [(n, columns.arrow_type(k)) for n, (k, _) in DATA_FIELDS[type_].items()])


_BLOCK_SCHEMAS = {t: _block_schema(t) for t in TABLES}


def _block_batch(origin: str, first: int, b: columns.Block) -> pa.RecordBatch:
    """A block as rows of ``_cb_<type>``: its arrays as they are (over the message's bytes),
    the envelope repeated, fields it does not carry as NULL."""
    n = b.rows
    schema = _BLOCK_SCHEMAS[b.type]
    const = [pa.repeat(pa.scalar(v, pa.string()), n) for v in (b.node, b.role, b.job, b.labels)]
    arrays = [
        pa.repeat(pa.scalar(origin, pa.string()), n),
        pa.array(np.arange(first, first + n, dtype=np.int64)),
        pa.array(b.nbytes),
        b.arrays["id"],
        b.arrays["ts"],
        *const,
    ]
    arrays += [b.arrays[f.name] if f.name in b.arrays else pa.nulls(n, f.type) for f in list(schema)[9:]]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


_LEAN_SCHEMAS = {
    t: pa.schema([s.field(n) for n in ("id", "ts", "node", "job")] + list(s)[9:])
    for t, s in _BLOCK_SCHEMAS.items()
}
_ROLES = set(ROLES)


def _envelope_ok(b: columns.Block, bad_labels: set[str]) -> bool:
    """A block's envelope passes the checks the checked path makes per row (same limits)."""
    return 1 <= len(b.node.encode()) <= 256 and b.role in _ROLES and b.labels not in bad_labels


def _lean_batch(b: columns.Block) -> pa.RecordBatch:
    """A block's rows for the fast path: id, ts, node, job and the data fields (no origin,
    line, size: nothing is dead-lettered from it)."""
    schema = _LEAN_SCHEMAS[b.type]
    n = b.rows
    arrays = [b.arrays["id"], b.arrays["ts"]]
    arrays += [pa.repeat(pa.scalar(v, pa.string()), n) for v in (b.node, b.job)]
    arrays += [b.arrays[f.name] if f.name in b.arrays else pa.nulls(n, f.type) for f in list(schema)[4:]]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _block_table(blocks: list[tuple[str, int, columns.Block]]) -> pa.Table:
    return pa.Table.from_batches([_block_batch(origin, first, b) for origin, first, b in blocks])


_BN = pa.schema(
    [
        ("node", pa.string()),
        ("role", pa.string()),
        ("job", pa.string()),
        ("lraw", pa.string()),
        ("ts", pa.float64()),
        ("agent", pa.bool_()),
    ]
)


def _block_nodes(blocks: list[columns.Block]) -> pa.Table:
    """Each block's envelope at its first and its last ts (for the nodes table)."""
    cols: list[list[Any]] = [[], [], [], [], [], []]
    for b in blocks:
        ts = b.arrays["ts"].to_numpy()
        agent = not b.type.startswith(TRAIN_PREFIX)
        for t in (float(ts.min()), float(ts.max())):
            for c, v in zip(cols, (b.node, b.role, b.job, b.labels, t, agent), strict=True):
                c.append(v)
    return pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(cols, _BN, strict=True)], schema=_BN)


def _lines_table(origins: list[str], line_nos: list[int], lines: list[str]) -> pa.Table:
    """One row per line, in several record batches so that DuckDB parses them on all cores."""
    if not lines:
        return _LINES.empty_table()
    return pa.Table.from_batches(
        [
            pa.record_batch(
                [
                    pa.array(origins[i : i + CHUNK], pa.string()),
                    pa.array(line_nos[i : i + CHUNK], pa.int64()),
                    pa.array(lines[i : i + CHUNK], pa.large_string()),
                ],
                names=["origin", "line_no", "line"],
            )
            for i in range(0, len(lines), CHUNK)
        ]
    )


def _ts(epoch: float) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).replace(tzinfo=None)
