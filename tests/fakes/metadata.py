"""Local HTTP servers that behave as the documented cloud metadata services do, for the
agent's cloud source (tests and bench/revocation_latency.py).

    srv = FakeMetadata("aws").start()      # srv.url -> http://127.0.0.1:PORT
    srv.preempt()                          # a notice appears, as the cloud would post it
    srv.mode = "hang" | "500" | "garbage"  # misbehave; "ok" to recover

GCE: ``/computeMetadata/v1/...`` needs ``Metadata-Flavor: Google`` (403 without) and
answers with it; values carry an ETag, ``?wait_for_change=true&last_etag=E&timeout_sec=N``
answers at once when the ETag is no longer E, else when the value changes or after N s.
AWS IMDSv2: ``PUT /latest/api/token`` with a TTL header gives a token that expires
(``token_ttl_cap`` shortens every token's life, to test renewal); a GET without a valid
token is 401; ``spot/instance-action`` and the rebalance recommendation are 404 until
posted.  Azure: ``Metadata: true`` required (400 without); the scheduled-events document
lists posted events; POSTing ``StartRequests`` approves (removes) them.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class FakeMetadata:
    def __init__(
        self,
        cloud: str,
        *,
        zone: str = "",
        instance_type: str = "",
        spot: bool = True,
        name: str = "vm-1",
        token_ttl_cap: float | None = None,
    ) -> None:
        assert cloud in ("gce", "aws", "azure")
        self.cloud = cloud
        self.mode = "ok"
        self.zone = zone or {"gce": "us-central1-a", "aws": "us-east-1b", "azure": "1"}[cloud]
        self.instance_type = (
            instance_type
            or {
                "gce": "a2-highgpu-1g",
                "aws": "p3.2xlarge",
                "azure": "Standard_NC6s_v3",
            }[cloud]
        )
        self.spot, self.name = spot, name
        self.pending_time: Any = "2026-03-01T11:58:30Z"
        self.token_ttl_cap = token_ttl_cap
        self.cond = threading.Condition()
        self.values = {"preempted": "FALSE", "maintenance-event": "NONE"}
        self.etags = {k: self._etag(k, v) for k, v in self.values.items()}
        self.instance_action: dict[str, Any] | None = None
        self.rebalance: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []
        self.incarnation = 1
        self.tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        self.approved: list[str] = []
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.refused_tokens = 0
        self.announced_at: float | None = None  # time.time() when the last notice appeared
        self.server: ThreadingHTTPServer | None = None
        self.fail_paths: set[str] = set()  # paths (without query) that answer 500 while "ok"

    @staticmethod
    def _etag(key: str, value: str) -> str:
        return hashlib.sha1(f"{key}={value}:{secrets.token_hex(4)}".encode()).hexdigest()[:16]

    # -- control ----------------------------------------------------------------------------
    def start(self) -> FakeMetadata:
        fake = self

        class Handler(_Handler):
            srv = fake

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="fake-metadata", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            with self.cond:
                self.mode = "stopped"
                self.cond.notify_all()
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def _set(self, key: str, value: str) -> None:
        with self.cond:
            self.values[key] = value
            self.etags[key] = self._etag(key, value)
            self.cond.notify_all()

    def preempt(self, lead: float | None = None) -> float:
        """Announce that this VM will be taken away; returns the deadline (unix s)."""
        now = time.time()
        self.announced_at = now
        if self.cloud == "gce":
            self._set("preempted", "TRUE")
            return now + 30
        if self.cloud == "aws":
            deadline = now + (120 if lead is None else lead)
            t = dt.datetime.fromtimestamp(int(deadline), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            with self.cond:
                self.instance_action = {"action": "terminate", "time": t}
            return float(int(deadline))
        deadline = now + (30 if lead is None else lead)
        self.add_event("Preempt", deadline)
        return float(int(deadline))

    def maintenance(self, value: str = "TERMINATE_ON_HOST_MAINTENANCE") -> None:
        self.announced_at = time.time()
        self._set("maintenance-event", value)

    def post_rebalance(self) -> None:
        self.announced_at = time.time()
        with self.cond:
            self.rebalance = {"noticeTime": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}

    def add_event(self, etype: str, not_before: float | None, resources: list[str] | None = None) -> str:
        self.announced_at = time.time()
        eid = secrets.token_hex(8).upper()
        with self.cond:
            self.events.append(
                {
                    "EventId": eid,
                    "EventType": etype,
                    "ResourceType": "VirtualMachine",
                    "Resources": [self.name] if resources is None else resources,
                    "EventStatus": "Scheduled",
                    "NotBefore": email.utils.formatdate(not_before, usegmt=True) if not_before else "",
                    "Description": f"{etype} scheduled by the platform",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            )
            self.incarnation += 1
        return eid

    # -- documents ---------------------------------------------------------------------------
    def gce_instance(self) -> dict[str, Any]:
        return {
            "id": 4412034093029384934,
            "name": self.name,
            "zone": f"projects/123456/zones/{self.zone}",
            "machineType": f"projects/123456/machineTypes/{self.instance_type}",
            "scheduling": {
                "preemptible": "TRUE" if self.spot else "FALSE",
                "provisioningModel": "SPOT" if self.spot else "STANDARD",
            },
            "attributes": {},
        }

    def aws_identity(self) -> dict[str, Any]:
        return {
            "instanceId": "i-0abc123def4567890",
            "instanceType": self.instance_type,
            "region": self.zone[:-1],
            "availabilityZone": self.zone,
            "accountId": "123456789012",
            "pendingTime": self.pending_time,  # when the instance entered "pending" (its launch)
        }

    def azure_instance(self) -> dict[str, Any]:
        return {
            "compute": {
                "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
                "name": self.name,
                "location": "westeurope",
                "zone": self.zone,
                "vmSize": self.instance_type,
                "priority": "Spot" if self.spot else "Regular",
            }
        }


class _Handler(BaseHTTPRequestHandler):
    srv: FakeMetadata
    protocol_version = "HTTP/1.1"

    def log_message(self, *a: Any) -> None:
        pass

    def _send(self, code: int, body: bytes | str | Any, headers: dict[str, str] | None = None) -> None:
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _misbehave(self) -> bool:
        s = self.srv
        if s.mode == "hang":
            with s.cond:
                s.cond.wait_for(lambda: s.mode != "hang", timeout=120)
            self.close_connection = True
            return True
        if s.mode == "500":
            self._send(500, "internal error")
            return True
        if s.mode == "garbage":
            h = {"Metadata-Flavor": "Google", "ETag": "zzz"} if s.cloud == "gce" else {}
            self._send(200, b"\x00\xffgarbage{{<html>", h)
            return True
        return False

    def do_PUT(self) -> None:
        s = self.srv
        s.requests.append(("PUT", self.path))
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        if self._misbehave():
            return
        if s.cloud != "aws" or self.path != "/latest/api/token":
            return self._send(404, "not found")
        try:
            ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
        except ValueError:
            return self._send(400, "missing or bad TTL")
        if not 1 <= ttl <= 21600:
            return self._send(400, "TTL out of range")
        if s.token_ttl_cap is not None:
            ttl = min(ttl, s.token_ttl_cap)  # type: ignore[assignment]
        token = secrets.token_urlsafe(24)
        s.tokens[token] = time.monotonic() + ttl
        self._send(200, token, {"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)})

    def do_POST(self) -> None:
        s = self.srv
        s.requests.append(("POST", self.path))
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        if self._misbehave():
            return
        if s.cloud != "azure" or not self.path.startswith("/metadata/scheduledevents"):
            return self._send(404, "not found")
        if self.headers.get("Metadata") != "true":
            return self._send(400, {"error": "Bad request. Required metadata header not specified"})
        try:
            ids = [r["EventId"] for r in json.loads(body)["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            return self._send(400, {"error": "bad StartRequests body"})
        with s.cond:
            s.approved += ids
            s.events = [e for e in s.events if e["EventId"] not in ids]
            s.incarnation += 1
        self._send(200, "")

    def do_GET(self) -> None:
        s = self.srv
        s.requests.append(("GET", self.path))
        if self._misbehave():
            return
        u = urlsplit(self.path)
        if u.path in s.fail_paths:
            return self._send(500, "internal error")
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        if s.cloud == "gce":
            return self._gce(u.path, q)
        if s.cloud == "aws":
            return self._aws(u.path)
        return self._azure(u.path)

    def _gce(self, path: str, q: dict[str, str]) -> None:
        s = self.srv
        h = {"Metadata-Flavor": "Google"}
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403, "Missing Metadata-Flavor:Google header.", h)
        root = "/computeMetadata/v1/instance/"
        if path == root + "id":
            return self._send(200, str(s.gce_instance()["id"]), h)
        if path == root and q.get("recursive") == "true":
            return self._send(200, s.gce_instance(), {**h, "Content-Type": "application/json"})
        key = path[len(root) :] if path.startswith(root) else ""
        if key not in s.values:
            return self._send(404, "not found", h)
        with s.cond:
            if q.get("wait_for_change") == "true":
                last = q.get("last_etag")
                timeout = float(q.get("timeout_sec", 300))
                s.cond.wait_for(
                    lambda: s.etags[key] != last or s.mode != "ok", timeout=None if last is None else timeout
                )
                if s.mode == "stopped":
                    return
            value, etag = s.values[key], s.etags[key]
        self._send(200, value, {**h, "ETag": etag})

    def _aws(self, path: str) -> None:
        s = self.srv
        tok = self.headers.get("X-aws-ec2-metadata-token")
        if tok is None or s.tokens.get(tok, 0) < time.monotonic():
            s.refused_tokens += 1
            return self._send(401, "")
        with s.cond:
            docs: dict[str, Any] = {
                "/latest/meta-data/instance-id": s.aws_identity()["instanceId"],
                "/latest/dynamic/instance-identity/document": s.aws_identity(),
                "/latest/meta-data/instance-life-cycle": "spot" if s.spot else "on-demand",
                "/latest/meta-data/spot/instance-action": s.instance_action,
                "/latest/meta-data/events/recommendations/rebalance": s.rebalance,
            }
        if docs.get(path) is None:
            return self._send(404, "Not Found")
        self._send(200, docs[path])

    def _azure(self, path: str) -> None:
        s = self.srv
        if self.headers.get("Metadata") != "true":
            return self._send(400, {"error": "Bad request. Required metadata header not specified"})
        if path == "/metadata/instance":
            return self._send(200, s.azure_instance())
        if path == "/metadata/scheduledevents":
            with s.cond:
                doc = {"DocumentIncarnation": s.incarnation, "Events": list(s.events)}
            return self._send(200, doc)
        self._send(404, "not found")
