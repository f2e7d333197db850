"""A fleet simulator: wire-format events of training jobs and spot VM lives with known
ground truth, for the performance-model tests and bench/model_quality.py.

Ground truth (``Truth``): a single worker's step time is
``a * FLOPs/peak + b * 4*params/bandwidth + c * tensors + d`` on the accelerator of the
catalogue; in a parameter-server cluster each worker's step takes
``T1 + e * S + f * S * W / P`` (S = parameter GB moved per step, W workers, P parameter
servers: the PS link saturates as W/P grows); checkpoint save / restore take
``g + h * GB``; spot VM lifetimes are exponential with a rate per (region, accelerator),
some lives stopped by their owners (censored).  Step telemetry has what real runs have:
multiplicative noise, a ramp while workers join, a partial last interval, and the odd
slow interval.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from cmdare.analytics import catalog

T0 = 1_780_000_000.0


@dataclass
class Truth:
    a: float = 1.4  # compute efficiency: 1/1.4 of peak
    b: float = 20.0  # passes over the weights per step (gradients, optimizer state, memory-bound kernels)
    c: float = 1.5e-4  # seconds per parameter tensor (kernel launches, optimizer)
    d: float = 0.004  # fixed per-step overhead
    e: float = 0.02  # s per GB moved, uncontended
    f: float = 0.06  # s per GB per worker per PS: contention
    save_fixed: float = 1.5
    save_per_gb: float = 0.9
    restore_fixed: float = 0.8
    restore_per_gb: float = 0.5
    noise: float = 0.03  # multiplicative, per interval
    hazard_per_hour: dict[tuple[str, str], float] = field(
        default_factory=lambda: {
            ("us-central1", "v100"): 0.08,
            ("us-central1", "k80"): 0.03,
            ("europe-west4", "v100"): 0.15,
        }
    )

    def t1(self, flops: float, params: float, tensors: float, acc: catalog.Accelerator) -> float:
        return (
            self.a * flops / acc.peak_flops + self.b * 4 * params / acc.bandwidth + self.c * tensors + self.d
        )

    def tw(self, t1: float, params: float, workers: int, ps: int) -> float:
        s = 4 * params / 1e9
        return t1 + self.e * s + self.f * s * workers / ps


MODELS = [  # name, params, tensors, forward GFLOPs per example (CNN-like spread)
    ("resnet18", 11.7e6, 62, 1.8),
    ("resnet34", 21.8e6, 110, 3.6),
    ("resnet50", 25.6e6, 161, 4.1),
    ("resnet101", 44.5e6, 314, 7.8),
    ("resnet152", 60.2e6, 467, 11.5),
    ("vgg11", 132.9e6, 22, 7.6),
    ("vgg16", 138.4e6, 32, 15.5),
    ("vgg19", 143.7e6, 38, 19.6),
    ("alexnet", 61.1e6, 16, 0.7),
    ("inception3", 23.8e6, 292, 5.7),
    ("mobilenet2", 3.5e6, 158, 0.3),
    ("densenet121", 8.0e6, 364, 2.9),
    ("googlenet", 6.6e6, 173, 1.5),
    ("squeezenet", 1.2e6, 52, 0.35),
    ("shufflenet", 2.3e6, 170, 0.15),
]


class Fleet:
    def __init__(self, truth: Truth | None = None, seed: int = 0) -> None:
        self.truth = truth or Truth()
        self.rng = random.Random(seed)
        self.cat = catalog.load()
        self.events: list[dict[str, Any]] = []
        self._n = 0
        self.t = T0

    def _ev(self, ts: float, node: str, type_: str, data: dict[str, Any], job: str = "") -> None:
        self._n += 1
        self.events.append(
            {
                "v": 1,
                "id": f"sim-{self._n}",
                "ts": round(ts, 6),
                "node": node,
                "role": "worker",
                "job": job,
                "labels": {},
                "type": type_,
                "data": data,
            }
        )

    def job(
        self,
        model: tuple,
        accel: str,
        workers: int = 1,
        ps: int = 0,
        batch: int = 32,
        intervals: int = 30,
        interval: float = 10.0,
        checkpoints: int = 0,
    ) -> str:
        name, params, tensors, gflops = model
        acc = self.cat[accel]
        flops = 3 * gflops * 1e9 * batch  # forward + backward
        tr = self.truth
        t1 = tr.t1(flops, params, tensors, acc)
        speed = 1 / t1 if ps == 0 else workers / tr.tw(t1, params, workers, ps)  # cluster steps/s
        job = f"{name}-{accel}-w{workers}p{ps}-{self._n}"
        start = self.t
        self.t += intervals * interval + 600
        self._ev(
            start,
            f"{job}-n0",
            "train_job",
            {
                "run": "r1",
                "rank": 0,
                "world_size": workers,
                "ps": ps,
                "model": name,
                "params": int(params),
                "tensors": tensors,
                "flops_per_step": flops,
                "batch_size": batch,
                "accelerator": acc.name,
            },
            job,
        )
        ranks = workers if ps > 0 else 1  # PS jobs: every worker reports its own steps
        for rank in range(ranks):
            step, t = 0, start + 20
            for i in range(intervals):
                ramp = (0.3, 0.6, 0.85)[i] if i < 3 else 1.0
                v = speed / ranks * ramp * math.exp(self.rng.gauss(0, tr.noise))
                if self.rng.random() < 0.03:
                    v *= 0.3  # a slow interval: a straggler, a noisy neighbour
                span = interval * (0.4 if i == intervals - 1 else 1.0)
                n = max(1, round(v * span))
                t += span
                self._ev(
                    t,
                    f"{job}-n{rank}",
                    "train_steps",
                    {
                        "run": "r1",
                        "rank": rank,
                        "interval_seconds": interval,
                        "steps": n,
                        "first_step": step + 1,
                        "last_step": step + n,
                        "examples": float(n * batch),
                        "step_mean_seconds": span / n,
                        "wait_mean_seconds": 0.0,
                        "steps_per_second": n / span,
                        "examples_per_second": n * batch / span,
                    },
                    job,
                )
                step += n
        for k in range(checkpoints):
            gb = 12 * params / 1e9 * self.rng.uniform(0.8, 1.2)  # weights + optimizer state
            for action, fixed, per in (
                ("save", tr.save_fixed, tr.save_per_gb),
                ("restore", tr.restore_fixed, tr.restore_per_gb),
            ):
                secs = (fixed + per * gb) * math.exp(self.rng.gauss(0, tr.noise))
                self._ev(
                    start + 30 + 10 * k,
                    f"{job}-n0",
                    "train_checkpoint",
                    {
                        "run": "r1",
                        "rank": 0,
                        "action": action,
                        "seconds": secs,
                        "bytes": int(gb * 1e9),
                        "step": 100 * k,
                        "ok": True,
                    },
                    job,
                )
        return job

    def vm_lives(self, per_group: int = 40, owner_stop_share: float = 0.3) -> None:
        """Spot VM lives: exponential lifetimes per group; for a share of the VMs the owner
        plans a stop at a uniform time within 48 h, independent of the lifetime (so the
        censoring is non-informative, as Kaplan-Meier assumes); the earlier of the two
        ends the life."""
        for (region, accel), rate in self.truth.hazard_per_hour.items():
            acc = self.cat[accel]
            for i in range(per_group):
                node = f"vm-{region}-{accel}-{i}"
                boot = T0 - 10 * 86400 + self.rng.uniform(0, 86400)
                life = self.rng.expovariate(rate) * 3600
                stop = None
                if self.rng.random() < owner_stop_share:
                    planned = self.rng.uniform(0.0, 48 * 3600)
                    stop = planned if planned < life else None
                end = boot + (stop or life)
                start = boot + self.rng.uniform(30, 90)
                if end <= start + 20:
                    end = start + 20
                self._ev(
                    start,
                    node,
                    "lifecycle",
                    {"event": "agent_start", "boot_time": boot, "interval_seconds": 10.0},
                )
                self._ev(
                    start + 1,
                    node,
                    "instance",
                    {
                        "cloud": "gce",
                        "region": region,
                        "zone": region + "-a",
                        "instance_type": "n1-standard-8",
                        "spot": True,
                        "accelerator": acc.name,
                        "accelerator_count": 1,
                        "boot_time": boot,
                    },
                )
                self._ev(end - 5, node, "heartbeat", {"seq": 1, "interval_seconds": 10.0})
                if stop is not None:
                    self._ev(
                        end,
                        node,
                        "lifecycle",
                        {"event": "agent_stop", "stop_reason": "SIGTERM", "boot_time": boot},
                    )
                else:
                    self._ev(
                        end - 25,
                        node,
                        "revocation",
                        {
                            "cloud": "gce",
                            "kind": "preemption",
                            "notice_id": "gce:preempted",
                            "revokes": True,
                            "deadline": end + 5,
                            "lead_seconds": 30.0,
                            "boot_time": boot,
                        },
                    )
