"""Training telemetry end to end: a real numpy training loop with a real multi-process data
loader -> cmdare.agent.track -> Unix socket -> cmdare-agent -> spool -> cmdare-collector
-> DuckDB -> analyze steps / jobs.  And the agent absent, killed and restarted while the
loop runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.conftest import BIN, ROOT, agent_env, wait_for

# training processes, agents and collectors run for seconds each: scripts/test-fast leaves it to the full run
pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: times what it waits for

LOOP = ROOT / "tests" / "integration" / "train_loop.py"



def start_agent(spool: Path, sock: Path, node: str = "train-1", *sets: str) -> subprocess.Popen:
    """A real agent process (0.5 s ticks, fake NVML, train socket ``sock``); ``sets``:
    more ``--set KEY=VALUE`` overrides."""
    p = subprocess.Popen(
        [
            str(BIN / "cmdare-agent"),
            "--spool-dir",
            str(spool),
            "--interval",
            "0.5s",
            "--node",
            node,
            "--set",
            "sources.gpu.backend=python:tests.fakes.nvml",
            "--set",
            f"sources.train.socket={sock}",
            "--set",
            "sources.train.enabled=true",
            *(a for kv in sets for a in ("--set", kv)),
        ],
        env=agent_env(CMDARE_FAKE_NVML="gpus=1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: sock.exists() or p.poll() is not None, 30, what="the agent's train socket")
    assert p.poll() is None, p.stderr.read() if p.stderr else ""
    return p


def train(mode: str, steps: int, job: str, sock: Path, pause: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(LOOP),
            "--mode",
            mode,
            "--steps",
            str(steps),
            "--job",
            job,
            "--pause",
            str(pause),
        ],
        env=agent_env(CMDARE_TRAIN_SOCKET=str(sock)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(p: subprocess.Popen, timeout: float = 120) -> dict:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def load(spool: Path, db: Path) -> None:
    r = subprocess.run(
        [str(BIN / "cmdare-collector"), "spool", str(spool), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


def analyze(*args: str) -> list[dict]:
    r = subprocess.run([str(BIN / "analyze"), *args, "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_input_bound_and_compute_bound_loops_are_told_apart(tmp_path: Path, sockdir: Path) -> None:
    spool, db, sock = tmp_path / "spool", tmp_path / "t.duckdb", sockdir / "train.sock"
    agent = start_agent(spool, sock)
    try:
        res_in = finish(train("input", 600, "job-input", sock))
        res_cpu = finish(train("compute", 300, "job-compute", sock))
        time.sleep(1.2)  # two more ticks: the last records are aggregated and spooled
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
    assert res_in["dropped"] == 0 and res_cpu["dropped"] == 0
    load(spool, db)

    rows = {r["run"]: r for r in analyze("steps", "--job", "job-input", "--db", str(db))}
    r = rows["r1"]
    assert r["steps"] == res_in["steps"] == 600  # every step record arrived, once
    assert r["input_wait_pct"] > 50 and r["input_bound"] == "highly input-bound"
    assert r["node"] == "train-1" and r["examples_per_s"] == pytest.approx(32 * r["steps_per_s"], rel=0.01)

    r = analyze("steps", "--job", "job-compute", "--db", str(db))[0]
    assert r["steps"] == 300
    assert r["input_wait_pct"] < 10 and r["input_bound"] == "not input-bound"

    bad = subprocess.run(
        [str(BIN / "analyze"), "steps", "--job", "nope", "--db", str(db)], capture_output=True, text=True
    )
    assert (
        bad.returncode == 1
        and "no steps for job 'nope' (jobs with steps: job-compute, job-input)" in bad.stderr
    )

    jobs = {j["job"]: j for j in analyze("jobs", "--db", str(db))}
    assert jobs["job-input"]["model"] == "linreg" and jobs["job-input"]["batch_size"] == 32
    assert jobs["job-input"]["input_bound"] == "highly input-bound"
    assert jobs["job-compute"]["input_bound"] == "not input-bound"

    con = duckdb.connect(str(db), read_only=True)
    ck = con.execute("SELECT job, action, bytes, ok FROM checkpoints ORDER BY job").fetchall()
    joined = con.execute(
        "SELECT count(*), count(gpu_util_ratio) FROM step_hardware WHERE job = 'job-input'"
    ).fetchone()
    con.close()
    assert ck == [("job-compute", "save", 512, True), ("job-input", "save", 512, True)]
    assert joined[0] > 0 and joined[1] == joined[0]  # each interval met the node's GPU samples

    # the findings: the input-bound loop is, the compute-bound one is not
    found = analyze("bottlenecks", "--kind", "input_bound", "--db", str(db))
    assert [f["job"] for f in found] == ["job-input"]
    f = found[0]
    assert f["evidence"]["profiler_class"] == "highly input-bound" and f["evidence"]["input_wait_share"] > 0.5
    assert f["suggests"] == ["data-workers", "placement"]


def test_agent_absent_killed_and_restarted_never_blocks_training(tmp_path: Path, sockdir: Path) -> None:
    spool, db, sock = tmp_path / "spool", tmp_path / "t.duckdb", sockdir / "train.sock"
    loop = train("compute", 1500, "job-chaos", sock, pause=0.002)  # no agent yet: ~12 s of steps
    time.sleep(1.5)
    agent = start_agent(spool, sock)
    time.sleep(2.0)
    agent.kill()  # SIGKILL: the socket file stays behind, nobody reads it
    agent.wait()
    time.sleep(1.5)
    agent = start_agent(spool, sock)  # replaces the stale socket
    try:
        res = finish(loop)
        time.sleep(1.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
    # the loop never raised and never blocked: no step took long, whatever the agent did
    assert res["steps"] == 1500 and res["max_step_seconds"] < 0.5
    assert res["dropped"] > 0  # what went nowhere was counted
    load(spool, db)
    con = duckdb.connect(str(db), read_only=True)
    stored, max_dropped, last = con.execute(
        "SELECT sum(steps), max(dropped_total), max(last_step) FROM steps WHERE job = 'job-chaos'"
    ).fetchone()
    con.close()
    assert 0 < stored < 1500 and last == 1500  # steps after the restart arrived, up to the end
    assert max_dropped > 0  # the library's drop count reached the database
    assert stored + res["dropped"] <= 1500 + 2  # never more than was recorded (+ job, checkpoint)


TB_WRITER = """
import sys, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
w = EventFileWriter(sys.argv[1], flush_secs=1)
t0 = time.time()
for i in range(1, 31):
    vals = [summary_pb2.Summary.Value(tag="global_step/sec", simple_value=20.0),
            summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / i)]
    w.add_event(event_pb2.Event(wall_time=t0 + i * 0.1, step=i * 2, summary=summary_pb2.Summary(value=vals)))
    w.flush()
    time.sleep(0.1)
w.close()
"""


def test_tensorboard_logs_reach_the_database_live_and_a_later_import_adds_nothing(
    tmp_path: Path, sockdir: Path
) -> None:
    pytest.importorskip("tensorboard")
    logs, spool, db = tmp_path / "tb" / "bert-tb", tmp_path / "spool", tmp_path / "t.duckdb"
    agent = start_agent(
        spool,
        sockdir / "t.sock",
        "tb-1",
        f'sources.tensorboard.logdirs=["{logs}"]',
        "sources.tensorboard.enabled=true",
        'sources.tensorboard.scalars=["loss"]',
    )
    try:
        writer = subprocess.run(
            [sys.executable, "-c", TB_WRITER, str(logs / "train")],
            env=agent_env(),
            timeout=60,
            capture_output=True,
        )
        assert writer.returncode == 0, writer.stderr
        time.sleep(1.5)  # the agent's next ticks read the last records
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=10)
    assert agent.returncode == 0, err
    load(spool, db)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), sum(steps), min(job), min(run) FROM steps").fetchone() == (
        30,
        58,
        "bert-tb",
        "train",
    )
    assert con.execute("SELECT count(*) FROM scalars WHERE tag = 'loss'").fetchone()[0] == 30
    con.close()
    (row,) = analyze("steps", "--job", "bert-tb", "--db", str(db))
    assert row["steps_per_s"] == pytest.approx(20.0) and row["node"] == "tb-1"
    r = subprocess.run(
        [
            str(BIN / "analyze"),
            "import",
            "tensorboard",
            str(logs),
            "--job",
            "bert-tb",
            "--db",
            str(db),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["steps"] == 0 and res["scalars"] == 0  # the agent already stored every point


def test_a_deliberately_slowed_rank_is_found_as_a_straggler(tmp_path: Path, sockdir: Path) -> None:
    """Four real training processes of one job (ranks 0-3 through $RANK / $WORLD_SIZE), rank
    2 made slower, through the agent, the spool and the collector: analyze bottlenecks names
    rank 2 as a persistent straggler and no other rank."""
    spool, db, sock = tmp_path / "spool", tmp_path / "t.duckdb", sockdir / "train.sock"
    agent = start_agent(spool, sock)
    try:
        procs = []
        for rank in range(4):
            slow = rank == 2
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(LOOP), "--mode", "compute", "--job", "job-ranks",
                     "--steps", "110" if slow else "280", "--pause", "0.08" if slow else "0.03"],
                    env=agent_env(CMDARE_TRAIN_SOCKET=str(sock), RANK=str(rank), WORLD_SIZE="4"),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        results = [finish(p) for p in procs]
        time.sleep(1.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
    assert all(r["dropped"] == 0 for r in results)
    load(spool, db)
    found = analyze("bottlenecks", "--kind", "straggler", "--set", "straggler.window=1s", "--db", str(db))
    assert [(f["job"], f["rank"], f["node"]) for f in found] == [("job-ranks", 2, "train-1")], found
    ev = found[0]["evidence"]
    assert ev["persistent"] is True and ev["slowdown"] > 1.5 and ev["ranks"] == 4


def test_input_workers_telemetry_reaches_the_database_and_sizes_the_input(tmp_path: Path, sockdir: Path) -> None:
    """A trainer fed by one real input-worker process (40 ms per batch; the trainer needs one
    every 10 ms): the worker's batches arrive as data_batches rows and the tf.data rule on
    them asks for about 4 workers."""
    spool, db, sock = tmp_path / "spool", tmp_path / "t.duckdb", sockdir / "train.sock"
    agent = start_agent(spool, sock)
    try:
        p = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "integration" / "input_service.py"), "--job", "job-fed",
             "--workers", "1", "--steps", "150", "--make-ms", "40", "--compute-ms", "10"],
            env=agent_env(CMDARE_TRAIN_SOCKET=str(sock)), capture_output=True, text=True, timeout=120,
        )
        assert p.returncode == 0, p.stderr
        time.sleep(1.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    made = [x for x in lines if "made" in x][0]
    assert made["dropped"] == 0 and made["made"] >= 150
    load(spool, db)
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT rank, sum(batches), sum(process_mean_seconds * batches) / sum(batches), max(node) "
        "FROM data_batches WHERE job = 'job-fed' GROUP BY rank"
    ).fetchall()
    con.close()
    assert len(rows) == 1 and rows[0][0] == 100 and rows[0][1] == made["made"] and rows[0][3] == "train-1"
    assert 0.035 < rows[0][2] < 0.08  # 40 ms of making per batch
    r = subprocess.run([str(BIN / "analyze"), "recommend", "data-workers", "--job", "job-fed", "--db", str(db), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[0])
    assert out["assumptions"]["current_workers"] == 1 and out["assumptions"]["source"] == "telemetry of job-fed"
    assert 3 <= out["action"]["workers"] <= 5  # 10 ms compute vs 40 ms per batch: 4


DDP = ROOT / "tests" / "integration" / "ddp_loop.py"


def ddp_job(model: str, job: str, sock: Path, steps: int = 80, script: Path | None = None,
            args: tuple[str, ...] = ()) -> list[dict]:
    """Two real DDP ranks over gloo (tests/integration/ddp_loop.py, or ``script``) through the
    adapter and the agent's train socket, as torchrun starts them: each rank's result line."""
    from tests.conftest import free_port

    port = free_port()
    argv = [str(DDP), "--model", model, *args] if script is None else [str(script), *args]
    procs = [subprocess.Popen(
        [sys.executable, *argv, "--steps", str(steps), "--job", job],
        env=agent_env(CMDARE_TRAIN_SOCKET=str(sock), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    return [finish(p, timeout=180) for p in procs]


def test_a_communication_bound_ddp_job_is_found_and_a_hidden_one_is_not(tmp_path: Path, sockdir: Path) -> None:
    """Issue 68: real torch.distributed DDP over gloo, 2 ranks, tracked by track_module on the
    DDP model (its communication hook times the all-reduce against the end of backward),
    through the agent, the spool and the collector. A wide model on a tiny batch (a step
    mostly all-reduce) gets a comm_bound finding from its telemetry; a narrow model on a
    large batch (the all-reduce hides in the step) gets none."""
    spool, db, sock = tmp_path / "spool", tmp_path / "t.duckdb", sockdir / "train.sock"
    agent = start_agent(spool, sock)
    try:
        bound = ddp_job("comm", "ddp-comm", sock)
        hidden = ddp_job("compute", "ddp-compute", sock)
        time.sleep(1.2)  # two more ticks: the last records are aggregated and spooled
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
    assert all(r["dropped"] == 0 and r["steps"] == 80 and r["buckets"] >= 79 for r in bound + hidden), bound + hidden
    load(spool, db)
    con = duckdb.connect(str(db), read_only=True)
    shares = dict(con.execute("SELECT job, sum(comm_mean_seconds * steps) / sum(step_mean_seconds * steps) FROM steps "
                              "GROUP BY job").fetchall())
    ranks = con.execute("SELECT count(DISTINCT rank) FROM steps WHERE job = 'ddp-comm'").fetchone()[0]
    con.close()
    assert shares["ddp-comm"] > 2 * shares["ddp-compute"], shares
    found = analyze("bottlenecks", "--kind", "comm_bound", "--db", str(db))
    assert [f["job"] for f in found] == ["ddp-comm"], (found, shares)
    ev = found[0]["evidence"]
    assert ev["ranks"] == ranks == 2 and ev["exposed_comm_pct"] == pytest.approx(100 * shares["ddp-comm"], abs=0.5)
    assert 0 < ev["exposed_comm_ms"] < ev["step_ms"] and found[0]["subject"] == "telemetry"
    # goodput calls that time communication, not productive (the reference rank's share)
    gp = {r["category"]: r for r in analyze("goodput", "--job", "ddp-comm", "--db", str(db))}
    step = sum(gp[c]["seconds"] for c in ("productive", "input_wait", "communication"))
    assert gp["communication"]["seconds"] > 0.3 * step, gp
    # and recommend cluster sizes it by the all-reduce model (one world size measured: its
    # own class's constant, no held-out basis), pricing gradient accumulation
    (advice,) = [analyze("recommend", "cluster", "--from-job", "ddp-comm", "--db", str(db))]
    assert advice["action"]["ps"] == 0 and advice["assumptions"]["grad_mb"] > 0, advice
    assert advice["assumptions"]["gain_accumulate"] > 0.2 and "accumulate gradients" in advice["why"], advice

