"""placement (``analyze recommend placement``): local versus remote input workers, by
replaying Pecan's AutoPlacement policy over the batch times a job observed per (remote,
local) configuration."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from cmdare.wire.plugin import Option

from ..db import AnalyticsError
from ..units import RECOMMENDERS, Recommendation, Recommender, Scope


def read_trace(path: str) -> dict[tuple[int, int], float]:
    """(remote, local) -> batch seconds from a CSV with columns remote,local,batch_ms (a
    configuration measured twice: the mean)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise AnalyticsError(f"--trace {p}: cannot read: {e.strerror}") from None
    rows = list(csv.DictReader(text.splitlines()))
    need = {"remote", "local", "batch_ms"}
    if not rows or not need <= set(rows[0]):
        raise AnalyticsError(f"--trace {p}: expected a header with columns remote,local,batch_ms")
    seen: dict[tuple[int, int], list[float]] = {}
    for i, r in enumerate(rows, 2):
        try:
            rem, loc, ms = int(r["remote"]), int(r["local"]), float(r["batch_ms"])
        except (TypeError, ValueError):
            raise AnalyticsError(f"--trace {p}: line {i}: remote and local must be integers, batch_ms a number") from None
        if rem < 0 or loc < 0 or not ms > 0 or not math.isfinite(ms):
            raise AnalyticsError(f"--trace {p}: line {i}: counts must be >= 0 and batch_ms positive")
        seen.setdefault((rem, loc), []).append(ms / 1000.0)
    return {k: sum(v) / len(v) for k, v in seen.items()}


@dataclass
class Replay:
    settled: tuple[int, int]  # the configuration the policy is at when it stops
    done: bool  # the policy finished (False: the trace ended first)
    next_to_try: tuple[int, int] | None
    path: list[tuple[str, tuple[int, int], float | None, str]]  # (phase, config, r, decision)


def auto_placement(
    trace: dict[tuple[int, int], float],
    host_price: float,
    worker_price: float,
    threshold: float = 0.03,
    local_stop: float = -0.10,
    local_limit: int = 8,
    label: str = "--trace",
) -> Replay:
    """Pecan's AutoPlacement (ATC 2024): r = 1 - batch time now / batch time before.
    Scale remote workers up (local 0) while r > ``threshold``; then add local workers (free:
    idle CPUs on the accelerator host) while r >= ``local_stop`` and under ``local_limit``;
    then remove remote workers while the removal is economical: w > (-r) x (c + n_remote x
    w), w the remote worker's price, c the accelerator host's (n_remote before removal)."""
    starts = sorted(rem for rem, loc in trace if loc == 0)
    if not starts:
        raise AnalyticsError(f"{label}: needs the starting configuration, remote workers only (local = 0)")
    cur = (starts[0], 0)
    path: list[tuple[str, tuple[int, int], float | None, str]] = [("start", cur, None, "remote workers only")]

    def r_of(a: tuple[int, int], b: tuple[int, int]) -> float:
        return 1.0 - trace[b] / trace[a]

    def missing(nxt: tuple[int, int], beyond: bool) -> Replay:
        if beyond:  # the trace went past a configuration it never measured
            raise AnalyticsError(
                f"{label}: no batch time for remote={nxt[0]}, local={nxt[1]}, though the trace has configurations "
                "past it (a gap: AutoPlacement moves one worker at a time)"
            )
        return Replay(cur, False, nxt, path)

    # 1. remote up
    while True:
        nxt = (cur[0] + 1, cur[1])
        if nxt not in trace:
            return missing(nxt, any(loc == 0 and rem > nxt[0] for rem, loc in trace))
        r = r_of(cur, nxt)
        if r > threshold:
            path.append(("remote up", nxt, r, f"r {r:+.1%} > {threshold:.0%}: keep"))
            cur = nxt
        else:
            path.append(("remote up", nxt, r, f"r {r:+.1%} <= {threshold:.0%}: back to {cur[0]} remote"))
            break
    # 2. local up
    while cur[1] < local_limit:
        nxt = (cur[0], cur[1] + 1)
        if nxt not in trace:
            return missing(nxt, any(rem == cur[0] and loc > nxt[1] for rem, loc in trace))
        r = r_of(cur, nxt)
        if r >= local_stop:
            path.append(("local up", nxt, r, f"r {r:+.1%} >= {local_stop:.0%}: keep (local workers are free)"))
            cur = nxt
        else:
            path.append(("local up", nxt, r, f"r {r:+.1%} < {local_stop:.0%}: back to {cur[1]} local"))
            break
    # 3. remote down while economical
    while cur[0] > 0:
        nxt = (cur[0] - 1, cur[1])
        if nxt not in trace:
            return missing(nxt, any(loc == cur[1] and rem < nxt[0] for rem, loc in trace))
        r = r_of(cur, nxt)
        economical = worker_price > (-r) * (host_price + cur[0] * worker_price)
        if economical:
            path.append(("remote down", nxt, r, f"r {r:+.1%}: saving {worker_price:g} > {-r:.3f} x {host_price + cur[0] * worker_price:g}: remove"))
            cur = nxt
        else:
            path.append(("remote down", nxt, r, f"r {r:+.1%}: not economical: keep {cur[0]} remote"))
            break
    return Replay(cur, True, None, path)


def cost_per_1000_steps(batch_s: float, remote: int, host_price: float, worker_price: float) -> float:
    return 1000 * batch_s / 3600 * (host_price + remote * worker_price)


@RECOMMENDERS.register
class Placement(Recommender):
    """Local versus remote input workers: Pecan's AutoPlacement replayed over the batch times
    a job observed per (remote, local) configuration. Scale remote workers up while the
    batch time improves by more than --threshold, then add local workers (free) while it
    does not get worse by more than 10 %, then remove remote workers while the removal is
    economical (w > -r x (c + n_remote x w)). Gives the configuration it settles on (or,
    when the trace ends first, the next one to measure) and the cost per 1,000 steps of each.

    \b
    Examples:
      analyze recommend placement --trace batches.csv --host-price 2.48 --worker-price 0.19
      analyze recommend placement --job resnet50-a --host-price 2.48 --worker-price 0.19

    With --job, the trace comes from telemetry: per minute, the job's input workers on a
    host of its training ranks (local) or elsewhere (remote), and the training ranks'
    median batch time; a configuration held two minutes or more counts (its first minute
    left out). A price not given is the price catalogue's for the job's own nodes (its
    accelerator hosts', its input workers'); --trace needs both prices.
    """

    name = "placement"
    DATABASE = "job"
    TERMINAL = {"trace": {"path": True}}
    OPTIONS = {
        "trace": Option("str", "", "CSV of observed batch times: remote,local,batch_ms"),
        "host_price": Option("float", 0.0, "$/hour of the accelerator host", lo=0),
        "worker_price": Option("float", 0.0, "$/hour of one remote input worker", lo=0),
        "threshold": Option("float", 0.03, "least improvement r for another remote worker", lo=0, hi=1),
        "local_stop": Option("float", -0.10, "r below which adding local workers stops", lo=-1, hi=0),
        "local_limit": Option("int", 8, "most local workers (idle CPUs on the accelerator host)", lo=0),
        "job": Option("str", "", "a job in the database: the trace from its telemetry (role-data workers, local or remote)"),
    }

    def _decided(self, con: duckdb.DuckDBPyConnection, job: str) -> tuple[int, str] | None:
        """How many input workers ``recommend data-workers`` decides for the job (and by which
        rule), or None when it cannot answer."""
        from ..units import RECOMMENDERS, run_unit

        try:
            [rec] = run_unit(RECOMMENDERS, "data_workers", con, Scope(), {"job": job})[:1]
        except (AnalyticsError, ValueError):
            return None
        return int(rec.action["workers"]), str(rec.assumptions.get("rule", "data-workers"))

    def _catalogue_prices(self, con: duckdb.DuckDBPyConnection) -> str:
        """The prices not given, from the price catalogue for the job's own nodes: the
        accelerator host's VM (the mean over the nodes with accelerators) and an input
        worker's (over those without); what was found, or why not."""
        from ..nodecost import job_vm_prices

        o = self.options
        nodes = job_vm_prices(con, o["job"])
        said = []
        for key, gpu, what in (("host_price", True, "accelerator host"), ("worker_price", False, "input worker")):
            if o[key] > 0:
                continue
            ps = [p for p, g, _ in nodes.values() if g == gpu and p]
            if ps:
                o[key] = round(sum(ps) / len(ps), 4)
                said.append(f"{what} {o[key]:g} $/h from the price catalogue ({len(ps)} nodes)")
            else:
                types = sorted({t for _, g, t in nodes.values() if g == gpu})
                said.append(f"no catalogue price for the job's {what} (" + (', '.join(types)[:80] if types else
                            f"no node of the job is one: {'none holds accelerators' if gpu else 'all hold accelerators'}")
                            + ")")
        return "; ".join(said)

    def run(self, con: duckdb.DuckDBPyConnection | None, scope: Scope) -> list[Recommendation]:
        o = self.options
        if bool(o["trace"]) == bool(o["job"]):
            raise AnalyticsError("placement needs --trace FILE.csv (remote,local,batch_ms per configuration observed) or --job J, one of them")
        priced_from = "given"
        if (o["host_price"] <= 0 or o["worker_price"] <= 0) and o["job"] and con is not None:
            priced_from = self._catalogue_prices(con)
        if o["host_price"] <= 0 or o["worker_price"] <= 0:
            raise AnalyticsError("placement needs --host-price and --worker-price ($/hour, above 0): removal is an economic rule"
                                 + (f" ({priced_from})" if priced_from != "given" else ""))
        if o["job"]:
            if con is None:
                raise AnalyticsError("placement --job needs the database")
            from .. import inputs

            tel = inputs.read(con, o["job"])
            trace, label, source = tel.configs, f"--job {o['job']}", f"telemetry of {o['job']}"
            if not trace:
                raise AnalyticsError(f"--job {o['job']}: no input configuration held for two minutes or more yet")
        else:
            trace, label, source = read_trace(o["trace"]), "--trace", "trace"
        rp = auto_placement(trace, o["host_price"], o["worker_price"], o["threshold"], o["local_stop"], o["local_limit"], label)
        rem, loc = rp.settled
        own = (rem, loc)
        decided = self._decided(con, o["job"]) if o["job"] and con is not None else None
        if decided is not None and decided[0] != rem + loc:
            # one answer per job: the data-workers rule decides how many; placement says where
            # (its local workers kept, the rest remote), and what its replay alone would say
            loc = min(loc, decided[0])
            rem = decided[0] - loc
        bt = trace.get((rem, loc))  # None: a count the job never ran at
        cost = {"dollars_per_hour": round(o["host_price"] + rem * o["worker_price"], 4)}
        if bt is not None:
            cost = {"dollars_per_1000_steps": round(cost_per_1000_steps(bt, rem, o["host_price"], o["worker_price"]), 4),
                    **cost}
        steps = " -> ".join(
            f"{ph} ({c[0]},{c[1]})" + (f" r {r:+.1%}" if r is not None else "")
            + ("" if r is None else " rejected" if ("back" in d or "not economical" in d) else " kept")
            for ph, c, r, d in rp.path
        )
        nxt = rp.next_to_try or own  # (set whenever the trace ends before the policy settles)
        why = (f"AutoPlacement settles on {own[0]} remote, {own[1]} local: {steps}" if rp.done else
               f"the trace ends at ({own[0]},{own[1]}) before the policy would: measure ({nxt[0]},{nxt[1]}) next; {steps}")
        if (rem, loc) != own and decided is not None:
            why = (f"{decided[0]} input workers as recommend data-workers decides ({decided[1]}): {rem} remote, "
                   f"{loc} local; placement's replay alone would say {own[0]} remote, {own[1]} local: {why}")
        assumptions: dict[str, Any] = {
            "rule": "Pecan AutoPlacement",
            "host_price_per_hour": o["host_price"],
            "worker_price_per_hour": o["worker_price"],
            "prices_from": priced_from,
            "placement_would_say": f"{own[0]} remote, {own[1]} local" if (rem, loc) != own else None,
            "threshold": o["threshold"],
            "local_stop": o["local_stop"],
            "local_limit": o["local_limit"],
            "settled": rp.done,
            "configurations_measured": len(trace),
            "source": source,
        }
        if rp.next_to_try is not None:
            assumptions["next_remote"], assumptions["next_local"] = rp.next_to_try
        for (r_, l_), b in sorted(trace.items()):
            assumptions[f"cost_per_1000_steps_{r_}r_{l_}l"] = round(cost_per_1000_steps(b, r_, o["host_price"], o["worker_price"]), 4)
        return [
            Recommendation(
                self.name,
                action={"remote": rem, "local": loc},
                predicted={"batch_seconds": round(bt, 6)} if bt is not None else {},
                cost=cost,
                assumptions=assumptions,
                why=why,
            )
        ]
