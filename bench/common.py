"""Helpers shared by the benchmarks: a real Kafka broker from scripts/kafka, synthetic
fleets of agents, peak-RSS and CPU readings."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Broker:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cmdare-bench-kafka-"))
        self.bootstrap = ""

    def __enter__(self) -> Broker:
        out = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "kafka"), "start", "--dir", str(self.dir)],
            capture_output=True,
            text=True,
            check=True,
        )
        self.bootstrap = out.stdout.strip().splitlines()[-1]
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "kafka"), "stop", "--dir", str(self.dir)],
            capture_output=True,
        )


@contextlib.contextmanager
def served(db: str | None = None) -> Iterator[tuple[Any, str]]:
    """A collector API (``Service``, its defaults) over ``db``, or over the golden demo
    fleet's database made once: (the service, its URL)."""
    from cmdare.analytics.server.service import HttpConfig, Service
    from cmdare.collector.db import connect

    if db:
        path = Path(db)
    else:
        from tests.analytics.test_golden_output import build

        path = Path(tempfile.mkdtemp()) / "fleet.duckdb"
        build(path)
    con = connect(path)
    svc = Service(con, path, HttpConfig("127.0.0.1", 0))
    url = svc.start()
    svc.ready = True
    try:
        yield svc, url
    finally:
        svc.stop()
        con.close()
