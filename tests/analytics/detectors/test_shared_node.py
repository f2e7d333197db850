"""Two jobs on one node never share evidence (issue 66): a tracked job and a Slurm job side by
side, the Slurm job's GPU throttled and idle-with-memory. Before, every GPU bucket on the
node during the tracked job's span was the tracked job's, so its findings counted the Slurm
job's GPU ("2 GPUs"). A GPU held by a scheduler job is the tracked job's only where that
holder ran it."""

from __future__ import annotations

from cmdare.wire.events import EventFactory

from .conftest import T0, found

HOT = 0x40 | 0x4 | 0x1  # hw_thermal + sw_power_cap (+ the idle bit, never a reason)


def shared(s, tracked_holder: str | None = None) -> None:
    """Node n0 for 30 minutes: GPU 0 the tracked job's (``tracked_holder``: the Slurm job it
    runs in, named on its samples), GPU 1 Slurm job 900's, throttled with its clock down."""
    f = EventFactory("n0", "worker", "resnet")
    s.events.append(f.make("train_job", {"run": "r", "rank": 0, "world_size": 1}, T0))
    for b in range(6):
        for k in range(15):
            ts = T0 + 300 * b + 10 + 20 * k
            mine = {"index": 0, "uuid": "G-0", "util_gpu_ratio": 0.95, "throttle_mask": 0, "sm_clock_hz": 1.6e9}
            if tracked_holder:
                mine["slurm_job"] = tracked_holder
            s.events.append(f.make("gpu", mine, ts, job=f"slurm-{tracked_holder}" if tracked_holder else "resnet"))
            s.events.append(f.make("gpu", {"index": 1, "uuid": "G-1", "util_gpu_ratio": 0.9, "throttle_mask": HOT,
                                           "sm_clock_hz": 0.9e9, "slurm_job": "900"}, ts, job="slurm-900"))
        s.events.append(f.make("train_steps", {"run": "r", "rank": 0, "steps": 10, "step_mean_seconds": 1.0,
                                               "interval_seconds": 10.0}, T0 + 300 * b + 150))


def test_a_slurm_jobs_gpu_beside_a_tracked_job_is_not_its_evidence(fleet) -> None:
    con, _ = fleet(lambda s: shared(s))
    f = found(con, "gpu_throttled")
    assert "resnet" not in f  # its own GPU never throttled
    (theirs,) = f["slurm-900"]
    assert theirs.subject == "1" and theirs.evidence["gpus"] == 1


def test_a_tracked_job_inside_its_slurm_job_keeps_its_own_gpu(fleet) -> None:
    """The tracked job runs in Slurm job 800 (its GPU's samples name it), beside job 900 on
    the same node: no process list links either, and 800 is not the node's only holder, so
    neither Slurm job's GPU is the tracked job's; 900's findings stay 900's."""
    con, _ = fleet(lambda s: shared(s, tracked_holder="800"))
    f = found(con, "gpu_throttled")
    assert "resnet" not in f and [x.subject for x in f["slurm-900"]] == ["1"]


def test_a_tracked_job_alone_inside_a_slurm_job_keeps_its_gpus_without_process_lists(fleet) -> None:
    """The common case the rule must not break: a tracked job whose node's GPUs are all held
    by the one Slurm job it runs in (no process list to prove it): they are its evidence."""
    def build(s) -> None:
        f = EventFactory("n1", "worker", "bert")
        s.events.append(f.make("train_job", {"run": "r", "rank": 0, "world_size": 1}, T0))
        for b in range(6):
            for k in range(15):
                s.events.append(f.make("gpu", {"index": 0, "uuid": "G-b", "util_gpu_ratio": 0.9, "throttle_mask": HOT,
                                               "sm_clock_hz": 0.9e9, "slurm_job": "700"}, T0 + 300 * b + 10 + 20 * k,
                                       job="slurm-700"))
            s.events.append(f.make("train_steps", {"run": "r", "rank": 0, "steps": 10, "step_mean_seconds": 1.0,
                                                   "interval_seconds": 10.0}, T0 + 300 * b + 150))

    con, _ = fleet(build)
    f = found(con, "gpu_throttled")
    assert [x.subject for x in f["bert"]] == ["0"] and "slurm-700" not in f
