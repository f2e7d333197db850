"""Cloud source: the VM's identity and revocation notices from the cloud's metadata service.

``start()`` returns at once; a thread detects the cloud (GCE, AWS, Azure, all probed
together, about ``detect_timeout`` on a machine in no cloud), reads the identity and
publishes it as an ``instance`` event (cloud, region, zone, instance id and type, spot
flag, accelerator from the cloud or the NVIDIA driver's list, boot time), then watches for
notices: GCE long-polls (``preempted``, ``maintenance-event``), AWS and Azure polls every
``poll_interval``.  Each notice becomes one ``revocation`` event, handed to the agent at
once (the source wakes it; it is spooled and sent to Kafka ahead of any backlog), and is
remembered in the agent's state file so a restarted agent does not publish it again.

Metadata trouble (timeouts, 5xx, malformed bodies, a refused token) never stops the agent:
the watcher backs off (up to ``backoff_max``), the source's status says what is wrong, and
it recovers by itself.  ``provider = "none"`` (or no cloud found) still publishes the
local identity (boot time, GPUs) and watches nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from cmdare.wire.plugin import Option
from cmdare.wire.units import ConfigError

from . import metadata as cloud
from .base import SOURCES, Emit, Source
from .state import AgentState

log = logging.getLogger("cmdare.agent.cloud")
PROVIDERS = ("auto", "none", *cloud.CLOUDS)


@SOURCES.register
class CloudSource(Source):
    """The VM's identity from the cloud's metadata service, and its revocation notices."""

    name = "cloud"
    OPTIONS = {
        "provider": Option("str", "auto", "auto (detect) | gce | aws | azure | none", choices=PROVIDERS),
        "metadata_url": Option("str", cloud.DEFAULT_BASE, "base URL of the metadata service"),
        "timeout": Option("duration", 2.0, "timeout of one metadata request"),
        "detect_timeout": Option("duration", 1.0, "how long detection waits for a metadata service"),
        "poll_interval": Option("duration", 1.0, "AWS / Azure notice polling interval"),
        "long_poll": Option("duration", 60.0, "GCE wait_for_change timeout of one long poll"),
        "backoff_max": Option("duration", 5.0, "longest wait between retries after metadata errors"),
        "aws_token_ttl": Option("duration", 21600.0, "lifetime asked for an IMDSv2 token"),
        "azure_approve": Option(
            "list",
            [],
            'Azure event types to approve early (StartRequests) once the notice is spooled, e.g. ["Preempt"]',
        ),
        "gpu_dir": Option("str", "/proc/driver/nvidia/gpus", "where the NVIDIA driver lists GPUs"),
    }

    @classmethod
    def parse_config(cls, where: str, raw: Any) -> dict[str, Any]:
        cfg = super().parse_config(where, raw)
        u = urlsplit(cfg["metadata_url"])
        if u.scheme != "http" or not u.netloc:
            raise ConfigError(
                f"{where}.metadata_url: expected an http://host[:port] URL, got {cfg['metadata_url']!r}"
            )
        for key in ("timeout", "detect_timeout", "poll_interval"):
            if not 0.01 <= cfg[key] <= 600:
                raise ConfigError(f"{where}.{key}: must be between 10ms and 10m, got {cfg[key]:g}s")
        if not 1 <= cfg["long_poll"] <= 3600:
            raise ConfigError(f"{where}.long_poll: must be between 1s and 1h")
        bad = [t for t in cfg["azure_approve"] if t not in cloud.AZURE_KINDS]
        if bad:
            raise ConfigError(
                f"{where}.azure_approve: unknown event type {bad[0]!r} (known: {', '.join(cloud.AZURE_KINDS)})"
            )
        return cfg

    def __init__(
        self,
        config: dict[str, Any],
        wake: Callable[[], None] | None = None,
        state: AgentState | None = None,
        boot_time: float | None = None,
        **_: Any,
    ) -> None:
        super().__init__(config)
        self.wake = wake or (lambda: None)
        self.state = state
        self.boot = boot_time if boot_time is not None else cloud.boot_time()
        self.http = cloud.Http(config["metadata_url"], config["timeout"])
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.queue: list[tuple[str, dict[str, Any], float, str | None]] = []
        self.problems: dict[str, str] = {}  # watcher -> what is wrong now
        self.identity: cloud.Identity | None = None
        self.client: Any = None
        self.emitted: set[str] = set()  # notice ids handed to the agent by this process
        self._queued: set[str] = set()
        self.threads: list[threading.Thread] = []

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self.threads:
            return
        self._thread(self._main, "cmdare-cloud")

    def _thread(self, target: Callable[..., None], name: str, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        self.threads.append(t)
        t.start()

    def settle(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.identity is None and not self.problems:
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()

    # -- what the agent calls -------------------------------------------------------------
    def collect(self, emit: Emit) -> None:
        self.collect_urgent(emit)
        with self.lock:
            problems = dict(self.problems)
        if problems:
            raise RuntimeError("; ".join(f"{k}: {v}" for k, v in sorted(problems.items()))[:500])

    def collect_urgent(self, emit: Emit) -> None:
        with self.lock:
            queue, self.queue = self.queue, []
        for type_, data, ts, notice_id in queue:
            emit(type_, data, ts)
            if notice_id:
                self.emitted.add(notice_id)
                if self.state is not None:
                    self.state.add(notice_id)

    # -- threads --------------------------------------------------------------------------
    def _problem(self, who: str, msg: str | None) -> None:
        with self.lock:
            if msg is None:
                if self.problems.pop(who, None) is not None:
                    log.info("cloud %s: recovered", who)
            else:
                if self.problems.get(who) != msg:
                    log.warning("cloud %s: %s", who, msg)
                self.problems[who] = msg

    def _put(self, type_: str, data: dict[str, Any], ts: float, notice_id: str | None = None) -> None:
        with self.lock:
            self.queue.append((type_, data, ts, notice_id))
        self.wake()

    def _retry(self, who: str, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` until it succeeds (backing off, reporting the problem) or the source
        stops (None)."""
        delay = min(1.0, self.config["backoff_max"])
        while not self.stop.is_set():
            try:
                out = fn()
                self._problem(who, None)
                return out
            except cloud.MetadataError as e:
                self._problem(who, str(e))
            except Exception as e:  # a bug must not kill the watcher silently
                self._problem(who, f"{type(e).__name__}: {e}")
            self.stop.wait(delay)
            delay = min(delay * 2, self.config["backoff_max"])
        return None

    def _main(self) -> None:
        cfg = self.config
        provider = cfg["provider"]
        if provider == "auto":
            self.client = cloud.detect(self.http, cfg["detect_timeout"], cfg["aws_token_ttl"])
            log.info("cloud: %s", self.client.name if self.client else "none detected")
        elif provider != "none":
            self.client = {
                "gce": lambda: cloud.Gce(self.http),
                "aws": lambda: cloud.Aws(self.http, cfg["aws_token_ttl"]),
                "azure": lambda: cloud.Azure(self.http),
            }[provider]()
        # notices must not wait for the identity: GCE and AWS watchers start first (Azure
        # needs the VM's name to pick its own events, so it watches once that is known)
        if isinstance(self.client, cloud.Gce):
            self._thread(self._gce, "cmdare-gce-maintenance", "maintenance-event")
            self._thread(self._gce, "cmdare-gce-preempted", "preempted")
        elif isinstance(self.client, cloud.Aws):
            self._thread(self._poll_loop, "cmdare-aws-notices")
        if self.client is not None:
            ident = self._retry("identity", self.client.identity)
            if ident is None:
                return
        else:
            ident = cloud.Identity()
        model, count = cloud.local_gpus(cfg["gpu_dir"])
        if ident.accelerator is None and model:
            ident.accelerator, ident.accelerator_count = model, count
        ident.boot_time = self.boot
        self.identity = ident
        self._put("instance", ident.data(), time.time())
        if isinstance(self.client, cloud.Azure):
            self._poll_loop()

    def _key(self, n: cloud.Notice) -> str:
        return f"{int(self.boot)}:{n.notice_id}"  # notices belong to this boot of the VM

    def _spooled(self, key: str) -> bool:
        """Handed to the agent by this process, or published by an earlier one."""
        return key in self.emitted or (self.state is not None and self.state.published(key))

    def _notice(self, n: cloud.Notice) -> None:
        key = self._key(n)
        if key in self._queued or (self.state is not None and self.state.published(key)):
            return
        self._queued.add(key)
        now = time.time()
        log.warning(
            "cloud notice: %s %s (deadline in %s s)",
            n.cloud,
            n.kind,
            f"{n.deadline - now:.0f}" if n.deadline else "?",
        )
        self._put("revocation", {**n.data(now), "boot_time": self.boot}, now, key)

    def _gce(self, key: str) -> None:
        gce: cloud.Gce = self.client
        etag: str | None = None
        delay = min(1.0, self.config["backoff_max"])
        while not self.stop.is_set():
            try:
                value, new_etag = gce.poll(key, etag, self.config["long_poll"])
                self._gce_value(key, value, new_etag)
                self._problem(key, None)
                delay = min(1.0, self.config["backoff_max"])
                if new_etag is None:  # a server that does not long-poll: do not spin
                    self.stop.wait(self.config["poll_interval"])
                etag = new_etag
            except cloud.MetadataError as e:
                self._problem(key, str(e))
                self.stop.wait(delay)
                delay = min(delay * 2, self.config["backoff_max"])

    def _gce_value(self, key: str, value: str, etag: str | None) -> None:
        if not value or not value.replace("_", "").isalnum() or not value.isupper():
            raise cloud.MetadataError(f"GCE {key}: malformed value {value[:40]!r}")
        if key == "preempted":
            if value not in ("TRUE", "FALSE"):
                raise cloud.MetadataError(f"GCE preempted: malformed value {value[:40]!r}")
            if value == "TRUE":
                self._notice(
                    cloud.Notice(
                        "gce",
                        "preemption",
                        "gce:preempted",
                        True,
                        action="stop",
                        deadline=time.time() + cloud.GCE_PREEMPT_NOTICE,
                    )
                )
        elif value != "NONE":
            self._notice(
                cloud.Notice(
                    "gce",
                    "maintenance",
                    f"gce:maintenance:{value}:{etag or int(time.time())}",
                    False,
                    action=value,
                    deadline=time.time() + cloud.GCE_MAINTENANCE_NOTICE,
                )
            )

    def _poll_loop(self) -> None:
        approve = set(self.config["azure_approve"])
        approved: set[str] = set()
        interval = self.config["poll_interval"]
        while not self.stop.is_set():
            t0 = time.monotonic()
            notices = self._retry("notices", self.client.notices)
            if notices is None:
                return
            for n in notices:
                self._notice(n)
                key = self._key(n)
                # approve only what the agent has already spooled (emitted before a flush)
                if (
                    isinstance(self.client, cloud.Azure)
                    and n.action in approve
                    and key not in approved
                    and self._spooled(key)
                ):
                    eid = n.notice_id.split(":", 1)[1]
                    try:
                        self.client.approve(eid)
                        approved.add(key)
                        log.warning("cloud: approved Azure event %s (%s)", eid, n.action)
                        self._problem("approve", None)
                    except cloud.MetadataError as e:
                        self._problem("approve", str(e))
            self.stop.wait(max(0.0, interval - (time.monotonic() - t0)))
