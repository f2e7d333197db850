"""The cmdare wire format, version 1 (documented in docs/wire-format.md and
agent/schema/event-v1.schema.json).

An event is one JSON object:

    {"v": 1, "id": "<uuid>", "ts": 1732270000.25, "node": "gpu-7", "role": "worker",
     "job": "resnet-a", "labels": {"team": "vision"}, "type": "gpu", "data": {...}}

On disk (the spool) and on Kafka, events travel as NDJSON: one event per line, one or
more lines per Kafka message.  Consumers de-duplicate on ``id``.

This module is shared by the agent (which builds events) and the collector (which
validates them), so it depends on the standard library alone.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

VERSION = 1
ROLES = ("worker", "ps", "chief", "data", "client")

# Field kinds used by the per-type data specs below.
FLOAT, INT, STR, BOOL, FLOATS, STRS, OBJS = "float", "int", "str", "bool", "float[]", "str[]", "object[]"

# type -> {field: (kind, unit/description)}.  Every data field is optional (a source
# omits what the hardware cannot report); a present field must have the declared kind.
DATA_FIELDS: dict[str, dict[str, tuple[str, str]]] = {
    "host": {
        "cpu_util_ratio": (FLOAT, "CPU busy share over the interval, all cores, 0..1"),
        "cpu_per_core_ratio": (FLOATS, "CPU busy share per logical core, 0..1"),
        "load1": (FLOAT, "1-minute load average"),
        "load5": (FLOAT, "5-minute load average"),
        "load15": (FLOAT, "15-minute load average"),
        "mem_total_bytes": (INT, "physical memory"),
        "mem_used_bytes": (INT, "memory in use (total - available)"),
        "mem_available_bytes": (INT, "memory available to new work"),
        "swap_total_bytes": (INT, "swap size"),
        "swap_used_bytes": (INT, "swap in use"),
        "net": (
            OBJS,
            "per NIC: nic, rx/tx _bytes_total, _packets_total, _errors_total, _drops_total (counters)",
        ),
        "disk": (OBJS, "per disk: disk, read/write _bytes_total, _ops_total, busy_seconds_total (counters)"),
        "procs": (INT, "number of processes"),
    },
    "gpu": {
        "index": (INT, "NVML device index"),
        "uuid": (STR, "GPU UUID"),
        "name": (STR, "product name"),
        "util_gpu_ratio": (FLOAT, "share of time a kernel was running, 0..1"),
        "util_mem_ratio": (FLOAT, "share of time device memory was read or written, 0..1"),
        "mem_used_bytes": (INT, "device memory used"),
        "mem_total_bytes": (INT, "device memory total"),
        "power_watts": (FLOAT, "power draw"),
        "power_limit_watts": (FLOAT, "enforced power limit"),
        "temp_celsius": (FLOAT, "GPU core temperature"),
        "sm_clock_hz": (FLOAT, "SM clock"),
        "mem_clock_hz": (FLOAT, "memory clock"),
        "pcie_tx_bytes_per_second": (FLOAT, "PCIe transmit throughput"),
        "pcie_rx_bytes_per_second": (FLOAT, "PCIe receive throughput"),
        "throttle_mask": (INT, "NVML clocks-event (throttle) reason bit mask"),
        "throttle_reasons": (STRS, "names of the active throttle reasons"),
        "ecc_corrected_total": (INT, "volatile corrected ECC errors since driver load (counter)"),
        "ecc_uncorrected_total": (INT, "volatile uncorrected ECC errors since driver load (counter)"),
        "processes": (OBJS, "per process: pid, used_bytes"),
    },
    "tpu": {
        "device": (INT, "TPU device (core) id as libtpu numbers it"),
        "hbm_used_bytes": (INT, "high-bandwidth memory in use"),
        "hbm_total_bytes": (INT, "high-bandwidth memory size"),
        "duty_cycle_ratio": (FLOAT, "share of time the TensorCore was busy, 0..1 (per chip)"),
        "hbm_bandwidth_ratio": (FLOAT, "HBM bandwidth utilisation, 0..1, where libtpu reports it"),
    },
    "gpu_event": {
        "index": (INT, "NVML device index"),
        "uuid": (STR, "GPU UUID"),
        "kind": (STR, "xid | ecc_corrected | ecc_uncorrected"),
        "count": (INT, "how many occurred (ECC: increase since the previous sample)"),
        "xid": (INT, "the Xid code, for kind=xid"),
    },
    "heartbeat": {
        "seq": (INT, "heartbeat number, contiguous within one agent instance, from 1"),
        "instance": (STR, "random id of this agent process start"),
        "agent_version": (STR, "cmdare-agent version"),
        "uptime_seconds": (FLOAT, "seconds since the agent started"),
        "samples_total": (INT, "sampling rounds completed"),
        "events_total": (INT, "events produced"),
        "spooled_total": (INT, "events written to the spool"),
        "shipped_total": (INT, "events acknowledged by Kafka (acks=all)"),
        "dropped_total": (INT, "events dropped: spool bound by size/age, or unwritable"),
        "spool_bytes": (INT, "current spool size on disk"),
        "spool_pending": (INT, "events spooled but not yet acknowledged"),
        "interval_seconds": (FLOAT, "the agent's sampling interval (liveness is judged in these)"),
    },
    "instance": {
        "cloud": (STR, "gce | aws | azure | none"),
        "region": (STR, "cloud region, e.g. us-central1, us-east-1, westeurope"),
        "zone": (STR, "zone / availability zone"),
        "instance_id": (STR, "the cloud's instance id"),
        "instance_type": (STR, "machine type / instance type / VM size"),
        "name": (STR, "the VM's name where the cloud has one (GCE, Azure)"),
        "spot": (BOOL, "preemptible / spot VM"),
        "accelerator": (STR, "accelerator type (TPU type from GCE, else the NVIDIA driver's GPU model)"),
        "accelerator_count": (INT, "number of accelerators"),
        "boot_time": (FLOAT, "when the VM booted, unix seconds"),
    },
    "lifecycle": {
        "event": (STR, "agent_start | agent_stop | boot | shutdown"),
        "instance": (STR, "random id of this agent process start (as in heartbeats)"),
        "boot_time": (FLOAT, "when the VM booted, unix seconds"),
        "stop_reason": (STR, "agent_stop: what stopped it (SIGTERM, SIGINT, duration, error)"),
        "interval_seconds": (FLOAT, "the agent's sampling interval"),
        "agent_version": (STR, "cmdare-agent version"),
        "uptime_seconds": (FLOAT, "agent_stop: seconds the agent ran"),
    },
    "revocation": {
        "cloud": (STR, "gce | aws | azure"),
        "kind": (
            STR,
            "preemption | spot-interruption | maintenance | rebalance | termination | reboot | redeploy | freeze",
        ),
        "action": (STR, "what the cloud will do (AWS action, GCE maintenance value, Azure event type)"),
        "deadline": (
            FLOAT,
            "when the cloud acts, unix seconds (the cloud's time, or GCE's documented notice)",
        ),
        "lead_seconds": (FLOAT, "deadline minus the time the agent saw the notice"),
        "notice_id": (STR, "the notice's identity: the same notice is published once"),
        "revokes": (BOOL, "the VM is being taken away (preemption, spot interruption)"),
        "detail": (STR, "the cloud's description, where it gives one"),
        "boot_time": (FLOAT, "when the VM booted, unix seconds (the life the notice ends)"),
    },
    "train_job": {
        "run": (STR, "run id (one job can have several runs, e.g. restarts)"),
        "rank": (INT, "rank of this training process"),
        "world_size": (INT, "number of training processes (workers)"),
        "ps": (INT, "number of parameter servers, for parameter-server jobs"),
        "role": (STR, "worker | ps | chief | data | client"),
        "pid": (INT, "process id of the training process"),
        "model": (STR, "model name"),
        "params": (INT, "number of model parameters"),
        "tensors": (INT, "number of parameter tensors"),
        "flops_per_step": (FLOAT, "floating-point operations per training step, when known"),
        "batch_size": (INT, "per-worker batch size"),
        "framework": (STR, "e.g. pytorch, tensorflow, jax"),
        "framework_version": (STR, "framework version"),
        "accelerator": (STR, "accelerator type, e.g. nvidia-a100, tpu-v4"),
    },
    "train_steps": {
        "run": (STR, "run id"),
        "rank": (INT, "rank of the training process"),
        "interval_seconds": (FLOAT, "length of the aggregation interval"),
        "steps": (INT, "steps completed in the interval"),
        "first_step": (INT, "number of the first step in the interval"),
        "last_step": (INT, "number of the last step in the interval"),
        "examples": (FLOAT, "examples (or tokens) processed in the interval"),
        "step_mean_seconds": (FLOAT, "mean step time (input wait included)"),
        "step_p50_seconds": (FLOAT, "median step time"),
        "step_p95_seconds": (FLOAT, "95th percentile step time"),
        "step_max_seconds": (FLOAT, "longest step"),
        "wait_mean_seconds": (FLOAT, "mean input wait per step (blocked on the next batch)"),
        "wait_p50_seconds": (FLOAT, "median input wait"),
        "wait_p95_seconds": (FLOAT, "95th percentile input wait"),
        "wait_max_seconds": (FLOAT, "longest input wait"),
        "wait_share_ratio": (FLOAT, "input wait / step time over the interval, 0..1"),
        "steps_per_second": (FLOAT, "steps per second over the time the steps covered"),
        "examples_per_second": (FLOAT, "examples per second over the time the steps covered"),
        "dropped_total": (INT, "step records the tracking library could not deliver (counter)"),
    },
    "train_slow_step": {
        "run": (STR, "run id"),
        "rank": (INT, "rank of the training process"),
        "step": (INT, "step number"),
        "step_seconds": (FLOAT, "this step's time"),
        "wait_seconds": (FLOAT, "this step's input wait"),
        "median_seconds": (FLOAT, "the rank's recent median step time it was compared with"),
        "examples": (FLOAT, "examples in this step"),
    },
    "train_scalar": {
        "run": (STR, "run id (TensorBoard: the event file's directory under the log dir)"),
        "rank": (INT, "rank of the training process"),
        "tag": (STR, "scalar name, e.g. loss"),
        "step": (INT, "training step the value belongs to"),
        "value": (FLOAT, "the value"),
    },
    "train_checkpoint": {
        "run": (STR, "run id"),
        "rank": (INT, "rank of the training process"),
        "action": (STR, "save | restore"),
        "seconds": (FLOAT, "time the save or restore took"),
        "bytes": (INT, "checkpoint size"),
        "step": (INT, "step the checkpoint belongs to"),
        "path": (STR, "where it was written or read"),
        "ok": (BOOL, "false when the save or restore raised"),
        "error": (STR, "the exception, when not ok"),
    },
    "status": {
        "source": (STR, "source or sink name, e.g. gpu, host, sink.kafka"),
        "ok": (BOOL, "whether the last collect/ship succeeded"),
        "state": (STR, "ok | error | unavailable"),
        "duration_seconds": (FLOAT, "time the last collect took"),
        "message": (STR, "why, when not ok or when the state changed"),
    },
}

ENVELOPE_KEYS = ("v", "id", "ts", "node", "role", "job", "labels", "type", "data")
MAX_ID_LEN = 64
MAX_NAME_LEN = 256


class Encoded(dict):
    """Event data that also carries its encoded text, made by the source that built it (the
    hot path: a GPU sample formatted from a template costs a fraction of the generic
    encoders).  ``text``, when set, must equal the compact JSON encoding of the dict,
    ``row``, when set, ``encode_row_data`` of it, and each of ``parts`` (field -> text) the
    compact JSON of that field, byte for byte; tests check every producer."""

    __slots__ = ("text", "row", "parts")

    def __init__(
        self,
        data: dict[str, Any],
        text: str | None = None,
        row: str | None = None,
        parts: dict[str, str] | None = None,
    ) -> None:
        super().__init__(data)
        self.text, self.row = text, row
        self.parts = parts  # field -> its compact JSON, for the row encoder to use as is


# -- the row form -------------------------------------------------------------------------
# A high-volume sample can travel as one tab-separated line instead of a JSON object:
#
#   r1<TAB>type<TAB>id<TAB>ts<TAB>node<TAB>role<TAB>job<TAB>labels<TAB>field1<TAB>field2...
#
# the data fields in DATA_FIELDS order (new fields are only ever appended), an empty field
# meaning absent; trailing absent fields are left off.  Same event, same validation, same
# tables: only the encoding differs, and it costs the collector a fifth of the JSON form to
# parse (no keys, no nesting).  Documented in docs/wire-format.md ("Row form").
ROW_PREFIX = "r1"
ROW_TYPES = ("host", "gpu", "tpu")  # what the agent sends as rows (``sample_format = "rows"``)
ROW_ENVELOPE = ("type", "id", "ts", "node", "role", "job", "labels")  # after the prefix


def row_str(s: str) -> str:
    """A string field: as is, or as a JSON string literal when it is empty, starts with a
    quote or holds a tab, line break or other character that is not printable."""
    if s and s[0] != '"' and s.isprintable():
        return s
    return _encoder.encode(s)


def row_field(kind: str, v: Any) -> str:
    if v is None:
        return ""
    if kind == STR:
        return row_str(v)
    t = type(v)
    if t is int:  # what the JSON encoder writes for an int (and a float's repr when finite),
        return int.__repr__(v)  # without its call chain: most host fields are numbers
    if t is float and v - v == 0.0:  # finite (inf - inf and nan - nan are nan)
        return float.__repr__(v)
    if kind == BOOL:
        return "true" if v else "false"
    if kind in (FLOAT, INT):
        return _encoder.encode(v)  # int -> digits, float -> repr; NaN / Infinity refused
    return _encoder.encode(v)  # the list kinds: compact JSON (never a raw tab or newline)


def encode_row_data(type_: str, data: Mapping[str, Any]) -> str | None:
    """The data fields of a row line, or None when ``data`` holds a field the type does not
    declare (only the JSON form can carry it)."""
    spec = DATA_FIELDS[type_]
    if not data.keys() <= spec.keys():
        return None
    parts = data.parts if type(data) is Encoded else None
    if parts:
        return "\t".join(
            parts[n] if n in parts else row_field(k, data.get(n)) for n, (k, _) in spec.items()
        ).rstrip("\t")
    return "\t".join(row_field(k, data.get(n)) for n, (k, _) in spec.items()).rstrip("\t")


def _row_value(type_: str, name: str, kind: str, x: str) -> Any:
    """Decode one row field (``x`` non-empty); InvalidEvent naming the field otherwise."""
    try:
        if kind == FLOAT:
            v = float(x)
            if math.isfinite(v):
                return v
        elif kind == INT:
            if _INT_TEXT.fullmatch(x) and -(2**63) <= int(x) < 2**63:
                return int(x)
        elif kind == STR:
            v = json.loads(x) if x[0] == '"' else x
            if type(v) is str:
                return v
        elif kind == BOOL:
            if x in ("true", "false"):
                return x == "true"
        else:
            v = json.loads(x)
            if _kind_ok(kind, v):
                return v
    except ValueError:
        pass
    raise InvalidEvent(f"{type_}.{name} must be {kind}, got {x[:60]}")


def decode_row(line: str) -> dict[str, Any]:
    """A row line as the event dict it stands for (not yet validated)."""
    parts = line.rstrip("\n").split("\t")
    if parts[0] != ROW_PREFIX:
        raise InvalidEvent(f"unsupported row format {parts[0][:20]!r} (this collector reads {ROW_PREFIX})")
    if len(parts) < 1 + len(ROW_ENVELOPE):
        raise InvalidEvent(
            f"row has {len(parts)} fields, fewer than the {1 + len(ROW_ENVELOPE)} of the envelope"
        )
    type_, id_, ts, node, role, job, labels = parts[1:8]
    ev: dict[str, Any] = {"v": VERSION}
    for key, x in (("type", type_), ("id", id_), ("node", node), ("role", role), ("job", job)):
        ev[key] = _row_value("row", key, STR, x) if x else ""
    try:
        ev["ts"] = float(ts)
    except ValueError:
        ev["ts"] = ts  # validate() says what is wrong with it
    try:
        ev["labels"] = json.loads(labels) if labels else {}
    except ValueError:
        raise InvalidEvent("field 'labels' must be an object of string values") from None
    spec = DATA_FIELDS.get(ev["type"])
    values = parts[8:]
    if spec is None:
        raise InvalidEvent(f"row of type {ev['type'][:60]!r}, which this collector does not know")
    if len(values) > len(spec):
        raise InvalidEvent(
            f"{ev['type']} row has {len(values)} data fields; this collector knows {len(spec)} (a newer agent?)"
        )
    ev["data"] = {
        name: _row_value(ev["type"], name, kind, x)
        for (name, (kind, _)), x in zip(spec.items(), values, strict=False)
        if x
    }
    return ev


_INT_TEXT = re.compile(r"-?(0|[1-9][0-9]*)")
_ROW_START = re.compile(r"r[0-9]+\t")  # a row line; anything else is read as JSON


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


class InvalidEvent(ValueError):
    """An event that is not valid wire format; the message is the one-line reason."""


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
            t = round(time.time() if ts is None else ts, 6)
            if not math.isfinite(t):
                raise ValueError(f"event timestamp must be finite, got {t!r}")
            ts_ = repr(t)
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
        self,
        type_: str,
        data: Mapping[str, Any],
        ts: float | None = None,
        job: str | None = None,
        id: str | None = None,
    ) -> dict[str, Any]:
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


# check_circular off: event data is built by the agent's own code from numbers, strings and
# parsed JSON, never self-referencing, and the check costs a third of encoding a sample
_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=True, check_circular=False)


def encode(event: Mapping[str, Any]) -> bytes:
    """One NDJSON line (with its trailing newline)."""
    return (_encoder.encode(event) + "\n").encode()


def encode_many(events: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(encode(e) for e in events)


def _kind_ok(kind: str, v: Any) -> bool:
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
        raise InvalidEvent(f"unsupported wire format version {v!r} (this collector reads v{VERSION})")
    id_ = ev.get("id")
    if type(id_) is not str or not 0 < len(id_) <= MAX_ID_LEN:
        raise InvalidEvent("field 'id' must be a non-empty string of at most 64 characters")
    ts = ev.get("ts")
    if not ((type(ts) is float and math.isfinite(ts)) or type(ts) is int) or not 0 < ts < 1e11:
        raise InvalidEvent(f"field 'ts' must be unix seconds, got {ts!r}"[:200])
    for key in ("node", "type"):
        val = ev.get(key)
        if type(val) is not str or not 0 < len(val) <= MAX_NAME_LEN:
            raise InvalidEvent(
                f"field '{key}' must be a non-empty string of at most {MAX_NAME_LEN} characters"
            )
    role = ev.get("role")
    if role not in ROLES:
        raise InvalidEvent(f"field 'role' must be one of {', '.join(ROLES)}, got {role!r}"[:200])
    if type(ev.get("job", "")) is not str:
        raise InvalidEvent("field 'job' must be a string")
    labels = ev.get("labels", {})
    if type(labels) is not dict or any(type(x) is not str for x in labels.values()):
        raise InvalidEvent("field 'labels' must be an object of string values")
    data = ev.get("data")
    if type(data) is not dict:
        raise InvalidEvent("field 'data' must be an object")
    spec = DATA_FIELDS.get(ev["type"])
    if spec is not None:
        for name, val in data.items():
            fs = spec.get(name)
            if fs is not None and val is not None and not _kind_ok(fs[0], val):
                raise InvalidEvent(
                    f"{ev['type']}.{name} must be {fs[0]}, got {type(val).__name__} {val!r}"[:200]
                )
    return ev


def decode_line(line: bytes | str) -> dict[str, Any]:
    """Parse and validate one line, JSON or row form; InvalidEvent on any problem."""
    try:
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        if _ROW_START.match(line):
            return validate(decode_row(line))
        ev = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        if isinstance(e, InvalidEvent):
            raise
        raise InvalidEvent(f"not valid JSON: {e}"[:200]) from None
    return validate(ev)


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a v1 event, generated from DATA_FIELDS."""
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
