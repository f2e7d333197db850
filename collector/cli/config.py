"""The collector's configuration: one typed struct (``CollectorConfig``) built from one
table of settings, each an ``Option`` (the contract the agent's sources and the detectors
use) with its config-file key and its flag. The ``kafka`` and ``spool`` commands take the
flags this table generates; ``--config FILE`` (TOML) gives the same settings as tables
(``[ingest]``, ``[storage]``, ``[lake]``, ``[http]``, ``[kafka]``, ``[alerting]``) and the
alert receivers as ``[[receivers]]`` tables (``kind`` and the kind's options:
notify/receivers.py). A flag or its environment variable beats the file; the file beats
the default. Every error is one line naming the flag or the file's key."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cmdare.wire.kafka import KafkaSecurity, parse_kafka_security
from cmdare.wire.plugin import Option
from cmdare.wire.units import ConfigError, parse_duration

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_CONFIG_BYTES = 1 << 20
EXCERPT = 20  # characters of a refused value quoted in its error
BOTH, KAFKA, SPOOL = ("kafka", "spool"), ("kafka",), ("spool",)
ALL = ("kafka", "spool", "serve")  # serve: a lake's server (its ruler evaluates the rules, runs the detectors)
KAFKA_SERVE = ("kafka", "serve")  # (a server's --notices consumer uses the brokers' security settings)


@dataclass(frozen=True)
class Setting:
    """One setting: ``section.key`` in the file (the key is also the struct's field), its
    typed option, and its flag. ``off``: the text ``off`` reads as None (``least``: the
    smallest value otherwise, in seconds)."""

    section: str
    key: str
    option: Option
    flag: str
    commands: tuple[str, ...] = BOTH
    envvar: str | None = None
    shown: str | None = None  # the default as --help shows it
    metavar: str | None = None
    multiple: bool = False
    is_flag: bool = False
    off: bool = False
    least: float = 0.0


def _s(section: str, key: str, kind: str, default: Any, help_: str, flag: str = "", **kw: Any) -> Setting:
    return Setting(section, key, Option(kind, default, help_), flag or "--" + key.replace("_", "-"), **kw)


SKEW_HELP = (
    "an event stamped further than this from the time it is stored is stored all the same, listed in the "
    "clock_skew table and left out of liveness and lifetime verdicts (analyze nodes shows it); off: no check"
)
LAKE_HELP = ("write an Apache Iceberg lake instead of --db: a directory (its catalog: DIR/catalog.db) or an "
             "object-store URI with --catalog; several collectors in one group may write one lake ($CMDARE_LAKE)")
HTTP_HELP = (
    "serve the API (queries while collecting; analyze finds it by itself) on ADDR:PORT; port 0: any free "
    "port (written to DB.service.json); off: none"
)

SETTINGS: tuple[Setting, ...] = (
    _s("storage", "db", "str", "cmdare.duckdb", "DuckDB database file (default: $CMDARE_DB, else ./cmdare.duckdb)",
       envvar="CMDARE_DB", shown="cmdare.duckdb"),
    _s("ingest", "group", "str", "cmdare-collector", "Kafka consumer group", commands=KAFKA, shown="cmdare-collector"),
    _s("ingest", "batch_bytes", "size", 64 << 20,
       "write a transaction at about this much message data (polls are sized to fit; at most three batches are in "
       "memory, one written, one waiting, one fetched); smaller batches send more rows through DuckDB's WAL: a "
       "backlog loads 1.5-2x slower per sample at 16MiB", commands=KAFKA, shown="64MiB"),
    _s("ingest", "max_wait", "duration", 1.0, "...or after this long", commands=KAFKA, shown="1s"),
    _s("ingest", "idle_exit", "duration", None,
       "exit once no message came for this long with partitions assigned (e.g. 30s); default: run until stopped",
       commands=KAFKA),
    _s("ingest", "progress_every", "duration", 10.0, "how often to print progress", commands=KAFKA, shown="10s"),
    _s("ingest", "follow", "bool", False, "keep loading new events until stopped", commands=SPOOL, is_flag=True),
    _s("ingest", "interval", "duration", 1.0, "with --follow: how often to look", commands=SPOOL, shown="1s"),
    _s("ingest", "max_clock_skew", "duration", 86400.0, SKEW_HELP, shown="1d", off=True),
    _s("storage", "retain_raw", "duration", 7 * 86400.0,
       "delete raw GPU / host / TPU samples this much older than the newest, once rolled up (off: keep all; a "
       "lake: cmdare-collector maintain)", shown="7d", off=True, least=300),
    _s("storage", "retain_rollups", "duration", 400 * 86400.0,
       "delete 1- and 5-minute rollup rows this much older than the newest (off: keep all)", shown="400d", off=True,
       least=300),
    _s("lake", "lake", "str", None, LAKE_HELP, envvar="CMDARE_LAKE", metavar="URI"),
    _s("lake", "catalog", "str", None,
       "with --lake: the Iceberg SQL catalog, postgresql://user@host/db (many hosts) or sqlite:///file "
       "($CMDARE_LAKE_CATALOG; default: DIR/catalog.db)", envvar="CMDARE_LAKE_CATALOG", metavar="URL"),
    _s("lake", "commit_every", "duration", 10.0,
       "with --lake: commit what is staged this often (data is visible to analyze this late)", shown="10s"),
    _s("http", "http", "str", "127.0.0.1:0", HTTP_HELP, envvar="CMDARE_HTTP", shown="127.0.0.1:0"),
    _s("http", "http_token_file", "str", None,
       "bearer token clients must send (needed off loopback; or $CMDARE_HTTP_TOKEN)"),
    _s("http", "http_tls_cert", "str", None, "TLS certificate for the API"),
    _s("http", "http_tls_key", "str", None, "TLS private key for the API"),
    _s("http", "session_ttl", "duration", 12 * 3600.0,
       "how long a page sign-in lasts (sign-out, a new token or a restart end it sooner)", shown="12h"),
    _s("http", "ui_url", "str", None,
       "where people open the pages (/ui) when a proxy stands in front: alerts link to URL/ui/alerts; default: the "
       "API's own address", envvar="CMDARE_UI_URL", metavar="URL"),
    _s("kafka", "security_protocol", "str", None,
       "PLAINTEXT | SSL | SASL_SSL | SASL_PLAINTEXT (default: PLAINTEXT; SASL_SSL once a user is given; SSL once a "
       "TLS file is given)", commands=KAFKA_SERVE, envvar="CMDARE_KAFKA_SECURITY_PROTOCOL"),
    _s("kafka", "sasl_mechanism", "str", None, "PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 (default with a user: "
       "SCRAM-SHA-512)", commands=KAFKA_SERVE, envvar="CMDARE_KAFKA_SASL_MECHANISM"),
    _s("kafka", "sasl_username", "str", None, "SASL user name", commands=KAFKA_SERVE, envvar="CMDARE_KAFKA_USERNAME"),
    _s("kafka", "sasl_password_file", "str", None,
       "file holding the SASL password (or $CMDARE_KAFKA_PASSWORD); never logged", commands=KAFKA_SERVE,
       envvar="CMDARE_KAFKA_PASSWORD_FILE"),
    _s("kafka", "ssl_cafile", "str", None,
       "CA certificates (PEM) that sign the brokers' certificates (default: the system's)", commands=KAFKA_SERVE,
       envvar="CMDARE_KAFKA_SSL_CAFILE"),
    _s("kafka", "ssl_certfile", "str", None, "client certificate (PEM), for brokers that require one",
       commands=KAFKA_SERVE, envvar="CMDARE_KAFKA_SSL_CERTFILE"),
    _s("kafka", "ssl_keyfile", "str", None, "client private key (PEM)", commands=KAFKA_SERVE,
       envvar="CMDARE_KAFKA_SSL_KEYFILE"),
    _s("kafka", "ssl_no_check_hostname", "bool", False,
       "do not check that the broker's certificate names the host (not recommended)", commands=KAFKA_SERVE, is_flag=True),
    _s("alerting", "rules", "list", [],
       "alerting rule file, evaluated live (repeatable; 'default': the shipped pack; $CMDARE_RULES: "
       "space-separated); docs/alerts.md", envvar="CMDARE_RULES", metavar="FILE", multiple=True, commands=ALL),
    _s("alerting", "inhibit_window", "duration", 1800.0,
       "after a revocation notice, how long rules marked inhibit_on_revocation stay quiet for that node and its job",
       shown="30m", commands=ALL),
    _s("alerting", "liveness_grace", "duration", 45.0,
       "after the collector was behind (a restart, a Kafka outage, a backlog), node-loss verdicts wait this long "
       "once it has caught up, for agents to re-send what they spooled", shown="45s", commands=ALL),
    _s("alerting", "resend", "duration", 60.0, "re-send firing alerts to the receivers this often",
       flag="--alert-resend", shown="1m", commands=ALL),
    _s("findings", "detect_every", "duration", 60.0,
       "run every detector over the last --detect-window this often and keep the findings table current (goodput, "
       "the pages and /metrics read it); off: only analyze bottlenecks stores findings", shown="1m", off=True,
       least=5, commands=ALL),
    _s("findings", "detect_window", "duration", 900.0,
       "the sliding window each scheduled detector round reads (its start moved back to a 5-minute boundary)",
       shown="15m", commands=ALL),
)
BY_KEY = {s.key: s for s in SETTINGS}
# receivers' secrets by receiver name (the file's [[receivers]] tables name them directly)
SECRET_FLAGS = (
    ("token_file", "--alert-token-file", "send a bearer token to receiver NAME, read from FILE (repeatable)"),
    ("password_file", "--alert-password-file",
     "send Basic auth to receiver NAME, user:password read from FILE (repeatable)"),
)


@dataclass
class CollectorConfig:
    """Everything one collector run needs, checked: what it reads (``command``: kafka or
    spool, ``target``: the URL or directory), and each setting by its key."""

    command: str
    target: str
    values: dict[str, Any]
    receivers: list[Any] = field(default_factory=list)  # notify.receivers.ReceiverSpec
    security: KafkaSecurity | None = None
    given: set[str] = field(default_factory=set)  # keys set by a flag or the file (not defaults)
    url: Any = None  # kafka: the parsed URL (root.run)

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["values"][key]
        except KeyError:
            raise AttributeError(key) from None

    @property
    def retention(self) -> Any:
        from ..writer import Retention

        return Retention(self.values["retain_raw"], self.values["retain_rollups"])


def _excerpt(v: Any, n: int = EXCERPT) -> str:
    """The start of a refused value as an error quotes it."""
    return repr(str(v)[:n])


def parse_value(s: Setting, where: str, v: Any) -> Any:
    """One setting's value from a flag's text or a file's value."""
    if v is None:
        return None
    if s.off and isinstance(v, str) and v.strip().lower() == "off":
        return None
    if isinstance(v, tuple):  # a repeatable flag's values (click gives a tuple)
        v = list(v)
    if s.option.kind == "str" and isinstance(v, str) and not v.strip():
        raise ConfigError(f"{where}: empty (leave it out for the default)")
    x = s.option.parse(where, v)
    if s.key == "max_clock_skew" and x <= 0:
        raise ConfigError(f"{where}: {v!r} must be more than 0 (or off)")
    if s.off and x < s.least:  # durations are never negative (parse_duration): least > 0 only bites
        off = "'off' keeps all" if s.section == "storage" else "or 'off'"
        raise ConfigError(f"{where}: {_excerpt(v)} must not be under {s.least:g} s; {off}")
    if s.key == "commit_every" and not 0.05 <= x <= 3600:
        raise ConfigError(f"{where}: {_excerpt(v)} must be from 50ms to 1h")
    if s.key == "session_ttl" and not 60 <= x <= 30 * 86400:
        raise ConfigError(f"{where}: {_excerpt(v)} must be from 1m to 30d")
    if s.key == "detect_window" and not 60 <= x <= 86400:
        raise ConfigError(f"{where}: {_excerpt(v)} must be from 1m to 1d")
    return x


def duration_or_off(flag: str, text: str, least: float = 0.0) -> float | None:
    """A duration flag that may be ``off`` (None); ConfigError under ``least`` seconds."""
    if text.strip().lower() == "off":
        return None
    v = parse_duration(flag, text)
    if v < least:  # never negative (parse_duration): a least of 0 refuses nothing
        raise ConfigError(f"{flag}: {_excerpt(text)} must not be under {least:g} s; 'off' keeps all")
    return v


def read_file(path: str) -> dict[str, Any]:
    """A TOML config file, bounded; ConfigError (one line) when unreadable or not TOML."""
    p = Path(path)
    try:
        if not p.is_file():
            raise ConfigError(f"--config {path}: not a regular file")
        with p.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read: {e.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"--config {path}: over {MAX_CONFIG_BYTES:,} bytes")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--config {path}: not TOML: {str(e).splitlines()[0][:120]}") from None
    return doc


def _from_file(path: str, command: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The file's settings (key -> raw value) and its receiver tables."""
    doc = read_file(path)
    sections = {s.section for s in SETTINGS}
    out: dict[str, Any] = {}
    receivers = doc.pop("receivers", [])
    if not isinstance(receivers, list) or not all(isinstance(r, dict) for r in receivers):
        raise ConfigError(f"{path}: receivers: expected [[receivers]] tables")
    for name, table in doc.items():
        if name not in sections or not isinstance(table, dict):
            raise ConfigError(f"{path}: unknown table [{str(name)[:40]}] (known: {', '.join(sorted(sections))}, "
                              "receivers)")
        for key, v in table.items():
            s = BY_KEY.get(key)
            if s is None or s.section != name:
                known = ", ".join(x.key for x in SETTINGS if x.section == name)
                raise ConfigError(f"{path}: unknown key {name}.{str(key)[:40]} (known: {known})")
            if command not in s.commands:
                raise ConfigError(f"{path}: {name}.{key}: the {command} command does not take it")
            out[key] = v
    return out, receivers


def build(command: str, target: str, flags: Mapping[str, Any], given_flags: set[str],
          file: str | None = None) -> CollectorConfig:
    """The config of one run: ``flags`` (click's values, by key), ``given_flags`` (the keys
    set on the command line or by their environment variable), ``file`` (``--config``)."""
    from cmdare.analytics.alerting.notify.receivers import kinds, spec_of

    raw, tables = _from_file(file, command) if file else ({}, [])
    values: dict[str, Any] = {}
    given: set[str] = set()
    for s in SETTINGS:
        if command not in s.commands:
            continue
        if s.key in given_flags:
            v, where = flags.get(s.key), s.flag
        elif s.key in raw:
            v, where = raw[s.key], f"{file}: {s.section}.{s.key}"
        else:
            values[s.key] = s.option.default if not isinstance(s.option.default, list) else list(s.option.default)
            continue
        given.add(s.key)
        values[s.key] = parse_value(s, where, v)
    receivers = [spec_of(f"{file}: receivers[{i}]", t) for i, t in enumerate(tables)]
    secrets: dict[str, dict[str, str]] = {}
    for key, flag, _ in SECRET_FLAGS:
        for spec in flags.get(key + "s", ()) or ():
            name, eq, path = spec.partition("=")
            if not eq or not name.strip() or not path:
                raise ConfigError(f"{flag}: expected NAME=FILE (NAME: the receiver's name), got {_excerpt(spec, 40)}")
            secrets.setdefault(name.strip(), {})[key] = path
    for kind, cls in kinds().items():
        for i, text in enumerate(flags.get(f"receiver_{kind}", ()) or ()):
            raw_opts = cls.from_flag(text)
            if cls.SECRETS:
                raw_opts.update(secrets.get(cls.label({"name": "", **raw_opts}), {}))
            receivers.append(cls.spec(f"{cls.FLAG}[{i}]", raw_opts))
    if secrets:
        names = [r.name for r in receivers if kinds().get(r.kind).SECRETS]
        unknown = sorted(set(secrets) - set(names))
        if unknown:
            raise ConfigError(f"receiver {unknown[0]!r}: no --alertmanager / --alert-webhook of that name "
                              f"(names: {', '.join(names) or 'none'})")
    if receivers:
        given.add("receivers")
    security = None
    if command in KAFKA_SERVE:
        sec = {k: values[k] for k in ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password_file",
                                      "ssl_cafile", "ssl_certfile", "ssl_keyfile") if values.get(k) is not None}
        if values.get("ssl_no_check_hostname"):
            sec["ssl_check_hostname"] = False
        security = parse_kafka_security("--", sec)
    cfg = CollectorConfig(command, target, values, receivers, security, given)
    _check(cfg)
    return cfg


def _check(cfg: CollectorConfig) -> None:
    """What the settings mean together."""
    if cfg.command == "serve":
        if cfg.receivers and not cfg.rules:
            raise ConfigError("--alertmanager / --alert-webhook / --alert-kafka: give the rules to evaluate with --rules")
        return
    if cfg.lake:
        refused = [BY_KEY[k].flag for k in sorted(cfg.given & {"db", "http", "rules"}) if cfg.values.get(k)]
        if "receivers" in cfg.given:
            refused.append("--alertmanager")
        for k in ("retain_raw", "retain_rollups"):
            if k in cfg.given:
                raise ConfigError(f"{BY_KEY[k].flag}: a lake's retention is cmdare-collector maintain's")
        if refused:
            raise ConfigError(f"--lake: {', '.join(refused)} belong to a database file; in lake mode the collector "
                              "only ingests (serve the lake with cmdare-collector serve --lake; query with analyze --lake)")
        return
    if cfg.receivers and not cfg.rules:
        raise ConfigError("--alertmanager / --alert-webhook / --alert-kafka: give the rules to evaluate with --rules")
    if cfg.command == "spool" and cfg.rules and not cfg.follow:
        raise ConfigError("--rules: alert rules are evaluated while collecting: add --follow")


def click_options(command: str) -> Callable[[Any], Any]:
    """A decorator adding the flags of ``command``'s settings (and the receiver flags, and
    ``--config``; and ``--db``, but to ``serve``) to a click command."""
    import click

    from cmdare.analytics.alerting.notify.receivers import kinds

    def deco(f: Any) -> Any:
        for key, flag, help_ in reversed(SECRET_FLAGS):
            f = click.option(flag, key + "s", multiple=True, metavar="NAME=FILE", help=help_)(f)
        for kind, cls in reversed(kinds().items()):
            f = click.option(cls.FLAG, f"receiver_{kind}", multiple=True, metavar=cls.FLAG_METAVAR,
                             envvar=cls.FLAG_ENVVAR, help=cls.FLAG_HELP)(f)
        for s in reversed(SETTINGS):
            if command not in s.commands or s.key == "db":
                continue
            kw: dict[str, Any] = {"help": s.option.help, "envvar": s.envvar, "metavar": s.metavar}
            if s.is_flag:
                kw["is_flag"] = True
            elif s.multiple:
                kw["multiple"] = True
            else:
                kw["default"] = s.shown  # shown only: a flag left at its default is not "given"
                kw["show_default"] = s.shown is not None
            f = click.option(s.flag, s.key, **kw)(f)
        f = click.option("--config", "config_file", type=click.Path(dir_okay=False), metavar="FILE",
                         help="a TOML file of these settings and [[receivers]] (flags beat it; docs/collector.md)")(f)
        if command == "serve":
            return f
        s = BY_KEY["db"]
        return click.option("--db", "db", envvar=s.envvar, default=s.shown, show_default=True, help=s.option.help)(f)

    return deco
