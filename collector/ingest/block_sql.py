"""Column blocks -> typed rows with a reason column, and the fast path.

A type's blocks whose rows all pass the checks go straight from Arrow into their table
(``fast_sql``); otherwise the checked path (``BLOCK_TYPE_SQL``) gives each row a reason,
with the same checks and reasons as the row lines'.
"""

from __future__ import annotations

import functools

from cmdare.wire import columns
from cmdare.wire.kinds import BOOL, FLOAT, INT, STR
from cmdare.wire.registry import DATA_FIELDS, MAX_ID_LEN, MAX_NAME_LEN, ROLES, ROW_PREFIX, TABLES, TYPES
from cmdare.wire.validation import TS_MAX
from cmdare.wire.validation import sql_reason as R

from . import storage
from .row_sql import row_field_sql
from .sql import Q, q, values_and_checks


def _block_field_sql(kind: str, x: str) -> tuple[str, str]:
    """(validity, value) of a column-block value ``x`` (non-NULL): numbers arrive typed, so
    only finiteness is left to check; the list kinds arrive as their JSON text."""
    if kind == FLOAT:
        return f"isfinite({x})", x
    if kind in (INT, BOOL, STR):
        return "true", x
    return row_field_sql(kind, x)


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

    values, checks = values_and_checks(type_, field_sql, lambda x: f"{x} IS NOT NULL")
    texts = ", ".join(f'c."{n}"' for n in fields)
    joins = ""
    for i, n in enumerate(distinct):
        ok, val = _block_field_sql(fields[n][0], "v")
        texts += f', k{i}.ok AS "{n}:ok", k{i}.val AS "{n}:val"'
        joins += (
            f' LEFT JOIN (SELECT v, {ok} AS ok, {val} AS val FROM (SELECT DISTINCT "{n}" AS v FROM _cb_{type_}))'
            f' k{i} ON k{i}.v = c."{n}"'
        )
    def quoted(x: str) -> str:  # as the row lines' reasons show the text
        return f"'{Q}' || {x} || '{Q}'"

    ereason = f"""CASE
      WHEN NOT coalesce(strlen(c.id) BETWEEN 1 AND {MAX_ID_LEN}, false) THEN {R("id")}
      WHEN NOT coalesce(isfinite(c.ts) AND c.ts > 0 AND c.ts < {TS_MAX:g}, false) THEN {R("ts", quoted("c.ts::VARCHAR"))}
      WHEN NOT coalesce(strlen(c.node) BETWEEN 1 AND {MAX_NAME_LEN}, false) THEN {R("node")}
      WHEN c.role NOT IN ({", ".join(map(q, ROLES))}) THEN {R("role", quoted("left(c.role, 40)"))}
      WHEN NOT coalesce(_lab.lok, false) THEN {R("labels")}
    END"""
    # a rejected row's text for dead_letters: the row form, re-made from the columns
    raw = " || chr(9) || ".join(
        [f"'{ROW_PREFIX}'", q(type_), _raw_str("d.id"), "d.tsd::VARCHAR", _raw_str("d.node"), "d.role"]
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


BLOCK_TYPE_SQL = {t: _block_type_sql(t) for t in TABLES}


# -- column blocks, the fast path --------------------------------------------------------------
# A type's column blocks in a batch where every row is clean (the normal case: the agent
# checked them before sending) go straight from Arrow into the table: no temp table of
# checked rows (measured: as costly as the insert itself).  The same checks decide it, as
# one aggregate over the rows (per-block envelope values are checked in Python once per
# block); a single failing row, or an id twice in the batch, sends the type to the checked
# path above, which finds each row's reason.
@functools.lru_cache(maxsize=256)
def fast_sql(type_: str, present: tuple[str, ...]) -> tuple[list[str], str, str]:
    """(lookup tables to create, the check query, the insert) for ``_cf_<type>``, whose data
    columns are ``present`` (those the batch's blocks carry a value of, in the registry's
    order): a field no block carries is neither checked nor named in the insert (its column
    takes its default, NULL), so an agent that sends few of a type's fields (a GPU without
    the profiling ones) does not pay for the others."""
    fields = {n: k for n, k in DATA_FIELDS[type_].items() if n in present}
    distinct = [n for n in _BY_DISTINCT.get(type_, ()) if n in TYPES[type_].repeated and n in fields]
    lookups, joins, values = [], "", []
    oks = [f"strlen(c.id) BETWEEN 1 AND {MAX_ID_LEN}", "isfinite(c.ts)", "c.ts > 0", f"c.ts < {TS_MAX:g}"]
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
    check = f"""SELECT {" AND ".join(checks)}, count(*) - count(DISTINCT (c.node, c.id)),
        make_timestamp(TRY_CAST(round(min(c.ts) * 1e6) AS BIGINT)),
        make_timestamp(TRY_CAST(round(max(c.ts) * 1e6) AS BIGINT)), count(*)
    FROM _cf_{type_} c"""
    table = TABLES[type_]
    by_name = dict(zip(fields, values, strict=True))
    stored, exprs = storage.insert_parts(table, list(fields), by_name.__getitem__)
    cols = "".join(f', "{n}"' for n in stored)
    insert = f"""INSERT INTO {storage.stored(table)} (id, ts, node, job{cols})
    SELECT c.id, make_timestamp(TRY_CAST(round(c.ts * 1e6) AS BIGINT)), c.node, c.job{"".join(", " + v for v in exprs)}
    FROM _cf_{type_} c{joins}
    WHERE NOT EXISTS (SELECT 1 FROM {storage.stored(table)} x WHERE x.ts BETWEEN ? AND ? AND x.id = c.id
                      AND x.node = c.node)"""
    return lookups, check, insert





_ROLES = set(ROLES)


def envelope_ok(b: columns.Block, bad_labels: set[str]) -> bool:
    """A block's envelope passes the checks the checked path makes per row (same limits)."""
    return 1 <= len(b.node.encode()) <= MAX_NAME_LEN and b.role in _ROLES and b.labels not in bad_labels
