"""Alertmanager's v2 API (``POST /api/v2/alerts``) or a generic webhook (Alertmanager's
webhook payload), and the delivery state every delivering receiver keeps.

Semantics (Alertmanager's, as Prometheus sends to it): a new firing episode is due at
once; while it fires it is due again every ``resend`` (``endsAt`` a little ahead); its
resolution is due once, with its ``endsAt``, and owed across restarts once the firing was
handed over (``Alert.notified``, saved before sending). Sending runs on the receiver's own
thread with retries and capped exponential backoff, each attempt bounded by one deadline
on the whole exchange (connect, send, headers, body): a receiver that hangs, trickles,
fails or refuses never blocks evaluation or ingest, and what it has not taken is kept."""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any

from ..evaluate import utcnow
from ..state import Alert, Engine
from . import receiver_label

log = logging.getLogger("cmdare.alerts")
_NEVER = dt.datetime(1970, 1, 1)
# the documented delivery bounds (docs/alerts.md, "Delivery"): one exchange's whole time, the
# backoff's cap, a firing alert's default repeat
TIMEOUT, BACKOFF_MAX, RESEND = 5.0, 30.0, 60.0
MAX_ITEMS = 500  # alerts one delivery carries: a bulk group goes in parts


def _urgent(it: Item) -> bool:
    """Critical alerts (a revocation, a lost node, a crash) go before everything else, in
    a delivery of their own: never behind a bulk group."""
    return it.body.get("labels", {}).get("severity") == "critical"


@dataclass
class Item:
    key: tuple[str, str]
    episode: Any  # the firing's fired_at: one episode of the instance
    resolved: bool
    body: dict[str, Any]


def _iso(t: Any) -> str:
    return t.isoformat(timespec="milliseconds") + "Z"


class Receiver:
    """Delivery state and the sending thread; subclasses say how a batch is delivered."""

    kind = "?"

    def __init__(self, label: str, resend: float = RESEND, timeout: float = TIMEOUT, backoff_max: float = BACKOFF_MAX,
                 generator: str = "http://localhost/cmdare") -> None:
        self.label = label
        self.resend, self.timeout, self.backoff_max, self.generator = resend, timeout, backoff_max, generator
        # handed over to the thread: key -> (episode, resolved, when); delivered resolutions
        self.handed: dict[tuple[str, str], tuple[Any, bool, dt.datetime]] = {}
        self.resolved_sent: set[tuple[tuple[str, str], Any]] = set()
        self.sent_total = self.failed_total = 0
        self.last_error: str | None = None
        self.engine: Engine | None = None
        self._batch: dict[tuple[str, str], Item] = {}
        self._cv = threading.Condition()
        self._stop = False
        self._sending = False
        self.thread = threading.Thread(target=self._run, name=f"cmdare-alerts-{self.kind}", daemon=True)
        self.thread.start()

    @property
    def name(self) -> str:
        """What metrics and logs call it: never its URL's credentials, path or query."""
        return f"{self.kind}:{self.label}"

    def restore(self, engine: Engine) -> None:
        """A previous run's deliveries: firing episodes handed over are resent at once
        unless known delivered within ``resend``; resolutions owed stay owed."""
        self.engine = engine
        for a in engine.snapshot():
            key = (a.rule, a.fingerprint)
            if a.notified:
                self.handed[key] = (a.fired_at, False, a.last_sent or _NEVER)
            if a.sent_resolved:
                self.resolved_sent.add((key, a.fired_at))

    def due(self, engine: Engine, rules: set[str]) -> list[Item]:
        """What is due of these rules' alerts: new and re-due firing episodes, owed
        resolutions. Marked handed over here; ``send`` queues them once saved."""
        self.engine = engine
        now = utcnow()
        out = []
        for a in engine.snapshot():
            if a.rule not in rules:
                continue
            key = (a.rule, a.fingerprint)
            h = self.handed.get(key)
            if a.state == "firing":
                if h is None or h[0] != a.fired_at or h[1] or (now - h[2]).total_seconds() >= self.resend:
                    out.append(Item(key, a.fired_at, False, self._item(a, now)))
            elif a.state == "resolved" and (key, a.fired_at) not in self.resolved_sent:
                owed = a.notified or (h is not None and h[0] == a.fired_at)
                if owed and not (h is not None and h[0] == a.fired_at and h[1]):
                    out.append(Item(key, a.fired_at, True, self._item(a, now)))
        for it in out:
            self.handed[it.key] = (it.episode, it.resolved, now)
        return out

    def send(self, items: list[Item]) -> None:
        if not items:
            return
        with self._cv:
            for it in items:  # a newer state of an alert replaces one not yet delivered
                self._batch[it.key] = it
            self._cv.notify()

    def _item(self, a: Alert, now: Any) -> dict[str, Any]:
        from urllib.parse import quote

        ends = a.resolved_at if a.state == "resolved" else now + dt.timedelta(seconds=4 * self.resend)
        d = {
            "labels": a.labels, "annotations": a.annotations,
            "startsAt": _iso(a.fired_at or a.active_at), "endsAt": _iso(ends),
            "generatorURL": f"{self.generator}/ui/alerts?rule={quote(a.rule, safe='')}",
        }
        if self.kind in ("webhook", "kafka"):
            d.update(status="resolved" if a.state == "resolved" else "firing", fingerprint=a.fingerprint)
        return d

    def _deliver(self, items: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        delay = 0.5
        while True:
            with self._cv:
                while not self._batch and not self._stop:
                    self._cv.wait()
                if self._stop and not self._batch:
                    return
                batch = self._take()
                self._sending = True
            try:
                self._deliver([it.body for it in batch.values()])
            except Exception as e:  # refused, timed out, 4xx/5xx: keep it, back off, retry
                self._sending = False
                self.failed_total += 1
                msg = f"{type(e).__name__}: {str(e)[:200]}"
                if msg != self.last_error:
                    log.warning("alert receiver %s: %s (retrying with backoff)", self.name, msg)
                self.last_error = msg
                with self._cv:  # newer versions of the same alerts win; the rest go again
                    self._batch = {**batch, **self._batch}
                    if self._stop:
                        return
                    self._cv.wait(delay)
                delay = min(delay * 2, self.backoff_max)
                continue
            delay = 0.5
            if self.last_error:
                log.info("alert receiver %s: delivering again", self.name)
            self.last_error = None
            self.sent_total += 1
            now = utcnow()
            for it in batch.values():
                if it.resolved:
                    self.resolved_sent.add((it.key, it.episode))
            if self.engine is not None:
                self.engine.delivered([(it.key, it.episode, it.resolved) for it in batch.values()], now)
            self._sending = False

    def _take(self) -> dict[tuple[str, str], Item]:
        """The next delivery (under the lock): the critical alerts queued, else at most
        MAX_ITEMS of the rest, oldest first; what is left waits for the next one."""
        keys = [k for k, it in self._batch.items() if _urgent(it)][:MAX_ITEMS]
        if not keys:
            keys = list(self._batch)[:MAX_ITEMS]
        return {k: self._batch.pop(k) for k in keys}

    def idle(self) -> bool:
        """Nothing queued and nothing being sent."""
        with self._cv:
            return not self._batch and not self._sending

    def stop(self, grace: float = 3.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self.thread.join(timeout=grace)


class HttpReceiver(Receiver):
    def __init__(self, kind: str, url: str, resend: float = RESEND, timeout: float = TIMEOUT,
                 backoff_max: float = BACKOFF_MAX,
                 generator: str = "http://localhost/cmdare", token: str | None = None, basic: str | None = None) -> None:
        label, url, self.basic = receiver_label(url)
        self.kind = kind
        self.url = url.rstrip("/")
        self.endpoint = self.url + "/api/v2/alerts" if kind == "alertmanager" else self.url
        self.token = token
        if basic:  # user:password from a file
            import base64

            self.basic = base64.b64encode(basic.encode()).decode()
        super().__init__(label, resend, timeout, backoff_max, generator)

    def _payload(self, items: list[dict[str, Any]]) -> bytes:
        if self.kind == "alertmanager":
            return json.dumps(items).encode()
        firing = any(i["status"] == "firing" for i in items)
        common = dict(set.intersection(*(set(i["labels"].items()) for i in items))) if items else {}
        return json.dumps({
            "version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": "firing" if firing else "resolved",
            "receiver": "cmdare", "groupLabels": {}, "commonLabels": common, "commonAnnotations": {},
            "externalURL": self.generator, "alerts": items,
        }).encode()

    def _deliver(self, items: list[dict[str, Any]]) -> None:
        self._post(self._payload(items))

    def _post(self, body: bytes) -> None:
        """One POST, all of it within ``timeout``: a timer shuts the socket at the deadline
        (a per-read timeout lets a server that trickles a byte at a time hold it forever)."""
        import http.client
        import ssl
        import urllib.parse

        u = urllib.parse.urlsplit(self.endpoint)
        if u.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                u.hostname or "", u.port, timeout=self.timeout, context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=self.timeout)
        headers = {"Content-Type": "application/json", "User-Agent": "cmdare-collector"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        elif self.basic:
            headers["Authorization"] = f"Basic {self.basic}"
        fired = threading.Event()

        def abort() -> None:
            fired.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        timer = threading.Timer(self.timeout, abort)
        timer.daemon = True
        timer.start()
        try:
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            conn.request("POST", path, body, headers)
            r = conn.getresponse()
            r.read(65536)
            if r.status >= 300:
                raise OSError(f"HTTP {r.status}")
        except (OSError, http.client.HTTPException):
            if fired.is_set():
                raise TimeoutError(f"no complete answer within {self.timeout:g} s") from None
            raise
        finally:
            timer.cancel()
            conn.close()
