"""Kubernetes pods of the GPUs (agent/sources/gpu/kubelet.py): the kubelet's pod-resources
``List`` asked over its Unix socket from a real gRPC server compiled from the kubelet's v1
proto (tests/fakes/kubelet.py), pods appearing, moving and deleted; the job named by a pod
label read from an API server, else namespace/pod; a kubelet that is absent, forbidden,
failing or answering garbage said in one line and retried; the GPU source's samples carry
namespace, pod and container and are sent as the pod's job's."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import grpc
import pytest

from cmdare.agent.sources.gpu import GpuSource, kubelet
from cmdare.wire.events import encode_row_data
from cmdare.wire.units import ConfigError
from tests.fakes.kubelet import ApiServer, FakeKubelet, FakePod, serve
from tests.fakes.nvml import FakeNvml
from tests.fakes.protos import compiled

KF = "training.kubeflow.org/job-name"


@pytest.fixture
def kube(tmp_path: Path):
    sock = tmp_path / "kubelet.sock"
    k = FakeKubelet()
    server = serve(k, sock)
    yield k, sock
    server.stop(None)


def _uuids(n: int = 4) -> list[str]:
    return [d.uuid for d in FakeNvml(gpus=n).devs]


def test_the_hand_decoder_reads_what_protoc_encodes() -> None:
    k = FakeKubelet([FakePod("vision", "resnet-worker-0", {"trainer": ["GPU-aaaa-1", "GPU-aaaa-2"], "sidecar": []}),
                     FakePod("nlp", "bert-0", {"main": ["MIG-bbbb-3", "GPU-cccc-4::1"]}, resource="nvidia.com/mig-1g.10gb")])
    got = kubelet.decode_list(k.answer().SerializeToString())  # CPU ids, memory, topology and DRA skipped
    assert got == [("vision", "resnet-worker-0", "trainer", "nvidia.com/gpu", "GPU-aaaa-1"),
                   ("vision", "resnet-worker-0", "trainer", "nvidia.com/gpu", "GPU-aaaa-2"),
                   ("nlp", "bert-0", "main", "nvidia.com/mig-1g.10gb", "MIG-bbbb-3"),
                   ("nlp", "bert-0", "main", "nvidia.com/mig-1g.10gb", "GPU-cccc-4::1")]
    assert kubelet.decode_list(b"") == []


@pytest.mark.parametrize(("dev", "want"), [
    ("GPU-8f3c2e1a-1b2c-4d5e-9f00-112233445566", "GPU-8f3c2e1a-1b2c-4d5e-9f00-112233445566"),
    ("MIG-4b1f2a3c-aaaa-bbbb-cccc-ddddeeeeffff", "MIG-4b1f2a3c-aaaa-bbbb-cccc-ddddeeeeffff"),
    ("MIG-GPU-8f3c2e1a/1/0", "MIG-GPU-8f3c2e1a/1/0"),  # the R450 MIG form
    ("GPU-8f3c2e1a::3", "GPU-8f3c2e1a"),  # time-slicing's replica
    ("0000:3b:00.0", None), ("gpu-0", None), ("", None), ("GPU-" + "a" * 300, None), ("GPU-a\nb", None),
])
def test_device_ids_name_gpu_and_mig_uuids_only(dev: str, want: str | None) -> None:
    assert kubelet.device_uuid(dev) == want


def test_pods_appearing_moving_and_deleted_are_followed(kube) -> None:
    k, sock = kube
    g = _uuids()
    api = ApiServer(k)
    try:
        k.pods = [FakePod("vision", "resnet-worker-0", {"trainer": g[:2]}, labels={KF: "resnet50-a"}),
                  FakePod("nlp", "bert-0", {"main": [g[2]]})]
        r = kubelet.PodResolver(str(sock), labels=kubelet.Labels(api.url))
        assert r.refresh()
        assert r.get(g[0]) == r.get(g[1]) and r.get(g[0]).job == "resnet50-a"  # the Kubeflow label
        assert (r.get(g[0]).namespace, r.get(g[0]).pod, r.get(g[0]).container) == ("vision", "resnet-worker-0", "trainer")
        assert r.get(g[2]).job == "nlp/bert-0"  # no job label: namespace/pod
        assert r.get(g[3]) is None
        gets = api.gets
        assert r.refresh() and api.gets == gets  # labels read once per pod
        k.pods[1].containers = {"main": [g[3]]}  # the pod moved to another GPU (recreated)
        k.pods.append(FakePod("nlp", "gpt-0", {"main": [g[2]]}, labels={"job-name": "gpt-sft"}))
        assert r.refresh()
        assert r.get(g[3]).pod == "bert-0" and r.get(g[2]).job == "gpt-sft"
        k.pods = k.pods[1:]  # resnet's pod deleted
        assert r.refresh() and r.get(g[0]) is None and ("vision", "resnet-worker-0") not in r.job_of
    finally:
        api.close()


def test_a_gpu_time_sliced_between_two_pods_is_named_by_neither(kube) -> None:
    k, sock = kube
    g = _uuids()
    k.pods = [FakePod("a", "p", {"c": [g[0] + "::0", g[1]]}), FakePod("b", "q", {"c": [g[0] + "::1"]})]
    r = kubelet.PodResolver(str(sock), labels=None)
    assert r.refresh() and r.get(g[0]) is None and r.get(g[1]).pod == "p"


def test_the_job_label_is_configurable_and_an_unreadable_api_server_names_namespace_pod(kube, caplog) -> None:
    k, sock = kube
    g = _uuids()
    k.pods = [FakePod("ml", "w-0", {"c": [g[0]]}, labels={"example.com/run": "sweep-7", KF: "ignored"})]
    api = ApiServer(k)
    try:
        r = kubelet.PodResolver(str(sock), job_labels=["example.com/run", KF], labels=kubelet.Labels(api.url))
        assert r.refresh() and r.get(g[0]).job == "sweep-7"
        forbidden = ApiServer(k, forbid=True)
        tok = Path(sock).parent / "token"
        tok.write_text("s3cr3t-token\n")
        r2 = kubelet.PodResolver(str(sock), labels=kubelet.Labels(forbidden.url, token_file=tok))
        with caplog.at_level(logging.WARNING, "cmdare.agent.gpu"):
            assert r2.refresh() and r2.refresh()
        assert r2.get(g[0]).job == "ml/w-0"
        said = [m for m in caplog.messages if "403" in m]
        assert len(said) == 1 and "get on pods" in said[0]  # one line, however often it is tried
        assert forbidden.seen[0] == "Bearer s3cr3t-token" and "s3cr3t" not in caplog.text
        assert forbidden.gets == 2  # a refused read is tried again at the next refresh
        forbidden.close()
    finally:
        api.close()


def test_no_socket_is_said_once_and_names_no_pod(tmp_path: Path, caplog) -> None:
    r = kubelet.PodResolver(str(tmp_path / "absent.sock"))
    with caplog.at_level(logging.INFO, "cmdare.agent.gpu"):
        assert not r.refresh() and not r.refresh()
    assert len([m for m in caplog.messages if "no kubelet pod-resources socket" in m]) == 1
    assert r.get("GPU-x") is None


def test_permission_denied_is_one_line(caplog) -> None:
    """The socket is the kubelet's (root's, 0600): an agent running as another user may not
    connect. As root here, the check runs in a child process that became nobody."""
    import subprocess
    import sys
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="cmdare-kubelet-"))
    d.chmod(0o755)  # traversable by anyone: the socket is found, not usable
    sock = d / "kubelet.sock"
    server = serve(FakeKubelet(), sock)
    try:
        sock.chmod(0o600)
        # a fresh interpreter (no fork of this threaded one); as root it imports what it needs,
        # then becomes nobody (who may not read this machine's Python) before it asks
        code = ("import logging, os, sys\n"
                "from cmdare.agent.sources.gpu import kubelet\n"
                "said = []\n"
                "h = logging.Handler()\n"
                "h.emit = lambda rec: said.append(rec.getMessage())\n"
                "logging.getLogger('cmdare.agent.gpu').addHandler(h)\n"
                "logging.getLogger('cmdare.agent.gpu').setLevel(logging.INFO)\n"
                "os.geteuid() == 0 and os.setuid(65534)\n"
                f"r = kubelet.PodResolver({str(sock)!r}, labels=None)\n"
                "print(repr(((r.refresh(), r.refresh()), said, os.geteuid())))\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        oks, said, euid = ast.literal_eval(out.stdout.strip().splitlines()[-1])
        assert euid != 0 and oks == (False, False)
        assert len(said) == 1 and "permission denied" in said[0], said
    finally:
        server.stop(None)
        import shutil

        shutil.rmtree(d, ignore_errors=True)


def test_a_failing_kubelet_keeps_the_last_answer_a_while_then_names_no_pod(kube, caplog) -> None:
    k, sock = kube
    g = _uuids()
    k.pods = [FakePod("a", "p", {"c": [g[0]]})]
    now = [0.0]
    r = kubelet.PodResolver(str(sock), interval=10.0, labels=None, clock=lambda: now[0])
    assert r.refresh()
    k.fail = grpc.StatusCode.UNAVAILABLE  # the kubelet restarts
    with caplog.at_level(logging.INFO, "cmdare.agent.gpu"):
        assert not r.refresh() and not r.refresh()
        now[0] = 29.0
        assert r.get(g[0]).pod == "p"  # the last answer holds for 3 intervals ...
        now[0] = 31.0
        assert r.get(g[0]) is None  # ... then no GPU is named by a pod it may have left
        k.fail = None
        assert r.refresh() and r.get(g[0]).pod == "p"
    said = [m for m in caplog.messages if "List failed" in m]
    assert len(said) == 1 and "UNAVAILABLE" in said[0]
    assert any("answers again" in m for m in caplog.messages)


@pytest.mark.parametrize("raw", [
    b"\x0a\xff\xff\xff\xff\x0f garbage",  # a length past the end
    b"\x0f\x01",  # wire type 7
])
def test_a_malformed_answer_is_said_and_the_last_good_one_kept(kube, raw: bytes, caplog) -> None:
    k, sock = kube
    g = _uuids()
    k.pods = [FakePod("a", "p", {"c": [g[0]]})]
    r = kubelet.PodResolver(str(sock), labels=None)
    assert r.refresh()
    k.raw = raw
    with caplog.at_level(logging.WARNING, "cmdare.agent.gpu"):
        assert not r.refresh()
    assert r.get(g[0]).pod == "p"
    assert any("malformed" in m for m in caplog.messages)


def test_an_answer_of_700k_device_ids_is_refused_at_the_bound_and_the_last_good_one_kept(kube, caplog) -> None:
    """Issue 69: a hostile kubelet answer (700k device ids under the byte cap) took the agent
    to 949 MiB and 15 s a refresh. Device ids are counted as they are decoded: the answer is
    refused at MAX_DEVICE_IDS, said in one line, the last good answer kept."""
    import resource
    import time

    k, sock = kube
    g = _uuids()
    k.pods = [FakePod("a", "p", {"c": [g[0]]})]
    r = kubelet.PodResolver(str(sock), labels=None)
    assert r.refresh()
    k.pods = [FakePod("a", "evil", {"c": [f"GPU-{i:08x}" for i in range(300_000)]})]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, "cmdare.agent.gpu"):
        assert not r.refresh()
    assert time.monotonic() - t0 < 3.0  # the gRPC transfer of ~4 MB; the decoding stops at 4,096 ids
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) << 10 < 100 << 20
    assert r.get(g[0]).pod == "p"
    said = [m for m in caplog.messages if "device ids" in m]
    assert len(said) == 1 and "more than 4,096 device ids listed" in said[0] and "\n" not in said[0]
    ok = [FakePod("a", f"p{i}", {"c": [f"GPU-{i:04d}-{j}" for j in range(8)]}) for i in range(512)]
    k.pods = ok  # 4,096 ids exactly: answered
    assert r.refresh() and r.get("GPU-0511-7").pod == "p511"


def test_hostile_names_are_bounded_and_printable_and_too_many_pods_refused(kube) -> None:
    k, sock = kube
    g = _uuids()
    evil = "x\x1b[31m\n" + "y" * 200_000
    k.pods = [FakePod(evil, evil, {evil: [g[0]]})]
    r = kubelet.PodResolver(str(sock), labels=None)
    assert r.refresh()
    p = r.get(g[0])
    assert len(p.pod) == len(p.namespace) == len(p.container) == kubelet.MAX_NAME
    assert p.pod.startswith("x?[31m?") and all(" " <= c <= "~" for c in p.job)
    pb2, _ = compiled("podresources")
    many = pb2.ListPodResourcesResponse(pod_resources=[pb2.PodResources(name=f"p{i}", namespace="n")
                                                       for i in range(kubelet.MAX_PODS + 1)])
    with pytest.raises(ValueError, match="more than 1024 pods"):
        kubelet.decode_list(many.SerializeToString())


def test_hostile_label_answers_cost_the_label_only(tmp_path: Path) -> None:
    import http.server
    import threading

    answers = iter([b"[1, 2]", b"{\"metadata\": {\"labels\": [\"x\"]}}", b"x" * (kubelet.MAX_LABEL_ANSWER + 10), b"{"])

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = next(answers)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        lab = kubelet.Labels(f"http://127.0.0.1:{srv.server_address[1]}")
        assert [lab.get("n", "p") for _ in range(4)] == [None, None, None, None]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(("cfg", "msg"), [
    ({"apiserver": "https://admin:hunter2@10.0.0.1:6443"}, "no credentials in the URL"),
    ({"apiserver": "ftp://x"}, r"expected '', 'none' or an http\(s\) URL"),
    ({"kubelet_socket": "relative.sock"}, "expected an absolute path"),
    ({"job_labels": ["has space"]}, "at most 16 label keys"),
    ({"job_labels": [f"k{i}" for i in range(17)]}, "at most 16 label keys"),
    ({"job_labels": "training.kubeflow.org/job-name"}, "expected a list of strings"),
    ({"kubernetes": "yes please"}, "sources.gpu.kubernetes"),
])
def test_bad_kubernetes_options_are_one_line_errors(cfg: dict, msg: str) -> None:
    with pytest.raises(ConfigError, match=msg) as e:
        GpuSource.parse_config("sources.gpu", cfg)
    assert "\n" not in str(e.value) and "hunter2" not in str(e.value)


def test_the_gpu_sources_samples_carry_the_pod_and_go_out_as_its_jobs(kube) -> None:
    k, sock = kube
    nv = FakeNvml(gpus=4)
    g = [d.uuid for d in nv.devs]
    k.pods = [FakePod("vision", "resnet-worker-0", {"trainer": g[:2]}, labels={KF: "resnet50-a"}),
              FakePod("nlp", "bert-0", {"main": [g[2]]})]
    api = ApiServer(k)
    try:
        src = GpuSource(GpuSource.parse_config("sources.gpu", {"kubelet_socket": str(sock), "apiserver": api.url}),
                        nvml=nv)
        got: list[tuple] = []
        src.collect(lambda t, d, job=None: got.append((d, job)) if t == "gpu" else None)  # start: the pods known
        by = {d["index"]: (d, job) for d, job in got}
        assert by[0][1] == by[1][1] == "resnet50-a" and by[2][1] == "nlp/bert-0" and by[3][1] is None
        d0 = by[0][0]
        assert (d0["namespace"], d0["pod"], d0["container"]) == ("vision", "resnet-worker-0", "trainer")
        assert "pod" not in by[3][0]
        for d, _ in got:  # the row the agent ships: byte for byte the generic encoder's
            assert d.row == encode_row_data("gpu", dict(d))
        k.pods = []  # deleted: the next refresh names no pod
        src.pods.refresh()
        got.clear()
        src.collect(lambda t, d, job=None: got.append((d, job)) if t == "gpu" else None)
        assert all(job is None and "pod" not in d for d, job in got)
    finally:
        src.close()
        api.close()
    assert src.pods._thread is None  # stopped with the source
    off = GpuSource(GpuSource.parse_config("sources.gpu", {"kubernetes": False}), nvml=FakeNvml(gpus=1))
    assert off.pods is None
