"""A job fed by input workers (role data) whose count moved over time, through the
collector into a database: the telemetry data-workers --job and placement --job read."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import Scenarios


@pytest.fixture(scope="session")
def input_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    f = Scenarios(seed=3)
    # 2 ranks computing 0.2 s per batch (10 batches/s in all); remote workers make one in
    # 0.5 s (2/s), local ones in 0.6 s: the input keeps up from 5 remote workers
    job = f.input_job()
    db = tmp_path_factory.mktemp("input") / "input.duckdb"
    con = connect(db)
    Writer(con).write([("sim", encode_many(f.events))])
    con.close()
    return db, job
