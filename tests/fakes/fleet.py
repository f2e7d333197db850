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

    def _ev(self, ts: float, node: str, type_: str, data: dict[str, Any], job: str = "", role: str = "worker") -> None:
        self._n += 1
        self.events.append(
            {
                "v": 1,
                "id": f"sim-{self._n}",
                "ts": round(ts, 6),
                "node": node,
                "role": role,
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

    def vm_lives(self, per_group: int = 40, owner_stop_share: float = 0.3,
                 zone_b: dict[tuple[str, str], float] | None = None) -> None:
        """Spot VM lives: exponential lifetimes per group; for a share of the VMs the owner
        plans a stop at a uniform time within 48 h, independent of the lifetime (so the
        censoring is non-informative, as Kaplan-Meier assumes); the earlier of the two
        ends the life. Lives run in zone ``<region>-a``; ``zone_b``: (region, accelerator) ->
        hazard per hour of a second zone ``<region>-b`` that every other life runs in."""
        for (region, accel), rate0 in self.truth.hazard_per_hour.items():
            acc = self.cat[accel]
            for i in range(per_group):
                node = f"vm-{region}-{accel}-{i}"
                in_b = bool(zone_b and (region, accel) in zone_b and i % 2)
                rate = zone_b[(region, accel)] if in_b and zone_b else rate0
                boot = T0 - 10 * 86400 + self.rng.uniform(0, 86400)
                life = self.rng.expovariate(rate) * 3600
                stop = None
                if self.rng.random() < owner_stop_share:
                    planned = self.rng.uniform(0.0, 48 * 3600)
                    stop = planned if planned < life else None
                end = boot + (stop or life)
                start = boot + self.rng.uniform(30, 90)
                # every tenth VM: the agent was started by hand well into the life (not by
                # the boot): its start says nothing about VM start-up
                by_hand = i % 10 == 9 and end - boot > 1200
                if by_hand:
                    start = boot + (end - boot) / 2
                if end <= start + 20:
                    end = start + 20
                self._ev(
                    start,
                    node,
                    "lifecycle",
                    {"event": "agent_start", "boot_time": boot, "interval_seconds": 10.0, "during_boot": not by_hand},
                )
                self._ev(
                    start + 1,
                    node,
                    "instance",
                    {
                        "cloud": "gce",
                        "region": region,
                        "zone": region + ("-b" if in_b else "-a"),
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


# ---------------------------------------------------------------------------------------
# Labelled scenarios for the detectors (analyze bottlenecks): jobs with and without each
# problem, with GPU, host, step, error and checkpoint telemetry at realistic noise, and the
# ground truth of what is wrong with each.

KINDS = ("ps_bound", "input_bound", "straggler", "gpu_idle", "gpu_throttled", "gpu_errors", "checkpoint_overhead")
TICK = 10.0  # the agent's sampling interval and the tracking library's step interval
GIB = 1 << 30


class Scenarios(Fleet):
    """``job(...)`` simulates one job from its behaviour; ``suite()`` builds the labelled
    set; ``labels``: job -> {kind: detail (a rank or node the finding must name) or None}."""

    def __init__(self, seed: int = 0, t0: float = T0, prefix: str = "sim") -> None:
        super().__init__(seed=seed)
        self.t0 = t0
        self.prefix = prefix
        self.labels: dict[str, dict[str, Any]] = {}
        self._jobs = 0

    def sim_job(
        self,
        labels: dict[str, Any] | None = None,
        *,
        kind: str = "job",
        nodes: int = 2,
        gpus: int = 2,
        minutes: float = 30.0,
        rank_speed: float = 5.0,
        wait: float = 0.02,
        wait_known: bool = True,
        util: float = 0.9,
        cpu: float = 0.35,
        idle: tuple[tuple[int, int], ...] = (),
        held_after: float | None = None,
        throttled_node: int | None = None,
        throttle_share: float = 0.0,
        slow_rank: int | None = None,
        slow: float = 1.0,
        slow_window: tuple[float, float] = (0.0, 1.0),
        slow_cpu: bool = False,
        xids: tuple[tuple[float, int], ...] = (),
        ecc_corrected: int = 0,
        ckpt_every: float | None = None,
        ckpt_seconds: float = 0.0,
        ps: int = 0,
        ps_load: float = 0.0,
        ps_agent: bool = False,
        model: str | None = None,
        accelerator: str = "v100",
        start: float | None = None,
        rank_spread: float = 0.0,
        warmup: float = 0.0,
    ) -> str:
        rng = self.rng
        self._jobs += 1
        job = f"{self.prefix}-{kind}-{self._jobs}"
        self.labels[job] = dict(labels or {})
        start = self.t0 + rng.uniform(0, 600) if start is None else start
        ticks = int(minutes * 60 / TICK)
        blocks = max(1, ticks // 30)  # 5-minute blocks for throttling
        order = list(range(blocks))
        rng.shuffle(order)
        hot = set(order[: round(throttle_share * blocks)])
        node_names = [f"{job}-n{r}" for r in range(nodes)]
        for r, node in enumerate(node_names):
            self._ev(
                start,
                node,
                "train_job",
                {
                    "run": "r1",
                    "rank": r,
                    "world_size": nodes,
                    "ps": ps,
                    "model": model or job,
                    "params": 25_000_000,
                    "tensors": 160,
                    "flops_per_step": 3e12,
                    "batch_size": 64,
                    "accelerator": accelerator,
                },
                job,
            )
        step = [0] * nodes
        base = [math.exp(rng.gauss(0, rank_spread)) for _ in range(nodes)]  # ranks differ a little
        mid = sorted(base)[nodes // 2]
        for r, b in enumerate(base):  # the truth: a rank 20 % slower than the others is a straggler
            if nodes >= 3 and b >= 1.2 * mid and "straggler" not in self.labels[job]:
                self.labels[job]["straggler"] = r
        ecc_left = ecc_corrected
        for i in range(ticks):
            t = start + (i + 1) * TICK
            frac = i / ticks
            stepping = held_after is None or frac < held_after
            warming = i * TICK < warmup * 60  # loading data, compiling: GPUs held, no steps yet
            for r, node in enumerate(node_names):
                throttled = r == throttled_node and (i // 30) in hot
                f = (1.25 if throttled else 1.0) * base[r]
                if r == slow_rank and slow_window[0] <= frac < slow_window[1]:
                    f *= slow
                if stepping and not warming:
                    st = f / rank_speed * math.exp(rng.gauss(0, 0.03))
                    if rng.random() < 0.03:
                        st /= 0.3  # the odd slow interval
                    n = max(1, round(TICK / st))
                    mean = TICK / n
                    d: dict[str, Any] = {
                        "run": "r1",
                        "rank": r,
                        "interval_seconds": TICK,
                        "steps": n,
                        "first_step": step[r] + 1,
                        "last_step": step[r] + n,
                        "examples": float(n * 64),
                        "step_mean_seconds": mean,
                        "steps_per_second": n / TICK,
                        "examples_per_second": n * 64 / TICK,
                    }
                    if wait_known:
                        w = min(0.95, max(0.0, wait * math.exp(rng.gauss(0, 0.1))))
                        d["wait_mean_seconds"] = w * mean
                        d["wait_share_ratio"] = w
                    step[r] += n
                    self._ev(t, node, "train_steps", d, job)
                c = 0.97 if (slow_cpu and r == slow_rank) else cpu
                self._ev(
                    t,
                    node,
                    "host",
                    {"cpu_util_ratio": min(1.0, max(0.0, c + rng.gauss(0, 0.03))), "mem_total_bytes": 64 * GIB},
                    job,
                )
                for g in range(gpus):
                    if not stepping:
                        u, mem = rng.uniform(0, 0.01), 12 * GIB  # the job stopped; its process holds the memory
                    elif warming:
                        u, mem = rng.uniform(0, 0.03), 6 * GIB
                    elif (r, g) in idle:
                        u, mem = rng.uniform(0, 0.02), 300 << 20
                    else:
                        u, mem = min(1.0, max(0.0, util / f * (1 + rng.gauss(0, 0.05)))), 14 * GIB
                    mask = 0x40 | 0x4 if throttled else (0x4 if rng.random() < 0.03 else 0)
                    self._ev(
                        t,
                        node,
                        "gpu",
                        {
                            "index": g,
                            "uuid": f"GPU-{node}-{g}",
                            "name": "Tesla V100-SXM2-16GB",
                            "util_gpu_ratio": round(u, 4),
                            "mem_used_bytes": mem,
                            "mem_total_bytes": 16 * GIB,
                            "sm_clock_hz": 1.38e9 * (0.7 if throttled else 1.0),
                            "throttle_mask": mask,
                            # a V100 draws ~40 W idle, 300 W flat out; warms with it
                            "power_watts": float(round(40 + 260 * u * (0.7 if throttled else 1.0))),  # whole watts: sums exact
                            "temp_celsius": round(35 + 45 * u + (8 if throttled else 0), 1),
                        },
                        job,
                    )
            for at, code in xids:
                if i == int(at * ticks):
                    self._ev(t, node_names[0], "gpu_event", {"index": 0, "uuid": f"GPU-{node_names[0]}-0", "kind": "xid", "count": 1, "xid": code}, job)
            if ecc_left and i >= ticks // 2:
                k = min(ecc_left, ecc_corrected // 3 + 1)
                ecc_left -= k
                self._ev(t, node_names[0], "gpu_event", {"index": 0, "uuid": f"GPU-{node_names[0]}-0", "kind": "ecc_corrected", "count": k}, job)
            if ckpt_every and stepping and i > 0 and (i * TICK) % ckpt_every < TICK:
                self._ev(t, node_names[0], "train_checkpoint", {"run": "r1", "rank": 0, "action": "save", "seconds": ckpt_seconds * rng.uniform(0.9, 1.1), "bytes": 400_000_000, "step": step[0], "ok": True}, job)
        if ps_agent:
            for p in range(ps):
                node = f"{job}-ps{p}"
                sent = 0
                for i in range(ticks):
                    t = start + (i + 1) * TICK
                    sent += int(ps_load * 0.9e9 * TICK)
                    self._ev(
                        t,
                        node,
                        "host",
                        {
                            "cpu_util_ratio": min(1.0, max(0.0, min(0.98, ps_load) + rng.gauss(0, 0.02))),
                            "mem_total_bytes": 64 * GIB,
                            "net": [{"nic": "eth0", "rx_bytes_total": sent, "tx_bytes_total": sent}],
                        },
                        job,
                        role="ps",
                    )
        return job

    def input_job(
        self,
        schedule: tuple[tuple[int, int], ...] = ((1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (5, 1), (5, 2), (4, 2), (3, 2)),
        *,
        kind: str = "input",
        ranks: int = 2,
        compute: float = 0.2,
        remote_s: float = 0.5,
        local_s: float = 0.6,
        minutes_each: float = 3.0,
        start: float | None = None,
        noise: float = 0.02,
    ) -> str:
        """A job fed by input workers (role data) whose count changes over time, as an
        autoscaler would move it: ``schedule`` of (remote, local) workers, each held
        ``minutes_each``. Every rank computes ``compute`` s per batch; a remote worker makes a
        batch in ``remote_s``, a local one (on rank 0's host, sharing its CPUs) in ``local_s``.
        A rank's batch time is max(compute, ranks / supply): input-bound until the workers
        make batches as fast as the ranks eat them; workers idle for the rest."""
        rng = self.rng
        self._jobs += 1
        job = f"{self.prefix}-{kind}-{self._jobs}"
        self.labels[job] = {}
        start = self.t0 if start is None else start
        nodes = [f"{job}-n{r}" for r in range(ranks)]
        for r, node in enumerate(nodes):
            self._ev(start, node, "train_job", {"run": "r1", "rank": r, "world_size": ranks, "model": job,
                                                 "batch_size": 64, "accelerator": "v100"}, job)
        steps = [0] * ranks
        ticks = int(minutes_each * 60 / TICK)
        t = start
        for rem, loc in schedule:
            supply = rem / remote_s + loc / local_s  # batches per second the workers can make
            demand = ranks / compute
            batch = max(compute, ranks / supply) if supply > 0 else 10.0
            busy = min(1.0, demand / supply) if supply > 0 else 0.0
            for _ in range(ticks):
                t += TICK
                for r, node in enumerate(nodes):
                    b = batch * math.exp(rng.gauss(0, noise))
                    n = max(1, round(TICK / b))
                    mean = TICK / n
                    w = max(0.0, mean - compute)
                    self._ev(t, node, "train_steps", {
                        "run": "r1", "rank": r, "interval_seconds": TICK, "steps": n, "first_step": steps[r] + 1,
                        "last_step": steps[r] + n, "examples": float(n * 64), "step_mean_seconds": mean,
                        "wait_mean_seconds": w, "wait_share_ratio": w / mean, "steps_per_second": n / TICK,
                        "examples_per_second": n * 64 / TICK}, job)
                    steps[r] += n
                    self._ev(t, node, "host", {"cpu_util_ratio": min(1.0, 0.3 + 0.15 * (loc if r == 0 else 0)),
                                               "mem_total_bytes": 64 * GIB}, job)
                    self._ev(t, node, "gpu", {"index": 0, "uuid": f"GPU-{node}-0", "name": "Tesla V100-SXM2-16GB",
                                              "util_gpu_ratio": round(min(1.0, 0.95 * compute / mean), 4),
                                              "mem_used_bytes": 14 * GIB, "mem_total_bytes": 16 * GIB,
                                              "power_watts": float(round(40 + 260 * min(1.0, 0.95 * compute / mean))),
                                              "temp_celsius": round(35 + 45 * min(1.0, 0.95 * compute / mean), 1)},
                    job)
                workers = [(f"{job}-d{k}", k, remote_s) for k in range(rem)] + [(nodes[0], 100 + k, local_s) for k in range(loc)]
                for node, rank, p in workers:
                    ps = p * math.exp(rng.gauss(0, noise))
                    made = max(1, round(TICK * busy / ps))
                    idle = max(0.0, (TICK - made * ps) / made)
                    self._ev(t, node, "train_data", {
                        "run": "r1", "rank": rank, "interval_seconds": TICK, "batches": made, "elements": float(made * 64),
                        "process_mean_seconds": ps, "process_p50_seconds": ps, "process_p95_seconds": ps * 1.1,
                        "idle_mean_seconds": idle, "idle_share_ratio": idle / (ps + idle),
                        "batches_per_second": made / TICK}, job, role="data")
        return job

    def ps_family(self, saturating: bool, ps_agent: bool) -> None:
        """A model on one accelerator at 1, 2, 4, 6, 8 workers with one PS; the PS serves
        ``k`` single-worker speeds (2.5: saturating, 12: not).  The cluster speed is a soft
        minimum of the workers' demand and the PS capacity; labelled PS-bound where the
        demand is at least 1.3x the capacity."""
        rng = self.rng
        s1 = rng.uniform(2.0, 8.0)
        cap = s1 * (2.5 if saturating else 12.0)
        model = f"model{self._jobs}"
        acc = rng.choice(["v100", "k80", "p100", "t4"])
        self.sim_job({}, kind="ps", nodes=1, rank_speed=s1, model=model, accelerator=acc, gpus=1)
        for w in (2, 4, 6, 8):
            v = ((w * s1) ** -4 + cap**-4) ** -0.25
            label = {"ps_bound": None} if w * s1 >= 1.3 * cap else {}
            self.sim_job(
                label, kind="ps", nodes=w, gpus=1, rank_speed=v / w, ps=1, ps_load=v / cap, ps_agent=ps_agent,
                model=model, accelerator=acc, util=0.9 * v / (w * s1),
            )

    def suite(self, per_kind: int = 20, healthy: int = 30) -> None:
        rng = self.rng
        for _ in range(healthy):
            self.sim_job(
                {}, kind="ok", nodes=rng.randint(1, 4), gpus=rng.randint(1, 4), util=rng.uniform(0.75, 0.97),
                wait=rng.uniform(0.0, 0.04), cpu=rng.uniform(0.2, 0.6), rank_speed=rng.uniform(2, 10),
                ckpt_every=rng.choice([None, 1200.0, 1800.0]), ckpt_seconds=rng.uniform(5, 15),
                xids=((0.5, 43),) if rng.random() < 0.2 else (),
                rank_spread=0.05, warmup=rng.uniform(0, 3),
            )
        for i in range(per_kind):
            known = i % 2 == 0
            self.sim_job(
                {"input_bound": None}, kind="input", nodes=rng.randint(1, 3), gpus=rng.randint(1, 4),
                wait=rng.uniform(0.25, 0.6), wait_known=known, util=rng.uniform(0.15, 0.45), cpu=rng.uniform(0.9, 0.98),
            )
        for i in range(per_kind):
            n = rng.randint(4, 6)
            r = rng.randrange(n)
            persistent = i % 2 == 0
            self.sim_job(
                {"straggler": r}, kind="straggler", nodes=n, gpus=1, slow_rank=r, slow=rng.uniform(1.4, 2.0),
                slow_window=(0.0, 1.0) if persistent else (0.3, 0.3 + rng.uniform(0.4, 0.45)),
                slow_cpu=rng.random() < 0.5, rank_spread=0.05,
            )
        for i in range(per_kind):
            if i % 2 == 0:
                n = rng.randint(1, 3)
                self.sim_job({"gpu_idle": 0}, kind="idle", nodes=n, gpus=4, idle=tuple((0, g) for g in range(rng.randint(1, 2))))
            else:
                self.sim_job({"gpu_idle": None}, kind="held", nodes=rng.randint(1, 2), gpus=2, held_after=0.5)
        for _ in range(per_kind):
            self.sim_job(
                {"gpu_throttled": 0}, kind="throttled", nodes=rng.randint(1, 2), gpus=rng.randint(1, 4),
                throttled_node=0, throttle_share=rng.uniform(0.3, 0.8),
            )
        for i in range(per_kind):
            if i % 3 == 2:
                self.sim_job({"gpu_errors": None}, kind="ecc", ecc_corrected=rng.randint(150, 500))
            else:
                code = rng.choice([79, 48, 13, 31, 94, 63])
                self.sim_job(
                    {"gpu_errors": None}, kind="xid",
                    xids=tuple((rng.uniform(0.2, 0.8), code) for _ in range(rng.randint(1, 4))),
                )
        for _ in range(per_kind):
            self.sim_job(
                {"checkpoint_overhead": None}, kind="ckpt", ckpt_every=rng.uniform(60, 150), ckpt_seconds=rng.uniform(12, 20)
            )
        for i in range(10):
            self.ps_family(saturating=i % 2 == 0, ps_agent=i % 4 < 2)


def evaluate(findings: list[dict[str, Any]], labels: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per kind: true positives, false positives, false negatives, precision and recall over
    (job, kind) pairs; a finding for a labelled job counts only when it names the labelled
    rank (straggler) or node (``<job>-n<k>``, GPU kinds) where the label gives one."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in findings:
        if f["job"] in labels:
            found.setdefault((f["job"], f["kind"]), []).append(f)
    out = {}
    for kind in KINDS:
        tp = fp = fn = 0
        for job, lab in labels.items():
            fs = found.get((job, kind), [])
            if kind in lab:
                detail = lab[kind]
                ok = [
                    f for f in fs
                    if detail is None
                    or (kind == "straggler" and f["rank"] == detail)
                    or (kind != "straggler" and f["node"] == f"{job}-n{detail}")
                ]
                tp += bool(ok)
                fn += not ok
                fp += len(fs) - len(ok) > 0 and not ok
            else:
                fp += bool(fs)
        out[kind] = {
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / (tp + fn) if tp + fn else 1.0,
        }
    return out


class DemoFleet(Scenarios):
    """The simulated fleet of scripts/demo: one job with each kind of problem, a healthy
    one and a revoked spot VM, over the last 40 minutes; every node is ``sim-...`` and every
    event carries the label ``simulated=true``."""

    def _ev(self, ts: float, node: str, type_: str, data: dict[str, Any], job: str = "", role: str = "worker") -> None:
        super()._ev(ts, node, type_, data, job, role)
        self.events[-1]["labels"] = {"simulated": "true"}

    def build(self) -> None:
        start = self.t0
        self.sim_job({}, kind="healthy", nodes=2, gpus=4, start=start, rank_spread=0.02)
        model = "sim-resnet50"
        self.sim_job({}, kind="ps", nodes=1, gpus=1, rank_speed=6.0, model=model, start=start)
        for w in (2, 4, 8):
            v = ((w * 6.0) ** -4 + 15.0**-4) ** -0.25
            self.sim_job({}, kind="ps", nodes=w, gpus=1, rank_speed=v / w, ps=1, ps_load=v / 15.0, ps_agent=True,
                         model=model, util=0.9 * v / (w * 6.0), start=start)
        # input-bound: its ranks eat 10 batches/s, 2 remote input workers make 4/s (it tried 3)
        self.input_job(((1, 0), (2, 0), (3, 0), (2, 0), (2, 0), (2, 0)), minutes_each=5.0, start=start)
        self.sim_job({}, kind="straggler", nodes=4, gpus=1, slow_rank=2, slow=1.7, slow_cpu=True, start=start)
        self.sim_job({}, kind="idle", nodes=1, gpus=4, idle=((0, 2), (0, 3)), start=start)
        self.sim_job({}, kind="throttled", nodes=1, gpus=2, throttled_node=0, throttle_share=0.6, start=start)
        self.sim_job({}, kind="xid", xids=((0.4, 79), (0.41, 79)), start=start)
        self.sim_job({}, kind="ckpt", ckpt_every=120.0, ckpt_seconds=15.0, start=start)
        self.revoked_vm(start)
        self.agents()

    def run_ends(self) -> None:
        """A ``finished`` end per (job, run, rank) half a second after its last step, but
        for ranks on revoked VMs."""
        revoked = {e["node"] for e in self.events if e["type"] == "revocation"}
        last: dict[tuple[str, str, int, str], tuple[float, int]] = {}
        for e in self.events:
            if e["type"] == "train_steps" and e["node"] not in revoked:
                d = e["data"]
                k = (e["job"], d["run"], d["rank"], e["node"])
                last[k] = max(last.get(k, (0.0, 0)), (e["ts"], d["last_step"]))
        for (job, run, rank, node), (ts, step) in sorted(last.items()):
            self._ev(ts + 0.5, node, "train_end", {"run": run, "rank": rank, "state": "finished", "steps": step}, job)

    def agents(self, every: float = 30.0) -> None:
        """What each simulated node's agent says of the node itself: started by the boot a
        minute after it, its identity (a GCE VM), heartbeats every ``every`` seconds while
        its job ran, and a clean stop at the end, so that analyze nodes shows real lives.
        Each rank's run ends ``finished`` after its last step (a rank on a revoked VM says
        nothing: the revocation ended it)."""
        self.run_ends()
        spans: dict[str, list[float]] = {}
        roles: dict[str, tuple[str, str]] = {}
        for e in self.events:
            sp = spans.setdefault(e["node"], [e["ts"], e["ts"]])
            sp[0], sp[1] = min(sp[0], e["ts"]), max(sp[1], e["ts"])
            roles.setdefault(e["node"], (e["role"], e["job"]))
        lived = {e["node"] for e in self.events if e["type"] == "lifecycle"}
        for node, (t0, t1) in sorted(spans.items()):
            if node in lived:
                continue
            role, job = roles[node]
            start, boot = t0 - 5, t0 - 65
            self._ev(start, node, "lifecycle", {"event": "agent_start", "boot_time": boot, "interval_seconds": every,
                                                "during_boot": True}, job, role)
            self._ev(start + 1, node, "instance", {"cloud": "gce", "region": "us-central1", "zone": "us-central1-a",
                                                   "instance_type": "n1-standard-8", "spot": False,
                                                   "boot_time": boot}, job, role)
            t, seq = start + every, 0
            while t < t1:
                seq += 1
                self._ev(t, node, "heartbeat", {"seq": seq, "interval_seconds": every, "spool_pending": 0,
                                                "dropped_total": 0}, job, role)
                t += every
            self._ev(t1 + 1, node, "lifecycle", {"event": "agent_stop", "stop_reason": "SIGTERM", "boot_time": boot},
                     job, role)

    def revoked_vm(self, start: float) -> None:
        """A spot VM running a job's rank, revoked 25 minutes in (a notice 30 s ahead)."""
        node = f"{self.prefix}-spot-vm-1"
        boot = start - 60
        self._ev(start, node, "lifecycle", {"event": "agent_start", "boot_time": boot, "interval_seconds": TICK,
                                            "during_boot": True})
        self._ev(start + 1, node, "instance", {"cloud": "gce", "region": "us-central1", "zone": "us-central1-a",
                                               "instance_type": "n1-standard-8", "spot": True, "accelerator": "nvidia-tesla-v100",
                                               "accelerator_count": 1, "boot_time": boot})
        end = start + 25 * 60
        t = start
        seq = 0
        while t < end:
            seq += 1
            self._ev(t, node, "heartbeat", {"seq": seq, "interval_seconds": TICK})
            t += TICK
        self._ev(end - 30, node, "revocation", {"cloud": "gce", "kind": "preemption", "notice_id": "gce:preempted",
                                                "revokes": True, "deadline": end, "lead_seconds": 30.0, "boot_time": boot})


def _main() -> None:
    """``python -m tests.fakes.fleet demo --db FILE``: write the demo's simulated fleet."""
    import argparse
    import time

    from cmdare.collector.db import connect
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import encode_many

    ap = argparse.ArgumentParser(prog="python -m tests.fakes.fleet")
    ap.add_argument("what", choices=("demo",))
    ap.add_argument("--db", required=True)
    a = ap.parse_args()
    f = DemoFleet(seed=1, t0=time.time() - 40 * 60)
    f.build()
    con = connect(a.db)
    r = Writer(con).write([("sim", encode_many(f.events))])
    con.close()
    print(f"simulated fleet (nodes sim-*, label simulated=true): {len(f.labels)} jobs and a revoked spot VM, {r.inserted:,} events into {a.db}")


if __name__ == "__main__":
    _main()
