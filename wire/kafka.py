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
