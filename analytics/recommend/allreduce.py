"""``recommend cluster --from-job J`` for a data-parallel job (no parameter server: DDP,
FSDP, Horovod): the world size and node layout from the all-reduce cost model fitted to the
runs of its model and accelerator (analytics/models/allreduce.py), and the actions that cut
the communication it cannot hide, each with its predicted gain and interval.

The answer follows the PS advice's evidence rule: the best measured layout stands unless a
predicted one's interval lies wholly above it; an unmeasured layout is named as the
experiment to run next, with its predicted gain."""

from __future__ import annotations

import math
from typing import Any

import duckdb

from ..db import AnalyticsError
from ..models import allreduce as ar
from ..units import Recommendation

ACCUMULATE = 4  # the gradient accumulation the advice prices: one all-reduce per this many micro-batches


def _speedup(f: ar.RingFit, world: int, nodes: int, grad: float) -> tuple[float, float, float] | None:
    """(speedup over one GPU, low, high): ranks x one rank's step time over the step time."""
    t = f.step_seconds(world, nodes, grad)
    if t is None or t <= 0:
        return None
    one = f.compute_s + f.wait_s
    s = world * one / t
    b = f.band(nodes, world)
    return s, s / (1 + b), s / max(1e-9, 1 - b)


def advise(con: duckdb.DuckDBPyConnection, job: str, shape: dict[str, Any], knee: float,
           max_workers: int) -> Recommendation:
    rs, notes = ar.runs(con, shape["model"], shape["accelerator"])
    mine = [r for r in rs if r.job == job]
    if not mine:
        why = f" ({'; '.join(notes[:3])})" if notes else ""
        raise AnalyticsError(f"cluster: {job} is data-parallel but none of its runs has what the all-reduce model "
                             f"needs: steps with their communication wait and its gradient bytes{why}")
    f = ar.fit(rs)
    cur = max(mine, key=lambda r: r.steps)
    grad = cur.grad_bytes
    # GPUs a node holds: as declared (torchrun's LOCAL_WORLD_SIZE), else the most a run put on one
    per_node = max(max(r.per_node, math.ceil(r.world / r.nodes)) for r in rs)
    measured: dict[tuple[int, int], float] = {}  # (world, nodes) -> speedup measured
    one = f.compute_s + f.wait_s
    for r in (r for r in rs if r.world <= max_workers):
        measured[(r.world, r.nodes)] = max(measured.get((r.world, r.nodes), 0.0), r.world * one / r.step_s)
    sizes = sorted({2 ** i for i in range(0, int(math.log2(max(1, max_workers))) + 1)} | {r.world for r in rs})
    series: dict[int, tuple[float, float, float, int]] = {}
    for n in (n for n in sizes if n <= max_workers):
        nodes = math.ceil(n / per_node)
        p = _speedup(f, n, nodes, grad)
        if p is not None:
            series[n] = (*p, nodes)
    if not series:
        raise AnalyticsError(f"cluster: the all-reduce model has no basis for {job}'s layouts (its runs: "
                             f"{', '.join(f'{r.world} ranks on {r.nodes} node(s)' for r in mine)})")
    # the knee: the largest size past which doubling adds less than the threshold per added GPU
    pick = min(series)
    for n in sorted(series):
        prev = max((m for m in series if m < n), default=None)
        if prev is None:
            continue
        gain = series[n][0] / series[prev][0]
        if gain ** (1 / (n - prev)) - 1 >= knee:
            pick = n
        else:
            break
    s, lo, hi, nodes = series[pick]
    best_m = max(measured.items(), key=lambda kv: kv[1]) if measured else None
    experiment = ""
    stay = False
    if (pick, nodes) not in measured and best_m is not None and lo <= best_m[1]:
        stay = True  # the interval does not lie wholly above the best measured layout
        experiment = (f"measure {pick} GPUs on {nodes} node(s) next: the model predicts a {s:.3g}x speedup over one "
                      f"GPU (interval {lo:.3g} .. {hi:.3g}) against {best_m[1]:.3g}x measured at "
                      f"{best_m[0][0]} GPUs on {best_m[0][1]} node(s)")
        (pick, nodes), s = best_m
        lo = hi = s
    actions = _actions(f, cur, per_node)
    assumptions: dict[str, Any] = {
        "from_job": job, "model": shape["model"], "accelerator": shape["accelerator"], "runs_fitted": len(rs),
        "held_out_mape_allreduce": None if f.mape is None else round(f.mape, 4),
        "gpus_per_node": per_node, "grad_mb": round(grad / 1e6, 3),
        **{f"exposed_s_per_gb_{c}": round(k * 1e9, 4) for c, k in f.k.items()},
        "compute_s": round(f.compute_s, 6), "knee_threshold": knee, "stays_with_measured": stay,
    }
    if experiment:
        assumptions["experiment"] = experiment
    if notes:
        assumptions["notes"] = "; ".join(notes[:5])
    txt = "; ".join(a["text"] for a in actions)
    seen = "" if stay or (pick, nodes) not in measured else f" (measured {measured[(pick, nodes)]:.3g}x)"
    why = (f"{'the best measured layout' if stay else 'the knee of the all-reduce model'}: {pick} GPUs on {nodes} "
           f"node(s), {s:.3g}x one GPU{seen}" + (f"; to settle the rest, {experiment}" if experiment else "")
           + (f". To hide the communication: {txt}" if txt else ""))
    predicted: dict[str, Any] = {"speedup": round(s, 4)}
    t = f.step_seconds(pick, nodes, grad)
    if t is not None:
        predicted["step_seconds"] = round(t, 6)
    interval = {} if stay or hi <= lo else {"speedup": (round(lo, 4), round(hi, 4))}
    for a in actions:
        if "gain" in a:
            assumptions[f"gain_{a['key']}"] = round(a["gain"], 4)
    return Recommendation("cluster", action={"workers": pick, "ps": 0, "nodes": nodes, "gpus_per_node": per_node},
                          predicted=predicted, interval=interval, why=why, assumptions=assumptions)


def _actions(f: ar.RingFit, cur: ar.RingRun, per_node: int) -> list[dict[str, Any]]:
    """What cuts the current run's exposed communication, with the gain the model predicts
    (per example; interval from its held-out error) where it has a basis."""
    out: list[dict[str, Any]] = []
    t = f.step_seconds(cur.world, cur.nodes, cur.grad_bytes)
    if t is None or cur.world <= 1:
        return out
    comm = t - f.compute_s - f.wait_s
    if comm <= 0:
        return out
    b = f.band(cur.nodes, cur.world)
    # gradient accumulation: one all-reduce per ACCUMULATE micro-batches
    acc = t / (f.compute_s + f.wait_s + comm / ACCUMULATE) - 1
    out.append({"key": "accumulate", "gain": acc,
                "text": f"accumulate gradients over {ACCUMULATE} micro-batches (or a {ACCUMULATE}x per-GPU batch): "
                        f"+{100 * acc:.0f} % examples/s (interval +{100 * acc / (1 + b):.0f} .. "
                        f"+{100 * acc / max(1e-9, 1 - b):.0f} %)"})
    if cur.nodes > 1 and "intra" in f.k and cur.world <= per_node:
        t1 = f.step_seconds(cur.world, 1, cur.grad_bytes)
        if t1:
            g = t / t1 - 1
            out.append({"key": "one_node", "gain": g,
                        "text": f"the same {cur.world} GPUs on one node (the ring inside NVLink): +{100 * g:.0f} %"})
    elif cur.nodes > 1 and cur.world > per_node:
        out.append({"key": "fewer_nodes", "text": f"fewer nodes with more GPUs each: its {cur.world} GPUs span "
                                                  f"{cur.nodes} nodes, and only {per_node} keep the ring on one"})
    elif cur.nodes > 1:
        out.append({"key": "fewer_nodes",
                    "text": f"fewer nodes with more GPUs each (now {cur.nodes} nodes of "
                            f"{math.ceil(cur.world / cur.nodes)}; no one-node run measured to price it)"})
    # DDP's fp16 compression hook halves the bytes a ring moves (the model's cost per byte;
    # the cast's own time is not in it)
    half = t / (f.compute_s + f.wait_s + comm / 2) - 1
    out.append({"key": "fp16_compress", "gain": half,
                "text": f"DDP's fp16 compression hook (half the bytes): +{100 * half:.0f} % (interval "
                        f"+{100 * half / (1 + b):.0f} .. +{100 * half / max(1e-9, 1 - b):.0f} %)"})
    out.append({"key": "unpriced", "text": "larger DDP buckets (bucket_cap_mb) or FSDP's hybrid sharding "
                                           "(not modelled here: no gain predicted)"})
    return out
