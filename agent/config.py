"""Agent configuration: one TOML file, overridable by environment and flags.

Precedence (last wins): built-in defaults < TOML file < ``CMDARE_AGENT_*`` environment
variables < ``--set key=value`` / named flags.  Environment variables name a key with
``__`` between table and key: ``CMDARE_AGENT_SPOOL__DIR=/data/spool`` sets ``spool.dir``.

Validation happens here, before any network call, and every problem is reported as one
line naming the key (``ConfigError``).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from cmdare.wire.kafka import SECURITY_KEYS, KafkaURL, parse_kafka_security, parse_kafka_url
from cmdare.wire.plugin import parse_bool as _bool
from cmdare.wire.plugin import parse_int as _int
from cmdare.wire.plugin import parse_str as _str
from cmdare.wire.registry import ROLES
from cmdare.wire.units import ConfigError, parse_duration, parse_size

__all__ = ["ConfigError", "KafkaURL", "parse_duration", "parse_kafka_url", "parse_size"]  # and the configs below

DEFAULT_PATH = "/etc/cmdare/agent.toml"
ENV_PREFIX = "CMDARE_AGENT_"


@dataclass
class SpoolConfig:
    dir: Path = Path("/var/lib/cmdare/spool")
    max_bytes: int = 1 << 30
    max_age: float = 7 * 86400.0
    segment_bytes: int = 8 << 20
    fsync: bool = True
    fsync_interval: float = 1.0  # group commits: at most one fsync per interval (0 = every write)


@dataclass
class SinkConfig:
    url: str = ""  # empty: the spool is the sink (embedded default)
    kafka: KafkaURL | None = None
    linger_ms: int = 50
    compression: str = "gzip"
    message_bytes: int = 256 << 10
    message_format: str = "columns"  # row-form samples packed as binary columns; "lines": as spooled
    batch_bytes: int = 2 << 20
    request_timeout: float = 10.0
    retry_backoff: float = 1.0
    retry_backoff_max: float = 30.0


@dataclass
class PrometheusConfig:
    listen: str = ""  # "ADDR:PORT" (":9464" = every address): serve /metrics; empty = off
    host: str = ""
    port: int = 0
    stale_after: float = 300.0  # drop a series not updated for this long
    max_series: int = 20_000  # live series at most; new ones past it are refused and counted
    tls_cert: str = ""
    tls_key: str = ""
    names: str = "cmdare"  # "dcgm": also dcgm-exporter's names for the GPU samples (cmdare.agent.dcgm)


@dataclass
class OtlpConfig:
    endpoint: str = ""  # empty = off; http/protobuf: http(s)://host:4318/v1/metrics, grpc: http(s)://host:4317
    protocol: str = "http/protobuf"
    interval: float = 0.0  # 0: the agent's sampling interval (at least 1s)
    timeout: float = 10.0
    headers: dict[str, str] = field(default_factory=dict)
    ca_file: str = ""


@dataclass
class AgentConfig:
    node: str = field(default_factory=socket.gethostname)
    role: str = "worker"
    job: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    interval: float = 10.0
    log_level: str = "info"
    sample_format: str = "rows"  # host / gpu / tpu samples as row lines; "json": every event a JSON object
    spool: SpoolConfig = field(default_factory=SpoolConfig)
    sink: SinkConfig = field(default_factory=SinkConfig)
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    otlp: OtlpConfig = field(default_factory=OtlpConfig)
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: str | None = None  # where it was read from, for messages


_TOP_KEYS = {
    "node",
    "role",
    "job",
    "labels",
    "interval",
    "log_level",
    "sample_format",
    "spool",
    "sink",
    "prometheus",
    "otlp",
    "sources",
}
SAMPLE_FORMATS = ("rows", "json")
_SPOOL_KEYS = {"dir", "max_bytes", "max_age", "segment_bytes", "fsync", "fsync_interval"}
_SINK_KEYS = {
    "url",
    "linger_ms",
    "compression",
    "message_bytes",
    "message_format",
    "batch_bytes",
    "request_timeout",
    "retry_backoff",
    "retry_backoff_max",
    *SECURITY_KEYS,  # SASL / TLS (cmdare.wire.kafka.KafkaSecurity)
}
_PROMETHEUS_KEYS = {"listen", "stale_after", "max_series", "tls_cert", "tls_key", "names"}
_OTLP_KEYS = {"endpoint", "protocol", "interval", "timeout", "headers", "ca_file"}
OTLP_PROTOCOLS = ("http/protobuf", "grpc")
MESSAGE_FORMATS = ("columns", "lines")
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
LOG_LEVELS = ("debug", "info", "warning", "error")


def _unknown(where: str, keys: set[str], known: set[str]) -> None:
    extra = sorted(set(keys) - known)
    if extra:
        k = f"{where}.{extra[0]}" if where else extra[0]
        raise ConfigError(f"unknown key '{k}' (known: {', '.join(sorted(known))})")


def _table(key: str, v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ConfigError(f"{key}: expected a table, got {type(v).__name__}")
    return v


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = tree
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: '{p}' is not a table")
        cur = nxt
    cur[parts[-1]] = value


def coerce_text(value: str) -> Any:
    """Values from env / --set arrive as text: read them as TOML values when they parse."""
    try:
        return tomllib.loads(f"x = {value}")["x"]
    except tomllib.TOMLDecodeError:
        return value


def load(
    path: str | os.PathLike[str] | None = None,
    *,
    required: bool = False,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AgentConfig:
    """Read, merge and validate.  ``required``: a missing file is an error (it was named
    explicitly); otherwise a missing default file means defaults."""
    env = os.environ if env is None else env
    tree: dict[str, Any] = {}
    src = str(path or env.get(ENV_PREFIX + "CONFIG") or DEFAULT_PATH)
    p = Path(src)
    if p.exists():
        try:
            tree = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{src}: invalid TOML: {e}") from None
        except OSError as e:
            raise ConfigError(f"{src}: cannot read: {e.strerror}") from None
    elif required or path is not None:
        raise ConfigError(f"{src}: config file not found")
    for k, v in sorted(env.items()):
        if k.startswith(ENV_PREFIX) and k != ENV_PREFIX + "CONFIG":
            dotted = k[len(ENV_PREFIX) :].lower().replace("__", ".")
            _set_path(tree, dotted, coerce_text(v))
    for k, v in (overrides or {}).items():  # already typed (flags, or --set read by coerce_text)
        _set_path(tree, k, v)
    cfg = from_tree(tree)
    cfg.path = src if p.exists() else None
    return cfg


def from_tree(tree: dict[str, Any]) -> AgentConfig:
    from .sources import REGISTRY  # the source names are the [sources.*] table names

    _unknown("", set(tree), _TOP_KEYS)
    cfg = AgentConfig()
    if "node" in tree:
        cfg.node = _str("node", tree["node"]).strip()
        if not cfg.node or len(cfg.node) > 256:
            raise ConfigError("node: must be 1-256 characters")
    if "role" in tree:
        cfg.role = _str("role", tree["role"])
    if cfg.role not in ROLES:
        raise ConfigError(f"role: must be one of {', '.join(ROLES)}, got {cfg.role!r}")
    if "job" in tree:
        cfg.job = _str("job", tree["job"])
    labels = _table("labels", tree.get("labels", {}))
    for k, v in labels.items():
        if not isinstance(v, str):
            raise ConfigError(f"labels.{k}: label values must be strings, got {v!r}")
    cfg.labels = dict(labels)
    if "interval" in tree:
        cfg.interval = parse_duration("interval", tree["interval"])
        if not 0.05 <= cfg.interval <= 3600:
            raise ConfigError(f"interval: must be between 50ms and 1h, got {tree['interval']!r}")
    if "log_level" in tree:
        cfg.log_level = _str("log_level", tree["log_level"]).lower()
        if cfg.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level: must be one of {', '.join(LOG_LEVELS)}, got {tree['log_level']!r}")
    if "sample_format" in tree:
        cfg.sample_format = _str("sample_format", tree["sample_format"]).lower()
        if cfg.sample_format not in SAMPLE_FORMATS:
            raise ConfigError(
                f"sample_format: must be one of {', '.join(SAMPLE_FORMATS)}, got {tree['sample_format']!r}"
            )

    _spool(cfg, _table("spool", tree.get("spool", {})))
    _sink(cfg, _table("sink", tree.get("sink", {})))
    _exports(cfg, tree)

    srcs = _table("sources", tree.get("sources", {}))
    _unknown("sources", set(srcs), set(REGISTRY))
    for name, cls in REGISTRY.items():
        raw = _table(f"sources.{name}", srcs.get(name, {}))
        cfg.sources[name] = cls.parse_config(f"sources.{name}", raw)
    return cfg


def _spool(cfg: AgentConfig, sp: dict[str, Any]) -> None:
    """The [spool] table."""
    _unknown("spool", set(sp), _SPOOL_KEYS)
    s = cfg.spool
    if "dir" in sp:
        s.dir = Path(_str("spool.dir", sp["dir"]))
    if "max_bytes" in sp:
        s.max_bytes = parse_size("spool.max_bytes", sp["max_bytes"])
    if "max_age" in sp:
        s.max_age = parse_duration("spool.max_age", sp["max_age"])
    if "segment_bytes" in sp:
        s.segment_bytes = parse_size("spool.segment_bytes", sp["segment_bytes"])
    if "fsync" in sp:
        s.fsync = _bool("spool.fsync", sp["fsync"])
    if "fsync_interval" in sp:
        s.fsync_interval = parse_duration("spool.fsync_interval", sp["fsync_interval"])
    if not 4096 <= s.segment_bytes <= 1 << 30:
        raise ConfigError("spool.segment_bytes: must be between 4KiB and 1GiB")
    if s.max_bytes < 2 * s.segment_bytes:
        raise ConfigError(
            f"spool.max_bytes: must be at least twice spool.segment_bytes ({2 * s.segment_bytes} bytes)"
        )


def _sink(cfg: AgentConfig, sk: dict[str, Any]) -> None:
    """The [sink] table (Kafka)."""
    _unknown("sink", set(sk), _SINK_KEYS)
    k = cfg.sink
    if "url" in sk:
        k.url = _str("sink.url", sk["url"]).strip()
    if k.url:
        k.kafka = parse_kafka_url("sink.url", k.url)
        k.kafka.security = parse_kafka_security("sink.", {x: sk[x] for x in SECURITY_KEYS if x in sk})
    elif any(sk.get(x) not in (None, "") for x in SECURITY_KEYS if x != "ssl_check_hostname"):
        raise ConfigError("sink.url: Kafka security settings are given but no sink.url")
    if "linger_ms" in sk:
        k.linger_ms = _int("sink.linger_ms", sk["linger_ms"], 0, 60_000)
    if "compression" in sk:
        k.compression = _str("sink.compression", sk["compression"]).lower()
        if k.compression not in COMPRESSIONS:
            raise ConfigError(
                f"sink.compression: must be one of {', '.join(COMPRESSIONS)}, got {sk['compression']!r}"
            )
    if "message_bytes" in sk:
        k.message_bytes = parse_size("sink.message_bytes", sk["message_bytes"])
        if not 1024 <= k.message_bytes <= 8 << 20:
            raise ConfigError("sink.message_bytes: must be between 1KiB and 8MiB")
    if "message_format" in sk:
        k.message_format = _str("sink.message_format", sk["message_format"]).lower()
        if k.message_format not in MESSAGE_FORMATS:
            raise ConfigError(
                f"sink.message_format: must be one of {', '.join(MESSAGE_FORMATS)}, got {sk['message_format']!r}"
            )
    if "batch_bytes" in sk:
        k.batch_bytes = parse_size("sink.batch_bytes", sk["batch_bytes"])
    for key in ("request_timeout", "retry_backoff", "retry_backoff_max"):
        if key in sk:
            setattr(k, key, parse_duration(f"sink.{key}", sk[key]))
    if k.batch_bytes < k.message_bytes:
        raise ConfigError("sink.batch_bytes: must be at least sink.message_bytes")


def parse_listen(key: str, value: str) -> tuple[str, int]:
    """``ADDR:PORT``, ``[v6]:PORT`` or ``:PORT`` (every address)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}: expected ADDR:PORT (e.g. 0.0.0.0:9464, :9464), got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def _module(key: str, module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
        raise ConfigError(f"{key}: needs the {module} package (pip install 'cmdare[{extra}]')")


def _exports(cfg: AgentConfig, tree: dict[str, Any]) -> None:
    pr = _table("prometheus", tree.get("prometheus", {}))
    _unknown("prometheus", set(pr), _PROMETHEUS_KEYS)
    p = cfg.prometheus
    if "listen" in pr:
        p.listen = _str("prometheus.listen", pr["listen"]).strip()
    if "stale_after" in pr:
        p.stale_after = parse_duration("prometheus.stale_after", pr["stale_after"])
    if "max_series" in pr:
        v = pr["max_series"]
        if type(v) is not int or not 100 <= v <= 10_000_000:
            raise ConfigError(f"prometheus.max_series: expected a whole number from 100 to 10000000, got {str(v)[:40]!r}")
        p.max_series = v
    for k in ("tls_cert", "tls_key"):
        if k in pr:
            setattr(p, k, _str(f"prometheus.{k}", pr[k]).strip())
    if "names" in pr:
        p.names = _str("prometheus.names", pr["names"]).strip()
        if p.names not in ("cmdare", "dcgm"):
            raise ConfigError(f"prometheus.names: expected \"cmdare\" or \"dcgm\" (also dcgm-exporter's names), "
                              f"got {p.names[:40]!r}")
    if bool(p.tls_cert) != bool(p.tls_key):
        raise ConfigError("prometheus.tls_cert: TLS needs both prometheus.tls_cert and prometheus.tls_key")
    if p.listen and p.listen.lower() != "off":
        p.host, p.port = parse_listen("prometheus.listen", p.listen)
        _module("prometheus.listen", "prometheus_client", "prometheus")
    else:
        p.listen = ""

    ot = _table("otlp", tree.get("otlp", {}))
    _unknown("otlp", set(ot), _OTLP_KEYS)
    o = cfg.otlp
    if "endpoint" in ot:
        o.endpoint = _str("otlp.endpoint", ot["endpoint"]).strip()
    if "protocol" in ot:
        o.protocol = _str("otlp.protocol", ot["protocol"]).strip().lower()
        if o.protocol not in OTLP_PROTOCOLS:
            raise ConfigError(f"otlp.protocol: must be one of {', '.join(OTLP_PROTOCOLS)}, got {ot['protocol']!r}")
    for k in ("interval", "timeout"):
        if k in ot:
            setattr(o, k, parse_duration(f"otlp.{k}", ot[k]))
    if "headers" in ot:
        h = _table("otlp.headers", ot["headers"])
        for k, v in h.items():
            if not isinstance(v, str):
                raise ConfigError(f"otlp.headers.{k}: header values must be strings")
        o.headers = dict(h)
    if "ca_file" in ot:
        o.ca_file = _str("otlp.ca_file", ot["ca_file"]).strip()
    if o.endpoint:
        if not o.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"otlp.endpoint: expected an http:// or https:// URL, got {o.endpoint!r}")
        if o.protocol == "grpc":
            _module("otlp.endpoint", "opentelemetry.exporter.otlp.proto.grpc", "otlp")
        else:
            _module("otlp.endpoint", "opentelemetry.exporter.otlp.proto.http", "otlp")
        if o.interval == 0:
            o.interval = max(1.0, cfg.interval)
        if o.interval < 1.0:
            raise ConfigError("otlp.interval: must be at least 1s")
