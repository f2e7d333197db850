"""Issue 68: data-parallel jobs through the adapters, end to end: a Hugging Face Trainer
under DDP and FSDP over two real gloo ranks, and both wrappers over NCCL where a machine
has two GPUs. Slow but timing nothing (counts and equalities), so they run beside the
other slow tests, not with the timed fault scenarios (tests/integration/test_training.py
holds the DDP runs whose communication shares are compared)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.conftest import ROOT
from tests.integration.test_training import ddp_job, load, start_agent

pytestmark = [pytest.mark.slow]


def test_a_hugging_face_trainer_under_ddp_reports_its_communication(tmp_path: Path, sockdir: Path) -> None:
    """Issue 68: the Hugging Face Trainer wraps the model in DDP only inside train(), and
    hands its callbacks the unwrapped one; CmdareCallback.attach(trainer, job) finds the
    wrapped model, times its all-reduce and declares its gradient bytes and GPUs per node.
    Two real ranks over gloo (tests/integration/hf_ddp.py), through the agent."""
    spool, db, sock = tmp_path / "spool", tmp_path / "t.duckdb", sockdir / "train.sock"
    agent = start_agent(spool, sock)
    try:
        ranks = ddp_job("", "hf-ddp", sock, steps=30, script=ROOT / "tests" / "integration" / "hf_ddp.py",
                        args=("--out", str(tmp_path / "hf")))
        time.sleep(1.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
    assert all(r["dropped"] == 0 and r["steps"] == 30 and r["buckets"] >= 30 for r in ranks), ranks
    load(spool, db)
    con = duckdb.connect(str(db), read_only=True)
    decl = con.execute("""SELECT max(world_size), max(gpus_per_node), max(grad_bytes), max(framework) FROM jobs
                          WHERE job = 'hf-ddp'""").fetchone()
    comm, steps = con.execute("SELECT sum(comm_mean_seconds * steps), sum(steps) FROM steps WHERE job = 'hf-ddp'"
                              ).fetchone()
    con.close()
    params = 2 * (2048 * 2048 + 2048)
    assert decl == (2, 2, 4 * params, "transformers"), decl
    assert steps == 60 and comm > 0, (comm, steps)


def test_an_fsdp_job_reports_its_reduce_scatter_and_trains_as_fsdp_does(tmp_path: Path, sockdir: Path) -> None:
    """Issue 68: FullyShardedDataParallel (two real ranks over gloo, each holding half of a
    wide model): track_module times each unit's reduce-scatter (watch_fsdp), every step
    carries its communication wait, and the hook reduces as FSDP's own does (rank 0's
    trained parameters equal the same model trained alone on the same batches)."""
    spool, db, sock = tmp_path / "spool", tmp_path / "t.duckdb", sockdir / "train.sock"
    agent = start_agent(spool, sock)
    try:
        ranks = ddp_job("comm", "fsdp-comm", sock, steps=40, args=("--wrap", "fsdp"))
        time.sleep(1.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
    assert all(r["dropped"] == 0 and r["steps"] == 40 and r["buckets"] >= 40 for r in ranks), ranks
    assert [r["same"] for r in sorted(ranks, key=lambda r: r["rank"])] == [True, None], ranks
    load(spool, db)
    con = duckdb.connect(str(db), read_only=True)
    rows, comm = con.execute("""SELECT sum(steps), sum(comm_mean_seconds * steps) FILTER (WHERE comm_mean_seconds > 0)
                                FROM steps WHERE job = 'fsdp-comm'""").fetchone()
    con.close()
    assert rows == 80 and comm > 0, (rows, comm)


@pytest.mark.gpu  # (CI has no GPU: it may skip there)
@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_the_data_parallel_hooks_over_nccl_on_two_gpus(tmp_path: Path, sockdir: Path, wrap: str) -> None:
    """Issue 68: the same DDP and FSDP jobs over NCCL, one GPU a rank, where the machine has
    two (the device checks; skipped elsewhere): the hooks' futures complete when the GPU's
    collective does, and each step still carries its communication wait."""
    gpus = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                          capture_output=True, text=True, timeout=120).stdout.strip()
    if not gpus.isdigit() or int(gpus) < 2:
        pytest.skip(f"NCCL needs two GPUs; this machine has {gpus or 'none'}")
    spool, db, sock = tmp_path / "spool", tmp_path / "t.duckdb", sockdir / "train.sock"
    agent = start_agent(spool, sock)
    try:
        ranks = ddp_job("comm", f"nccl-{wrap}", sock, steps=40, args=("--wrap", wrap, "--backend", "nccl"))
        time.sleep(1.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
    assert all(r["dropped"] == 0 and r["steps"] == 40 and r["buckets"] >= 40 for r in ranks), ranks
    if wrap == "fsdp":
        assert [r["same"] for r in sorted(ranks, key=lambda r: r["rank"])] == [True, None], ranks
    load(spool, db)
    con = duckdb.connect(str(db), read_only=True)
    rows, comm = con.execute(f"""SELECT sum(steps), count(comm_mean_seconds) FROM steps
                                 WHERE job = 'nccl-{wrap}'""").fetchone()
    con.close()
    assert rows == 80 and comm > 0, (rows, comm)
