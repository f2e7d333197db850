"""Detector tests build small simulated fleets (tests/fakes/fleet.py Scenarios) into a real
DuckDB database and run one detector on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from cmdare.analytics.detectors import detect
from cmdare.analytics.units import Finding, Scope
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import Scenarios

Build = Callable[[Scenarios], None]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., tuple[duckdb.DuckDBPyConnection, Scenarios]]]:
    """``fleet(build, seed=0)``: a database holding what ``build`` simulated, and the
    simulator (its ``labels``)."""
    cons: list[duckdb.DuckDBPyConnection] = []

    def make(build: Build, seed: int = 0) -> tuple[duckdb.DuckDBPyConnection, Scenarios]:
        s = Scenarios(seed=seed)
        build(s)
        con = connect(tmp_path / f"f{len(cons)}.duckdb")
        assert Writer(con).write([("sim", encode_many(s.events))]).dead == 0
        cons.append(con)
        return con, s

    yield make
    for c in cons:
        c.close()


def found(con: duckdb.DuckDBPyConnection, kind: str, scope: Scope | None = None, **options: Any) -> dict[str, list[Finding]]:
    """job -> the findings of detector ``kind``."""
    out: dict[str, list[Finding]] = {}
    for f in detect(kind, con, scope or Scope(), **options):
        out.setdefault(f.job or "", []).append(f)
    return out
