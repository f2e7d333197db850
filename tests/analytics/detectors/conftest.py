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


T0 = 1.75e9 - (1.75e9 % 300)


def agent_gpus(tmp_path: Path, nvml: Any, job: str = "j", ticks: int = 60, every: float = 10.0,
               node: str = "n0", extra: list[bytes] | None = None, proc: Path | None = None) -> duckdb.DuckDBPyConnection:
    """A database holding what the real GPU source read from ``nvml`` (the fake NVML) for
    ``ticks`` ticks, sent in the agent's row form, beside a job stepping on the node whose
    rank 0 declared pid 4000 (the fake's process on GPU 0); ``proc``: the /proc its Slurm
    resolver reads (default: none, not this machine's)."""
    from cmdare.agent.sources.gpu import GpuSource, slurm
    from cmdare.wire.events import EventFactory

    src = GpuSource(GpuSource.parse_config("sources.gpu", {}), nvml=nvml)
    src.slurm = slurm.Resolver(proc) if proc is not None else None
    agent = EventFactory(node, "worker", "", rows=True)
    lines: list[bytes] = [agent.line("train_job", {"run": "r", "rank": 0, "pid": 4000, "world_size": 1}, T0, job=job)]
    for k in range(ticks):
        ts = T0 + k * every
        src.collect(lambda t, d, ts=ts, job=None: lines.append(agent.line(t, d, ts, job)))
        lines.append(agent.line("train_steps", {"run": "r", "rank": 0, "steps": 10, "steps_per_second": 1.0,
                                                "interval_seconds": every}, ts, job=job))
    src.close()
    con = connect(tmp_path / f"agent-{job}.duckdb")
    assert Writer(con).write([("agent", b"".join(lines + (extra or [])))]).dead == 0
    return con
