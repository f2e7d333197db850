from __future__ import annotations

from cmdare.analytics.units import Scope

from .conftest import found


def test_idle_gpus_of_a_running_job_and_memory_held_with_no_work(fleet) -> None:
    def build(s):
        s.sim_job(kind="idle", nodes=2, gpus=4, idle=((1, 2), (1, 3)))
        s.sim_job(kind="held", nodes=1, gpus=2, held_after=0.5)
        s.sim_job(kind="warmup", nodes=1, gpus=2, warmup=4)  # loading data for 4 minutes: not idle
        s.sim_job(kind="busy", nodes=2, gpus=2)

    con, _ = fleet(build)
    f = found(con, "gpu_idle")
    assert set(f) == {"sim-idle-1", "sim-held-2"}
    idle = f["sim-idle-1"][0]
    assert (idle.node, idle.subject, idle.severity) == ("sim-idle-1-n1", "2,3", "warning")
    assert idle.evidence["idle_gpus"] == 2 and idle.evidence["gpus"] == 4
    assert 0.9 <= idle.evidence["gpu_hours_wasted"] <= 1.1  # 2 GPUs x 30 minutes
    held = f["sim-held-2"][0]
    assert held.evidence["in_job"] is False and held.evidence["mem_used_bytes"] > 10 * 2**30
    assert held.subject == "0,1" and "hold 12.0 GiB" in held.summary
    # the held time is what the idle buckets outside every span add up to, at the GPUs'
    # sampling interval (read apart from the summary the detector uses)
    from cmdare.analytics.detectors import evidence

    scope = Scope()
    b, s = evidence.gpu_buckets(con, scope), evidence.spans(con, scope)
    (secs,) = con.execute(
        f"""SELECT sum(n * 300 / (SELECT max(n) FROM {b} x WHERE x.node = g.node AND x."index" = g."index"))
            FROM {b} g WHERE node = 'sim-held-2-n0' AND util < 0.05 AND mem >= 2^30
              AND NOT EXISTS (SELECT 1 FROM {s} s WHERE s.node = g.node AND g.b + INTERVAL 300 SECOND > s.t0
                              AND g.b <= s.t1)""").fetchone()
    assert secs > 0 and held.evidence["gpu_hours_wasted"] == round(secs / 3600, 3)


def test_every_gpu_idle_is_a_stalled_job_and_options_apply(fleet) -> None:
    con, _ = fleet(lambda s: s.sim_job(kind="stalled", nodes=1, gpus=2, idle=((0, 0), (0, 1))))
    f = found(con, "gpu_idle")["sim-stalled-1"][0]
    assert f.severity == "critical" and f.evidence["job_stalled"] is True
    assert f.summary.endswith("GPU-hours wasted); every GPU of the job is idle: stalled?")
    assert found(con, "gpu_idle", min_idle="2h") == {}


T0 = 1.75e9 - (1.75e9 % 300)  # a 5-minute bucket's start
GIB = 2**30


def _steps(s, node: str, job: str, start: float, end: float) -> None:
    """``job`` steps on ``node`` from ``start`` to ``end`` (one record a minute)."""
    from cmdare.wire.events import EventFactory

    f = EventFactory(node, "worker", job)
    for ts in range(int(start) + 60, int(end) + 1, 60):
        s.events.append(f.make("train_steps", {"run": "r", "steps": 60, "steps_per_second": 1.0,
                                               "interval_seconds": 60.0}, float(ts)))


def _gpu(s, node: str, index: int, buckets: dict[int, float], mem: int | None = None, job: str = "") -> None:
    """GPU ``index`` of ``node`` sampled every 10 s: ``buckets``: bucket number -> utilisation."""
    from cmdare.wire.events import EventFactory

    f = EventFactory(node, "worker", job)
    for b, util in buckets.items():
        for k in range(30):
            data = {"index": index, "uuid": f"G-{node}-{index}", "util_gpu_ratio": util}
            if mem is not None:
                data["mem_used_bytes"] = mem
            s.events.append(f.make("gpu", data, T0 + 300 * b + 10 * k + 5))


def _utc(ts: float):
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).replace(tzinfo=None)


def test_an_idle_gpu_finding_states_its_numbers_exactly(fleet) -> None:
    """Job "exact" steps for three buckets (900 s) on two nodes. On n0, GPU 0 is idle the
    whole time (900 s), GPU 1 exactly min_idle (600 s, 2 of 3 buckets), GPU 2 idle one
    bucket of the two it reported (300 s: half its time but under min_idle); n1's GPU is busy."""
    def build(s):
        for node in ("exact-n0", "exact-n1"):
            _steps(s, node, "exact", T0, T0 + 900)
        _gpu(s, "exact-n0", 0, {0: 0.0, 1: 0.0, 2: 0.0}, mem=3 * GIB + 2)
        _gpu(s, "exact-n0", 1, {0: 0.01, 1: 0.03, 2: 0.7})  # no memory reported
        _gpu(s, "exact-n0", 2, {0: 0.0, 1: 0.9})
        _gpu(s, "exact-n1", 0, {0: 0.9, 1: 0.9, 2: 0.9}, mem=5 * GIB)

    con, _ = fleet(build)
    (f,) = found(con, "gpu_idle")["exact"]  # nothing reported as memory held outside a job
    assert f.evidence == {
        "idle_gpus": 2, "gpus": 3, "gpu_hours_wasted": 0.417, "mean_util_ratio": 0.1233,  # (0 + (0.01 + 0.03 + 0.7) / 3) / 2, to 4 places
        "idle_share": 0.833, "mem_used_bytes": (3 * GIB + 2) // 2, "job_stalled": False,
    } and round(1500 / 3600, 4) == 0.4167 and round(150 / 180, 4) == 0.8333  # kept to 3 places
    assert f.summary == "2 of 3 GPUs on exact-n0 idle while the job ran (mean 12% busy; 0.4 GPU-hours wasted)"
    assert (f.node, f.subject, f.severity, f.confidence, f.suggests) == ("exact-n0", "0,1", "warning", 0.9, ())  # no recommender sizes away an idle GPU
    assert (f.window_start, f.window_end) == (_utc(T0), _utc(T0 + 900))
    # GPU 1 at exactly 2/3 of its time idle: min_share is "at least"
    assert found(con, "gpu_idle", min_share=repr(2 / 3))["exact"][0].subject == "0,1"
    assert found(con, "gpu_idle", min_share="0.67")["exact"][0].subject == "0"
    assert found(con, "gpu_idle", min_idle="601s")["exact"][0].subject == "0"
    assert found(con, "gpu_idle", idle_util="0.02")["exact"][0].subject == "0"  # GPU 1's second bucket: busy


def test_memory_held_with_no_job_stepping_is_named_with_the_job_that_left_it(fleet) -> None:
    """Node left-n0: job "left-a" steps in bucket 0, its two GPUs then hold memory idle in
    buckets 1 and 2, when job "left-b" starts at bucket 3's first instant; left-b's bucket is
    its own, and GPU 0 holds memory idle again after it (bucket 4: 900 s in all, GPU 1 600 s). The finding names left-a (the last job to step before the
    memory was left), not left-b nor the agent's own job label. Node lone-n0 never ran a
    job: its finding is the agent's job."""
    def build(s):
        _steps(s, "left-n0", "left-a", T0, T0 + 240)
        _steps(s, "left-n0", "left-b", T0 + 900, T0 + 1140)
        _gpu(s, "left-n0", 0, {0: 0.9, 1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}, mem=2 * GIB, job="agent-label")
        _gpu(s, "left-n0", 1, {0: 0.9, 1: 0.0, 2: 0.0}, mem=4 * GIB + 2, job="agent-label")
        _gpu(s, "lone-n0", 0, {0: 0.0, 1: 0.0}, mem=GIB, job="lone")
        _gpu(s, "none-n0", 0, {0: 0.0, 1: 0.0}, mem=GIB)  # no job anywhere: none named

    con, _ = fleet(build)
    f = found(con, "gpu_idle")
    assert set(f) == {"left-a", "lone", ""}
    (left,) = f["left-a"]
    assert left.evidence == {"idle_gpus": 2, "gpu_hours_wasted": 0.417, "mem_used_bytes": 3 * GIB + 1,
                             "in_job": False}
    assert left.summary == "2 GPUs on left-n0 hold 3.0 GiB each with no work and no job stepping (0.4 GPU-hours)"
    assert (left.node, left.subject, left.severity, left.confidence) == ("left-n0", "0,1", "warning", 0.8)
    assert (left.window_start, left.window_end) == (_utc(T0 + 300), _utc(T0 + 1500))
    (lone,) = f["lone"]
    assert (lone.node, lone.evidence["gpu_hours_wasted"], lone.evidence["mem_used_bytes"]) == ("lone-n0", 0.167, GIB)
    assert f[""][0].node == "none-n0" and f[""][0].job is None
    assert found(con, "gpu_idle", min_mem="1025MiB").keys() == {"left-a"}
    assert set(found(con, "gpu_idle", Scope(job="lone"))) == {"lone"}


def test_a_gpu_busy_by_gpu_util_but_idle_by_its_graphics_engine_is_idle(tmp_path) -> None:
    """NVML's GPU_UTIL counts a GPU busy while one tiny kernel runs; where GPM's
    graphics-engine activity is there, the idle detector judges by it."""
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import EventFactory

    from .conftest import T0

    def db(name: str, gr: float | None):
        f = EventFactory("t0", "worker", "")
        lines = []
        for k in range(180):  # 30 minutes at 10 s
            ts = T0 + 10 * k
            lines.append(f.line("train_steps", {"run": "r", "steps": 10, "steps_per_second": 1.0,
                                                "interval_seconds": 10.0}, ts, job="tiny"))
            g = {"index": 0, "uuid": "GPU-t", "util_gpu_ratio": 0.9, "mem_used_bytes": 2 << 30}
            if gr is not None:
                g["gr_engine_active_ratio"] = gr
            lines.append(f.line("gpu", g, ts))
        con = connect(tmp_path / f"{name}.duckdb")
        assert Writer(con).write([("t", b"".join(lines))]).dead == 0
        return con

    f = found(db("gr", 0.02), "gpu_idle")
    assert list(f) == ["tiny"] and f["tiny"][0].evidence
    assert found(db("util-only", None), "gpu_idle") == {}  # no GPM: GPU_UTIL, 90 %


def test_idle_tpu_cores_of_a_running_job_are_reported_as_tpu_cores(tmp_path) -> None:
    """A TPU VM's cores are the job's accelerators: duty cycle is their utilisation."""
    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import EventFactory

    from .conftest import T0

    f = EventFactory("tpu-vm", "worker", "")
    lines = []
    for k in range(180):
        ts = T0 + 10 * k
        lines.append(f.line("train_steps", {"run": "r", "steps": 10, "steps_per_second": 1.0,
                                            "interval_seconds": 10.0, "input_wait_seconds_mean": 0.5,
                                            "step_mean_seconds": 1.0}, ts, job="bert"))
        for dev in range(4):
            duty = 0.01 if dev < 2 else 0.8
            lines.append(f.line("tpu", {"device": dev, "duty_cycle_ratio": duty, "hbm_used_bytes": 8 << 30,
                                        "hbm_total_bytes": 16 << 30}, ts))
    con = connect(tmp_path / "tpu.duckdb")
    assert Writer(con).write([("t", b"".join(lines))]).dead == 0
    f = found(con, "gpu_idle")
    (x,) = f["bert"]
    assert x.summary.startswith("2 of 4 TPU cores on tpu-vm idle while the job ran") and x.subject == "0,1"
    assert x.evidence["idle_gpus"] == 2 and x.evidence["job_stalled"] is False
    steps = con.execute("SELECT round(avg(gpu_util_ratio), 4) FROM step_hardware").fetchone()[0]
    assert steps == round((0.01 * 2 + 0.8 * 2) / 4, 4)  # the steps' accelerator use: the TPU cores'
