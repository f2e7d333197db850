"""Kubernetes pods of the GPUs: which pod, namespace and container the kubelet gave each GPU
to, from the kubelet's pod-resources API (``v1.PodResourcesLister/List``, gRPC over its
Unix socket, as dcgm-exporter asks it), and the job each pod runs, from the pod's labels
where the agent may read them from the API server.

- The device plugin hands out GPUs by id: a GPU's UUID (``GPU-...``), a MIG instance's UUID
  (``MIG-...``), with ``::N`` after it where time-slicing shares one GPU between replicas.
  A GPU listed for two pods (time-slicing) is named by neither: which process is whose
  needs the pods' cgroups, not done yet.
- The job: the value of the first of ``job_labels`` the pod carries (``training.kubeflow.
  org/job-name`` for a PyTorchJob, ``jobset.sigs.k8s.io/jobset-name``, ...), else
  ``<namespace>/<pod>``. Labels are read from the API server (in-cluster: the service
  account's token and CA, ``GET /api/v1/namespaces/NS/pods/NAME``), once per pod; where
  the agent may not read them, the job is ``<namespace>/<pod>``.

The lookups run in a thread of their own every ``interval``: a tick reads a dict. A kubelet
that does not answer (no socket: not a Kubernetes node; permission denied; a restart) is
said in one log line per new reason and tried again; the last answer holds for ``3 x
interval``, then the GPUs are named by no pod. Every value is bounded: an answer up to
``MAX_ANSWER`` bytes, names up to 253 printable characters, at most 1,024 pods and 4,096
device ids (an answer past either is refused, the last good one kept).

The messages are decoded with ``cmdare.wire.protowire`` (grpcio, no protobuf), as the TPU
source decodes libtpu's.
"""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmdare.wire.protowire import fields
from cmdare.wire.rowform import row_str
from cmdare.wire.units import ConfigError

from .fields import AT

log = logging.getLogger("cmdare.agent.gpu")

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST = "/v1.PodResourcesLister/List"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
JOB_LABELS = ("training.kubeflow.org/job-name", "jobset.sigs.k8s.io/jobset-name", "batch.kubernetes.io/job-name",
              "job-name")
MAX_ANSWER = 8 << 20  # a node's List answer (every pod's CPUs, memory and devices): far below this
MAX_PODS = 1024
MAX_DEVICE_IDS = 4096  # 16 GPUs x 7 MIG instances x time-slicing replicas and other plugins' devices, with room
MAX_NAME = 253  # a DNS subdomain, Kubernetes's longest object name
MAX_LABEL_ANSWER = 1 << 20
_PRINTABLE = re.compile(r"[^\x20-\x7e]")
_DEVICE = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/_.-]{1,120}")
_AT = (AT["namespace"], AT["pod"], AT["container"])
_LABEL_KEY = re.compile(r"(?:[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def check_config(where: str, cfg: dict[str, Any]) -> None:
    """ConfigError for an ``apiserver`` that is not '', 'none' or an http(s) URL without
    credentials in it (they would reach log lines: the token file carries them), a
    ``kubelet_socket`` that is not an absolute path, more than 16 ``job_labels`` or one that
    is no label key."""
    api = cfg.get("apiserver", "")
    if api not in ("", "none"):
        u = urllib.parse.urlsplit(api)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ConfigError(f"{where}.apiserver: expected '', 'none' or an http(s) URL, got {api[:80]!r}")
        if u.username or u.password:
            raise ConfigError(f"{where}.apiserver: no credentials in the URL (the service account's token is sent)")
    sock = cfg.get("kubelet_socket", SOCKET)
    if not sock.startswith("/") or len(sock) > 256 or "\0" in sock:
        raise ConfigError(f"{where}.kubelet_socket: expected an absolute path, got {sock[:80]!r}")
    labels = cfg.get("job_labels", JOB_LABELS)
    if len(labels) > 16 or not all(_LABEL_KEY.fullmatch(k) for k in labels):
        raise ConfigError(f"{where}.job_labels: at most 16 label keys ([prefix/]name), got {str(labels)[:80]}")


def _name(b: bytes) -> str:
    return _PRINTABLE.sub("?", b.decode("utf-8", "replace"))[:MAX_NAME]


def _strings(buf: bytes, num: int) -> list[bytes]:
    return [v for n, wt, v in fields(buf) if n == num and wt == 2]


def decode_list(buf: bytes) -> list[tuple[str, str, str, str, str]]:
    """A ``ListPodResourcesResponse`` as (namespace, pod, container, resource name, device id)
    per device assigned (field numbers of the kubelet's v1 ``api.proto``: pod_resources 1;
    PodResources name 1, namespace 2, containers 3; ContainerResources name 1, devices 2;
    ContainerDevices resource_name 1, device_ids 2). ValueError: not such a message, or one
    past ``MAX_PODS`` pods or ``MAX_DEVICE_IDS`` device ids (refused as soon as it passes,
    before the rest is decoded: a hostile answer costs its first ids only)."""
    out: list[tuple[str, str, str, str, str]] = []
    for i, pod in enumerate(_strings(buf, 1)):
        if i >= MAX_PODS:
            raise ValueError(f"more than {MAX_PODS} pods listed")
        name = ns = b""
        containers = []
        for n, wt, v in fields(pod):
            if wt != 2:
                continue
            if n == 1:
                name = v
            elif n == 2:
                ns = v
            elif n == 3:
                containers.append(v)
        for c in containers:
            cname = b""
            devices = []
            for n, wt, v in fields(c):
                if n == 1 and wt == 2:
                    cname = v
                elif n == 2 and wt == 2:
                    devices.append(v)
            for d in devices:
                res = b""
                for n, wt, v in fields(d):
                    if wt != 2:
                        continue
                    if n == 1 and not res:
                        res = v
                    elif n == 2:
                        if len(out) >= MAX_DEVICE_IDS:
                            raise ValueError(f"more than {MAX_DEVICE_IDS:,} device ids listed")
                        out.append((_name(ns), _name(name), _name(cname), _name(res), _name(v)))
    return out


def device_uuid(device_id: str) -> str | None:
    """The GPU / MIG UUID a device plugin's id names (time-slicing's ``::N`` replica suffix
    dropped), or None for an id of another form."""
    base = device_id.split("::", 1)[0]
    return base if _DEVICE.fullmatch(base) else None


@dataclass(frozen=True)
class Pod:
    namespace: str
    pod: str
    container: str
    job: str
    texts: tuple[str, str, str]  # the three fields' row-form texts (made once)

    def put(self, d: dict[str, Any], t: list[str]) -> None:
        d["namespace"], d["pod"], d["container"] = self.namespace, self.pod, self.container
        t[_AT[0]], t[_AT[1]], t[_AT[2]] = self.texts


def make_pod(namespace: str, pod: str, container: str, job: str) -> Pod:
    return Pod(namespace, pod, container, job, (row_str(namespace), row_str(pod), row_str(container)))


class Labels:
    """A pod's labels from the API server (``GET /api/v1/namespaces/NS/pods/NAME``): in-cluster
    (``KUBERNETES_SERVICE_HOST``, the service account's token and CA) unless ``url`` names
    one; ``None`` where it cannot say (no API server, no right to read pods, an answer that
    is not a pod). The token never appears in a log line or an error."""

    def __init__(self, url: str = "", token_file: str | Path = SERVICE_ACCOUNT / "token",
                 ca_file: str | Path = SERVICE_ACCOUNT / "ca.crt", timeout: float = 2.0) -> None:
        if not url:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            url = f"https://{'[' + host + ']' if ':' in host else host}:{port}" if host else ""
        self.url = url.rstrip("/")
        self.token_file, self.ca_file, self.timeout = Path(token_file), Path(ca_file), timeout
        self.said: set[str] = set()

    def _say(self, why: str) -> None:
        if why not in self.said:
            self.said.add(why)
            log.warning("Kubernetes pod labels: %s (jobs are named namespace/pod meanwhile)", why)

    def get(self, namespace: str, pod: str) -> dict[str, str] | None:
        if not self.url:
            return None
        q = urllib.parse.quote
        req = urllib.request.Request(f"{self.url}/api/v1/namespaces/{q(namespace, safe='')}/pods/{q(pod, safe='')}")
        try:
            token = self.token_file.read_text()[:16384].strip()
        except OSError:
            token = ""
        if token:
            req.add_header("Authorization", "Bearer " + token)
        ctx = None
        if self.url.startswith("https:"):
            ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file.is_file() else None)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=ctx) as r:
                body = r.read(MAX_LABEL_ANSWER + 1)
        except urllib.error.HTTPError as e:
            self._say(f"the API server answered {e.code} for pods"
                      + (" (the agent's service account needs get on pods)" if e.code in (401, 403) else ""))
            return None
        except (OSError, ValueError) as e:  # refused, timed out, TLS
            self._say(f"the API server at {self.url} cannot be reached: {type(e).__name__}")
            return None
        if len(body) > MAX_LABEL_ANSWER:
            self._say(f"a pod's answer is over {MAX_LABEL_ANSWER} bytes")
            return None
        try:
            meta = json.loads(body).get("metadata", {})
            raw = meta.get("labels") or {}
        except (ValueError, AttributeError):
            self._say("the API server's answer is not a pod")
            return None
        if not isinstance(raw, dict):
            return None
        return {_name(str(k).encode()): _name(str(v).encode()) for k, v in list(raw.items())[:256]}


class PodResolver:
    """GPU UUID -> the ``Pod`` holding it, refreshed from the kubelet every ``interval`` in a
    thread (``start``/``stop``), or on demand (``refresh``: tests)."""

    def __init__(self, socket: str = SOCKET, interval: float = 10.0, timeout: float = 2.0,
                 job_labels: tuple[str, ...] | list[str] = JOB_LABELS, labels: Labels | None = None,
                 grpc_module: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.socket, self.interval, self.timeout = socket, interval, timeout
        self.job_labels = tuple(job_labels)
        self.labels = labels
        self._grpc = grpc_module
        self.clock = clock
        self.by_uuid: dict[str, Pod] = {}  # replaced whole, never changed in place: a tick reads it unlocked
        self.fresh_until = 0.0
        self.job_of: dict[tuple[str, str], str] = {}  # (namespace, pod) -> its job, read once per pod
        self.channel: Any = None
        self.said: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what a tick reads ------------------------------------------------------------------
    def get(self, uuid: str) -> Pod | None:
        if not self.by_uuid or self.clock() > self.fresh_until:
            return None
        return self.by_uuid.get(uuid)

    # -- the lookups ------------------------------------------------------------------------
    def _say(self, why: str, level: int = logging.WARNING) -> None:
        if why != self.said:  # one line per new reason; said again after it recovers
            self.said = why
            log.log(level, "Kubernetes pods: %s", why)

    def _list(self) -> bytes | None:
        if not os.path.exists(self.socket):
            self._say(f"no kubelet pod-resources socket at {self.socket} (not a Kubernetes node, or not mounted "
                      "into the agent's pod); tried again every interval", logging.INFO)
            return None
        if not os.access(self.socket, os.R_OK | os.W_OK):
            self._say(f"permission denied on {self.socket} (the agent needs read and write access to the socket)")
            return None
        if self._grpc is None:
            try:
                import grpc
            except ImportError:
                self._say("grpcio is not installed (pip install 'cmdare[tpu]'): GPUs are named by no pod")
                return None
            self._grpc = grpc
        grpc = self._grpc
        if self.channel is None:
            self.channel = grpc.insecure_channel("unix://" + self.socket,
                                                 options=[("grpc.max_receive_message_length", MAX_ANSWER)])
        rpc = self.channel.unary_unary(LIST, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            return rpc(b"", timeout=self.timeout)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            detail = (e.details() if hasattr(e, "details") else "") or ""
            self._say(f"the kubelet's List failed: {code.name if code else e}: {_name(detail.encode())[:120]}")
            self.close_channel()  # a restarted kubelet makes a new socket: connect afresh
            return None

    def refresh(self) -> bool:
        """Ask the kubelet once; True when it answered (the mapping replaced)."""
        answer = self._list()
        if answer is None:
            return False
        try:
            listed = decode_list(answer)
        except ValueError as e:
            self._say(f"the kubelet's List answer is malformed: {e}")
            return False
        holders: dict[str, set[tuple[str, str, str]]] = {}
        for ns, pod, container, _res, dev in listed:
            uuid = device_uuid(dev)
            if uuid is not None and ns and pod:
                holders.setdefault(uuid, set()).add((ns, pod, container))
        out: dict[str, Pod] = {}
        live = set()
        for uuid, hs in holders.items():
            if len(hs) != 1:  # time-slicing: two pods on one GPU; neither is named
                continue
            ns, pod, container = next(iter(hs))
            live.add((ns, pod))
            out[uuid] = make_pod(ns, pod, container, self._job(ns, pod))
        self.job_of = {k: v for k, v in self.job_of.items() if k in live}  # deleted pods forgotten
        self.by_uuid = out
        self.fresh_until = self.clock() + 3 * self.interval
        if self.said is not None:
            log.info("Kubernetes pods: the kubelet answers again (%d GPUs held by pods)", len(out))
            self.said = None
        return True

    def _job(self, ns: str, pod: str) -> str:
        key = (ns, pod)
        job = self.job_of.get(key)
        if job is None:
            found = self.labels.get(ns, pod) if self.labels is not None else None
            job = next((found[k] for k in self.job_labels if found and found.get(k)), None) or f"{ns}/{pod}"
            if found is not None or self.labels is None:  # a failed read is tried again next time
                self.job_of[key] = job
        return job

    # -- the thread -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self.refresh()  # the first tick already knows the pods
            self._thread = threading.Thread(target=self._run, name="cmdare-kubelet", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception as e:  # never the sampling's problem
                self._say(f"lookup failed: {type(e).__name__}: {_name(str(e).encode())[:120]}")

    def close_channel(self) -> None:
        if self.channel is not None:
            try:
                self.channel.close()
            except Exception:
                pass
            self.channel = None

    def stop(self) -> None:
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout=self.timeout + 1)
        self.close_channel()
