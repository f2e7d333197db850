"""What makes an event valid, and the one-line reason a collector gives when it is not.

``RULES`` is every reason an event (or a message) is refused: the dead-letter reasons
users see in ``dead_letters.reason``, kept as data in wire/schema/dead-letters.tsv and
listed in docs/wire-format.md ("What a collector rejects").  Each check renders its reason from here: ``reason()`` for the Python
validator below, ``sql_reason()`` for the collector's SQL (JSON lines, row lines and column
blocks are checked in DuckDB, see cmdare.collector.ingest).  A value in ``{got}`` is the
offending value as each form can show it (Python: its repr; SQL: its text).

Standard library only (the agent's dependency rule).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .kinds import BOOL, FLOAT, FLOATS, INT, OBJS, STR, STRS
from .registry import DATA_FIELDS, MAX_ID_LEN, MAX_NAME_LEN, ROLES, ROW_ENVELOPE, ROW_PREFIX, VERSION

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

def _load_rules() -> dict[str, Rule]:
    """RULES from wire/schema/dead-letters.tsv, the limits filled in."""
    limits = {
        "MAX_EVENT_BYTES": MAX_EVENT_BYTES,
        "VERSION": VERSION,
        "MAX_ID_LEN": MAX_ID_LEN,
        "MAX_NAME_LEN": MAX_NAME_LEN,
        "ROLES": _ROLE_LIST,
        "ROW_PREFIX": ROW_PREFIX,
        "ENVELOPE_FIELDS": _ENV_FIELDS,
    }
    rules = {}
    text = resources.files("cmdare.wire").joinpath("schema", "dead-letters.tsv").read_text()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, what, reason_ = line.split("\t")
            rules[name] = Rule(name, re.sub(r"<([A-Z_]+)>", lambda m: str(limits[m.group(1)]), reason_), what)
    return rules


RULES: dict[str, Rule] = _load_rules()


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
