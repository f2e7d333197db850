"""TPU source: libtpu's runtime metrics, read the way Google's ``tpu-info`` reads them.

While a TPU program runs with runtime metrics enabled (``TPU_RUNTIME_METRICS_PORTS``,
default 8431), libtpu serves the gRPC service
``tpu.monitoring.runtime.RuntimeMetricService`` on localhost.  Per tick this source calls
``GetRuntimeMetric`` for HBM used and total bytes and TensorCore duty cycle, plus HBM
bandwidth utilisation where libtpu lists a metric for it (``ListSupportedMetrics``,
matched by the ``bandwidth_metric`` pattern), and emits one ``tpu`` event per device.

No libtpu, no TPU program running, or grpcio not installed: a normal state, reported once
(``unavailable``) and retried every ``retry_interval``.  The messages are encoded and
decoded with ``cmdare.agent.protowire``, so the agent needs grpcio but not protobuf.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from typing import Any

from cmdare.wire.plugin import Option
from cmdare.wire.protowire import encode_bytes_field, fields, signed64
from cmdare.wire.units import ConfigError

from .base import SOURCES, Emit, Source, SourceUnavailable

SERVICE = "/tpu.monitoring.runtime.RuntimeMetricService/"
TOTAL = "tpu.runtime.hbm.memory.total.bytes"
USAGE = "tpu.runtime.hbm.memory.usage.bytes"
DUTY = "tpu.runtime.tensorcore.dutycycle.percent"


def _attr_value(buf: bytes) -> Any:
    """AttrValue: string_attr 1, bool_attr 2, int_attr 3, double_attr 4 (others ignored)."""
    for num, wt, v in fields(buf):
        if num == 1 and wt == 2:
            return v.decode("utf-8", "replace")
        if num in (2, 3) and wt == 0:
            return signed64(v)
        if num == 4 and wt == 1:
            return struct.unpack("<d", v)[0]
    return None


def _device(attr: bytes) -> int | None:
    """The device id of a Metric's Attribute {key 1, value 2}: an int (or digit string)
    value, or a ``device_ordinal`` entry of a key/value list."""
    for num, wt, v in fields(attr):
        if num != 2 or wt != 2:
            continue
        val = _attr_value(v)
        if isinstance(val, int):
            return val
        if isinstance(val, str) and val.isdigit():
            return int(val)
        for an, awt, av in fields(v):  # kvlist_attr 6 -> KeyValueList {repeated Attribute 1}
            if an == 6 and awt == 2:
                for kn, _kwt, kv in fields(av):
                    if kn == 1:
                        key = next((x.decode() for n, w, x in fields(kv) if n == 1 and w == 2), "")
                        if key == "device_ordinal":
                            d = _device(kv)
                            if d is not None:
                                return d
    return None


def _gauge(buf: bytes) -> float | None:
    """Gauge: as_double 1, as_int 2 (string / bool are not numbers here)."""
    for num, wt, v in fields(buf):
        if num == 1 and wt == 1:
            return struct.unpack("<d", v)[0]
        if num == 2 and wt == 0:
            return float(signed64(v))
    return None


def decode_metric_response(buf: bytes) -> dict[int, float]:
    """MetricResponse {TPUMetric metric 1 {name 1, description 2, repeated Metric metrics 3}}
    -> {device id: gauge value}.  Metric: attribute 1, gauge 3."""
    out: dict[int, float] = {}
    for num, wt, tm in fields(buf):
        if num != 1 or wt != 2:
            continue
        for mn, mwt, m in fields(tm):
            if mn != 3 or mwt != 2:
                continue
            dev, val = None, None
            for fn, fwt, fv in fields(m):
                if fn == 1 and fwt == 2:
                    dev = _device(fv)
                elif fn == 3 and fwt == 2:
                    val = _gauge(fv)
            if dev is not None and val is not None:
                out[dev] = val
    return out


def decode_supported(buf: bytes) -> list[str]:
    """ListSupportedMetricsResponse {repeated SupportedMetric 1 {metric_name 1}}."""
    names = []
    for num, wt, sm in fields(buf):
        if num == 1 and wt == 2:
            for n, w, v in fields(sm):
                if n == 1 and w == 2:
                    names.append(v.decode("utf-8", "replace"))
    return names


@SOURCES.register
class TpuSource(Source):
    """libtpu's runtime metrics per TPU device (HBM, duty cycle, HBM bandwidth), over the
    gRPC service that ``tpu-info`` reads, with grpcio only."""

    name = "tpu"
    OPTIONS = {
        "address": Option("str", "localhost:8431", "libtpu runtime metrics server (TPU_RUNTIME_METRICS_PORTS)"),
        "timeout": Option("duration", 2.0, "deadline of each call"),
        "bandwidth_metric": Option(
            "str",
            r"hbm.*bandwidth|memory_bandwidth",
            "pattern picking the HBM bandwidth utilisation metric from the ones libtpu lists",
        ),
        "retry_interval": Option("duration", 60.0, "how often to look again while no TPU program serves metrics"),
    }

    @classmethod
    def parse_config(cls, where: str, raw: Any) -> dict[str, Any]:
        cfg = super().parse_config(where, raw)
        try:
            cfg["bandwidth_re"] = re.compile(cfg["bandwidth_metric"])
        except re.error as e:
            raise ConfigError(f"{where}.bandwidth_metric: not a regular expression: {e}") from None
        return cfg

    def __init__(self, config: dict[str, Any], grpc_module: Any = None, **_: Any) -> None:
        super().__init__(config)
        self._grpc = grpc_module
        self.channel: Any = None
        self.bandwidth: str | None = None
        self.next_try = 0.0
        self._why = ""

    def start(self) -> None:
        if time.monotonic() < self.next_try:
            raise SourceUnavailable(self._why)
        self.next_try = time.monotonic() + self.config["retry_interval"]
        if self._grpc is None:
            self._nobody_listening()  # most machines have no TPU: do not load grpc (16 MB) for nothing
            try:
                import grpc
            except ImportError:
                self._why = "grpcio is not installed (pip install 'cmdare[tpu]')"
                raise SourceUnavailable(self._why) from None
            self._grpc = grpc
        grpc = self._grpc
        addr = self.config["address"]
        self.channel = grpc.secure_channel(addr, grpc.local_channel_credentials())
        try:
            names = decode_supported(self._call("ListSupportedMetrics", b""))
        except ValueError as e:
            self.close()
            raise RuntimeError(f"ListSupportedMetrics: malformed response: {e}") from None
        except Exception:
            self.close()
            raise
        self.bandwidth = next((n for n in names if self.config["bandwidth_re"].search(n)), None)
        if names and not {TOTAL, USAGE} <= set(names):
            self.close()
            self._why = f"{addr} serves no HBM metrics (libtpu lists {len(names)} others)"
            raise SourceUnavailable(self._why)

    def _nobody_listening(self) -> None:
        """SourceUnavailable when nothing accepts TCP connections at ``address`` (a plain
        ``host:port``); other address forms are left to gRPC."""
        host, sep, port = self.config["address"].rpartition(":")
        if not sep or not port.isdigit() or "/" in host:
            return
        try:
            socket.create_connection(
                (host.strip("[]"), int(port)), timeout=min(self.config["timeout"], 1.0)
            ).close()
        except OSError:
            self._why = (
                f"no TPU program serving runtime metrics on {self.config['address']} "
                "(libtpu serves them only while one runs)"
            )
            raise SourceUnavailable(self._why) from None

    def _call(self, method: str, request: bytes) -> bytes:
        grpc = self._grpc
        rpc = self.channel.unary_unary(
            SERVICE + method, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        try:
            return rpc(request, timeout=self.config["timeout"])
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            addr = self.config["address"]
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self._why = f"no TPU program serving runtime metrics on {addr} (libtpu serves them only while one runs)"
                raise SourceUnavailable(self._why) from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                self._why = f"{addr} does not implement {SERVICE}{method}"
                raise SourceUnavailable(self._why) from None
            detail = e.details() if hasattr(e, "details") else ""
            raise RuntimeError(f"{method}: {code.name if code else e}: {detail}") from None

    def _metric(self, name: str) -> dict[int, float]:
        try:
            return decode_metric_response(
                self._call("GetRuntimeMetric", encode_bytes_field(1, name.encode()))
            )
        except ValueError as e:
            raise RuntimeError(f"{name}: malformed response: {e}") from None

    def collect(self, emit: Emit) -> None:
        if self.channel is None:
            self.start()
        try:
            total, usage, duty = self._metric(TOTAL), self._metric(USAGE), self._metric(DUTY)
            bw = self._metric(self.bandwidth) if self.bandwidth else {}
        except SourceUnavailable:
            self.close()  # the program ended: look again after retry_interval
            raise
        # duty cycle is per chip; on chips with two cores (v2, v3) memory is per core
        per_chip = len(usage) // len(duty) if duty and len(usage) % len(duty) == 0 else 1
        for dev in sorted(set(usage) | set(total)):
            d: dict[str, Any] = {"device": dev}
            if dev in usage:
                d["hbm_used_bytes"] = int(usage[dev])
            if dev in total:
                d["hbm_total_bytes"] = int(total[dev])
            chip = dev // per_chip
            if chip in duty:
                d["duty_cycle_ratio"] = duty[chip] / 100.0
            b = bw.get(dev, bw.get(chip))
            if b is not None:  # libtpu's utilisation metrics are percentages
                d["hbm_bandwidth_ratio"] = b / 100.0
            emit("tpu", d)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
