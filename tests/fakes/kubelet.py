"""A local kubelet pod-resources server for tests: a real gRPC server on a Unix socket, its
messages compiled with grpcio-tools from ``podresources.proto`` (the kubelet's v1 API), that
answers ``List`` from what the test put in ``FakeKubelet.pods`` at the time of the call
(pods appearing, moving between GPUs, deleted), and an API server's pod endpoint
(``GET /api/v1/namespaces/NS/pods/NAME``) for the pods' labels."""

from __future__ import annotations

import json
import threading
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc

from .protos import compiled


@dataclass
class FakePod:
    namespace: str
    name: str
    containers: dict[str, list[str]]  # container -> device ids (GPU / MIG UUIDs, time-slicing's ``::N``)
    labels: dict[str, str] = field(default_factory=dict)
    resource: str = "nvidia.com/gpu"


@dataclass
class FakeKubelet:
    pods: list[FakePod] = field(default_factory=list)
    calls: int = 0
    fail: grpc.StatusCode | None = None  # every List fails so while set
    raw: bytes | None = None  # List answers these bytes as they are (a broken kubelet)

    def answer(self) -> Any:
        pb2, _ = compiled("podresources")
        out = []
        for p in self.pods:
            cs = [pb2.ContainerResources(
                name=c, devices=[pb2.ContainerDevices(resource_name=p.resource, device_ids=ids,
                                                      topology=pb2.TopologyInfo(nodes=[pb2.NUMANode(ID=0)]))],
                cpu_ids=[2, 3], memory=[pb2.ContainerMemory(memory_type="memory", size=1 << 30)],
                dynamic_resources=[pb2.DynamicResource(claim_name="c", claim_namespace=p.namespace, claim_resources=[
                    pb2.ClaimResource(cdi_devices=[pb2.CDIDevice(name="k8s.gpu.example.com/gpu=gpu-0")],
                                      driver_name="gpu.example.com", pool_name="n0", device_name="gpu-0")])])
                  for c, ids in p.containers.items()]
            out.append(pb2.PodResources(name=p.name, namespace=p.namespace, containers=cs))
        return pb2.ListPodResourcesResponse(pod_resources=out)


def serve(kubelet: FakeKubelet, socket: Path) -> grpc.Server:
    """The pod-resources service on the Unix socket ``socket`` (started)."""
    pb2, pb2_grpc = compiled("podresources")

    class Lister(pb2_grpc.PodResourcesListerServicer):
        def List(self, request, context):  # noqa: N802 (gRPC method name)
            kubelet.calls += 1
            if kubelet.fail is not None:
                context.abort(kubelet.fail, "kubelet says no")
            return kubelet.answer()

    def raw_or_list(request: bytes, context: Any) -> bytes:
        if kubelet.raw is not None:
            kubelet.calls += 1
            return kubelet.raw
        return Lister().List(pb2.ListPodResourcesRequest.FromString(request), context).SerializeToString()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(raw_or_list, request_deserializer=lambda b: b,
                                                    response_serializer=lambda b: b)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server


class ApiServer:
    """The API server's ``GET /api/v1/namespaces/NS/pods/NAME`` over HTTP: the pod's labels
    from ``kubelet.pods``; 403 where ``forbid`` is set, 404 for an unknown pod. ``seen``:
    the Authorization headers it was sent."""

    def __init__(self, kubelet: FakeKubelet, forbid: bool = False) -> None:
        self.kubelet, self.forbid, self.seen, self.gets = kubelet, forbid, [], 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.gets += 1
                outer.seen.append(self.headers.get("Authorization", ""))
                parts = self.path.split("/")
                pod = next((p for p in outer.kubelet.pods if len(parts) == 7 and parts[4] == p.namespace
                            and parts[6] == p.name), None)
                code = 403 if outer.forbid else 200 if pod else 404
                body = json.dumps({"kind": "Pod", "metadata": {"name": pod.name, "namespace": pod.namespace,
                                                               "labels": pod.labels}} if code == 200 else
                                  {"kind": "Status", "code": code}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
