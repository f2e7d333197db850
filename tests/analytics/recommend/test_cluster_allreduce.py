"""Issue 68: `recommend cluster --from-job J` for a data-parallel job (no parameter server)
answers world size and GPUs per node from the all-reduce cost model fitted to the runs of
its model and accelerator, names the actions that hide its communication with their
predicted gains, and keeps the PS advice's evidence rule: the best measured layout stands
unless a predicted one's interval lies wholly above it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.analytics.models import allreduce as ar
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import EventFactory

T0 = 1.75e9 + 17
GRAD = 400e6  # gradient bytes a step all-reduces
K = {"intra": 1e-10, "inter": 8e-10}  # exposed seconds per byte a rank moves: NVLink vs the network


def ring_job(job: str, world: int, nodes: int, noise: float = 0.0, grad: float | None = GRAD,
             comm: bool = True, model: str = "bert", scale: float = 1.0) -> bytes:
    """``world`` ranks spread over ``nodes`` nodes of 8 GPUs, 0.2 s computation and 0.01 s
    input wait a step, plus the ring's exposed communication (``noise``: a relative error
    on it; ``scale``: on its cost per byte)."""
    per = -(-world // nodes)
    e = K["inter" if nodes > 1 else "intra"] * scale * ar.moved(world, GRAD) * (1 + noise)
    out = []
    for rank in range(world):
        f = EventFactory(f"{job}-n{rank // per}", "worker", job, {})
        decl = {"run": "r", "rank": rank, "world_size": world, "model": model, "accelerator": "nvidia-a100",
                "params": 100_000_000, "gpus_per_node": 8}
        if grad is not None:
            decl["grad_bytes"] = int(grad)
        out.append(f.line("train_job", decl, T0))
        k = max(1, int(10 / (0.21 + e)))  # the steps a 10-second interval holds
        for i in range(30):
            d = {"run": "r", "rank": rank, "interval_seconds": 10.0, "steps": k, "first_step": k * i,
                 "last_step": k * i + k, "step_mean_seconds": 0.21 + e, "wait_mean_seconds": 0.01}
            if comm:
                d["comm_mean_seconds"] = e
            out.append(f.line("train_steps", d, T0 + 10 * (i + 1)))
    return b"".join(out)


def db_of(tmp_path: Path, *jobs: bytes) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "ring.duckdb"
    con = connect(path)
    Writer(con, max_skew=None).write([("m", b"".join(jobs))])
    con.close()
    return path


def rec(db: Path, *args: str) -> tuple[int, object]:
    r = CliRunner().invoke(cli, ["recommend", "cluster", "--db", str(db), *args])
    return r.exit_code, (json.loads(r.stdout) if r.exit_code == 0 and "--json" in args else r.output)  # (one object)


@pytest.fixture()
def fleet(tmp_path: Path) -> Path:
    return db_of(tmp_path, ring_job("ddp-1", 1, 1), ring_job("ddp-4", 4, 1, 0.05), ring_job("ddp-8", 8, 1, -0.04),
                 ring_job("ddp-16", 16, 2, 0.03), ring_job("ddp-32", 32, 4, -0.02))


def test_the_fit_recovers_each_links_cost_and_scores_each_run_held_out(fleet: Path) -> None:
    con = connect(fleet, read_only=True)
    rs, notes = ar.runs(con, "bert", "nvidia-a100")
    f = ar.fit(rs)
    con.close()
    assert len(rs) == 5 and notes == []
    assert f.k["intra"] == pytest.approx(K["intra"], rel=0.06) and f.k["inter"] == pytest.approx(K["inter"], rel=0.04)
    assert f.compute_s == pytest.approx(0.2) and f.wait_s == pytest.approx(0.01)
    assert sorted(f.held_out) == ["inter", "intra"] and 0 < f.mape < 0.06


def test_a_ring_that_crosses_nodes_is_sized_back_to_one_node_with_its_actions(fleet: Path) -> None:
    code, out = rec(fleet, "--from-job", "ddp-16", "--json")
    assert code == 0, out
    r = out
    # one node of 8 GPUs: 8 x 0.21 / 0.28 = 6x; 16 on two nodes fall to about 4x
    assert r["action"] == {"workers": 8, "ps": 0, "nodes": 1, "gpus_per_node": 8}
    assert r["predicted"]["speedup"] == pytest.approx(6.0, rel=0.05)
    a = r["assumptions"]
    assert a["held_out_mape_allreduce"] < 0.06 and a["runs_fitted"] == 5 and a["stays_with_measured"] is False
    # ddp-16 waits 0.6 s a step on the network: one all-reduce per 4 micro-batches
    # gives (0.81) / (0.21 + 0.15) - 1 = +125 % examples/s
    assert a["gain_accumulate"] == pytest.approx(1.25, rel=0.05)
    # fp16 compression halves the bytes: 0.81 / (0.21 + 0.30) - 1 = +59 %
    assert a["gain_fp16_compress"] == pytest.approx(0.59, rel=0.05)
    assert "accumulate gradients over 4 micro-batches" in r["why"] and "fewer nodes with more GPUs each" in r["why"]
    assert "fp16 compression hook (half the bytes)" in r["why"] and "hybrid sharding" in r["why"]


def test_an_unmeasured_knee_whose_interval_overlaps_the_measured_best_is_the_experiment(tmp_path: Path) -> None:
    """A model whose ring is dear on NVLink too, measured at 1, 2 and 4 GPUs with noisy
    communication: the model's knee, 8 GPUs on the node, was never measured and its held-out
    error (the two runs predict each other 32-67 % off) puts its interval's low end under the
    4 GPUs measured: the answer stays 4 GPUs, and 8 is the experiment to run next."""
    db = db_of(tmp_path, ring_job("ddp-1", 1, 1, scale=2.5), ring_job("ddp-2", 2, 1, 0.6, scale=2.5),
               ring_job("ddp-4", 4, 1, -0.6, scale=2.5))
    code, out = rec(db, "--from-job", "ddp-4", "--max-workers", "8", "--json")
    assert code == 0, out
    r = out
    a = r["assumptions"]
    assert a["stays_with_measured"] is True and r["action"]["workers"] == 4 and r["interval"] == {}
    assert a["experiment"].startswith("measure 8 GPUs on 1 node(s) next: the model predicts")
    assert r["why"].startswith("the best measured layout: 4 GPUs on 1 node(s)")
    # and where the interval lies wholly above, the prediction is the answer
    db2 = db_of(tmp_path / "b", ring_job("ddp-1", 1, 1), ring_job("ddp-2", 2, 1, 0.02), ring_job("ddp-4", 4, 1))
    code, out = rec(db2, "--from-job", "ddp-4", "--max-workers", "8", "--json")
    assert code == 0 and out["action"]["workers"] == 8 and out["assumptions"]["stays_with_measured"] is False
    assert out["interval"]["speedup"][0] > 4 * 0.21 / (0.21 + K["intra"] * ar.moved(4, GRAD))


def test_a_data_parallel_job_without_what_the_model_needs_is_one_line(tmp_path: Path) -> None:
    db = db_of(tmp_path, ring_job("nograd", 4, 1, grad=None, comm=True, model="m2"))
    con = connect(db, read_only=True)
    assert ar.shape(con, "nograd") is not None  # it reports communication: data-parallel
    rs, notes = ar.runs(con, "m2", "nvidia-a100")
    con.close()
    assert len(rs) == 1 and notes == ["nograd/r: gradient bytes taken as 4 x its parameters (float32)"]
    code, out = rec(db, "--from-job", "nograd", "--gpu-type", "h100")
    assert code != 0 and "is data-parallel (no parameter server)" in out and "--gpu-type" in out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_hostile_step_records_cost_only_their_own_run(tmp_path: Path) -> None:
    """A broken adapter's records (a step time of 1e300 s, a negative communication wait):
    the finite runs still fit; nothing fails."""
    bad = EventFactory("bad-n0", "worker", "ddp-bad", {})
    lines = [bad.line("train_job", {"run": "r", "rank": 0, "world_size": 2, "model": "bert",
                                    "accelerator": "nvidia-a100", "grad_bytes": int(GRAD)}, T0)]
    lines += [bad.line("train_steps", {"run": "r", "rank": 0, "interval_seconds": 10.0, "steps": 40,
                                       "step_mean_seconds": v, "comm_mean_seconds": c}, T0 + 10 * (i + 1))
              for i, (v, c) in enumerate([(1e300, 0.1), (0.3, -50.0)])]
    db = db_of(tmp_path, ring_job("ddp-1", 1, 1), ring_job("ddp-8", 8, 1), ring_job("ddp-16", 16, 2), b"".join(lines))
    code, out = rec(db, "--from-job", "ddp-8", "--json")
    assert code == 0, out
    assert "ddp-bad/r: implausible step records" in out["assumptions"]["notes"]
    clean = db_of(tmp_path / "clean", ring_job("ddp-1", 1, 1), ring_job("ddp-8", 8, 1), ring_job("ddp-16", 16, 2))
    code, want = rec(clean, "--from-job", "ddp-8", "--json")
    assert code == 0 and {k: v for k, v in out["assumptions"].items() if k != "notes"} == want["assumptions"]
    assert (out["action"], out["predicted"]) == (want["action"], want["predicted"])
