"""Kafka sink (kafka-python): acks=all, linger batching, compression, key = node id so
that one node's events stay in one partition, in order.

``write(messages)`` sends a list of NDJSON messages and returns how many of them, from
the front, Kafka acknowledged; the rest must be retried (the Telegraf buffer contract:
take a batch, then accept / keep).  Nothing here retries on its own beyond kafka-python's
request retries: the shipper decides.
"""

from __future__ import annotations

import logging
from typing import Any

from cmdare.wire.kafka import KafkaURL, explain

log = logging.getLogger("cmdare.agent.kafka")


class SinkError(Exception):
    """The sink cannot take data now; the message says why in one line."""


class KafkaSink:
    name = "kafka"

    def __init__(
        self,
        url: KafkaURL,
        key: str,
        linger_ms: int = 50,
        compression: str = "gzip",
        message_bytes: int = 256 << 10,
        request_timeout: float = 10.0,
    ) -> None:
        self.url, self.key = url, key.encode()
        self.linger_ms, self.compression = linger_ms, compression
        self.message_bytes, self.request_timeout = message_bytes, request_timeout
        self.producer: Any = None

    def open(self) -> None:
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        try:
            self.producer = KafkaProducer(
                bootstrap_servers=self.url.bootstrap,
                acks="all",
                linger_ms=self.linger_ms,
                compression_type=None if self.compression == "none" else self.compression,
                max_request_size=max(self.message_bytes * 2, 1 << 20),
                batch_size=max(self.message_bytes, 16384),
                request_timeout_ms=int(self.request_timeout * 1000),
                delivery_timeout_ms=int(self.request_timeout * 1000) + self.linger_ms + 1000,
                max_in_flight_requests_per_connection=1,  # keep a node's order across retries
                retries=3,
                reconnect_backoff_max_ms=2000,
                max_block_ms=int(self.request_timeout * 1000),
                bootstrap_timeout_ms=int(self.request_timeout * 1000),
                client_id="cmdare-agent",
                **self.url.client_options(),  # SASL / TLS
            )
        except KafkaError as e:
            raise SinkError(f"{self.url.text}: {explain(e)}") from None
        except Exception as e:  # bad compression library etc.
            raise SinkError(f"{self.url.text}: {type(e).__name__}: {e}") from None

    def probe(self, timeout: float = 10.0) -> int:
        """Check that the broker answers and the topic exists or can be created; return
        its partition count."""
        from kafka.errors import KafkaError

        if self.producer is None:
            self.open()
        try:
            parts = self.producer.partitions_for(self.url.topic)
        except KafkaError as e:
            raise SinkError(f"{self.url.text}: broker did not answer a metadata request ({e})") from None
        if not parts:
            raise SinkError(f"{self.url.text}: topic {self.url.topic!r} not found and not auto-created")
        return len(parts)

    def write(self, messages: list[bytes]) -> int:
        """Send; return how many leading messages were acknowledged (acks=all)."""
        if self.producer is None:
            self.open()
        futures = []
        try:
            for m in messages:
                futures.append(self.producer.send(self.url.topic, value=m, key=self.key))
        except Exception as e:
            log.warning("kafka send failed: %s", e)
        try:
            self.producer.flush(timeout=self.request_timeout + self.linger_ms / 1000 + 2)
        except Exception as e:
            log.warning("kafka flush: %s", e)
        ok = 0
        for f in futures:
            if f.is_done and f.succeeded():
                ok += 1
            else:
                if f.is_done and f.exception is not None:
                    log.warning("kafka: %s", f.exception)
                break
        return ok

    def close(self, timeout: float = 2.0) -> None:
        if self.producer is not None:
            try:
                self.producer.close(timeout=timeout)
            except Exception:
                pass
            self.producer = None
