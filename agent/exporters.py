"""Standard exports of the agent's samples, beside the spool and Kafka: a Prometheus
``/metrics`` endpoint (``[prometheus]``, with ``prometheus-client``) and an OTLP metrics
sink (``[otlp]``, with the OpenTelemetry SDK and its OTLP exporters).

Both read one table of current values, ``MetricStore``, fed with every event the agent
emits (``observe``).  The names come from the wire registry, so a field added there is
exported without a change here:

- ``cmdare_<domain>_<field>``: the domain is ``host``, ``gpu``, ``tpu``, ``train`` (the
  ``train_steps`` events), ``data`` (``train_data``), ``agent`` (heartbeats and source
  status); the field keeps its base unit (``_seconds``, ``_bytes``, ``_ratio``, ``_watts``,
  ``_celsius``; ``_hz`` becomes ``_hertz``).
- Fields that are counters (``*_total``) are counters; the rest are gauges.  The exporter
  also counts ``cmdare_train_steps_total`` / ``cmdare_train_examples_total`` and
  ``cmdare_data_batches_total`` / ``cmdare_data_elements_total`` from the per-interval
  counts, ``cmdare_gpu_events_total{kind,xid}`` from GPU events (Xid, ECC) and
  ``cmdare_revocation_notices_total{kind}`` from revocation notices.
- Labels: ``node``, ``role``, ``job`` and the agent's ``[labels]`` on every series; ``gpu``
  (NVML index; a MIG instance's is ``1000 x (parent + 1) + slot``, its parent and SM share
  are the gauges ``cmdare_gpu_parent_index`` and ``cmdare_gpu_mig_slice_ratio``) and ``uuid``;
  ``link`` (NVLink); ``device`` (TPU); ``run`` and ``rank``; ``nic``, ``disk``,
  ``core``; ``source`` for the agent's per-source health.

A series that has not been updated for ``stale_after`` (a GPU that fell off the bus, a run
that ended) is dropped rather than exported at its last value forever.

Imports of prometheus-client and OpenTelemetry happen when an exporter is opened: the
agent's own dependencies stay small (``pip install 'cmdare[prometheus]'`` / ``[otlp]``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cmdare.wire.kinds import FLOAT, FLOATS, INT, OBJS
from cmdare.wire.registry import DATA_FIELDS

log = logging.getLogger("cmdare.agent.exporters")

REFUSED = "cmdare_agent_series_refused_total"
DOMAINS = {"host": "host", "gpu": "gpu", "tpu": "tpu", "train_steps": "train", "train_data": "data", "heartbeat": "agent"}
# fields that become labels (field -> label name), per event type
LABEL_FIELDS: dict[str, dict[str, str]] = {
    "gpu": {"index": "gpu", "uuid": "uuid"},
    "tpu": {"device": "device"},
    "train_steps": {"run": "run", "rank": "rank"},
    "train_data": {"run": "run", "rank": "rank"},
}
# per-interval counts that the exporter sums into counters (field -> counter base name)
ACCUMULATE = {
    "train_steps": {"steps": "cmdare_train_steps", "examples": "cmdare_train_examples"},
    "train_data": {"batches": "cmdare_data_batches", "elements": "cmdare_data_elements"},
}
SKIP = {"heartbeat": {"seq"}, "train_steps": {"first_step"}}
OBJ_LABEL = {"net": "nic", "disk": "disk", "nvlink": "link"}
COMMON_LABELS = ("node", "role", "job")
_LABEL_RE = re.compile(r"[^a-zA-Z0-9_]")

# OTLP units (UCUM, as the OpenTelemetry semantic conventions write them), by name suffix
_UNITS = (
    ("_bytes_per_second", "By/s"),
    ("_per_second", "1/s"),
    ("_seconds", "s"),
    ("_bytes", "By"),
    ("_ratio", "1"),
    ("_watts", "W"),
    ("_celsius", "Cel"),
    ("_hertz", "Hz"),
)


def metric_field(name: str) -> str:
    """A registry field name in Prometheus base units."""
    return name[:-3] + "_hertz" if name.endswith("_hz") else name


def unit_of(name: str) -> str:
    base = name[:-6] if name.endswith("_total") else name
    for suffix, unit in _UNITS:
        if base.endswith(suffix):
            return unit
    return "1"


def label_name(key: str) -> str:
    """A user label key as a valid Prometheus label name."""
    s = _LABEL_RE.sub("_", key)
    return "_" + s if not s or s[0].isdigit() else s


@dataclass
class Family:
    """One metric: ``name`` is the exposition name (counters end ``_total``)."""

    name: str
    kind: str  # gauge | counter
    help: str
    labelnames: tuple[str, ...]
    series: dict[tuple[str, ...], list[float]] = field(default_factory=dict)  # label values -> [value, updated]
    dcgm: bool = False  # a dcgm-exporter name (cmdare.agent.dcgm): /metrics only, a counter without ``_total``

    @property
    def unit(self) -> str:
        return unit_of(self.name)

    @property
    def base(self) -> str:
        """The name without ``_total`` (prometheus-client and OpenTelemetry add it)."""
        return self.name[:-6] if self.kind == "counter" and self.name.endswith("_total") else self.name


class MetricStore:
    """The current value of every exported series, fed by ``observe`` (the agent's thread),
    read by scrapes and OTLP exports (their threads)."""

    def __init__(
        self,
        node: str,
        role: str,
        job: str,
        labels: dict[str, str] | None = None,
        stale_after: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        max_series: int = 20_000,
        names: str = "cmdare",
    ) -> None:
        import socket

        self.dcgm = names == "dcgm"  # also dcgm-exporter's names for the GPU samples (cmdare.agent.dcgm)
        self.hostname = node or socket.gethostname()
        self._gpus: dict[str, tuple[str, ...]] = {}  # NVML index -> its dcgm labels (Xid events carry no name)
        self.static = {label_name(k): str(v) for k, v in (labels or {}).items() if label_name(k) not in COMMON_LABELS}
        self.node, self.role, self.job = node, role, job
        self.stale_after, self.clock = stale_after, clock
        self.families: dict[str, Family] = {}
        self.lock = threading.Lock()
        self.on_new_family: list[Callable[[Family], None]] = []
        # a bound on live series (each distinct label set: a flood of job / run / rank
        # values must not grow /metrics and the agent's memory without end)
        self.max_series = max_series
        self.nseries = 0
        self.refused = 0
        self._refused_logged = float("-inf")

    # -- feeding
    def _family(self, name: str, kind: str, help: str, labelnames: tuple[str, ...], dcgm: bool = False) -> Family:
        f = self.families.get(name)
        if f is None:
            f = self.families[name] = Family(
                name, kind, help, COMMON_LABELS + tuple(self.static) + labelnames, dcgm=dcgm
            )
            for cb in self.on_new_family:
                cb(f)
        return f

    def _set(self, f: Family, values: tuple[str, ...], v: float, now: float, add: bool = False) -> None:
        key = (self.node, self.role, *values[:1], *self.static.values(), *values[1:])
        cur = f.series.get(key)
        if cur is None:
            if self.nseries >= self.max_series and f.name != REFUSED:
                self._refuse(now)
                return
            self.nseries += 1
        if add:
            f.series[key] = [(cur[0] if cur else 0.0) + v, now]
        elif cur is None:
            f.series[key] = [v, now]
        else:
            cur[0], cur[1] = v, now

    def _refuse(self, now: float) -> None:
        """A new series past ``max_series``: counted (itself a series), logged once a minute."""
        self.refused += 1
        f = self._family(REFUSED, "counter", "new series refused: the agent's max_series was reached", ())
        self._set(f, (self.job,), 1.0, now, add=True)
        if now - self._refused_logged >= 60:
            self._refused_logged = now
            log.warning("metrics: %d series live, the limit (prometheus.max_series): new series refused "
                        "(%d so far)", self.nseries, self.refused)

    def observe(self, type_: str, data: dict[str, Any], job: str | None = None) -> None:
        """One emitted event (any type: the ones without metrics are ignored)."""
        job_ = self.job if job is None else job
        now = self.clock()
        try:
            with self.lock:
                if type_ == "status":
                    self._status(data, job_, now)
                elif type_ == "gpu_event":
                    self._gpu_event(data, job_, now)
                elif type_ == "revocation":
                    f = self._family(
                        "cmdare_revocation_notices_total", "counter", "revocation notices seen (per notice)", ("kind",)
                    )
                    self._set(f, (job_, str(data.get("kind", ""))), 1.0, now, add=True)
                elif type_ in DOMAINS:
                    self._sample(type_, data, job_, now)
                    if self.dcgm and type_ == "gpu":
                        self._dcgm(data, job_, now)
        except (TypeError, ValueError) as e:  # a malformed sample never stops the agent
            log.debug("metrics: %s event not exported: %s", type_, e)

    def _status(self, d: dict[str, Any], job: str, now: float) -> None:
        src = str(d.get("source", ""))
        f = self._family("cmdare_agent_source_up", "gauge", "1 when the source's last collection succeeded", ("source",))
        self._set(f, (job, src), 1.0 if d.get("ok") else 0.0, now)
        if "duration_seconds" in d:
            f = self._family(
                "cmdare_agent_source_duration_seconds", "gauge", "time the source's last collection took", ("source",)
            )
            self._set(f, (job, src), float(d["duration_seconds"]), now)

    def _dcgm(self, d: dict[str, Any], job: str, now: float) -> None:
        from . import dcgm

        lv = dcgm.labels(d, self.hostname)
        if lv is None:
            return
        self._gpus[str(d.get("index"))] = lv
        for c in dcgm.COUNTERS:
            v = c.value(d)
            if v is not None:
                self._set(self._family(c.name, c.kind, c.help, dcgm.LABELS, dcgm=True), (job, *lv), v, now)

    def _gpu_event(self, d: dict[str, Any], job: str, now: float) -> None:
        xid = d.get("xid")
        lv = self._gpus.get(str(d.get("index", "")))
        if self.dcgm and lv is not None and isinstance(xid, int) and not isinstance(xid, bool):
            from . import dcgm

            self._set(self._family(dcgm.XID.name, dcgm.XID.kind, dcgm.XID.help, dcgm.LABELS, dcgm=True),
                      (job, *lv), float(xid), now)
        f = self._family(
            "cmdare_gpu_events_total", "counter", "GPU error events (Xid, ECC) seen", ("gpu", "uuid", "kind", "xid")
        )
        vals = (job, str(d.get("index", "")), str(d.get("uuid", "")), str(d.get("kind", "")), "" if xid is None else str(xid))
        self._set(f, vals, float(d.get("count") or 1), now, add=True)

    def _sample(self, type_: str, d: dict[str, Any], job: str, now: float) -> None:
        domain = DOMAINS[type_]
        specs = DATA_FIELDS[type_]
        lf = LABEL_FIELDS.get(type_, {})
        lnames = tuple(lf.values())
        lvals = tuple("" if d.get(k) is None else str(d.get(k)) for k in lf)
        skip = SKIP.get(type_, set())
        acc = ACCUMULATE.get(type_, {})
        for k, v in d.items():
            if k in lf or k in skip or v is None:
                continue
            spec = specs.get(k)
            if spec is None:
                continue
            kind, desc = spec
            if k in acc:
                f = self._family(acc[k] + "_total", "counter", f"sum of: {desc}", lnames)
                self._set(f, (job, *lvals), float(v), now, add=True)
                continue
            if kind in (INT, FLOAT):
                if isinstance(v, bool):
                    continue
                name = f"cmdare_{domain}_{metric_field(k)}"
                f = self._family(name, "counter" if k.endswith("_total") else "gauge", desc, lnames)
                self._set(f, (job, *lvals), float(v), now)
            elif kind == FLOATS and isinstance(v, list):
                name = f"cmdare_{domain}_{metric_field(k)}"
                f = self._family(name, "gauge", desc, (*lnames, "core"))
                for i, x in enumerate(v):
                    if isinstance(x, (int, float)):
                        self._set(f, (job, *lvals, str(i)), float(x), now)
            elif kind == OBJS and k in OBJ_LABEL and isinstance(v, list):
                lab = OBJ_LABEL[k]
                for obj in v:
                    if not isinstance(obj, dict):
                        continue
                    who = str(obj.get(lab, ""))
                    for ok, ov in obj.items():
                        if ok == lab or isinstance(ov, bool) or not isinstance(ov, (int, float)):
                            continue
                        name = f"cmdare_{domain}_{k}_{metric_field(ok)}"
                        f = self._family(
                            name, "counter" if ok.endswith("_total") else "gauge", f"{desc.split(':')[0]}: {ok}", (*lnames, lab)
                        )
                        self._set(f, (job, *lvals, who), float(ov), now)

    # -- reading
    def snapshot(self) -> list[tuple[Family, list[tuple[tuple[str, ...], float]]]]:
        """Every family with its live series (stale ones dropped), copied under the lock."""
        now = self.clock()
        out = []
        with self.lock:
            for f in list(self.families.values()):
                dead = [k for k, (_, t) in f.series.items() if now - t > self.stale_after]
                self.nseries -= len(dead)
                for k in dead:
                    del f.series[k]
                out.append((f, [(k, v[0]) for k, v in f.series.items()]))
        return out

    def series_of(self, name: str) -> list[tuple[dict[str, str], float]]:
        """One family's live series as (labels, value) (the OTLP callbacks)."""
        now = self.clock()
        with self.lock:
            f = self.families.get(name)
            if f is None:
                return []
            return [
                (dict(zip(f.labelnames, k, strict=True)), v[0]) for k, v in f.series.items() if now - v[1] <= self.stale_after
            ]


class _CounterType(str):
    """``counter`` in the TYPE line without prometheus-client's ``_total`` on the family's
    name: dcgm-exporter's counters have none (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``), and
    dashboards and rules written for it read them by those names."""

    def __eq__(self, other: object) -> bool:
        return other != "counter" and str.__eq__(self, other)

    __hash__ = str.__hash__


def _dcgm_family(f: Family, series: list[tuple[tuple[str, ...], float]]) -> Any:
    from prometheus_client.metrics_core import Metric

    m = Metric(f.name, f.help, "gauge" if f.kind == "gauge" else "counter")
    if f.kind == "counter":
        m.type = _CounterType("counter")
    for key, v in series:
        m.add_sample(f.name, dict(zip(f.labelnames, key, strict=True)), v)
    return m


def _text_only(app: Any) -> Any:
    """The WSGI app answering in the Prometheus text format whatever the scraper accepts, as
    dcgm-exporter does: OpenMetrics requires a counter's samples to end ``_total``, which
    dcgm-exporter's do not."""

    def text(environ: dict[str, Any], start_response: Any) -> Any:
        return app({**environ, "HTTP_ACCEPT": "text/plain; version=0.0.4"}, start_response)
    return text


class PrometheusExporter:
    """``/metrics`` in the Prometheus text format, served by prometheus-client's own HTTP
    server (a thread), with the agent process's standard ``process_*`` metrics beside."""

    def __init__(
        self, store: MetricStore, host: str, port: int, certfile: str | None = None, keyfile: str | None = None
    ) -> None:
        self.store, self.host, self.port = store, host, port
        self.certfile, self.keyfile = certfile, keyfile
        self.server: Any = None

    def open(self) -> None:
        from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        store = self.store

        class _Collector:
            def collect(self) -> Iterable[Any]:
                for f, series in store.snapshot():
                    if f.dcgm:
                        yield _dcgm_family(f, series)
                        continue
                    m: CounterMetricFamily | GaugeMetricFamily
                    if f.kind == "counter":
                        m = CounterMetricFamily(f.base, f.help, labels=f.labelnames)
                    else:
                        m = GaugeMetricFamily(f.name, f.help, labels=f.labelnames)
                    for key, v in series:
                        m.add_metric(list(key), v)
                    yield m

        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Collector())  # type: ignore[arg-type]
        ProcessCollector(registry=reg)
        try:
            self.server, _ = start_http_server(
                self.port, self.host, registry=reg, certfile=self.certfile, keyfile=self.keyfile
            )
            if store.dcgm:
                self.server.set_app(_text_only(self.server.get_app()))
        except OSError as e:
            raise OSError(f"prometheus.listen: cannot listen on {self.host}:{self.port}: {e.strerror or e}") from None
        self.port = self.server.server_port
        log.info("prometheus: serving /metrics on %s:%d", self.host, self.port)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class _Watched:
    """Wraps an OTLP exporter to report each export's outcome once per change of state."""

    def __init__(self, exporter: Any, on_status: Callable[[bool, str], None]) -> None:
        self._e, self._on = exporter, on_status
        self._ok: bool | None = None
        self.exported_total = self.failed_total = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._e, name)

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kw: Any) -> Any:
        from opentelemetry.sdk.metrics.export import MetricExportResult

        try:
            r = self._e.export(metrics_data, timeout_millis=timeout_millis, **kw)
        except Exception as e:  # the SDK logs; the agent reports it as a status
            r, err = MetricExportResult.FAILURE, f"{type(e).__name__}: {e}"
        else:
            err = "export failed (the OTLP endpoint refused or did not answer; see the log)"
        ok = r == MetricExportResult.SUCCESS
        if ok:
            self.exported_total += 1
        else:
            self.failed_total += 1
        if ok != self._ok:
            self._on(ok, "exporting" if ok else err)
        self._ok = ok
        return r


class OtlpExporter:
    """The same metrics pushed to an OpenTelemetry backend: an SDK ``MeterProvider`` whose
    observable instruments read ``MetricStore`` at each export (``interval``), through the
    OTLP exporter for ``http/protobuf`` or ``grpc``."""

    def __init__(
        self,
        store: MetricStore,
        endpoint: str,
        protocol: str = "http/protobuf",
        interval: float = 10.0,
        timeout: float = 10.0,
        headers: dict[str, str] | None = None,
        ca_file: str | None = None,
        resource: dict[str, str] | None = None,
        on_status: Callable[[bool, str], None] | None = None,
    ) -> None:
        self.store, self.endpoint, self.protocol = store, endpoint, protocol
        self.interval, self.timeout, self.headers, self.ca_file = interval, timeout, headers or {}, ca_file
        self.resource = resource or {}
        self.on_status = on_status or (lambda ok, msg: None)
        self.provider: Any = None
        self.meter: Any = None
        self.watched: _Watched | None = None
        self._instruments: dict[str, Any] = {}

    def open(self) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        if self.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcExporter,
            )

            creds = None
            if self.ca_file:
                import grpc

                with open(self.ca_file, "rb") as fh:
                    creds = grpc.ssl_channel_credentials(fh.read())
            ep = self.endpoint
            exporter: Any = GrpcExporter(
                endpoint=ep,
                insecure=ep.startswith("http://"),
                credentials=creds,
                headers=self.headers or None,
                timeout=self.timeout,
            )
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter as HttpExporter,
            )

            exporter = HttpExporter(
                endpoint=self.endpoint, headers=self.headers or None, timeout=self.timeout, certificate_file=self.ca_file
            )
        self.watched = _Watched(exporter, self.on_status)
        reader = PeriodicExportingMetricReader(
            self.watched,  # type: ignore[arg-type]
            export_interval_millis=self.interval * 1000,
            export_timeout_millis=self.timeout * 1000,
        )
        self.provider = MeterProvider(
            metric_readers=[reader], resource=Resource.create({"service.name": "cmdare-agent", **self.resource})
        )
        self.meter = self.provider.get_meter("cmdare.agent")
        with self.store.lock:
            fams = list(self.store.families.values())
            self.store.on_new_family.append(self._instrument)
        for f in fams:
            self._instrument(f)
        log.info("otlp: exporting every %gs to %s (%s)", self.interval, self.endpoint, self.protocol)

    def _instrument(self, f: Family) -> None:
        """One observable instrument per family, created when the family first appears (its
        callback runs in the reader's thread, outside the store's lock)."""
        from opentelemetry.metrics import CallbackOptions, Observation

        if f.name in self._instruments or self.meter is None or f.dcgm:  # dcgm-exporter's names: /metrics only
            return
        name = f.name

        def cb(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(v, attrs) for attrs, v in self.store.series_of(name)]

        make = self.meter.create_observable_counter if f.kind == "counter" else self.meter.create_observable_gauge
        self._instruments[name] = make(f.base, callbacks=[cb], unit=f.unit, description=f.help)

    def close(self, timeout: float = 3.0) -> None:
        if self.provider is not None:
            try:
                self.provider.shutdown(timeout_millis=timeout * 1000)
            except Exception as e:
                log.debug("otlp shutdown: %s", e)
            self.provider = None
