"""An OTLP metrics receiver for tests: decodes the real OTLP protobuf
(``ExportMetricsServiceRequest`` from ``opentelemetry-proto``) sent over HTTP
(``POST /v1/metrics``, as the OpenTelemetry Collector's otlphttp receiver takes it) or gRPC
(``MetricsService/Export``), and keeps every data point it received."""

from __future__ import annotations

import gzip
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc


class Point(dict):
    """One data point: name, kind (gauge | sum), unit, value, attributes, resource, monotonic."""


class Received:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.points: list[Point] = []
        self.headers: list[dict[str, str]] = []
        self.fail_with: int | None = None  # HTTP status to answer with (None: 200)

    def add(self, req: Any, headers: dict[str, str]) -> None:
        pts = []
        for rm in req.resource_metrics:
            res = {a.key: _value(a.value) for a in rm.resource.attributes}
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    data = getattr(m, kind)
                    for dp in data.data_points:
                        pts.append(
                            Point(
                                name=m.name,
                                kind=kind,
                                unit=m.unit,
                                description=m.description,
                                monotonic=getattr(data, "is_monotonic", None),
                                value=dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int,
                                attributes={a.key: _value(a.value) for a in dp.attributes},
                                resource=res,
                            )
                        )
        with self.lock:
            self.requests += 1
            self.points.extend(pts)
            self.headers.append(headers)

    def latest(self, name: str) -> list[Point]:
        """The data points of ``name`` in the newest request that had it."""
        with self.lock:
            pts = [p for p in self.points if p["name"] == name]
        if not pts:
            return []
        last: dict[tuple, Point] = {}
        for p in pts:
            last[tuple(sorted(p["attributes"].items()))] = p
        return list(last.values())


def _value(v: Any) -> Any:
    k = v.WhichOneof("value")
    return getattr(v, k) if k else None


class _Handler(BaseHTTPRequestHandler):
    received: Received

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/metrics" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        if self.received.fail_with:
            self.send_response(self.received.fail_with)
            self.end_headers()
            return
        req = metrics_service_pb2.ExportMetricsServiceRequest()
        req.ParseFromString(body)  # a real decode: malformed bytes raise
        self.received.add(req, dict(self.headers.items()))
        out = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a: Any) -> None:
        pass


class HttpReceiver:
    def __init__(self) -> None:
        self.received = Received()
        handler = type("H", (_Handler,), {"received": self.received})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}/v1/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.received.add(request, dict(context.invocation_metadata()))
        return metrics_service_pb2.ExportMetricsServiceResponse()


class GrpcReceiver:
    def __init__(self) -> None:
        import grpc

        self.received = Received()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Servicer(self.received), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"
        self.server.start()

    def close(self) -> None:
        self.server.stop(0)
