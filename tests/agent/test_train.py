"""The tracking library (cmdare.agent.track) and the agent's train source, over a real
Unix datagram socket."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cmdare.agent import track
from cmdare.agent.config import ConfigError
from cmdare.agent.runtime import SourceRunner
from cmdare.agent.sources.base import SourceUnavailable
from cmdare.agent.sources.train import TrainSource
from tests.conftest import ROOT, wait_for


class Listener:
    """The receiving end the agent would be: a bound datagram socket."""

    def __init__(self, path: Path) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(str(path))
        self.s.settimeout(1.0)

    def messages(self) -> list[dict]:
        out = []
        self.s.setblocking(False)
        while True:
            try:
                out.append(json.loads(self.s.recv(1 << 20)))
            except BlockingIOError:
                return out


def test_library_imports_without_the_agents_dependencies() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('psutil', 'pynvml', 'kafka', 'tomli', 'duckdb', 'numpy'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from cmdare.agent import track\n"
        "run = track.init('j', socket_path='/nonexistent/x.sock')\n"
        "[run.step(examples=1) for _ in range(3)]\n"
        "run.close(); print(run.steps, run.dropped)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)}
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "4"]  # 2 step records, the job declaration and the end: all dropped


def test_batches_measures_input_wait_and_step_time(sockdir: Path) -> None:
    ln = Listener(sockdir / "a.sock")
    run = track.init(
        "job-a", run="r9", rank=3, world_size=4, model="m", params=10, socket_path=str(sockdir / "a.sock")
    )

    def slow_loader() -> Iterator[int]:
        for i in range(6):
            time.sleep(0.03)  # the loop blocks 30 ms on each batch
            yield i

    seen = []
    for b in run.batches(slow_loader(), examples=lambda b: b + 1):
        seen.append(b)
        time.sleep(0.01)  # 10 ms of "compute"
    run.close()
    assert seen == list(range(6))
    msgs = ln.messages()
    job = msgs[0]
    assert job["k"] == "job" and job["job"] == "job-a" and job["run"] == "r9" and job["rank"] == 3
    assert job["world_size"] == 4 and job["params"] == 10 and job["model"] == "m"
    recs = [r for m in msgs if m["k"] == "steps" for r in m["s"]]
    assert len(recs) == 6 and run.steps == 6 and run.dropped == 0
    assert [r[3] for r in recs] == [1, 2, 3, 4, 5, 6]  # examples of the batch each step processed
    for _ts, step_s, wait_s, _ex, _n in recs[:-1]:
        assert 0.025 < wait_s < 0.1 and step_s == pytest.approx(wait_s + 0.01, abs=0.02)
    assert recs[-1][2] < 0.01  # the last step ends at StopIteration: no batch to wait for


def test_produced_times_an_input_workers_batches_and_its_hand_over(sockdir: Path) -> None:
    ln = Listener(sockdir / "d.sock")
    run = track.init("job-d", role="data", rank=2, socket_path=str(sockdir / "d.sock"))

    def pipeline() -> Iterator[int]:
        for i in range(5):
            time.sleep(0.03)  # 30 ms to make each batch
            yield i

    out = []
    for b in run.produced(pipeline(), examples=64):
        out.append(b)
        time.sleep(0.01)  # 10 ms handing it over (a queue put)
    assert out == list(range(5)) and run.batches_produced == 5 and run.steps == 0
    msgs = ln.messages()
    assert msgs[0]["k"] == "job" and msgs[0]["role"] == "data" and msgs[0]["rank"] == 2
    recs = [r for m in msgs if m["k"] == "data" for r in m["s"]]
    assert not [m for m in msgs if m["k"] == "steps"]
    assert len(recs) == 5 and [r[4] for r in recs] == [1, 2, 3, 4, 5] and {r[3] for r in recs} == {64}
    for _ts, proc, idle, _n, _i in recs:
        assert 0.025 < proc < 0.1 and 0.008 < idle < 0.06
    # a consumer that stops early: the last batch is still recorded when the generator closes
    gen = run.produced(pipeline())
    next(gen)
    gen.close()
    run.close()
    assert run.batches_produced == 6


def test_checkpoint_is_timed_with_its_size_and_failure(sockdir: Path) -> None:
    ln = Listener(sockdir / "c.sock")
    run = track.init("job-c", socket_path=str(sockdir / "c.sock"))
    with run.checkpoint("save", path="/ckpt/1") as ck:
        time.sleep(0.02)
        ck.bytes = 1234
    with pytest.raises(OSError), run.checkpoint("restore"):
        raise OSError("disk gone")
    with pytest.raises(ValueError, match="save' or 'restore"):
        run.checkpoint("copy")
    cks = [m for m in ln.messages() if m["k"] == "ckpt"]
    assert cks[0]["action"] == "save" and cks[0]["bytes"] == 1234 and cks[0]["ok"] is True
    assert cks[0]["seconds"] >= 0.02 and cks[0]["path"] == "/ckpt/1"
    assert cks[1]["ok"] is False and cks[1]["error"] == "OSError: disk gone"


def test_no_agent_drops_and_counts_never_raises() -> None:
    run = track.init("job-x", socket_path="/nonexistent/dir/t.sock")
    for _ in range(track.FLUSH_RECORDS * 2 + 1):
        run.step(examples=8)
    run.close()
    assert run.steps == 513 and run.dropped == 1 + 512 + 1  # job declaration, every record, the end


def test_init_rejects_bad_arguments_with_one_line() -> None:
    with pytest.raises(ValueError, match="job must be a non-empty string"):
        track.init("")
    with pytest.raises(ValueError, match="role must be one of"):
        track.init("j", role="boss")


# -- the agent side ----------------------------------------------------------------------
def source(path: Path, **cfg: object) -> TrainSource:
    return TrainSource(TrainSource.parse_config("sources.train", {"socket": str(path), **cfg}))


def collect(src: TrainSource) -> list[tuple[str, dict, float | None, str | None]]:
    out: list = []
    src.collect(lambda t, d, ts=None, job=None: out.append((t, d, ts, job)))
    return out


def send(path: Path, msg: dict | bytes) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(msg if isinstance(msg, bytes) else json.dumps(msg).encode(), str(path))
    s.close()


def test_source_aggregates_steps_per_rank(sockdir: Path) -> None:
    p = sockdir / "t.sock"
    src = source(p)
    src.start()
    try:
        head = {"v": 1, "job": "j", "run": "r", "pid": 1, "dropped": 4}
        recs = [[1000.0 + i, 0.1 * (i + 1), 0.01 * (i + 1), 32, i + 1] for i in range(10)]
        send(p, {**head, "rank": 0, "k": "steps", "s": recs})
        send(p, {**head, "rank": 1, "k": "steps", "s": recs[:2]})
        wait_for(lambda: src.received == 2, 5, what="datagrams")
        evs = collect(src)
    finally:
        src.close()
    steps = {d["rank"]: (d, ts, job) for t, d, ts, job in evs if t == "train_steps"}
    d, ts, job = steps[0]
    assert job == "j" and ts == 1009.0
    assert d["steps"] == 10 and d["examples"] == 320 and d["first_step"] == 1 and d["last_step"] == 10
    assert d["step_mean_seconds"] == pytest.approx(0.55) and d["step_max_seconds"] == pytest.approx(1.0)
    assert d["step_p50_seconds"] == pytest.approx(0.5) and d["step_p95_seconds"] == pytest.approx(1.0)
    assert d["wait_share_ratio"] == pytest.approx(0.1) and d["dropped_total"] == 4
    # the steps covered 9 s between ends plus the first step's own 0.1 s
    assert d["steps_per_second"] == pytest.approx(10 / 9.1) and d["examples_per_second"] == pytest.approx(
        320 / 9.1
    )
    assert steps[1][0]["steps"] == 2
    assert not p.exists()  # close removes the socket


def test_source_aggregates_an_input_workers_batches(sockdir: Path) -> None:
    p = sockdir / "t.sock"
    src = source(p)
    src.start()
    try:
        head = {"v": 1, "job": "j", "run": "r", "pid": 1, "dropped": 0, "rank": 7}
        recs = [[2000.0 + i, 0.2 * (1 + i % 2), 0.05, 64, i + 1] for i in range(10)]
        send(p, {**head, "k": "data", "s": recs})
        send(p, {**head, "k": "data", "s": [[1, 2, 3]]})  # malformed: counted, never fatal
        wait_for(lambda: src.received == 1 and src.bad == 1, 5, what="datagrams")
        evs = collect(src)
    finally:
        src.close()
    data = [(d, ts, job) for t, d, ts, job in evs if t == "train_data"]
    assert len(data) == 1 and not [e for e in evs if e[0] == "train_steps"]
    d, ts, job = data[0]
    assert job == "j" and ts == 2009.0 and d["rank"] == 7 and d["batches"] == 10 and d["elements"] == 640
    assert d["process_mean_seconds"] == pytest.approx(0.3) and d["process_p50_seconds"] == pytest.approx(0.2)  # the lower middle, as for steps
    assert d["idle_mean_seconds"] == pytest.approx(0.05) and d["idle_share_ratio"] == pytest.approx(0.05 / 0.35)


def test_slow_steps_are_kept_on_their_own(sockdir: Path) -> None:
    p = sockdir / "s.sock"
    src = source(p, slow_factor="3")
    src.start()
    try:
        head = {"v": 1, "job": "j", "run": "", "rank": 0, "k": "steps"}
        send(p, {**head, "s": [[1.0 + i, 0.1, 0.0, 1, i] for i in range(30)]})
        wait_for(lambda: src.received == 1, 5, what="datagram")
        assert not [e for e in collect(src) if e[0] == "train_slow_step"]
        send(p, {**head, "s": [[40.0, 0.1, 0.0, 1, 30], [41.0, 0.5, 0.3, 1, 31], [42.0, 0.25, 0.0, 1, 32]]})
        wait_for(lambda: src.received == 2, 5, what="datagram")
        slow = [(d, ts) for t, d, ts, _ in collect(src) if t == "train_slow_step"]
    finally:
        src.close()
    assert len(slow) == 1 and slow[0][1] == 41.0
    assert slow[0][0] == {
        "run": "",
        "rank": 0,
        "step": 31,
        "step_seconds": 0.5,
        "wait_seconds": 0.3,
        "median_seconds": 0.1,
        "examples": 1,
    }


def test_bad_datagrams_are_counted_and_bad_fields_left_out(sockdir: Path, caplog) -> None:
    p = sockdir / "b.sock"
    src = source(p)
    src.start()
    try:
        send(p, b"not json")
        send(p, {"v": 2, "job": "j", "rank": 0, "k": "steps", "s": []})
        send(p, {"v": 1, "job": "j", "rank": 0, "k": "steps", "s": [[1, 2, "x", 4, 5]]})
        send(p, {"v": 1, "job": "j", "rank": 0, "k": "steps", "s": [[1, float("nan"), 0, 4, 5]]})
        send(p, {"v": 1, "job": "j", "rank": 0, "k": "job", "params": "many", "model": "m"})
        wait_for(lambda: src.received + src.bad == 5, 5, what="datagrams")
        assert src.bad == 4
        evs = collect(src)
    finally:
        src.close()
    # the pid: this process, as the kernel named the sender
    assert [(t, d) for t, d, _, _ in evs] == [("train_job", {"run": "", "rank": 0, "model": "m", "pid": os.getpid()})]
    assert "train_job.params must be int" in caplog.text and "4 malformed or refused datagrams" in caplog.text


def test_stale_socket_is_replaced_and_a_file_in_the_way_is_unavailable(sockdir: Path) -> None:
    stale = sockdir / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(stale))
    s.close()  # a killed agent leaves this behind
    src = source(stale)
    src.start()
    send(stale, {"v": 1, "job": "j", "rank": 0, "k": "job"})
    wait_for(lambda: src.received == 1, 5, what="datagram")
    src.close()
    (sockdir / "plain").write_text("important")
    runner = SourceRunner(source(sockdir / "plain"))
    statuses: list = []
    runner.tick(lambda *a, **k: None, lambda *a: statuses.append(a))
    assert statuses[0][1] == "unavailable" and "not a socket" in statuses[0][3]
    assert (sockdir / "plain").read_text() == "important"


def test_slow_factor_must_be_above_one() -> None:
    with pytest.raises(ConfigError, match=r"sources.train.slow_factor: must be a number above 1, got '0.5'"):
        TrainSource.parse_config("sources.train", {"slow_factor": "0.5"})


def test_socket_is_0660_for_a_group_and_an_unknown_group_is_said(sockdir: Path) -> None:
    import grp
    import os
    import stat as st

    p = sockdir / "g.sock"
    mine = grp.getgrgid(os.getgid()).gr_name
    src = source(p, socket_group=mine)
    src.start()
    try:
        m = p.stat()
        assert st.S_IMODE(m.st_mode) == 0o660 and m.st_gid == os.getgid()  # not 0666: other users cannot send
    finally:
        src.close()
    src = source(p, socket_mode="0666")
    src.start()
    try:
        assert st.S_IMODE(p.stat().st_mode) == 0o666
    finally:
        src.close()
    src = source(p, socket_group="no-such-group-cmdare")
    with pytest.raises(SourceUnavailable, match="socket_group 'no-such-group-cmdare' does not exist"):
        src.start()
    assert not p.exists()
    for bad, msg in (("660x", "expected octal permission bits like 0660"), ("0460", "the owner (the agent) must keep write")):
        with pytest.raises(ConfigError, match=re.escape(msg)):
            source(p, socket_mode=bad)


def test_communication_wait_travels_from_the_library_to_the_steps_event(sockdir: Path) -> None:
    """run.add_comm_wait (issue 68): each step after the first report carries its
    communication wait; the agent reports its mean and share beside input wait."""
    ln = Listener(sockdir / "c.sock")
    run = track.init("ddp", rank=1, socket_path=str(sockdir / "c.sock"))
    run.step()
    for i in range(4):
        time.sleep(0.02)
        run.add_comm_wait(0.005 if i else float("nan"))  # not finite: ignored
        run.add_comm_wait(-1)  # negative: ignored
        run.step(examples=8)
    run.close()
    recs = [r for m in ln.messages() if m["k"] == "steps" for r in m["s"]]
    assert [len(r) for r in recs] == [5, 6, 6, 6]  # the first step had no report yet
    assert [r[5] for r in recs[1:]] == [0.005, 0.005, 0.005]
    # ... and a run that never reports it sends the five fields it always did
    p = sockdir / "t.sock"
    src = source(p)
    src.start()
    try:
        head = {"v": 1, "job": "j", "run": "r", "pid": 1, "dropped": 0}
        send(p, {**head, "rank": 0, "k": "steps", "s": [[1000.0 + i, 0.1, 0.01, 8, i + 1, 0.04] for i in range(5)]})
        send(p, {**head, "rank": 1, "k": "steps", "s": [[1000.0 + i, 0.1, 0.01, 8, i + 1] for i in range(5)]})
        # hostile: more than the step itself, negative, a string, a seventh field: the datagram is refused
        for bad in ([1.0, 0.1, 0.0, 1, 1, 0.5], [1.0, 0.1, 0.0, 1, 1, -0.1], [1.0, 0.1, 0.0, 1, 1, "x"],
                    [1.0, 0.1, 0.0, 1, 1, 0.01, 7]):
            send(p, {**head, "rank": 2, "k": "steps", "s": [bad]})
        wait_for(lambda: src.received == 2 and src.bad == 4, 5, what="datagrams")
        evs = collect(src)
    finally:
        src.close()
    steps = {d["rank"]: d for t, d, _, _ in evs if t == "train_steps"}
    assert steps[0]["comm_mean_seconds"] == pytest.approx(0.04) and steps[0]["comm_share_ratio"] == pytest.approx(0.4)
    assert "comm_mean_seconds" not in steps[1] and 2 not in steps


def test_a_sender_the_agent_cannot_see_is_said_once_and_never_given_a_pid(sockdir: Path, caplog) -> None:
    """Issue 66: a job page showed a job's own GPU process as another's. Where the agent
    runs in a PID namespace of its own (a DaemonSet without hostPID), the kernel's
    credentials give a trainer's PID as 0: its GPU processes cannot be matched to its job.
    That is said once, in one line naming the fix, and no PID is taken from the datagram."""
    import logging
    import socket
    import struct

    src = source(sockdir / "t.sock")
    zero = [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("iII", 0, 1000, 1000))]
    with caplog.at_level(logging.WARNING, logger="cmdare.agent.train"):
        assert src._sender_pid(zero) is None and src._sender_pid(zero) is None
    said = [r.getMessage() for r in caplog.records if "PID namespace" in r.getMessage()]
    assert len(said) == 1 and "hostPID: true" in said[0] and "\n" not in said[0]
    mine = [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("iII", 4242, 0, 0))]
    assert src._sender_pid(mine) == 4242 and src._sender_pid([]) is None
