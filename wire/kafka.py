"""``kafka://host:port[,host:port]/topic`` addresses, as the agent's sink and the collector
take them.  Standard library only (the agent's dependency rule)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from .units import ConfigError


@dataclass
class KafkaURL:
    bootstrap: list[str]
    topic: str
    security: KafkaSecurity | None = None  # None: PLAINTEXT

    def client_options(self) -> dict[str, object]:
        return self.security.client_options() if self.security else {}

    @property
    def text(self) -> str:
        return f"kafka://{','.join(self.bootstrap)}/{self.topic}"


_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def parse_kafka_url(key: str, url: str) -> KafkaURL:
    """``kafka://host:port[,host:port]/topic``."""
    parts = urlsplit(url)
    if parts.scheme != "kafka":
        raise ConfigError(
            f"{key}: {url!r} is not a kafka:// URL (expected kafka://host:port[,host:port]/topic)"
        )
    reject_userinfo(key, url)
    hosts = [h for h in parts.netloc.split(",")]
    if not parts.netloc or any(not h for h in hosts):
        raise ConfigError(f"{key}: {url!r} names no broker (expected kafka://host:port[,host:port]/topic)")
    for h in hosts:
        host, _, port = h.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{key}: broker {h!r} in {url!r} must be host:port with a port 1-65535")
    topic = parts.path.lstrip("/")
    if not _TOPIC.match(topic):
        raise ConfigError(
            f"{key}: {url!r} needs a topic name of letters, digits, '.', '_' or '-' after the '/'"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"{key}: {url!r} must not have a query or fragment")
    return KafkaURL(hosts, topic)


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORD_ENV = "CMDARE_KAFKA_PASSWORD"
USERNAME_ENV = "CMDARE_KAFKA_USERNAME"
SECURITY_KEYS = (
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password_file",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
)


@dataclass
class KafkaSecurity:
    """How a client authenticates to the brokers and encrypts the connection: SASL (PLAIN,
    SCRAM-SHA-256/512) and TLS (a CA file, a client certificate and key).  The password is
    read from a file or ``$CMDARE_KAFKA_PASSWORD``, never taken on a command line or in a
    config value, and never shown: ``describe()`` and ``repr()`` leave it out."""

    protocol: str = "PLAINTEXT"
    mechanism: str = ""
    username: str = ""
    password: str = ""
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    check_hostname: bool = True
    password_from: str = ""  # where the password came from (a path or the variable's name)

    def __repr__(self) -> str:
        return f"KafkaSecurity({self.describe()})"

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def describe(self) -> str:
        """One line for logs and ``--check``: protocol, mechanism, user, files; no secret."""
        parts = [self.protocol]
        if self.sasl:
            parts.append(f"{self.mechanism} as {self.username!r} (password from {self.password_from})")
        if self.tls:
            parts.append(f"CA {self.cafile or 'system'}")
            if self.certfile:
                parts.append(f"client certificate {self.certfile}")
        return ", ".join(parts)

    def client_options(self) -> dict[str, object]:
        """Keyword arguments for kafka-python's producer, consumer and admin clients."""
        if self.protocol == "PLAINTEXT":
            return {}
        o: dict[str, object] = {"security_protocol": self.protocol}
        if self.sasl:
            o.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                     sasl_plain_password=self.password)
        if self.tls:
            o["ssl_check_hostname"] = self.check_hostname
            if self.cafile:
                o["ssl_cafile"] = self.cafile
            if self.certfile:
                o.update(ssl_certfile=self.certfile, ssl_keyfile=self.keyfile or None)
        return o


def _readable(key: str, path: str) -> str:
    import os

    if not os.path.isfile(path):
        raise ConfigError(f"{key}: {path}: no such file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{key}: {path}: not readable by this user")
    return path


def parse_kafka_security(prefix: str, values: dict[str, object], env: dict[str, str] | None = None) -> KafkaSecurity:
    """``values``: the keys of ``SECURITY_KEYS`` that were given (``prefix``: how to name them
    in errors, e.g. ``sink.`` or ``--``).  Every problem is a one-line ``ConfigError``."""
    import os

    env = dict(os.environ) if env is None else env

    def name(k: str) -> str:
        return f"--{k.replace('_', '-')}" if prefix == "--" else f"{prefix}{k}"

    def text(k: str) -> str:
        v = values.get(k)
        if v is None:
            return ""
        if not isinstance(v, str):
            raise ConfigError(f"{name(k)}: expected a string, got {v!r}")
        return v.strip()

    s = KafkaSecurity()
    proto = text("security_protocol").upper()
    if proto:
        if proto not in SECURITY_PROTOCOLS:
            raise ConfigError(f"{name('security_protocol')}: must be one of {', '.join(SECURITY_PROTOCOLS)}, got {proto!r}")
        s.protocol = proto
    mech = text("sasl_mechanism").upper()
    s.username = text("sasl_username") or env.get(USERNAME_ENV, "")
    pw_file = text("sasl_password_file")
    if (mech or s.username or pw_file) and not proto:
        s.protocol = "SASL_SSL"  # credentials without a protocol: SASL over TLS, never in clear
    if s.sasl:
        s.mechanism = mech or "SCRAM-SHA-512"
        if s.mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"{name('sasl_mechanism')}: must be one of {', '.join(SASL_MECHANISMS)}, got {mech!r}")
        if not s.username:
            raise ConfigError(f"{name('sasl_username')}: {s.protocol} needs a user name (or ${USERNAME_ENV})")
        if pw_file:
            try:
                with open(_readable(name("sasl_password_file"), pw_file)) as fh:
                    s.password = fh.read().rstrip("\r\n")
            except OSError as e:
                raise ConfigError(f"{name('sasl_password_file')}: {pw_file}: {e.strerror}") from None
            s.password_from = pw_file
        elif env.get(PASSWORD_ENV):
            s.password, s.password_from = env[PASSWORD_ENV], f"${PASSWORD_ENV}"
        else:
            raise ConfigError(f"{name('sasl_password_file')}: {s.protocol} needs a password file (or ${PASSWORD_ENV})")
        if not s.password:
            raise ConfigError(f"{name('sasl_password_file')}: the password is empty ({s.password_from})")
    elif mech or s.username or pw_file:
        raise ConfigError(f"{name('sasl_mechanism')}: SASL settings need security_protocol SASL_SSL or SASL_PLAINTEXT, not {s.protocol}")
    tls_files = {k: text(k) for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile")}
    if any(tls_files.values()) and not s.tls:
        if proto:
            raise ConfigError(f"{name('ssl_cafile')}: TLS files need security_protocol SSL or SASL_SSL, not {s.protocol}")
        s.protocol = "SSL"
    for k, v in tls_files.items():
        if v:
            _readable(name(k), v)
    s.cafile, s.certfile, s.keyfile = tls_files["ssl_cafile"], tls_files["ssl_certfile"], tls_files["ssl_keyfile"]
    if s.keyfile and not s.certfile:
        raise ConfigError(f"{name('ssl_keyfile')}: a client key needs its certificate ({name('ssl_certfile')})")
    check = values.get("ssl_check_hostname")
    if check is not None:
        if not isinstance(check, bool):
            raise ConfigError(f"{name('ssl_check_hostname')}: expected true or false, got {check!r}")
        s.check_hostname = check
    return s


def reject_userinfo(key: str, url: str) -> None:
    """Credentials in a URL end up in logs and status events: refuse them."""
    if "@" in urlsplit(url).netloc:
        raise ConfigError(
            f"{key}: credentials do not go in the URL (it is logged); use sasl_username and "
            f"sasl_password_file or ${PASSWORD_ENV}"
        )


class _Diagnosis:
    """Remembers the last connection problem kafka-python logged (it reports a wrong
    password or an untrusted certificate only as "Unable to bootstrap" to the caller, and
    the reason in its log), so that ``explain`` can name it."""

    PATTERNS = (
        ("SaslAuthenticationFailedError", "authentication failed"),
        ("CERTIFICATE_VERIFY_FAILED", "TLS: the broker's certificate is not trusted (check ssl_cafile)"),
        ("BAD_CERTIFICATE", "TLS: the broker refused the client certificate (check ssl_certfile / ssl_keyfile)"),
        ("CERTIFICATE_REQUIRED", "TLS: the broker requires a client certificate (ssl_certfile / ssl_keyfile)"),
        ("WRONG_VERSION_NUMBER", "TLS: the listener does not speak TLS (check security_protocol and the port)"),
        ("UnsupportedSaslMechanism", "the broker does not enable this SASL mechanism"),
    )

    def __init__(self) -> None:
        import logging

        class H(logging.Handler):
            def emit(h, record: logging.LogRecord) -> None:  # noqa: N805
                self.note(record.getMessage())

        self.handler = H(level=logging.INFO)
        self.last: tuple[float, str] | None = None
        self.identified = 0.0  # when a connection last got as far as the broker's version

    def note(self, msg: str) -> None:
        import time

        if "Broker version identified" in msg:
            self.identified = time.monotonic()
            return
        if "socket disconnected" in msg and "Abort" in msg and time.monotonic() - self.identified < 5.0:
            # kafka-python races the broker: after a failed SASL exchange the broker sends the
            # error and closes; the client often sees only the close.  A connection dropped
            # right after the version exchange (which precedes authentication) is that.
            self.identified = 0.0
            if self.last is None or "authentication failed" not in self.last[1]:
                self.last = (time.monotonic(), "authentication failed: the broker closed the connection during "
                             "authentication (check the user name, password and mechanism)")
            return
        for pat, what in self.PATTERNS:
            if pat in msg:
                detail = ""
                if pat == "SaslAuthenticationFailedError":
                    detail = msg.rsplit("SaslAuthenticationFailedError: ", 1)[-1].rstrip(")")
                elif "[SSL" in msg:
                    detail = msg[msg.index("[SSL"):].split(" (_ssl.c")[0]
                self.last = (time.monotonic(), f"{what}: {detail}" if detail else what)
                return

    def recent(self, within: float = 120.0) -> str | None:
        import time

        if self.last and time.monotonic() - self.last[0] <= within:
            return self.last[1]
        return None


DIAGNOSIS = _Diagnosis()


class _Redact:
    """A logging filter that blanks secrets out of every record a handler prints."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()

    def filter(self, record: object) -> bool:
        import logging

        assert isinstance(record, logging.LogRecord)
        if self.secrets:
            msg = record.getMessage()
            if any(s in msg for s in self.secrets):
                for s in self.secrets:
                    msg = msg.replace(s, "***")
                record.msg, record.args = msg, None
        return True


REDACT = _Redact()


def client_logging(debug: bool = False, secrets: tuple[str, ...] = ()) -> None:
    """kafka-python's own log: kept out of the output (it retries noisily; ``debug``: shown),
    read for the reasons ``explain`` gives, and never printing a password (its DEBUG log
    shows SASL PLAIN's bytes, password included).  ``$CMDARE_KAFKA_DEBUG=1`` shows it too."""
    import logging
    import os

    debug = debug or os.environ.get("CMDARE_KAFKA_DEBUG") == "1"
    lg = logging.getLogger("kafka")
    if DIAGNOSIS.handler not in lg.handlers:
        lg.addHandler(DIAGNOSIS.handler)
    lg.setLevel(logging.DEBUG if debug else logging.INFO)  # INFO: connection events only
    lg.propagate = debug
    REDACT.secrets.update(s for s in secrets if s)
    for h in logging.getLogger().handlers:
        if REDACT not in h.filters:
            h.addFilter(REDACT)  # type: ignore[arg-type]


def explain(e: BaseException) -> str:
    """One line for a Kafka client error; authentication and TLS failures say so (and
    never carry the password: kafka-python's messages do not include it)."""
    name = type(e).__name__
    text = f"{e}".strip().splitlines()[0] if f"{e}".strip() else ""
    why = DIAGNOSIS.recent()
    if why and ("bootstrap" in text.lower() or "NoBrokersAvailable" in name or "Timeout" in name):
        return why
    if "Authentication" in name or "SaslAuthentication" in name or "authentication" in text.lower():
        return f"authentication failed: {text or name}"
    if "SSL" in name or "certificate" in text.lower() or "ssl" in text.lower():
        return f"TLS handshake failed: {text or name}"
    return f"cannot reach a broker ({name}: {text})"
