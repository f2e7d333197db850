"""Alerts as JSON messages on a Kafka topic (``--alert-kafka kafka://host:port/topic``): one
message per alert and change (the webhook format's alert object, with ``status``), keyed
by fingerprint so that one alert's messages stay in order; acks=all."""

from __future__ import annotations

import json
from typing import Any

from .http import RESEND, Receiver


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
