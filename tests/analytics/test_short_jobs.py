"""Short scheduler jobs billed by their samples' own span (issue 66): a 20-second pod on 2
GPUs was charged 0.1667 GPU-hours (the 5-minute bucket, 15x its 0.011) and a 55-second
Slurm job 300 s. A job's GPU-seconds now lie within one sampling interval of its samples'
span, a GPU at a time, at any length and across bucket edges."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import EventFactory

T0 = (int(time.time()) // 300 - 12) * 300 + 17.0  # an hour ago, 17 s into a 5-minute bucket
A100 = "NVIDIA A100-SXM4-40GB"


def _gpu(f: EventFactory, i: int, ts: float, job: str, **extra: object) -> bytes:
    return f.line("gpu", {"index": i, "uuid": f"GPU-{f.node}-{i}", "name": A100, "util_gpu_ratio": 0.9, **extra},
                  ts, job=job)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("short") / "s.duckdb"
    lines = []
    pod = EventFactory("k8s-n0", "worker", "")
    lines += [_gpu(pod, i, T0 + k, "ml/short", namespace="ml", pod="short", container="main")
              for k in range(21) for i in (0, 1)]  # 20 s on 2 GPUs, a sample a second
    slurm = EventFactory("slurm-n0", "worker", "")
    lines += [_gpu(slurm, 0, T0 + 1000 + k, "slurm-777", slurm_job="777", slurm_user="bob")
              for k in range(0, 56, 5)]  # 55 s, every 5 s
    # 10 minutes every 10 s, across two bucket edges, on one GPU
    lines += [_gpu(slurm, 1, T0 + 1500 + 10 * k, "slurm-778", slurm_job="778", slurm_user="bob") for k in range(61)]
    tr = EventFactory("tr-n0", "worker", "resnet50-a")
    lines.append(tr.line("train_job", {"run": "r", "rank": 0, "world_size": 1}, T0 + 2000, job="resnet50-a"))
    for k in range(21):
        lines += [_gpu(tr, i, T0 + 2000 + k, "resnet50-a") for i in (0, 1)]
        if k % 2 == 0 and k:
            lines.append(tr.line("train_steps", {
                "run": "r", "rank": 0, "interval_seconds": 2.0, "steps": 20, "first_step": 1 + 10 * k,
                "last_step": 20 + 10 * k, "examples": 640.0, "step_mean_seconds": 0.1, "wait_mean_seconds": 0.0,
                "steps_per_second": 10.0, "examples_per_second": 320.0}, T0 + 2000 + k, job="resnet50-a"))
    con = connect(p)
    assert Writer(con, max_skew=None).write([("x", b"".join(lines))]).dead == 0
    con.close()
    return p


def total_seconds(db: Path, job: str) -> float:
    r = CliRunner().invoke(cli, ["goodput", "--job", job, "--json", "--db", str(db)])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    return next(x["seconds"] for x in rows if x["category"] == "total")


@pytest.mark.parametrize(("job", "gpus", "span", "every"), [
    ("ml/short", 2, 20.0, 1.0),  # before: 600 (2 x the bucket)
    ("slurm-777", 1, 55.0, 5.0),  # before: 300
    ("slurm-778", 1, 600.0, 10.0),  # across bucket edges
    ("resnet50-a", 2, 20.0, 1.0),  # a tracked job: its wall time
])
def test_a_jobs_gpu_seconds_lie_within_one_interval_of_its_samples_span(db: Path, job: str, gpus: int, span: float,
                                                                        every: float) -> None:
    got = total_seconds(db, job)
    assert gpus * span <= got + 1e-6 and got <= gpus * (span + every) + 1e-6, (job, got)


def test_the_fleet_table_bills_the_same(db: Path) -> None:
    r = CliRunner().invoke(cli, ["goodput", "--fleet", "--by", "job", "--json", "--db", str(db)])
    assert r.exit_code == 0, r.output
    rows = {x["job"]: x["gpu_hours"] for x in json.loads(r.output.splitlines()[0])}
    assert rows["ml/short"] == pytest.approx(42 / 3600, abs=1e-4) and rows["slurm-777"] == pytest.approx(60 / 3600,
                                                                                                          abs=1e-4)
