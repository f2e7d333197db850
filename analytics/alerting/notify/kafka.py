"""Alerts as JSON messages on a Kafka topic (``--alert-kafka kafka://host:port/topic``): one
message per alert and change (the webhook format's alert object, with ``status``), keyed
by fingerprint so that one alert's messages stay in order; acks=all."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from cmdare.wire.plugin import Option

from .http import RESEND, Receiver
from .receivers import RECEIVERS, ReceiverKind, ReceiverSpec


class KafkaReceiver(Receiver):
    kind = "kafka"

    def __init__(self, url: Any, resend: float = RESEND, generator: str = "http://localhost/cmdare") -> None:
        self.kurl = url
        self.producer: Any = None
        super().__init__(url.text, resend, generator=generator)

    @property
    def name(self) -> str:
        return self.kurl.text

    def _deliver(self, items: list[dict[str, Any]]) -> None:
        from kafka import KafkaProducer

        if self.producer is None:
            self.producer = KafkaProducer(bootstrap_servers=self.kurl.bootstrap, acks="all", client_id="cmdare-alerts",
                                          request_timeout_ms=int(self.timeout * 1000),
                                          max_block_ms=int(self.timeout * 1000), **self.kurl.client_options())
        try:
            futures = [self.producer.send(self.kurl.topic, key=i["fingerprint"].encode(), value=json.dumps(i).encode())
                       for i in items]
            for f in futures:
                f.get(timeout=self.timeout)
        except Exception:
            self.producer.close(timeout=1)
            self.producer = None
            raise

    def stop(self, grace: float = 3.0) -> None:
        super().stop(grace)
        if self.producer is not None:
            self.producer.close(timeout=1)


@RECEIVERS.register
class Kafka(ReceiverKind):
    """Receiver kind ``kafka``: alerts published to a topic (the kafka input's SASL / TLS
    settings apply)."""

    name = "kafka"
    FLAG = "--alert-kafka"
    FLAG_METAVAR = "URL"
    FLAG_HELP = ("publish alerts to this Kafka topic, kafka://host:port/topic (repeatable; the kafka "
                 "command's SASL / TLS options apply)")
    OPTIONS: ClassVar[Mapping[str, Option]] = {"url": Option("str", "", "kafka://host:port[,host:port]/topic")}

    @classmethod
    def spec(cls, where: str, raw: Mapping[str, Any]) -> ReceiverSpec:
        from cmdare.wire.kafka import parse_kafka_url

        s = super().spec(where, raw)
        parse_kafka_url("--alert-kafka", s.options["url"])  # ConfigError when it is not one
        return s

    @classmethod
    def build(cls, options: Mapping[str, Any], resend: float, generator: str, security: Any = None) -> Any:
        from cmdare.wire.kafka import parse_kafka_url

        u = parse_kafka_url("--alert-kafka", options["url"])
        u.security = security
        return KafkaReceiver(u, resend, generator=generator)

