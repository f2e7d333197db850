"""The agent's main loop.

Every ``interval`` (aligned to the wall clock) each enabled source collects once; each
source's success and duration become a ``status`` event; the tick's events are appended
to the spool in one write.  A source that raises fails only its own tick.  A shipper
thread forwards the spool to Kafka when a sink URL is configured.

SIGTERM / SIGINT: stop sampling, give the shipper up to ``STOP_GRACE`` seconds to flush,
close the spool, exit - within 5 s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cmdare.wire.events import Encoded, EventFactory, jstr

from . import __version__
from .config import AgentConfig
from .exporters import MetricStore, OtlpExporter, PrometheusExporter
from .sdnotify import Notifier
from .sinks.kafka import KafkaSink
from .sinks.shipper import Shipper
from .sinks.spool import Spool
from .sources import REGISTRY, Source, SourceUnavailable
from .sources import metadata as cloud
from .sources.state import AgentState

log = logging.getLogger("cmdare.agent")
STOP_GRACE = 3.0


class SourceRunner:
    """Wraps one source: start with retry, per-tick timing, state changes reported once."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.state = "new"
        self.started = False

    def tick(self, emit: Callable[..., None], status: Callable[..., None]) -> None:
        name = self.source.name
        t0 = time.perf_counter()
        try:
            if not self.started:
                self.source.start()
                self.started = True
            self.source.collect(emit)
            state, msg = "ok", None
        except SourceUnavailable as e:
            state, msg = "unavailable", str(e)
            self.started = False
        except Exception as e:
            state, msg = "error", f"{type(e).__name__}: {e}"[:500]
        dur = round(time.perf_counter() - t0, 6)
        changed = state != self.state
        if changed:
            if state == "ok":
                log.info("source %s: ok", name)
            elif state == "unavailable":
                log.warning("source %s: unavailable: %s", name, msg)
            else:
                log.error("source %s: %s", name, msg)
        self.state = state
        if state == "unavailable" and not changed:
            return  # said once; not every tick
        status(name, state, dur, msg if (msg or changed) else None)


class Agent:
    def __init__(
        self, cfg: AgentConfig, adapters: dict[str, Any] | None = None, notifier: Notifier | None = None
    ) -> None:
        self.cfg = cfg
        self.factory = EventFactory(cfg.node, cfg.role, cfg.job, cfg.labels, rows=cfg.sample_format == "rows")
        self.started_at = time.time()
        self.notifier = notifier or Notifier()
        self.stop_event = threading.Event()
        self.stop_reason = "duration"
        self._wake = threading.Event()  # set by stop() and by sources with urgent events
        self.samples_total = 0
        self.events_total = 0
        self.spool = Spool(
            cfg.spool.dir,
            cfg.spool.max_bytes,
            cfg.spool.max_age,
            cfg.spool.segment_bytes,
            cfg.spool.fsync,
            consumer="shipped" if cfg.sink.kafka else "collected",
            fsync_interval=cfg.spool.fsync_interval,
        )
        self.shipper: Shipper | None = None
        self._sink_status: list[tuple[str, bool, str]] = []
        self._spool_problem: str | None = None  # the spool's trouble at the last tick
        adapters = dict(adapters or {})
        self.state = AgentState(cfg.spool.dir)
        self.boot_time = adapters.pop("boot_time", None) or cloud.boot_time()
        self.system_stopping = adapters.pop("system_stopping", cloud.system_stopping)
        self.system_state = adapters.pop("system_state", cloud.system_state)
        self.runners = []
        for name, cls in REGISTRY.items():
            scfg = cfg.sources[name]
            if scfg["enabled"]:
                self.runners.append(
                    SourceRunner(
                        cls(
                            scfg,
                            stats=self.stats,
                            wake=self._wake.set,
                            state=self.state,
                            boot_time=self.boot_time,
                            **adapters,
                        )
                    )
                )
        self._pending: list[bytes] = []
        self._pending_n = 0
        # the standard exports ([prometheus], [otlp]): every emitted event also updates
        # the table of current values they read
        self.metrics: MetricStore | None = None
        self.prometheus: PrometheusExporter | None = None
        self.otlp: OtlpExporter | None = None
        if cfg.prometheus.listen or cfg.otlp.endpoint:
            self.metrics = MetricStore(cfg.node, cfg.role, cfg.job, cfg.labels, cfg.prometheus.stale_after,
                                       max_series=cfg.prometheus.max_series, names=cfg.prometheus.names)
        if cfg.prometheus.listen:
            p = cfg.prometheus
            self.prometheus = PrometheusExporter(
                self.metrics, p.host, p.port, p.tls_cert or None, p.tls_key or None  # type: ignore[arg-type]
            )
        if cfg.otlp.endpoint:
            o = cfg.otlp
            self.otlp = OtlpExporter(
                self.metrics,  # type: ignore[arg-type]
                o.endpoint,
                o.protocol,
                o.interval,
                o.timeout,
                o.headers,
                o.ca_file or None,
                resource={"host.name": cfg.node, "service.instance.id": self.factory.ids.instance},
                on_status=lambda ok, msg: self._sink_status.append(("sink.otlp", ok, msg)),
            )

    # -- counters for the heartbeat
    def stats(self) -> dict[str, Any]:
        return {
            "instance": self.factory.ids.instance,
            "agent_version": __version__,
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "samples_total": self.samples_total,
            "events_total": self.events_total,
            "spooled_total": self.spool.spooled_total,
            "shipped_total": self.shipper.shipped_total if self.shipper else 0,
            "dropped_total": self.spool.dropped_total,
            "spool_bytes": self.spool.size_bytes(),
            "spool_pending": self.spool.pending,
            "interval_seconds": self.cfg.interval,
        }

    def emit(
        self,
        type_: str,
        data: dict[str, Any],
        ts: float | None = None,
        job: str | None = None,
        id: str | None = None,
    ) -> None:
        self._pending.append(self.factory.line(type_, data, ts, job, id))
        self._pending_n += 1
        if self.metrics is not None:
            self.metrics.observe(type_, data, job)

    def _emitter(self, ts: float) -> Callable[..., None]:
        """The ``emit`` a source gets: events without their own timestamp take ``ts``."""
        return lambda t, d, ts_=None, job=None, id=None: self.emit(t, d, ts_ or ts, job, id)

    def _status(self, source: str, state: str, dur: float, msg: str | None) -> None:
        d: dict[str, Any] = {"source": source, "ok": state == "ok", "state": state, "duration_seconds": dur}
        if msg:
            d["message"] = msg
            self.emit("status", d)
            return
        # the common case, once per source per tick: the JSON text from a template
        text = f'{{"source":{jstr(source)},"ok":{"true" if state == "ok" else "false"},"state":{jstr(state)},"duration_seconds":{dur!r}}}'
        self.emit("status", Encoded(d, text))

    def _on_sink(self, ok: bool, msg: str) -> None:
        self._sink_status.append(("sink.kafka", ok, msg))  # picked up by the next tick (thread-safe append)

    def _sink_statuses(self) -> None:
        """The sinks' state changes since the last call, as status events."""
        while self._sink_status:
            name, ok, msg = self._sink_status.pop(0)
            self._status(name, "ok" if ok else "error", 0.0, msg)

    def tick(self) -> None:
        ts = time.time()
        for r in self.runners:
            r.tick(self._emitter(ts), self._status)
        self._sink_statuses()
        if self.spool.problem:  # every tick while the disk refuses (the oldest may be dropped)
            self._status("spool", "error", 0.0, self.spool.problem)
        elif self._spool_problem:
            self._status("spool", "ok", 0.0, "writing again")
        self._spool_problem = self.spool.problem
        self.samples_total += 1
        self.flush()

    def flush(self, urgent: bool = False) -> None:
        """Append the pending events to the spool; ``urgent``: also hand them to the shipper
        to send ahead of any backlog."""
        if not self._pending:
            return
        data, n = b"".join(self._pending), self._pending_n
        self._pending, self._pending_n = [], 0
        if self.spool.append(data, n):  # else dropped, counted, said once by the spool
            self.events_total += n
            if self.shipper:
                if urgent:
                    self.shipper.priority(data)
                self.shipper.wake.set()

    def open(self) -> None:
        self.spool.open()
        try:
            if self.prometheus:
                self.prometheus.open()
            if self.otlp:
                self.otlp.open()
        except BaseException:
            if self.prometheus:
                self.prometheus.close()
            self.spool.close()
            raise
        k = self.cfg.sink
        if k.kafka:
            sink = KafkaSink(
                k.kafka, self.cfg.node, k.linger_ms, k.compression, k.message_bytes, k.request_timeout
            )
            self.shipper = Shipper(
                self.spool,
                sink,
                k.batch_bytes,
                k.retry_backoff,
                k.retry_backoff_max,
                on_status=self._on_sink,
                columns=k.message_format == "columns",
            )
            self.shipper.start()
        self._lifecycle_start()

    def _lifecycle(self, event: str, ts: float | None = None, **extra: Any) -> None:
        d: dict[str, Any] = {
            "event": event,
            "instance": self.factory.ids.instance,
            "boot_time": self.boot_time,
            "interval_seconds": self.cfg.interval,
            "agent_version": __version__,
            **extra,
        }
        self.emit("lifecycle", d, ts)

    def _lifecycle_start(self) -> None:
        """``boot`` (dated at the boot) when this is the agent's first start since the VM
        booted, then ``agent_start``; spooled and sent at once."""
        if self.state.new_boot(self.boot_time):
            self._lifecycle("boot", ts=self.boot_time)
        state = self.system_state()  # "starting": the boot started the agent (VM start-up is measurable)
        self._lifecycle("agent_start", **({} if state is None else {"during_boot": state == "starting"}))
        self.flush(urgent=True)

    def run(self, duration: float | None = None) -> None:
        """Tick until stopped (signal) or for ``duration`` seconds."""
        self.open()
        self.notifier.ready(f"sampling every {self.cfg.interval:g}s")
        end = None if duration is None else time.monotonic() + duration
        interval = self.cfg.interval
        wd = self.notifier.watchdog_interval
        next_tick = time.time()
        try:
            while not self.stop_event.is_set():
                now = time.time()
                if now >= next_tick:
                    self.tick()
                    # next boundary on the interval grid; skip missed ones rather than bursting
                    next_tick = (int(time.time() / interval) + 1) * interval
                if end is not None and time.monotonic() >= end:
                    break
                wait = next_tick - time.time()
                if wd:
                    self.notifier.watchdog()
                    wait = min(wait, wd)
                if end is not None:
                    wait = min(wait, end - time.monotonic())
                if self._wake.wait(max(0.0, wait)) and not self.stop_event.is_set():
                    self._wake.clear()
                    self.urgent()
        except BaseException:
            self.stop_reason = "error"
            raise
        finally:
            self.close()

    def urgent(self) -> None:
        """Between ticks: emit and flush what sources say cannot wait."""
        ts = time.time()
        for r in self.runners:
            if r.started:
                try:
                    r.source.collect_urgent(self._emitter(ts))
                except Exception as e:
                    log.error("source %s: urgent events: %s: %s", r.source.name, type(e).__name__, e)
        self.flush(urgent=True)

    def stop(self, reason: str = "stop") -> None:
        """Stop sampling (from a signal handler: ``reason`` is the signal's name)."""
        self.stop_reason = reason
        self.stop_event.set()
        self._wake.set()

    def close(self) -> None:
        self.notifier.stopping()
        t0 = time.monotonic()
        for r in self.runners:
            try:
                if r.started:
                    r.source.collect_urgent(self._emitter(time.time()))  # a notice just seen
                r.source.close()
            except Exception as e:
                log.debug("closing %s: %s", r.source.name, e)
        self.flush(urgent=True)
        # a clean stop, and the OS going down when systemd is stopping everything
        self._lifecycle(
            "agent_stop", stop_reason=self.stop_reason, uptime_seconds=round(time.time() - self.started_at, 3)
        )
        if self.stop_reason.startswith("SIG"):
            try:
                if self.system_stopping():
                    self._lifecycle("shutdown")
            except Exception as e:
                log.debug("shutdown check: %s", e)
        self.flush(urgent=True)
        if self.shipper:
            self.shipper.stop(STOP_GRACE)
        if self.otlp:  # a last export with the final values
            self.otlp.close(timeout=max(0.5, STOP_GRACE - (time.monotonic() - t0)))
        if self.prometheus:
            self.prometheus.close()
        self._sink_statuses()  # a failure seen after the last tick: spooled, shipped next start
        self.flush()
        self.spool.close()
        log.info(
            "stopped in %.2fs (spooled %d, shipped %d, pending %d)",
            time.monotonic() - t0,
            self.spool.spooled_total,
            self.shipper.shipped_total if self.shipper else 0,
            self.spool.pending,
        )
