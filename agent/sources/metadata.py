"""Cloud metadata services: which cloud this VM is in, its identity, and revocation notices.

All three clouds serve instance metadata at 169.254.169.254 (the base URL is configurable,
tests point it at local servers), each with its own paths and headers:

- GCE: ``/computeMetadata/v1/...`` with ``Metadata-Flavor: Google`` (the reply carries the
  same header).  ``instance/preempted`` (FALSE -> TRUE about 30 s before a preemption) and
  ``instance/maintenance-event`` (NONE -> MIGRATE_/TERMINATE_ON_HOST_MAINTENANCE about 60 s
  ahead) are long-polled with ``?wait_for_change=true&last_etag=E``: the server answers at
  once when the value's ETag is no longer E, so no change between two polls is missed.
- AWS (IMDSv2): a session token from ``PUT /latest/api/token``
  (``X-aws-ec2-metadata-token-ttl-seconds``), sent as ``X-aws-ec2-metadata-token`` and
  renewed before it expires (or at once when a request is refused with 401).
  ``meta-data/spot/instance-action`` is 404 until an interruption is scheduled, then
  ``{"action": "terminate|stop|hibernate", "time": "2026-11-22T12:00:00Z"}`` two minutes
  ahead; ``meta-data/events/recommendations/rebalance`` gives ``{"noticeTime": ...}``.
- Azure: ``/metadata/instance`` and ``/metadata/scheduledevents`` with ``Metadata: true``;
  an event document lists events (``Preempt``, ``Terminate``, ``Reboot``, ``Redeploy``,
  ``Freeze``) with ``NotBefore``; POSTing ``{"StartRequests": [{"EventId": ...}]}``
  approves one early.

Requests never use a proxy and always have a timeout; every failure is a
``MetadataError`` with a one-line reason.  Nothing here blocks the agent's main loop: the
``cloud`` source runs detection and watchers on their own threads.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("cmdare.agent.cloud")

DEFAULT_BASE = "http://169.254.169.254"
CLOUDS = ("gce", "aws", "azure")
GCE_PREEMPT_NOTICE = 30.0  # seconds GCE documents between preempted=TRUE and the stop
GCE_MAINTENANCE_NOTICE = 60.0
AZURE_API = "2020-07-01"
AZURE_INSTANCE_API = "2021-02-01"


class MetadataError(Exception):
    """A metadata request failed; str() is a one-line reason naming the URL."""


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self, what: str) -> Any:
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            raise MetadataError(f"{what}: malformed body (not JSON): {self.body[:60]!r}") from None


class Http:
    """Plain HTTP to the metadata service: no proxy, a timeout on every request."""

    def __init__(self, base: str, timeout: float) -> None:
        self.base = base.rstrip("/")
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        data: bytes | None = None,
        timeout: float | None = None,
    ) -> Reply:
        url = self.base + path
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(req, timeout=timeout or self.timeout) as r:
                return Reply(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read(1 << 20))
        except urllib.error.HTTPError as e:
            try:
                body = e.read(4096)
            except OSError:
                body = b""
            return Reply(e.code, {k.lower(): v for k, v in (e.headers or {}).items()}, body)
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in str(reason):
                reason = f"timed out after {timeout or self.timeout:g}s"
            raise MetadataError(f"{method} {url}: {reason}") from None


@dataclass
class Identity:
    cloud: str = "none"
    region: str | None = None
    zone: str | None = None
    instance_id: str | None = None
    instance_type: str | None = None
    name: str | None = None
    spot: bool | None = None
    accelerator: str | None = None
    accelerator_count: int | None = None
    boot_time: float | None = None
    launched_at: float | None = None  # when the cloud began launching it (AWS pendingTime)

    def data(self) -> dict[str, Any]:
        """The ``instance`` event's data: the fields that are known."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Notice:
    """One revocation / maintenance notice as a cloud announced it."""

    cloud: str
    kind: str  # preemption | spot-interruption | maintenance | rebalance | termination | reboot | ...
    notice_id: str  # stable across polls: the same notice is published once
    revokes: bool  # the VM is being taken away (its life ends as 'revoked')
    action: str | None = None
    deadline: float | None = None  # unix seconds when the cloud acts
    detail: str | None = None

    def data(self, seen: float) -> dict[str, Any]:
        d: dict[str, Any] = {
            "cloud": self.cloud,
            "kind": self.kind,
            "notice_id": self.notice_id,
            "revokes": self.revokes,
        }
        if self.action:
            d["action"] = self.action
        if self.deadline is not None:
            d["deadline"] = round(self.deadline, 3)
            d["lead_seconds"] = round(self.deadline - seen, 3)
        if self.detail:
            d["detail"] = self.detail[:500]
        return d


def _iso(s: Any, what: str) -> float:
    """ISO-8601 (AWS) time to unix seconds."""
    if not isinstance(s, str):
        raise MetadataError(f"{what}: expected a time string, got {s!r}"[:200])
    try:
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise MetadataError(f"{what}: unreadable time {s!r}"[:200]) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def _rfc1123(s: Any, what: str) -> float | None:
    """Azure's NotBefore ("Mon, 19 Sep 2016 18:29:47 GMT"); empty: the event has started."""
    if s in (None, ""):
        return None
    try:
        return email.utils.parsedate_to_datetime(str(s)).timestamp()
    except (TypeError, ValueError):
        raise MetadataError(f"{what}: unreadable NotBefore {s!r}"[:200]) from None


def local_gpus(gpu_dir: str | Path) -> tuple[str | None, int | None]:
    """NVIDIA GPUs the driver lists (``/proc/driver/nvidia/gpus/*/information``): the model
    of the first one and how many; (None, None) without the driver."""
    try:
        dirs = sorted(p for p in Path(gpu_dir).iterdir() if p.is_dir())
    except OSError:
        return None, None
    if not dirs:
        return None, None
    model = None
    try:
        for line in (dirs[0] / "information").read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return model, len(dirs)


# -- GCE ------------------------------------------------------------------------------------
class Gce:
    name = "gce"
    H = {"Metadata-Flavor": "Google"}
    ROOT = "/computeMetadata/v1/"

    def __init__(self, http: Http) -> None:
        self.http = http

    def detect(self, timeout: float) -> bool:
        r = self.http.request("GET", self.ROOT + "instance/id", self.H, timeout=timeout)
        return r.status == 200 and r.headers.get("metadata-flavor", "").lower() == "google"

    def identity(self) -> Identity:
        r = self.http.request("GET", self.ROOT + "instance/?recursive=true", self.H)
        if r.status != 200:
            raise MetadataError(f"GCE instance metadata: HTTP {r.status}")
        d = r.json("GCE instance metadata")
        if not isinstance(d, dict):
            raise MetadataError("GCE instance metadata: expected an object")
        zone = str(d.get("zone", "")).rsplit("/", 1)[-1] or None
        sched = d.get("scheduling") or {}
        spot = (
            str(sched.get("preemptible", "")).upper() == "TRUE"
            or str(sched.get("provisioningModel", "")).upper() == "SPOT"
        )
        attrs = d.get("attributes") or {}
        return Identity(
            cloud="gce",
            zone=zone,
            region=zone.rsplit("-", 1)[0] if zone and "-" in zone else None,
            instance_id=str(d["id"]) if d.get("id") is not None else None,
            instance_type=str(d.get("machineType", "")).rsplit("/", 1)[-1] or None,
            name=d.get("name") or None,
            spot=spot,
            accelerator=(f"tpu-{attrs['accelerator-type']}" if attrs.get("accelerator-type") else None),
        )

    def poll(self, key: str, etag: str | None, wait: float) -> tuple[str, str | None]:
        """(value, etag) of ``instance/<key>``; with an etag, waits up to ``wait`` s for a
        change from it (the server answers at once if it already changed)."""
        path = self.ROOT + "instance/" + key
        timeout = None
        if etag is not None:
            path += f"?wait_for_change=true&last_etag={etag}&timeout_sec={int(wait)}"
            timeout = wait + 5
        r = self.http.request("GET", path, self.H, timeout=timeout)
        if r.status != 200:
            raise MetadataError(f"GCE {key}: HTTP {r.status}")
        try:
            value = r.body.decode("ascii").strip()
        except UnicodeDecodeError:
            raise MetadataError(f"GCE {key}: malformed body {r.body[:40]!r}") from None
        return value, r.headers.get("etag")


# -- AWS ------------------------------------------------------------------------------------
class Aws:
    name = "aws"

    def __init__(self, http: Http, token_ttl: float = 21600) -> None:
        self.http = http
        self.ttl = max(1, int(token_ttl))
        self.token: str | None = None
        self.token_expires = 0.0

    def _token(self, force: bool = False, timeout: float | None = None) -> str:
        # renew at 80 % of the token's life, or when a request was refused
        if force or self.token is None or time.monotonic() >= self.token_expires:
            r = self.http.request(
                "PUT",
                "/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": str(self.ttl)},
                data=b"",
                timeout=timeout,
            )
            if r.status != 200:
                raise MetadataError(f"AWS IMDSv2 token: HTTP {r.status}")
            tok = r.body.strip()
            if not tok or not tok.isascii() or not tok.decode().isprintable():
                raise MetadataError(f"AWS IMDSv2 token: malformed token {r.body[:40]!r}")
            self.token = tok.decode()
            self.token_expires = time.monotonic() + 0.8 * self.ttl
        return self.token

    def get(self, path: str, timeout: float | None = None) -> Reply:
        r = self.http.request(
            "GET", path, {"X-aws-ec2-metadata-token": self._token(timeout=timeout)}, timeout=timeout
        )
        if r.status == 401:  # expired or revoked token: one fresh try
            r = self.http.request(
                "GET", path, {"X-aws-ec2-metadata-token": self._token(force=True)}, timeout=timeout
            )
        return r

    def detect(self, timeout: float) -> bool:
        self._token(force=True, timeout=timeout)
        r = self.get("/latest/meta-data/instance-id", timeout=timeout)
        return r.status == 200

    def identity(self) -> Identity:
        r = self.get("/latest/dynamic/instance-identity/document")
        if r.status != 200:
            raise MetadataError(f"AWS instance identity document: HTTP {r.status}")
        d = r.json("AWS instance identity document")
        if not isinstance(d, dict):
            raise MetadataError("AWS instance identity document: expected an object")
        life = self.get("/latest/meta-data/instance-life-cycle")
        launched = None
        if d.get("pendingTime") is not None:
            try:
                launched = _iso(d["pendingTime"], "AWS pendingTime")
            except MetadataError as e:  # the rest of the identity is still good
                log.debug("%s", e)
        return Identity(
            cloud="aws",
            launched_at=launched,
            region=d.get("region"),
            zone=d.get("availabilityZone"),
            instance_id=d.get("instanceId"),
            instance_type=d.get("instanceType"),
            spot=(life.body.decode("ascii", "replace").strip() == "spot") if life.status == 200 else None,
        )

    def notices(self) -> list[Notice]:
        out = []
        r = self.get("/latest/meta-data/spot/instance-action")
        if r.status == 200:
            d = r.json("AWS spot/instance-action")
            if not isinstance(d, dict) or "action" not in d:
                raise MetadataError(f"AWS spot/instance-action: unexpected document {r.body[:80]!r}")
            t = _iso(d.get("time"), "AWS spot/instance-action")
            action = str(d["action"])
            out.append(
                Notice(
                    "aws",
                    "spot-interruption",
                    f"aws:instance-action:{action}:{d.get('time')}",
                    True,
                    action=action,
                    deadline=t,
                )
            )
        elif r.status != 404:
            raise MetadataError(f"AWS spot/instance-action: HTTP {r.status}")
        r = self.get("/latest/meta-data/events/recommendations/rebalance")
        if r.status == 200:
            d = r.json("AWS rebalance recommendation")
            if not isinstance(d, dict) or "noticeTime" not in d:
                raise MetadataError(f"AWS rebalance recommendation: unexpected document {r.body[:80]!r}")
            _iso(d["noticeTime"], "AWS rebalance recommendation")
            out.append(Notice("aws", "rebalance", f"aws:rebalance:{d['noticeTime']}", False))
        elif r.status != 404:
            raise MetadataError(f"AWS rebalance recommendation: HTTP {r.status}")
        return out


# -- Azure ----------------------------------------------------------------------------------
AZURE_KINDS = {
    "Preempt": ("preemption", True),
    "Terminate": ("termination", False),
    "Reboot": ("reboot", False),
    "Redeploy": ("redeploy", False),
    "Freeze": ("freeze", False),
}


class Azure:
    name = "azure"
    H = {"Metadata": "true"}

    def __init__(self, http: Http) -> None:
        self.http = http
        self.vm_name: str | None = None

    def detect(self, timeout: float) -> bool:
        r = self.http.request(
            "GET", f"/metadata/instance?api-version={AZURE_INSTANCE_API}", self.H, timeout=timeout
        )
        if r.status != 200:
            return False
        d = r.json("Azure instance metadata")
        return isinstance(d, dict) and isinstance(d.get("compute"), dict)

    def identity(self) -> Identity:
        r = self.http.request("GET", f"/metadata/instance?api-version={AZURE_INSTANCE_API}", self.H)
        if r.status != 200:
            raise MetadataError(f"Azure instance metadata: HTTP {r.status}")
        d = r.json("Azure instance metadata")
        c = d.get("compute") if isinstance(d, dict) else None
        if not isinstance(c, dict):
            raise MetadataError("Azure instance metadata: no 'compute' object")
        self.vm_name = c.get("name") or None
        region = c.get("location") or None
        z = c.get("zone") or None
        return Identity(
            cloud="azure",
            region=region,
            zone=f"{region}-{z}" if region and z else z,
            instance_id=c.get("vmId") or None,
            instance_type=c.get("vmSize") or None,
            name=self.vm_name,
            spot=str(c.get("priority", "")).lower() == "spot" if c.get("priority") else None,
        )

    def events(self) -> list[dict[str, Any]]:
        r = self.http.request("GET", f"/metadata/scheduledevents?api-version={AZURE_API}", self.H)
        if r.status != 200:
            raise MetadataError(f"Azure scheduled events: HTTP {r.status}")
        d = r.json("Azure scheduled events")
        evs = d.get("Events") if isinstance(d, dict) else None
        if not isinstance(evs, list) or not all(isinstance(e, dict) and e.get("EventId") for e in evs):
            raise MetadataError(f"Azure scheduled events: unexpected document {r.body[:80]!r}")
        return evs

    def notices(self) -> list[Notice]:
        out = []
        for e in self.events():
            res = e.get("Resources") or []
            if self.vm_name and res and self.vm_name not in res:
                continue  # an event for another VM of the same availability set / scale set
            etype = str(e.get("EventType", ""))
            kind, revokes = AZURE_KINDS.get(etype, (etype.lower() or "unknown", False))
            out.append(
                Notice(
                    "azure",
                    kind,
                    f"azure:{e['EventId']}",
                    revokes,
                    action=etype,
                    deadline=_rfc1123(e.get("NotBefore"), f"Azure event {e['EventId']}"),
                    detail=str(e.get("Description") or "")[:500] or None,
                )
            )
        return out

    def approve(self, event_id: str) -> None:
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        r = self.http.request(
            "POST",
            f"/metadata/scheduledevents?api-version={AZURE_API}",
            {**self.H, "Content-Type": "application/json"},
            data=body,
        )
        if r.status not in (200, 204):
            raise MetadataError(f"Azure StartRequests for {event_id}: HTTP {r.status}")


def detect(http: Http, timeout: float, aws_token_ttl: float = 21600) -> Gce | Aws | Azure | None:
    """Probe the three clouds at once; the first that answers as itself wins, within about
    ``timeout`` seconds (a machine in no cloud never waits longer)."""
    clients: list[Any] = [Gce(http), Aws(http, aws_token_ttl), Azure(http)]
    found: list[Any] = []
    done = threading.Event()
    left = [len(clients)]
    lock = threading.Lock()

    def probe(c: Any) -> None:
        try:
            ok = c.detect(timeout)
        except MetadataError as e:
            log.debug("cloud detection: %s: %s", c.name, e)
            ok = False
        with lock:
            if ok:
                found.append(c)
                done.set()
            left[0] -= 1
            if left[0] == 0:
                done.set()

    for c in clients:
        threading.Thread(target=probe, args=(c,), name=f"cmdare-detect-{c.name}", daemon=True).start()
    done.wait(timeout * 2 + 1)
    with lock:
        return found[0] if found else None


def boot_time() -> float:
    """When this machine booted (unix seconds), from the kernel (``btime`` in /proc/stat)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        pass
    import psutil

    return float(psutil.boot_time())


def system_state() -> str | None:
    """systemd's state of the whole system (``starting`` while it boots, ``running``,
    ``degraded``, ``stopping``...); None without systemd or when it does not answer."""
    import shutil
    import subprocess

    exe = shutil.which("systemctl")
    if not exe or not Path("/run/systemd/system").is_dir():
        return None
    try:
        out = subprocess.run(
            [exe, "is-system-running"], capture_output=True, text=True, timeout=1.0, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out if out.isidentifier() and len(out) <= 32 else None


def system_stopping() -> bool:
    """Whether the operating system is shutting down (systemd's state is 'stopping'), so a
    SIGTERM is part of a shutdown rather than a service stop."""
    return system_state() == "stopping"


__all__ = [
    "CLOUDS",
    "DEFAULT_BASE",
    "Aws",
    "Azure",
    "Gce",
    "Http",
    "Identity",
    "MetadataError",
    "Notice",
    "boot_time",
    "detect",
    "local_gpus",
    "system_state",
    "system_stopping",
]
