"""Storing a batch again while the database fails in a way that can pass (storage full,
read-only, over quota; memory taken by queries running beside ingest): nothing is
acknowledged until it is stored, and it is stored once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import duckdb

from .ingest.batch import WriteResult

log = logging.getLogger("cmdare.collector")

# what a database file on a full, read-only or over-quota filesystem says: it can pass
_STORAGE = ("no space left on device", "read-only file system", "disk quota exceeded", "could not write file")


def storage_problem(e: BaseException) -> str | None:
    """The cause in one line when ``e`` is the database failing in a way that can pass
    (storage full, read-only, over quota; out of memory while queries hold it: the batch's
    transaction was rolled back whole); None for any other error."""
    if isinstance(e, MemoryError | duckdb.OutOfMemoryException):
        first = (str(e).strip().splitlines() or ["out of memory"])[0]
        return f"out of memory ({first[:160]})"
    if not isinstance(e, duckdb.Error | OSError):
        return None
    text = str(e)
    if not any(k in text.lower() for k in _STORAGE):
        return None
    first = text.strip().splitlines()[0]
    return first.split("Failed to commit: ", 1)[-1]  # DuckDB's wrapper says less than the cause


class StorageRetry:
    """Stores a batch, and while the database's storage fails in a way that can pass, tries
    the same batch again with backoff: nothing is acknowledged (Kafka offset, spool cursor)
    until it is stored, and it is stored once.  Says so in one line when it starts failing
    and once when it works again, not per try."""

    def __init__(self, stop: threading.Event, first: float = 1.0, most: float = 30.0) -> None:
        self.stop, self.first, self.most = stop, first, most
        self.failures = 0  # tries that failed since the last success

    def __call__(self, store: Callable[[], WriteResult]) -> WriteResult:
        delay, since = self.first, time.monotonic()
        while True:
            try:
                result = store()
            except Exception as e:
                why = storage_problem(e)
                if why is None or self.stop.is_set():
                    raise
                if not self.failures:
                    log.error("cannot store a batch: %s; nothing is acknowledged, retrying with backoff", why)
                self.failures += 1
                self.stop.wait(delay)
                delay = min(delay * 2, self.most)
                continue
            if self.failures:
                log.warning(
                    "storing works again after %.0fs and %d failed tries: the batch is stored",
                    time.monotonic() - since,
                    self.failures,
                )
                self.failures = 0
            return result
