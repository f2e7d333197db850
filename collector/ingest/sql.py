"""SQL helpers shared by the encodings' modules: quoting, checks on JSON text, and the
per-field value and check expressions every encoding renders the same way."""

from __future__ import annotations

from collections.abc import Callable

from cmdare.wire.registry import DATA_FIELDS, ROW_ENVELOPE
from cmdare.wire.validation import sql_reason

NENV = 1 + len(ROW_ENVELOPE)  # a row line's fields before its data: prefix + envelope
Q = "''"  # a quote inside a SQL string literal


def q(s: str) -> str:
    """``s`` as a SQL string literal."""
    return "'" + s.replace("'", "''") + "'"


def struct(fields: list[str]) -> str:
    """A json_transform structure reading each of ``fields`` as raw JSON text."""
    return "{" + ", ".join(f'"{n}":"JSON"' for n in fields) + "}"


def is_num(x: str) -> str:
    """JSON text ``x`` starts like a number."""
    return f"(left({x}, 1) BETWEEN '0' AND '9' OR left({x}, 1) = '-')"


def all_of(x: str, pred: str) -> str:
    """Every element ``e`` of the JSON array text ``x`` satisfies ``pred``."""
    return f"coalesce(list_bool_and(list_transform(from_json({x}, '[\"JSON\"]'), lambda e: {pred})), true)"


def present(x: str) -> str:
    """JSON text ``x`` holds a value (not absent, not null)."""
    return f"({x} IS NOT NULL AND {x} <> 'null')"


def values_and_checks(
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
            f"WHEN {present(x)} AND NOT ({ok}) THEN "
            + sql_reason("field", f"left({x}::VARCHAR, 60)", type=type_, field=name, kind=kind)
        )
    return values, checks

