"""The agent process for real: ticks into the spool, SIGTERM within 5 s (also with the
broker away), sd_notify readiness and watchdog over a real socket, the systemd unit, and
the agent importing with only its own dependencies."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cmdare.agent.config import load
from cmdare.agent.runtime import Agent
from cmdare.agent.sdnotify import Notifier
from cmdare.wire.events import decode_line
from cmdare.wire.spool import Position, read_lines
from tests.conftest import BIN, agent_env, wait_for
from tests.fakes.nvml import FakeNvml


def spool_events(d: Path) -> list[dict]:
    chunks, _, _ = read_lines(d, Position(0, 0), 1 << 30)
    return [decode_line(x) for c, _ in chunks for x in c.splitlines()]


def test_job_declarations_and_checkpoints_reach_the_spool_at_once_not_next_tick(tmp_path: Path) -> None:
    import tempfile
    import threading

    from cmdare.agent import track

    sock = Path(tempfile.mkdtemp(prefix="cmt-")) / "t.sock"
    cfg = load(
        None,
        env={"CMDARE_AGENT_CONFIG": str(tmp_path / "none.toml")},
        overrides={
            "node": "n1",
            "interval": 3600.0,  # the next tick is far away (ticks align to the clock's interval grid)
            "spool.dir": str(tmp_path / "sp"),
            "spool.fsync": False,
            "sources.train.socket": str(sock),
            "sources.gpu.enabled": False,
            "sources.tensorboard.enabled": False,
            "sources.tpu.enabled": False,
            "sources.cloud.enabled": False,
        },
    )
    agent = Agent(cfg)
    t = threading.Thread(target=agent.run, daemon=True)
    t.start()
    try:
        wait_for(lambda: sock.exists(), 10, what="the train socket")
        t0 = time.monotonic()
        run = track.init("urgent-job", model="m", socket_path=str(sock))
        with run.checkpoint("save", path="/tmp/x") as ck:
            ck.bytes = 123
        wait_for(
            lambda: {"train_job", "train_checkpoint"} <= {e["type"] for e in spool_events(tmp_path / "sp")},
            5,
            interval=0.02,
            what="declaration and checkpoint in the spool",
        )
        took = time.monotonic() - t0
    finally:
        agent.stop()
        t.join(10)
    assert took < 2.0  # not at the next tick
    evs = spool_events(tmp_path / "sp")
    assert [e["job"] for e in evs if e["type"].startswith("train_")] == ["urgent-job", "urgent-job"]
    first = next(i for i, e in enumerate(evs) if e["type"] == "train_job")
    # written between ticks: after the first tick, before any second one (the urgent path adds no tick)
    assert sum(e["type"] == "heartbeat" for e in evs[:first]) == 1


def test_agent_ticks_into_the_spool_with_status_per_source(tmp_path: Path) -> None:
    cfg = load(
        None,
        env={"CMDARE_AGENT_CONFIG": str(tmp_path / "none.toml")},
        overrides={
            "node": "n1",
            "job": "j",
            "interval": 0.1,
            "spool.dir": str(tmp_path / "sp"),
            "spool.fsync": False,
            "labels": {"team": "t"},
            "sources.train.socket": str(tmp_path / "t.sock"),
            "sources.cloud.provider": "none",
        },
    )
    agent = Agent(cfg, adapters={"nvml": FakeNvml(gpus=2)})
    agent.run(duration=0.55)
    evs = spool_events(tmp_path / "sp")
    types = [e["type"] for e in evs]
    ticks = types.count("host")
    assert ticks >= 4
    assert types.count("gpu") == 2 * ticks and types.count("heartbeat") == ticks
    # host, gpu, heartbeat, train and cloud report every tick; tpu (no TPU program here)
    # says once that it is unavailable; tensorboard is off until configured
    assert types.count("status") == 5 * ticks + 1
    once = [e["data"] for e in evs if e["type"] == "status" and e["data"]["source"] in ("tpu", "tensorboard")]
    assert [d["source"] for d in once] == ["tpu"]
    assert all(d["state"] == "unavailable" and d["message"] for d in once)
    assert {e["node"] for e in evs} == {"n1"} and all(e["labels"] == {"team": "t"} for e in evs)
    assert [e["data"]["seq"] for e in evs if e["type"] == "heartbeat"] == list(range(1, ticks + 1))
    assert len({e["id"] for e in evs}) == len(evs)
    st = [e["data"] for e in evs if e["type"] == "status" and e["data"]["source"] == "gpu"]
    assert all(s["ok"] and s["duration_seconds"] >= 0 for s in st)


def test_one_failing_source_does_not_stop_the_others(tmp_path: Path) -> None:
    cfg = load(
        None,
        env={"CMDARE_AGENT_CONFIG": str(tmp_path / "none.toml")},
        overrides={
            "interval": 0.1,
            "spool.dir": str(tmp_path / "sp"),
            "spool.fsync": False,
            "sources.train.enabled": False,
            "sources.cloud.provider": "none",
        },
    )
    agent = Agent(cfg, adapters={"nvml": FakeNvml(scenario="driver_missing")})
    agent.run(duration=0.35)
    evs = spool_events(tmp_path / "sp")
    gpu_status = [e["data"] for e in evs if e["type"] == "status" and e["data"]["source"] == "gpu"]
    assert len(gpu_status) == 1 and gpu_status[0]["state"] == "unavailable"  # reported once
    assert sum(e["type"] == "host" for e in evs) >= 3


def _start_agent(tmp_path: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(BIN / "cmdare-agent"),
            "--spool-dir",
            str(tmp_path / "sp"),
            "--interval",
            "0.2s",
            "--set",
            "sources.gpu.backend=python:tests.fakes.nvml",
            *extra,
        ],
        env=env or agent_env(),
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("sink", ["none", "unreachable-kafka"])
def test_sigterm_stops_within_5_seconds(tmp_path: Path, sink: str) -> None:
    extra: list[str] = []
    if sink != "none":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        extra = ["--sink", f"kafka://127.0.0.1:{port}/t"]
    p = _start_agent(tmp_path, *extra)
    wait_for(lambda: list((tmp_path / "sp").glob("*.ndjson")), 20, what="the agent's first spool segment")
    time.sleep(1.0)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=10)
    took = time.monotonic() - t0
    assert rc == 0 and took < 5.0, f"exit {rc} after {took:.1f}s: {p.stderr.read()[-500:]}"
    evs = spool_events(tmp_path / "sp")
    assert sum(e["type"] == "host" for e in evs) >= 3  # nothing sampled was lost on the way out


def test_sd_notify_ready_and_watchdog(tmp_path: Path) -> None:
    sock_path = str(tmp_path / "notify.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(sock_path)
    srv.settimeout(20)
    p = _start_agent(tmp_path, env=agent_env(NOTIFY_SOCKET=sock_path, WATCHDOG_USEC="400000"))
    try:
        got = []
        while not any("READY=1" in m for m in got) or sum("WATCHDOG=1" in m for m in got) < 2:
            got.append(srv.recv(4096).decode())
        p.send_signal(signal.SIGTERM)
        while not any("STOPPING=1" in m for m in got):
            got.append(srv.recv(4096).decode())
        assert p.wait(timeout=10) == 0
    finally:
        p.kill()
        srv.close()


def test_notifier_is_a_no_op_outside_systemd() -> None:
    n = Notifier(env={})
    assert not n.enabled and n.watchdog_interval is None
    n.ready()  # must not raise


def test_agent_imports_with_only_its_own_dependencies() -> None:
    """The agent is installed on every VM: importing all of it must not need DuckDB,
    pyarrow, click, statsmodels or anything from the collector / analytics side."""
    code = """
import sys, importlib.abc
BLOCK = ("duckdb", "pyarrow", "click", "statsmodels", "pandas", "numpy", "cmdare.collector", "cmdare.analytics",
         "prometheus_client", "opentelemetry")  # the exports import theirs when configured
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith(BLOCK):
            raise ImportError("agent must not import " + name)
sys.meta_path.insert(0, Block())
import pkgutil, importlib, cmdare.agent
for m in pkgutil.walk_packages(cmdare.agent.__path__, "cmdare.agent."):
    if not m.name.startswith("cmdare.agent.adapters."):  # framework adapters import their framework
        importlib.import_module(m.name)
import cmdare.agent.cli
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "ok", r.stderr


def test_once_prints_one_round_as_json(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            str(BIN / "cmdare-agent"),
            "--once",
            "--spool-dir",
            str(tmp_path / "sp"),
            "--set",
            "sources.gpu.backend=python:tests.fakes.nvml",
            "--node",
            "n9",
        ],
        env=agent_env(CMDARE_FAKE_NVML="gpus=3"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    evs = json.loads(r.stdout)
    assert [e["type"] for e in evs].count("gpu") == 3 and evs[0]["node"] == "n9"
    assert not list((tmp_path / "sp").glob("*.ndjson"))  # --once writes nothing


def lifecycle_agent(tmp_path: Path, boot: float, stopping: bool = False, state: str | None = None) -> Agent:
    cfg = load(
        None,
        env={"CMDARE_AGENT_CONFIG": str(tmp_path / "none.toml")},
        overrides={
            "node": "n1",
            "interval": 0.1,
            "spool.dir": str(tmp_path / "sp"),
            "spool.fsync": False,
            "sources.train.enabled": False,
            "sources.gpu.enabled": False,
            "sources.tpu.enabled": False,
            "sources.cloud.provider": "none",
        },
    )
    return Agent(cfg, adapters={"boot_time": boot, "system_stopping": lambda: stopping,
                                "system_state": lambda: state})


def test_lifecycle_boot_start_stop_and_shutdown(tmp_path: Path) -> None:
    boot = time.time() - 3600
    lifecycle_agent(tmp_path, boot, state="starting").run(duration=0.25)  # first start since this boot
    a = lifecycle_agent(tmp_path, boot, state="running")  # restarted: same boot, long after it
    threading.Timer(0.25, a.stop, args=("SIGTERM",)).start()
    a.run()
    a = lifecycle_agent(tmp_path, boot + 7200, stopping=True)  # rebooted (no systemd); stopped by the shutdown
    threading.Timer(0.25, a.stop, args=("SIGTERM",)).start()
    a.run()
    evs = spool_events(tmp_path / "sp")
    life = [(e["data"]["event"], e["data"].get("stop_reason")) for e in evs if e["type"] == "lifecycle"]
    assert life == [
        ("boot", None),
        ("agent_start", None),
        ("agent_stop", "duration"),
        ("agent_start", None),  # the same boot: no boot event
        ("agent_stop", "SIGTERM"),
        ("boot", None),
        ("agent_start", None),
        ("agent_stop", "SIGTERM"),
        ("shutdown", None),
    ]
    lc = [e for e in evs if e["type"] == "lifecycle"]
    assert lc[0]["ts"] == round(boot, 6) and lc[5]["ts"] == round(boot + 7200, 6)  # dated at the boot
    assert all(e["data"]["interval_seconds"] == 0.1 and e["data"]["boot_time"] for e in lc)
    starts = [e for e in evs if e["type"] == "lifecycle" and e["data"]["event"] == "agent_start"]
    # started by the boot / by hand later / unknown (no systemd): only the first measures start-up
    assert [s["data"].get("during_boot") for s in starts] == [True, False, None]
    firsts = [next(i for i, x in enumerate(evs) if x["id"] == s["id"]) for s in starts]
    assert all(evs[i - 1]["type"] == "lifecycle" or i == 1 for i in firsts)  # before any sample
    idents = [e["data"] for e in evs if e["type"] == "instance"]
    assert len(idents) == 3 and all(d["cloud"] == "none" for d in idents)
    assert [d["boot_time"] for d in idents] == [boot, boot, boot + 7200]


def test_a_hanging_metadata_service_never_holds_up_the_other_sources(tmp_path: Path) -> None:
    from tests.fakes.metadata import FakeMetadata

    srv = FakeMetadata("aws").start()
    srv.mode = "hang"
    try:
        cfg = load(
            None,
            env={"CMDARE_AGENT_CONFIG": str(tmp_path / "none.toml")},
            overrides={
                "node": "n1",
                "interval": 0.1,
                "spool.dir": str(tmp_path / "sp"),
                "spool.fsync": False,
                "sources.train.enabled": False,
                "sources.gpu.enabled": False,
                "sources.tpu.enabled": False,
                "sources.cloud.provider": "aws",
                "sources.cloud.metadata_url": srv.url,
                "sources.cloud.timeout": "300ms",
            },
        )
        t0 = time.monotonic()
        Agent(cfg).run(duration=1.0)
        took = time.monotonic() - t0
    finally:
        srv.stop()
    evs = spool_events(tmp_path / "sp")
    assert took < 2.0  # the stop is not held up by a request in flight either
    assert sum(e["type"] == "host" for e in evs) >= 8 and sum(e["type"] == "heartbeat" for e in evs) >= 8
    cloud = [e["data"] for e in evs if e["type"] == "status" and e["data"]["source"] == "cloud"]
    errors = [d for d in cloud if d["state"] == "error"]
    assert errors and "timed out after 0.3s" in errors[0]["message"]
    assert not any(e["type"] == "instance" for e in evs)


def test_sigterm_ends_the_agent_even_while_a_source_never_returns(tmp_path: Path) -> None:
    """Issue 69: a call that never returns in the sampling loop (here NVML's utilisation
    read, as a driver stuck in an ioctl; before, a FIFO in the Slurm GPU map) kept the agent
    past SIGTERM for 10 s and more. The signal is taken by a thread of its own: the process
    ends within 5 s, says why in one line, and what it spooled before stays."""
    env = {**agent_env(), "CMDARE_FAKE_NVML": "gpus=1,scenario=hang,lost_after=3"}
    p = _start_agent(tmp_path, env=env)
    wait_for(lambda: list((tmp_path / "sp").glob("*.ndjson")), 20, what="the agent's first spool segment")
    wait_for(lambda: sum(e["type"] == "gpu" for e in spool_events(tmp_path / "sp")) >= 3, 20,
             what="three GPU samples (then the read hangs)")
    time.sleep(1.0)  # stuck in the fourth read by now
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=15)
    took = time.monotonic() - t0
    err = p.stderr.read()
    assert took < 5.0, f"exit {rc} after {took:.1f}s: {err[-500:]}"
    assert rc == 1 and "has not returned 4.5 s after SIGTERM (a source is stuck)" in err
    assert sum(e["type"] == "gpu" for e in spool_events(tmp_path / "sp")) >= 3
