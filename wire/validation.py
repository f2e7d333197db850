"""What makes an event valid, and the one-line reason a collector gives when it is not.

``RULES`` is the list of every reason an event (or a message) is refused: the dead-letter
reasons users see in ``dead_letters.reason``, documented in docs/wire-format.md
("Dead letters").  Each check renders its reason from here: ``reason()`` for the Python
validator below, ``sql_reason()`` for the collector's SQL (JSON lines, row lines and column
blocks are checked in DuckDB, see cmdare.collector.ingest).  A value in ``{got}`` is the
offending value as each form can show it (Python: its repr; SQL: its text).

Standard library only (the agent's dependency rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .registry import (
    BOOL,
    DATA_FIELDS,
    FLOAT,
    FLOATS,
    INT,
    MAX_ID_LEN,
    MAX_NAME_LEN,
    OBJS,
    ROLES,
    ROW_ENVELOPE,
    ROW_PREFIX,
    STR,
    STRS,
    VERSION,
)

MAX_EVENT_BYTES = 1 << 20  # one event (a line, or a block's row) at most
TS_MAX = 1e11  # ts must be unix seconds in (0, TS_MAX)


class InvalidEvent(ValueError):
    """An event that is not valid wire format; the message is the one-line reason."""


@dataclass(frozen=True)
class Rule:
    name: str
    text: str  # the reason; {placeholders} filled by reason() / sql_reason()
    what: str  # when it applies (docs)


_ROLE_LIST = ", ".join(ROLES)
_ENV_FIELDS = 1 + len(ROW_ENVELOPE)

RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule("utf8", "not UTF-8 text (byte {got}): not a cmdare event message", "a message that is not UTF-8"),
        Rule("no_value", "message has no value", "a Kafka message without a value"),
        Rule("size", f"event of {{got}} bytes exceeds the {MAX_EVENT_BYTES} byte limit", "a line over 1 MiB"),
        Rule("json", "not valid JSON", "a line that is neither JSON nor a row"),
        Rule("object", "event is a JSON {got}, expected an object", "JSON that is not an object"),
        Rule(
            "version",
            f"unsupported wire format version {{got}} (this collector reads v{VERSION})",
            "a 'v' other than 1",
        ),
        Rule("id", f"field 'id' must be a non-empty string of at most {MAX_ID_LEN} characters", "bad id"),
        Rule("ts", "field 'ts' must be unix seconds, got {got}", "ts not a number in (0, 1e11)"),
        Rule(
            "node",
            f"field 'node' must be a non-empty string of at most {MAX_NAME_LEN} characters",
            "bad node",
        ),
        Rule(
            "type",
            f"field 'type' must be a non-empty string of at most {MAX_NAME_LEN} characters",
            "bad type",
        ),
        Rule("role", f"field 'role' must be one of {_ROLE_LIST}, got {{got}}", "a role not in the list"),
        Rule("job", "field 'job' must be a string", "job not a string"),
        Rule("labels", "field 'labels' must be an object of string values", "labels not string to string"),
        Rule("data", "field 'data' must be an object", "data not an object"),
        Rule("field", "{type}.{field} must be {kind}, got {got}", "a data field not of its kind"),
        Rule(
            "row_format",
            f"unsupported row format {{got}} (this collector reads {ROW_PREFIX})",
            "a row line of another row format",
        ),
        Rule(
            "row_short",
            f"row has {{got}} fields, fewer than the {_ENV_FIELDS} of the envelope",
            "a row line cut short",
        ),
        Rule("row", "not a valid row", "a row line no other rule explains"),
        Rule("row_type", "row of type {got}, which this collector does not know", "a row of an unknown type"),
        Rule(
            "row_long",
            "{type} row has {got} data fields; this collector knows {known} (a newer agent?)",
            "a row with more fields than its type has",
        ),
        Rule("block", "{detail}", "a column block message that cannot be read (the message whole)"),
    )
}


def reason(name: str, **values: Any) -> str:
    """The reason of rule ``name`` with its placeholders filled (Python form)."""
    return RULES[name].text.format(**values)


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def sql_reason(name: str, got: str | None = None, **consts: Any) -> str:
    """The reason of rule ``name`` as a SQL expression: ``got`` is the SQL expression of the
    offending value (pasted in as is), ``consts`` fill the other placeholders."""
    text = RULES[name].text
    if "{got}" not in text:
        return _q(text.format(**consts))
    head, tail = text.split("{got}")
    parts = [_q(head.format(**consts))] if head else []
    parts.append(got if got is not None else "''")
    if tail:
        parts.append(_q(tail.format(**consts)))
    return " || ".join(parts)


def kind_ok(kind: str, v: Any) -> bool:
    """Whether a decoded JSON value ``v`` is of field kind ``kind``."""
    t = type(v)
    if kind == FLOAT:
        return (t is float and math.isfinite(v)) or t is int
    if kind == INT:
        return t is int
    if kind == STR:
        return t is str
    if kind == BOOL:
        return t is bool
    if kind == FLOATS:
        return t is list and all((type(x) is float and math.isfinite(x)) or type(x) is int for x in v)
    if kind == STRS:
        return t is list and all(type(x) is str for x in v)
    if kind == OBJS:
        return t is list and all(type(x) is dict for x in v)
    return False


def validate(ev: Any) -> dict[str, Any]:
    """Check one decoded event; return it or raise InvalidEvent with a one-line reason.

    Unknown ``type`` values are valid (they are stored as unknown events so a newer agent
    never loses data to an older collector); unknown ``v`` values are not.
    """
    if type(ev) is not dict:
        raise InvalidEvent(f"event is a JSON {type(ev).__name__}, expected an object")
    v = ev.get("v")
    if v != VERSION or type(v) is not int:
        raise InvalidEvent(reason("version", got=repr(v)))
    id_ = ev.get("id")
    if type(id_) is not str or not 0 < len(id_) <= MAX_ID_LEN:
        raise InvalidEvent(reason("id"))
    ts = ev.get("ts")
    if not ((type(ts) is float and math.isfinite(ts)) or type(ts) is int) or not 0 < ts < TS_MAX:
        raise InvalidEvent(reason("ts", got=repr(ts))[:200])
    for key in ("node", "type"):
        val = ev.get(key)
        if type(val) is not str or not 0 < len(val) <= MAX_NAME_LEN:
            raise InvalidEvent(reason(key))
    role = ev.get("role")
    if role not in ROLES:
        raise InvalidEvent(reason("role", got=repr(role))[:200])
    if type(ev.get("job", "")) is not str:
        raise InvalidEvent(reason("job"))
    labels = ev.get("labels", {})
    if type(labels) is not dict or any(type(x) is not str for x in labels.values()):
        raise InvalidEvent(reason("labels"))
    data = ev.get("data")
    if type(data) is not dict:
        raise InvalidEvent(reason("data"))
    spec = DATA_FIELDS.get(ev["type"])
    if spec is not None:
        for name, val in data.items():
            fs = spec.get(name)
            if fs is not None and val is not None and not kind_ok(fs[0], val):
                got = f"{type(val).__name__} {val!r}"
                raise InvalidEvent(reason("field", type=ev["type"], field=name, kind=fs[0], got=got)[:200])
    return ev
