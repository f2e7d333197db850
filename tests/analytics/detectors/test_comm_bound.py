"""comm_bound on the shared profiler traces: the sampled 128-rank job, a quarter of whose
step is exposed communication, is found; the 2-rank DDP job (under 5 %) is not."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from cmdare.analytics.units import Scope, detect
from cmdare.collector.db import connect
from tests.analytics.test_traces import HTA_DATA


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory):
    from cmdare.analytics.imports import traces

    c = connect(tmp_path_factory.mktemp("comm") / "c.duckdb")
    for name in ("ddp-2ranks", "sampled-128ranks"):
        traces.import_files(c, [HTA_DATA / name], name)
    yield c
    c.close()


def test_exposed_communication_past_the_threshold_is_a_finding_with_its_numbers(con) -> None:
    found = detect("comm_bound", con, Scope())
    assert [f.job for f in found] == ["sampled-128ranks"]
    f = found[0]
    assert f.severity == "warning" and 20 <= f.evidence["exposed_comm_pct"] <= 30
    assert f.evidence["world_size"] == 128 and f.evidence["ranks_traced"] == 2 and f.evidence["steps"] == 1
    assert 0 < f.evidence["exposed_comm_ms"] < f.evidence["step_ms"] and "% of each step waits" in f.summary
    assert f.window_start is not None


def test_thresholds_scope_and_the_import_window(con) -> None:
    assert detect("comm_bound", con, Scope(), critical_exposed=0.2)[0].severity == "critical"
    assert [f.job for f in detect("comm_bound", con, Scope(), min_exposed=0.04)] == ["ddp-2ranks", "sampled-128ranks"]
    assert detect("comm_bound", con, Scope(job="ddp-2ranks")) == []
    later = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) + dt.timedelta(hours=1)
    assert detect("comm_bound", con, Scope(None, later, None)) == []  # imported before the window


def test_without_imported_traces_it_finds_nothing_quietly(tmp_path: Path) -> None:
    """Most jobs have no trace: no finding and no note (before migration 026 either)."""
    import duckdb

    assert detect("comm_bound", connect(tmp_path / "fresh.duckdb"), Scope()) == []
    bare = duckdb.connect(str(tmp_path / "bare.duckdb"))
    assert detect("comm_bound", bare, Scope()) == []
    bare.close()


def _steps(tmp_path: Path, job: str, comm: float | None, n: int = 60, declare: dict | None = None) -> Path:
    """A 2-rank job's step intervals as the agent reports them, 1 s steps, ``comm`` s of each
    waiting on communication (None: a run that reports none); ``declare``: each rank's
    declaration, and its node's host samples sending 40 MB/s."""
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import EventFactory

    db = tmp_path / f"{job}.duckdb"
    c = connect(db)
    lines = []
    t0 = dt.datetime.now(dt.timezone.utc).timestamp() - 3600
    for rank in (0, 1):
        f = EventFactory(f"{job}-n{rank}", "worker", job)
        for i in range(n):
            d = {"run": "r", "rank": rank, "interval_seconds": 10.0, "steps": 10, "first_step": 10 * i + 1,
                 "last_step": 10 * i + 10, "examples": 80.0, "step_mean_seconds": 1.0, "wait_mean_seconds": 0.01,
                 "wait_share_ratio": 0.01, "steps_per_second": 1.0, "examples_per_second": 8.0}
            if comm is not None:
                d |= {"comm_mean_seconds": comm, "comm_share_ratio": comm}
            lines.append(f.line("train_steps", d, t0 + 10 * i))
            if declare is not None:
                lines.append(f.line("host", {"cpu_util_ratio": 0.5, "net": [
                    {"nic": "eth0", "rx_bytes_total": 10**9, "tx_bytes_total": 10**9 + 400_000_000 * i}]}, t0 + 10 * i))
        if declare is not None:
            lines.append(f.line("train_job", {"run": "r", "rank": rank, **declare}, t0 - 5))
    Writer(c).write([("t", b"".join(lines))])
    c.close()
    return db


@pytest.mark.parametrize(("comm", "severity"), [(0.3, "warning"), (0.5, "critical"), (0.05, None), (None, None)])
def test_the_jobs_own_communication_wait_is_judged_too(tmp_path: Path, comm, severity) -> None:
    import duckdb

    db = _steps(tmp_path, "ddp", comm)
    with duckdb.connect(str(db), read_only=True) as c:
        found = detect("comm_bound", c, Scope())
    if severity is None:
        assert found == []
        return
    (f,) = found
    assert f.severity == severity and f.subject == "telemetry" and f.job == "ddp"
    assert f.evidence["exposed_comm_pct"] == pytest.approx(100 * comm) and f.evidence["ranks"] == 2
    assert f.evidence["step_ms"] == pytest.approx(1000.0) and f.evidence["steps"] == 1200


def test_a_ring_across_nodes_says_its_shape_and_the_bytes_it_moves(tmp_path: Path) -> None:
    """Issue 68: the declaration's world size, GPUs per node and gradient bytes (the PyTorch
    adapter declares them for a DDP model) and the hosts' network: 16 ranks on 2 nodes of 8
    all-reducing 100 MB a step move 2 x 15/16 x 100 = 187.5 MB a rank a step."""
    import duckdb

    db = _steps(tmp_path, "ring", 0.4, declare={"world_size": 16, "gpus_per_node": 8, "grad_bytes": 100_000_000})
    with duckdb.connect(str(db), read_only=True) as c:
        (f,) = detect("comm_bound", c, Scope())
    ev = f.evidence
    assert (ev["world_size"], ev["gpus_per_node"], ev["nodes"], ev["grad_mb"]) == (16, 8, 2, 100.0)
    assert ev["allreduce_mb_per_step"] == pytest.approx(187.5) and ev["allreduce_mb_s"] == pytest.approx(187.5)
    assert ev["host_net_tx_mb_s"] == pytest.approx(40.0, rel=1e-6)
    assert "the ring spans 2 nodes of 8 GPU(s), 187.5 MB a rank a step, hosts sending 40 MB/s" in f.summary
    assert f.suggests == ("cluster",)  # recommend cluster --from-job sizes it (the all-reduce model)


@pytest.mark.parametrize("bad", [{"world_size": -3, "gpus_per_node": 0, "grad_bytes": -1}, {"grad_bytes": 0}])
def test_a_nonsense_declaration_adds_no_evidence(tmp_path: Path, bad: dict) -> None:
    import duckdb

    db = _steps(tmp_path, "odd", 0.4, declare=bad)
    with duckdb.connect(str(db), read_only=True) as c:
        (f,) = detect("comm_bound", c, Scope())
    assert not {"world_size", "nodes", "grad_mb", "allreduce_mb_per_step"} & set(f.evidence)
    assert "ring spans" not in f.summary and f.suggests == ()


def test_the_models_scaling_across_the_world_sizes_measured_and_its_nvlink_traffic(tmp_path: Path) -> None:
    """Issue 68's evidence: the scaling efficiency of the job's model over the world sizes its
    runs measured (a one-GPU run the base), and what the job's GPUs sent over NVLink."""
    import duckdb

    from cmdare.wire.events import EventFactory
    from tests.analytics.recommend.test_cluster_allreduce import T0, db_of, ring_job

    nvl = EventFactory("ddp-16-n0", "worker", "ddp-16", {})
    gpu = b"".join(nvl.line("gpu", {"index": g, "uuid": f"GPU-{g}", "nvlink_total_tx_bytes_per_second": 2e9 + 1e9 * g},
                            T0 + 100) for g in range(2))
    db = db_of(tmp_path, ring_job("ddp-1", 1, 1), ring_job("ddp-8", 8, 1), ring_job("ddp-16", 16, 2), gpu)
    with duckdb.connect(str(db), read_only=True) as c:
        found = {f.job: f for f in detect("comm_bound", c, Scope(since=None))}
    ev = found["ddp-16"].evidence
    # one rank's step 0.21 s alone, 0.28 s among 8 on a node, 0.81 s among 16 on two
    assert ev["scaling_efficiency"] == "1:1.00,8:0.75,16:0.26"
    assert ev["nvlink_tx_mb_s"] == pytest.approx(2500.0)
    assert "nvlink_tx_mb_s" not in found["ddp-8"].evidence  # its GPUs report none
