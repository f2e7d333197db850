"""The all-reduce cost model: a data-parallel job's step time at another world size and
node layout, fitted to the runs the job (and every job of its model and accelerator)
measured.

A step of data-parallel training is its computation (the per-GPU batch: the same at any
world size), its input wait, and the gradient communication computation did not hide
(``comm_mean_seconds``, from the adapters' DDP hook or ``run.add_comm_wait``). A ring
all-reduce over ``n`` ranks moves ``V = 2 (n - 1) / n x B`` bytes per rank (``B``: the
gradient bytes a step reduces, ``grad_bytes``), at the pace of its slowest link: NVLink or
PCIe while the ring stays on one node, the network once it spans several. So the exposed
communication is taken as ``k x V`` with one constant per link class, ``intra`` (the run's
ranks on one node) or ``inter`` (on several: counted from the nodes its steps came from),
fitted by least squares through the origin on the runs of that class (what the ring hides
behind backward is in ``k``: it is the exposed part that costs). Predicted step time:
``c + w + k_class x V``, with ``c`` and ``w`` the median computation and input wait per
step over the runs.

Held-out error: each multi-rank run predicted from the others (its class's constant and
the medians fitted without it); the interval of a prediction is +-the largest held-out
error of its class (+-50 % where a class has one run: no held-out basis). Nothing here is
chosen by looking at the data: one constant per class, no law compared."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import duckdb

from ..db import has_column

NO_BASIS = 0.5  # the interval's half-width where a class has no held-out run
MAX_STEP_S = 86400.0  # a run whose mean step is longer (a broken adapter's records) is left out


@dataclass(frozen=True)
class RingRun:
    job: str
    run: str
    world: int  # ranks
    nodes: int  # the nodes its steps came from
    grad_bytes: float
    step_s: float  # mean step time (input wait and exposed communication included)
    comm_s: float  # mean exposed communication per step
    wait_s: float  # mean input wait per step
    steps: int
    per_node: int = 0  # GPUs its nodes hold, as declared (0: not declared)

    @property
    def moved(self) -> float:
        """Bytes a ring all-reduce moves per rank and step."""
        return moved(self.world, self.grad_bytes)

    @property
    def link(self) -> str:
        return link(self.nodes)

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.comm_s - self.wait_s)


def moved(world: int, grad_bytes: float) -> float:
    return 2 * (world - 1) / world * grad_bytes if world > 1 else 0.0


def link(nodes: int) -> str:
    return "inter" if nodes > 1 else "intra"


_RUNS = """
WITH d AS (SELECT job, run, arg_max(world_size, ts) FILTER (WHERE world_size > 0) AS world,
                  arg_max(grad_bytes, ts) FILTER (WHERE grad_bytes > 0) AS grad,
                  arg_max(params, ts) FILTER (WHERE params > 0) AS params,
                  arg_max(gpus_per_node, ts) FILTER (WHERE gpus_per_node > 0) AS per_node,
                  coalesce(arg_max(ps, ts) FILTER (WHERE ps IS NOT NULL), 0) AS ps,
                  arg_max(model, ts) FILTER (WHERE model <> '') AS model,
                  arg_max(accelerator, ts) FILTER (WHERE accelerator <> '') AS acc
           FROM jobs GROUP BY job, run),
     s AS (SELECT job, run, count(DISTINCT node) AS nodes, count(DISTINCT rank) AS ranks, sum(steps) AS steps,
                  sum(step_mean_seconds * steps) / sum(steps) AS t,
                  sum(coalesce(comm_mean_seconds, 0) * steps) / sum(steps) AS e,
                  count(comm_mean_seconds) AS has_comm,
                  sum(coalesce(wait_mean_seconds, 0) * steps) / sum(steps) AS w
           FROM steps WHERE steps > 0 AND step_mean_seconds > 0 AND isfinite(step_mean_seconds)
           GROUP BY job, run)
SELECT s.job, s.run, coalesce(d.world, s.ranks), s.nodes, coalesce(d.grad, 4 * d.params), s.t, s.e, s.w, s.steps,
       s.has_comm, d.grad IS NULL, coalesce(d.per_node, 0)
FROM s JOIN d USING (job, run)
WHERE d.ps = 0 AND d.model IS NOT DISTINCT FROM $model AND d.acc IS NOT DISTINCT FROM $acc
ORDER BY s.job, s.run"""


def shape(con: duckdb.DuckDBPyConnection, job: str) -> dict[str, Any] | None:
    """The job's model and accelerator, if it is data-parallel (no parameter server, and it
    reports communication or declares its gradient bytes); else None."""
    if not (has_column(con, "jobs", "grad_bytes") and has_column(con, "steps", "comm_mean_seconds")):
        return None
    row = con.execute(
        """SELECT arg_max(model, ts) FILTER (WHERE model <> ''), arg_max(accelerator, ts) FILTER (WHERE accelerator <> ''),
                  coalesce(arg_max(ps, ts) FILTER (WHERE ps IS NOT NULL), 0), bool_or(grad_bytes > 0),
                  (SELECT count(*) FROM steps WHERE job = $j AND comm_mean_seconds IS NOT NULL) > 0
           FROM jobs WHERE job = $j""", {"j": job}).fetchone()
    if row is None or row[2] or not (row[3] or row[4]):
        return None
    return {"model": row[0], "accelerator": row[1]}


def runs(con: duckdb.DuckDBPyConnection, model: str | None, accelerator: str | None) -> tuple[list[RingRun], list[str]]:
    """The data-parallel runs of that model and accelerator; notes on what was assumed."""
    out, notes = [], []
    for job, run, world, nodes, grad, t, e, w, steps, has_comm, guessed, per_node in con.execute(
            _RUNS, {"model": model, "acc": accelerator}).fetchall():
        if not (0 < t < MAX_STEP_S and 0 <= e <= t and 0 <= w <= t):
            notes.append(f"{job}/{run}: implausible step records (step {t:.3g} s, communication {e:.3g} s): left out")
            continue
        if not grad or world < 1 or (world > 1 and not has_comm):
            notes.append(f"{job}/{run}: " + ("no gradient bytes or parameters declared" if not grad else
                                              "reports no communication wait"))
            continue
        if guessed:
            notes.append(f"{job}/{run}: gradient bytes taken as 4 x its parameters (float32)")
        out.append(RingRun(job, run, int(world), int(nodes), float(grad), float(t), float(e), float(w), int(steps),
                           int(per_node)))
    return out, notes


@dataclass(frozen=True)
class RingFit:
    k: dict[str, float]  # seconds of exposed communication per byte a rank moves, per link class
    compute_s: float
    wait_s: float
    held_out: dict[str, list[float]]  # per class: each run's absolute relative error, predicted from the others
    runs: int

    def step_seconds(self, world: int, nodes: int, grad_bytes: float) -> float | None:
        if world <= 1:
            return self.compute_s + self.wait_s
        k = self.k.get(link(nodes))
        return None if k is None else self.compute_s + self.wait_s + k * moved(world, grad_bytes)

    def band(self, nodes: int, world: int) -> float:
        """The interval's relative half-width at that layout."""
        if world <= 1:
            return max((e for es in self.held_out.values() for e in es), default=NO_BASIS)
        errs = self.held_out.get(link(nodes), [])
        return max(errs) if errs else NO_BASIS

    @property
    def mape(self) -> float | None:
        errs = [e for es in self.held_out.values() for e in es]
        return sum(errs) / len(errs) if errs else None


def _k(rs: list[RingRun]) -> float | None:
    den = sum(r.moved ** 2 for r in rs)
    return sum(r.comm_s * r.moved for r in rs) / den if den > 0 else None


def _fit(rs: list[RingRun]) -> tuple[dict[str, float], float, float]:
    k = {c: v for c in ("intra", "inter") if (v := _k([r for r in rs if r.world > 1 and r.link == c])) is not None}
    return k, statistics.median(r.compute_s for r in rs), statistics.median(r.wait_s for r in rs)


def fit(rs: list[RingRun]) -> RingFit:
    """The constants and medians over ``rs``, and each multi-rank run's held-out error."""
    k, c, w = _fit(rs)
    held: dict[str, list[float]] = {}
    for i, r in enumerate(rs):
        rest = rs[:i] + rs[i + 1:]
        if r.world <= 1 or not rest:
            continue
        k2, c2, w2 = _fit(rest)
        if r.link not in k2:
            continue
        pred = c2 + w2 + k2[r.link] * r.moved
        held.setdefault(r.link, []).append(abs(pred - r.step_s) / r.step_s)
    return RingFit(k, c, w, held, len(rs))
