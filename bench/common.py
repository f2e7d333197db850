"""Helpers shared by the benchmarks: a real Kafka broker from scripts/kafka, synthetic
fleets of agents, peak-RSS and CPU readings."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

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
