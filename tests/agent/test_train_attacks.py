"""The training socket tried as a hostile local user would (issue 32): datagrams that used to
kill the receiver thread, records that overflowed a whole tick, a flood of distinct ranks.
Each costs what it is (counted per job), never another job's steps, never the receiver; and
a fuzz of the decoder over thousands of generated datagrams."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmdare.agent.exporters import MetricStore
from cmdare.agent.sources.train import TrainSource
from tests.agent.test_train import collect, send, source
from tests.conftest import examples, wait_for

HEAD = {"v": 1, "run": "r", "pid": 1, "dropped": 0}



def _steps(job: str, rank: int = 0, n: int = 5, examples: float = 32) -> dict:
    return {**HEAD, "job": job, "rank": rank, "k": "steps",
            "s": [[1000.0 + i, 0.1, 0.01, examples, i + 1] for i in range(n)]}


def test_datagrams_that_killed_the_receiver_are_counted_and_it_keeps_receiving(sockdir: Path) -> None:
    p = sockdir / "t.sock"
    src = source(p)
    src.start()
    try:
        send(p, b'{"v":1,"job":"evil","run":"","rank":0,"k":"steps","s":[],"dropped":1e999}')
        send(p, b"[" * 200_000)
        send(p, b'{"v":1,"job":"evil","run":"","rank":0,"k":"steps","s":[],"dropped":-1}')
        send(p, json.dumps({**HEAD, "job": "x" * 1000, "rank": 0, "k": "steps", "s": []}).encode())
        send(p, json.dumps({**HEAD, "job": "evil", "rank": 2**40, "k": "steps", "s": []}).encode())
        wait_for(lambda: src.bad == 5, 5, what="five bad datagrams counted")
        assert src._thread is not None and src._thread.is_alive()
        send(p, _steps("good"))
        wait_for(lambda: src.received == 1, 5, what="a good datagram after them")
        evs = collect(src)
    finally:
        src.close()
    assert [(t, job, d["steps"]) for t, d, _, job in evs if t == "train_steps"] == [("train_steps", "good", 5)]


def test_one_jobs_out_of_range_records_cost_none_of_another_jobs_steps(sockdir: Path) -> None:
    p = sockdir / "t.sock"
    src = source(p)
    src.start()
    try:
        send(p, _steps("evil", examples=1e308))
        send(p, _steps("good", n=500))
        wait_for(lambda: src.received == 1 and src.bad == 1, 5, what="datagrams")
        assert src.bad_by_job == {"evil": 1}
        evs = collect(src)
    finally:
        src.close()
    got = {job: d for t, d, _, job in evs if t == "train_steps"}
    assert set(got) == {"good"} and got["good"]["steps"] == 500


def test_a_failing_aggregate_costs_that_rank_only(sockdir: Path, monkeypatch) -> None:
    p = sockdir / "t.sock"
    src = source(p)
    src.start()
    try:
        send(p, _steps("a"))
        send(p, _steps("b"))
        wait_for(lambda: src.received == 2, 5, what="datagrams")
        out: list = []

        def emit(t, d, ts=None, job=None):
            if job == "a":
                raise ValueError("Out of range float values are not JSON compliant")
            out.append((t, job))

        src.collect(emit)
    finally:
        src.close()
    assert ("train_steps", "b") in out


def test_a_flood_of_ranks_is_capped_counted_and_metrics_stay_bounded(sockdir: Path) -> None:
    p = sockdir / "t.sock"
    src = source(p, max_ranks_per_job=50, max_ranks=80)
    src.start()
    try:
        for i in range(300):
            send(p, _steps("flood", rank=i, n=1))
        for i in range(60):
            send(p, _steps("other", rank=i, n=1))
        wait_for(lambda: src.received + src.bad == 360, 10, what="all datagrams handled")
        assert sum(1 for k in src.ranks if k[0] == "flood") == 50  # its own cap
        assert len(src.ranks) == 80  # and the total cap: other got the 30 left
        assert src.refused == 280
        evs = collect(src)
    finally:
        src.close()
    store = MetricStore("n", "worker", "", max_series=500)
    for t, d, _, job in evs:
        store.observe(t, d, job)
    assert store.nseries <= 501 and store.refused > 0  # the cap, and the refusal counter itself
    snap = {f.name: series for f, series in store.snapshot()}
    assert sum(len(x) for x in snap.values()) <= 501  # the cap, and the refusal counter itself
    assert snap["cmdare_agent_series_refused_total"][0][1] == store.refused


def test_the_receiver_thread_is_supervised(sockdir: Path, caplog) -> None:
    p = sockdir / "t.sock"
    src = source(p)
    src.start()
    try:
        stop = threading.Event()
        dead = threading.Thread(target=stop.wait, args=(0,))
        dead.start()
        dead.join()
        old = src._thread
        src._thread = dead  # as if the receiver had ended
        collect(src)
        assert src.restarts == 1 and src._thread is not dead and src._thread.is_alive()
        assert "receiver ended; restarted" in caplog.text
        send(p, _steps("j"))
        wait_for(lambda: src.received == 1, 5, what="a datagram through the new receiver")
        assert old is not None
    finally:
        src.close()


# -- fuzz -----------------------------------------------------------------------------------
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10)),
    lambda k: st.one_of(st.lists(k, max_size=6), st.dictionaries(st.text(max_size=4), k, max_size=4)), max_leaves=20)
messages = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 2, "1"]), "job": st.one_of(st.just("j"), st.text(max_size=5), values),
     "rank": st.one_of(st.integers(-5, 5), values), "k": st.sampled_from(["steps", "data", "job", "ckpt", "x"]),
     "s": st.one_of(st.lists(st.lists(st.one_of(st.floats(), st.integers(-10, 2**60)), min_size=5, max_size=5),
                             max_size=4), values)},
    optional={"run": values, "dropped": st.one_of(st.integers(-1, 2**64), st.floats()), "params": values},
)


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=messages)
def test_fuzz_generated_datagrams_are_taken_or_counted(m: dict) -> None:
    src = TrainSource(TrainSource.parse_config("sources.train", {"socket": "/nonexistent/t.sock"}))
    try:
        data = json.dumps(m, allow_nan=True).encode()
    except (ValueError, OverflowError):
        return
    src._take(data)  # never raises
    assert src.received + src.bad == 1
    evs: list = []
    src.collect_urgent(lambda t, d, ts=None, job=None: evs.append(t))
    with src.lock:
        for r in src.ranks.values():
            for rec in r.records + r.produced:
                assert all(isinstance(x, (int, float)) and abs(x) < 1e300 for x in rec)


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300))
def test_fuzz_raw_bytes_are_counted(data: bytes) -> None:
    src = TrainSource(TrainSource.parse_config("sources.train", {"socket": "/nonexistent/t.sock"}))
    src._take(data)
    assert src.received + src.bad == 1
