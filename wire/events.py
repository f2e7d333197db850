"""Events of the cmdare wire format, version 1 (documented in docs/wire-format.md and
wire/schema/event-v1.schema.json): building them (the agent's ``EventFactory``), encoding
them as JSON lines, and reading a line back in either form.

An event is one JSON object:

    {"v": 1, "id": "<uuid>", "ts": 1732270000.25, "node": "gpu-7", "role": "worker",
     "job": "resnet-a", "labels": {"team": "vision"}, "type": "gpu", "data": {...}}

On disk (the spool) and on Kafka, events travel as NDJSON: one event per line, one or
more lines per Kafka message.  Consumers de-duplicate on ``id``.

The types and their fields are in registry.py, the checks and their reasons in
validation.py, the row form in rowform.py.  Standard library only (the agent's dependency
rule).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .registry import (
    BOOL,
    DATA_FIELDS,
    ENVELOPE_KEYS,
    FLOAT,
    FLOATS,
    INT,
    JSON_ENCODER,
    MAX_ID_LEN,
    MAX_NAME_LEN,
    OBJS,
    ROLES,
    ROW_PREFIX,
    ROW_TYPES,
    STR,
    STRS,
    VERSION,
)
from .rowform import ROW_START, Encoded, decode_row, encode_row_data, row_str
from .validation import InvalidEvent, validate

_encoder = JSON_ENCODER

# the registry's and the row form's names most users of events need, re-exported
__all__ = [
    "BOOL", "DATA_FIELDS", "ENVELOPE_KEYS", "FLOAT", "FLOATS", "INT", "MAX_ID_LEN", "MAX_NAME_LEN", "OBJS",
    "ROLES", "ROW_PREFIX", "ROW_TYPES", "STR", "STRS", "VERSION", "Encoded", "EventFactory", "IdGenerator",
    "InvalidEvent", "decode_line", "decode_row", "encode", "encode_many", "encode_row_data", "jstr",
    "json_schema", "row_str", "validate",
]

_JSTR: dict[str, str] = {}


def jstr(s: str) -> str:
    """A JSON string literal, as the event encoder writes it (short ones cached: source
    names, states, GPU names and uuids repeat every tick)."""
    t = _JSTR.get(s)
    if t is None:
        t = _encoder.encode(s)
        if len(s) <= 128:
            if len(_JSTR) > 4096:
                _JSTR.clear()
            _JSTR[s] = t
    return t


class IdGenerator:
    """Fleet-unique event ids without coordination.

    96 random bits fixed per agent start (``instance``) plus a 32-bit counter, printed
    as a UUID.  A new random prefix is drawn if the counter ever wraps.
    """

    def __init__(self) -> None:
        self._new_prefix()

    def _new_prefix(self) -> None:
        p = os.urandom(12).hex()
        self.instance = p
        self._head = f"{p[0:8]}-{p[8:12]}-{p[12:16]}-{p[16:20]}-{p[20:24]}"
        self._seq = 0

    def next(self) -> str:
        self._seq += 1
        if self._seq > 0xFFFFFFFF:
            self._new_prefix()
            self._seq = 1
        return f"{self._head}{self._seq:08x}"


class EventFactory:
    """Builds envelopes for one agent: node, role, job and labels stamped on every event."""

    def __init__(
        self,
        node: str,
        role: str,
        job: str = "",
        labels: Mapping[str, str] | None = None,
        rows: bool = False,
    ):
        self.ids = IdGenerator()
        self.node, self.role, self.job = node, role, job
        self.labels = dict(labels or {})
        self.rows = rows  # ROW_TYPES go out in the row form
        self._row_mids: dict[str, str] = {}
        # what every line of this agent repeats, encoded once (see ``line``)
        self._mids: dict[str, str] = {}
        self._mid = self._job_mid(job)
        self._types: dict[str, str] = {}
        self._ts_in, self._ts_text = float("nan"), ""  # the last timestamp given, as written

    def line(
        self,
        type_: str,
        data: Mapping[str, Any],
        ts: float | None = None,
        job: str | None = None,
        id: str | None = None,
    ) -> bytes:
        """``encode(self.make(type_, data, ts, job, id))``, byte for byte, without
        re-encoding the envelope fields that never change (the agent's hot path).  ``id``:
        a source's own deterministic id (re-reading a file yields the same events)."""
        if type(ts) is float and ts == self._ts_in:  # a tick's events share its timestamp
            ts_ = self._ts_text
        else:
            at = round(time.time() if ts is None else ts, 6)
            if not math.isfinite(at):
                raise ValueError(f"event timestamp must be finite, got {at!r}")
            ts_ = repr(at)
            if type(ts) is float:
                self._ts_in, self._ts_text = ts, ts_
        if self.rows and type_ in ROW_TYPES:
            row = data.row if type(data) is Encoded and data.row is not None else encode_row_data(type_, data)
            if row is not None:
                j = self.job if job is None else job
                mid = self._row_mids.get(j) or self._row_mid(j)
                id_ = row_str(id) if id else self.ids.next()
                return f"{ROW_PREFIX}\t{type_}\t{id_}\t{ts_}{mid}{row}\n".encode()
        t = self._types.get(type_)
        if t is None:
            t = self._types[type_] = f'{_encoder.encode(type_)},"data":'
        mid = self._mid
        if job is not None and job != self.job:  # a training job's event carries that job's id
            mid = self._mids.get(job) or self._job_mid(job)
        id_ = _encoder.encode(id) if id else f'"{self.ids.next()}"'
        body = data.text if type(data) is Encoded and data.text is not None else _encoder.encode(data)
        return (f'{{"v":{VERSION},"id":{id_},"ts":{ts_}{mid}{t}{body}}}\n').encode()

    def _row_mid(self, job: str) -> str:
        """The pre-encoded row fields between ``ts`` and the data, for events of ``job``."""
        if len(self._row_mids) > 1000:
            self._row_mids.clear()
        m = self._row_mids[job] = (
            f"\t{row_str(self.node)}\t{self.role}\t{row_str(job) if job else ''}\t{_encoder.encode(self.labels)}\t"
        )
        return m

    def _job_mid(self, job: str) -> str:
        """The pre-encoded envelope between ``ts`` and ``type`` for events of ``job``."""
        if len(self._mids) > 1000:
            self._mids.clear()
        m = self._mids[job] = (
            f',"node":{_encoder.encode(self.node)},"role":{_encoder.encode(self.role)},"job":{_encoder.encode(job)}'
            f',"labels":{_encoder.encode(self.labels)},"type":'
        )
        return m

    def make(
        self, type_: str, data: Mapping[str, Any], ts: float | None = None, job: str | None = None, id: str | None = None
    ) -> dict[str, Any]:
        """The event as a dict (what ``line`` encodes)."""
        return {
            "v": VERSION,
            "id": id or self.ids.next(),
            "ts": round(time.time() if ts is None else ts, 6),
            "node": self.node,
            "role": self.role,
            "job": self.job if job is None else job,
            "labels": self.labels,
            "type": type_,
            "data": data,  # sources hand over a fresh dict each time
        }


def encode(event: Mapping[str, Any]) -> bytes:
    """One NDJSON line (with its trailing newline)."""
    return (_encoder.encode(event) + "\n").encode()


def encode_many(events: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(encode(e) for e in events)


def decode_line(line: bytes | str) -> dict[str, Any]:
    """Parse and validate one line, JSON or row form; InvalidEvent on any problem."""
    try:
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        if ROW_START.match(line):
            return validate(decode_row(line))
        ev = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        if isinstance(e, InvalidEvent):
            raise
        raise InvalidEvent(f"not valid JSON: {e}"[:200]) from None
    return validate(ev)


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a v1 event, generated from the registry's TYPES."""
    kinds = {
        FLOAT: {"type": "number"},
        INT: {"type": "integer"},
        STR: {"type": "string"},
        BOOL: {"type": "boolean"},
        FLOATS: {"type": "array", "items": {"type": "number"}},
        STRS: {"type": "array", "items": {"type": "string"}},
        OBJS: {"type": "array", "items": {"type": "object"}},
    }
    variants = []
    for type_, fields in DATA_FIELDS.items():
        props = {}
        for name, (kind, desc) in fields.items():
            props[name] = {"anyOf": [kinds[kind], {"type": "null"}], "description": desc}
        variants.append(
            {
                "if": {"properties": {"type": {"const": type_}}, "required": ["type"]},
                "then": {"properties": {"data": {"type": "object", "properties": props}}},
            }
        )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://cmdare.dev/schema/event-v1.json",
        "title": "cmdare telemetry event, wire format v1",
        "type": "object",
        "required": ["v", "id", "ts", "node", "role", "type", "data"],
        "properties": {
            "v": {"const": VERSION},
            "id": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_ID_LEN,
                "description": "fleet-unique id; consumers de-duplicate on it",
            },
            "ts": {"type": "number", "exclusiveMinimum": 0, "description": "unix time, seconds"},
            "node": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LEN},
            "role": {"enum": list(ROLES)},
            "job": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "type": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_NAME_LEN,
                "description": "event type; unknown types are kept, not rejected",
            },
            "data": {"type": "object"},
        },
        "allOf": variants,
    }


# NVML clocks-event (throttle) reason bits -> the names gpu samples carry in throttle_reasons
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
