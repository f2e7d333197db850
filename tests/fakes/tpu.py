"""A local libtpu runtime-metrics server for tests: a real gRPC server (local
credentials, as libtpu's) generated with grpcio-tools from ``tpu_metrics.proto`` at test
time, so the agent's hand-written protobuf codec is checked against protoc's."""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from .protos import compiled


def generated() -> tuple[Any, Any]:
    """(pb2, pb2_grpc) compiled from tpu_metrics.proto (once per test session)."""
    return compiled("tpu_metrics")


TOTAL = "tpu.runtime.hbm.memory.total.bytes"
USAGE = "tpu.runtime.hbm.memory.usage.bytes"
DUTY = "tpu.runtime.tensorcore.dutycycle.percent"
BANDWIDTH = "tpu.runtime.hbm.memory.bandwidth.utilization.percent"


@dataclass
class FakeTpu:
    """``cores`` devices, ``cores_per_chip`` of them per chip (2 on v2/v3, 1 from v4)."""

    cores: int = 4
    cores_per_chip: int = 1
    hbm_total: int = 32 << 30
    with_bandwidth: bool = True
    device_as_string: bool = False  # newer libtpu puts device ordinals in string attributes
    calls: list[str] = field(default_factory=list)

    def used(self, dev: int) -> int:
        return (dev + 1) * (1 << 30)

    def duty(self, chip: int) -> float:
        return 10.0 * (chip + 1)

    def bandwidth(self, dev: int) -> float:
        return 5.0 + dev

    def values(self, name: str) -> dict[int, Any]:
        if name == TOTAL:
            return {d: self.hbm_total for d in range(self.cores)}
        if name == USAGE:
            return {d: self.used(d) for d in range(self.cores)}
        if name == DUTY:
            return {c: self.duty(c) for c in range(self.cores // self.cores_per_chip)}
        if name == BANDWIDTH and self.with_bandwidth:
            return {d: self.bandwidth(d) for d in range(self.cores)}
        return {}

    def supported(self) -> list[str]:
        return [TOTAL, USAGE, DUTY, "tpu.runtime.uptime.seconds.gauge"] + (
            [BANDWIDTH] if self.with_bandwidth else []
        )


def serve(tpu: FakeTpu, garbage: bool = False) -> tuple[grpc.Server, str]:
    """Start the server on a free loopback port; returns (server, "127.0.0.1:port")."""
    pb2, pb2_grpc = generated()

    class Servicer(pb2_grpc.RuntimeMetricServiceServicer):
        def GetRuntimeMetric(self, request, context):  # noqa: N802 (gRPC method name)
            tpu.calls.append(request.metric_name)
            vals = tpu.values(request.metric_name)
            if not vals:
                context.abort(grpc.StatusCode.NOT_FOUND, f"unknown metric {request.metric_name}")
            metrics = []
            for dev, v in vals.items():
                if tpu.device_as_string:
                    attr = pb2.Attribute(
                        key="device",
                        value=pb2.AttrValue(
                            kvlist_attr=pb2.KeyValueList(
                                attributes=[
                                    pb2.Attribute(key="core_type", value=pb2.AttrValue(string_attr="tc")),
                                    pb2.Attribute(
                                        key="device_ordinal", value=pb2.AttrValue(string_attr=str(dev))
                                    ),
                                ]
                            )
                        ),
                    )
                else:
                    attr = pb2.Attribute(key="device-id", value=pb2.AttrValue(int_attr=dev))
                g = pb2.Gauge(as_double=v) if isinstance(v, float) else pb2.Gauge(as_int=v)
                metrics.append(pb2.Metric(attribute=attr, gauge=g))
            return pb2.MetricResponse(metric=pb2.TPUMetric(name=request.metric_name, metrics=metrics))

        def ListSupportedMetrics(self, request, context):  # noqa: N802
            return pb2.ListSupportedMetricsResponse(
                supported_metric=[pb2.SupportedMetric(metric_name=n) for n in tpu.supported()]
            )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    if garbage:  # answers every call with bytes that are not a protobuf message
        handler = grpc.method_handlers_generic_handler(
            "tpu.monitoring.runtime.RuntimeMetricService",
            {
                m: grpc.unary_unary_rpc_method_handler(
                    lambda req, ctx: b"\x0a\xff\xff\xff\xff\x0f garbage",
                    request_deserializer=lambda b: b,
                    response_serializer=lambda b: b,
                )
                for m in ("GetRuntimeMetric", "ListSupportedMetrics")
            },
        )
        server.add_generic_rpc_handlers((handler,))
    else:
        pb2_grpc.add_RuntimeMetricServiceServicer_to_server(Servicer(), server)
    port = server.add_secure_port(
        "127.0.0.1:0", grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    )
    server.start()
    return server, f"127.0.0.1:{port}"
