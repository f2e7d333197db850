"""provision (``analyze recommend provision``): the cheapest mix of spot instance types,
within quotas, that reaches a loss target by a deadline under spotDNN's model of
heterogeneous asynchronous training: an exact search over every count vector, not spotDNN's
sliding window; revocation-aware with the lifetime and overhead fits; on-demand as the
fallback.

The model (spotDNN, Shang et al. 2023; ``../shared/anchors.md``), per instance type i with
g_i GPUs and local batch b_i = batch_per_gpu * g_i:

- profiled alone: T_prof = b_i / images_per_second; T_comp = T_prof - T_comm(alone), with
  T_comm = 2 S / B_wk + 2 g_i S / B_pcie and B_wk = B_req alone;
- in a cluster of n instances, the PS bandwidth is shared when B_req > B_ps / n:
  B_wk = P B_ps / n + (1 - P) B_req with P = min(alpha sqrt(n) + beta, 1) (at least 0);
- T^i = T_comp + 2 S / B_wk + 2 g_i S / B_pcie; T_exp = 1 / sum 1 / T^i;
  speed v = sum b_i / T^i; weighted-average batch b_w = v T_exp;
- iterations to the loss target from f_loss = (g2 b_w + g3) sqrt((R + g4) n) / (j + g1) + g5,
  or ``[job] iterations``; time T = j T_exp; cost = T * sum of prices.

R, the heterogeneity coefficient: unspecified by the paper, 1 in spotDNN's predictor and by
default here (``[loss] heterogeneity = "none"``); ``"share"`` opts in to cmdare's R = n *
sum_i w_i^2 over the speed shares w_i = v_i / v (1 for a homogeneous cluster, n when one
instance does all the work); the answer names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from cmdare.wire.plugin import Option

from .. import catalog
from ..db import AnalyticsError
from ..detectors import evidence
from ..models.lifetime import lives_summary
from ..units import RECOMMENDERS, Recommendation, Recommender, Scope
from .profile import InstanceType, Profile, load_profile  # noqa: F401  (the profile's format: profile.py)
from .region import revocation_rate

# spotDNN's published time-prediction error on heterogeneous clusters (2-8 workers): the
# predicted hours' interval is widened by it
MODEL_ERROR = 0.069
CHUNK = 1 << 18


def evaluate(prof: Profile, counts: np.ndarray, loss: float | None) -> dict[str, np.ndarray]:
    """spotDNN's model for each row of ``counts`` (plans x instance types): instances n,
    iteration time T_exp (s), speed (images/s), weighted-average batch, R, iterations j and
    time (s; inf where the loss model gives no positive j)."""
    c = counts.astype(float)
    n = c.sum(axis=1)
    nn = np.maximum(n, 1.0)
    S, breq, bps = prof.param_mb, prof.worker_bandwidth, prof.ps_bandwidth
    share = np.clip(prof.alpha * np.sqrt(nn) + prof.beta, 0.0, 1.0)
    bwk = np.where(breq > bps / nn, share * bps / nn + (1 - share) * breq, breq)
    g = np.array([t.gpus for t in prof.instances], dtype=float)
    b = np.array([t.batch for t in prof.instances], dtype=float)
    T = prof.t_comp()[None, :] + (2 * S / bwk)[:, None] + (2 * g * S / prof.pcie)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = (c / T).sum(axis=1)
        t_exp = 1.0 / rate
        spd = b[None, :] / T
        v = (c * spd).sum(axis=1)
        bw = v * t_exp
        R = n * (c * spd**2).sum(axis=1) / v**2 if prof.heterogeneity == "share" else np.ones_like(n)
        if prof.gammas is not None and loss is not None:
            g1, g2, g3, g4, g5 = prof.gammas
            j = (g2 * bw + g3) * np.sqrt(np.maximum(R + g4, 0.0) * n) / (loss - g5) - g1
        else:
            j = np.full_like(n, prof.iterations or 0.0)
        secs = np.where((j > 0) & (n > 0), j * t_exp, np.inf)
    return {"n": n, "t_exp": t_exp, "speed": v, "b_w": bw, "R": R, "j": j, "seconds": secs}


def plans(quotas: list[int], start: int, stop: int) -> np.ndarray:
    """Count vectors ``start``..``stop`` of the mixed-radix enumeration of 0..quota per type."""
    idx = np.arange(start, stop, dtype=np.int64)
    out = np.empty((len(idx), len(quotas)), dtype=np.int64)
    for m, q in enumerate(quotas):
        idx, out[:, m] = np.divmod(idx, q + 1)
    return out


def sliding_window(prof: Profile, loss: float | None, deadline: float | None, price: np.ndarray) -> tuple[np.ndarray, float] | None:
    """spotDNN's own provisioner (its released code): the instances listed by quota, fastest
    type first, and every circular window of consecutive instances tried; the cheapest
    window meeting the deadline. Kept as the baseline the exact search is compared with."""
    order = np.argsort(prof.t_prof(), kind="stable")
    seq = [m for m in order for _ in range(prof.instances[m].quota)]
    L = len(seq)
    rows = []
    for n in range(1, L + 1):
        for s in range(L):
            row = np.zeros(len(prof.instances), dtype=np.int64)
            for k in range(n):
                row[seq[(s + k) % L]] += 1
            rows.append(row)
    counts = np.unique(np.array(rows), axis=0)
    ev = evaluate(prof, counts, loss)
    cost = ev["seconds"] / 3600 * (counts @ price)
    ok = np.isfinite(cost) & ((ev["seconds"] <= deadline) if deadline else True)
    if not ok.any():
        return None
    i = int(np.argmin(np.where(ok, cost, np.inf)))
    return counts[i], float(cost[i])


@dataclass
class _Best:
    key: float = math.inf
    row: np.ndarray | None = None
    stats: dict[str, float] = field(default_factory=dict)


class _Risk:
    """Per instance type: revocations per hour (lifetime fit, with interval) and the time
    one revocation costs the job (restart overhead + work since the last checkpoint)."""

    def __init__(self, prof: Profile, con: duckdb.DuckDBPyConnection | None) -> None:
        M = len(prof.instances)
        self.rate = np.zeros((3, M))  # rate, lo, hi per hour
        self.delay = np.zeros(M)
        self.fit_ids: list[str] = []
        self.notes: list[str] = []
        self.counted = np.zeros(M, dtype=bool)
        self.lives: dict[int, dict[str, Any]] = {}  # instance type -> its lifetime curve
        self.brier_skill: float | None = None
        life = evidence.latest_fit(con, "lifetime") if con is not None else None
        over = evidence.latest_fit(con, "overhead") if con is not None else None
        lost = (prof.checkpoint_interval or 0.0) / 2
        if prof.checkpoint_interval is None:
            self.notes.append("no [job] checkpoint_interval_s: work lost since the last checkpoint not counted")
        cat = catalog.load()
        if life is None:
            self.notes.append("no lifetime fit" + ("" if con is not None else " (no database)")
                              + ": revocations not counted")
            return
        self.fit_ids.append(life["fit_id"])
        self.brier_skill = (life.get("cv") or {}).get("brier_skill")
        used_over = False
        for m, t in enumerate(prof.instances):
            if not (t.region and t.accelerator):
                self.notes.append(f"{t.type}: no region or accelerator: revocations not counted")
                continue
            try:
                acc = catalog.lookup(t.accelerator, cat).name
            except AnalyticsError:
                acc = t.accelerator
            curve = life["model"]["curves"].get(f"{t.region}/{acc}")
            r = revocation_rate(curve) if curve else None
            if r is None:
                self.notes.append(f"{t.type}: the lifetime fit has no {t.region}/{acc} lives: revocations not counted")
                continue
            self.rate[:, m] = r
            self.counted[m] = True
            self.lives[m] = curve
            restart, src = self._restart(over, t.region, acc, prof.restart_seconds, prof.param_mb)
            used_over |= src == "fit"
            self.delay[m] = restart + lost
        if used_over and over:
            self.fit_ids.append(over["fit_id"])

    def _restart(self, over: dict[str, Any] | None, region: str, acc: str, given: float | None,
                 param_mb: float | None = None) -> tuple[float, str]:
        """Seconds from a revocation to training again (the work lost is added apart): the
        measured notice-to-resume; else the fitted spot start-up of this region and
        accelerator (the cloud's phases) plus restoring the checkpoint (the fitted restore of
        a checkpoint of the model's size, else its fitted save time: reading it back costs
        about what writing it did); else the start-up the agents measured."""
        if over:
            m = over["model"]
            r = m.get("resume_after_revocation_seconds")
            if r and r.get("mean") is not None and r["mean"] > 0:
                return float(r["mean"]), "fit"
            if m.get("vm_startup"):
                from ..models.overhead_records import predict_save, predict_startup

                st = predict_startup(m["vm_startup"], region, "spot", acc)
                if not st["extrapolates"]:
                    restore, how = 0.0, "no checkpoint restore time known"
                    if param_mb and m.get("checkpoint", {}).get("restore"):
                        from ..models.overhead import predict_checkpoint

                        restore, how = predict_checkpoint(over, "restore", param_mb / 1000)[0], "fitted restore"
                    elif param_mb and m.get("checkpoint_save"):
                        restore, how = predict_save(m["checkpoint_save"], param_mb)["seconds"], "fitted save time"
                    self.notes.append(f"{region}/{acc}: restart = fitted spot start-up {st['seconds']:.0f} s + "
                                      f"restore {restore:.1f} s ({how})")
                    return st["seconds"] + restore, "fit"
            s = m.get("vm_startup_seconds", {}).get(f"{region}/{acc}/spot")
            if s and s.get("mean") is not None:
                return float(s["mean"]), "fit"
        if given is not None:
            return given, "profile"
        self.notes.append(f"{region}/{acc}: no restart time fitted or given: 60 s assumed")
        return 60.0, "assumed"


def _expected(secs: np.ndarray, counts: np.ndarray, risk: _Risk, which: int, deadline: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Expected seconds with revocations (renewal: T / (1 - lambda d)) and P(finish by the
    deadline): revocations Poisson over the deadline, each costing d seconds."""
    from scipy.stats import poisson

    lam_h = counts @ risk.rate[which]  # revocations per hour, whole plan
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(lam_h > 0, (counts @ (risk.rate[which] * risk.delay)) / lam_h, 0.0)
        lam = lam_h / 3600
        frac = lam * d
        exp = np.where(frac < 1, secs / (1 - frac), np.inf)
        if deadline is None:
            return exp, np.ones_like(secs)
        slack = deadline - secs
        k = np.where(d > 0, np.floor(slack / np.where(d > 0, d, 1)), np.inf)
        p = np.where(slack < 0, 0.0, np.where(np.isinf(k), 1.0, poisson.cdf(np.minimum(k, 1e9), lam * deadline)))
    return exp, p


@RECOMMENDERS.register
class Provision(Recommender):
    """The cheapest mix of spot instance types within quotas that reaches a loss target by a
    deadline, under spotDNN's model (heterogeneous iteration time T_exp = 1 / sum 1/T_i, PS
    bandwidth contention, the loss model): an exact search over every count vector. With a
    database holding a lifetime fit, each plan's expected revocations over its duration add
    the restart time (overhead fit) and the work since the last checkpoint, and a plan needs
    P(meeting the deadline) >= --confidence; on-demand is the fallback. Prices come from
    the profile or the price catalogue ($CMDARE_PRICES), with their as-of date. When no
    plan is possible it says which constraint binds.

    \b
    Example:
      analyze recommend provision --profile resnet.toml --loss 0.8 --deadline 1h
    """

    name = "provision"
    DATABASE = "optional"
    TERMINAL = {"profile": {"required": True, "path": True}, "profile_text": {"hidden": True},
                "db": {"help": "database with lifetime / overhead fits (revocation-aware plans); without one, "
                               "revocations are not counted"}}
    OPTIONS = {
        "profile": Option("str", "", "the provisioning profile, TOML (required)"),
        "profile_text": Option("str", "", "the profile's TOML itself, instead of profile naming a file (what a client "
                                          "sends the API; profile then only names it)"),
        "loss": Option("float", 0.0, "loss target (default: the profile's [job] loss_target)"),
        "deadline": Option("duration", 0.0, "training must finish within this (default: the profile's; 0: none)"),
        "confidence": Option("float", 0.9, "P(meeting the deadline) a spot plan needs, with revocations", lo=0, hi=1),
        "on_demand": Option("bool", True, "fall back to on-demand prices when no spot plan meets the deadline"),
        "max_plans": Option("int", 20_000_000, "largest search space (product of quota + 1 per type)", lo=1),
    }
    REQUIRES = ()

    def run(self, con: duckdb.DuckDBPyConnection | None, scope: Scope) -> list[Recommendation]:
        o = self.options
        if not o["profile"] and not o["profile_text"]:
            raise AnalyticsError("provision: give --profile FILE.toml (docs/recommendations.md#provision)")
        prof = load_profile(o["profile"] or "profile", o["profile_text"] or None)
        loss = o["loss"] or prof.loss_target
        if prof.gammas is not None and prof.iterations is None:
            if loss is None:
                raise AnalyticsError(f"provision: give --loss (or [job] loss_target in {prof.path})")
            if loss <= prof.gammas[4]:
                raise AnalyticsError(
                    f"provision: loss target {loss:g} is at or below the loss model's floor g5 = {prof.gammas[4]:g}: "
                    "no number of iterations reaches it"
                )
        elif prof.iterations is not None:
            loss = None
        deadline = o["deadline"] or prof.deadline
        quotas = [t.quota for t in prof.instances]
        space = math.prod(q + 1 for q in quotas)
        if space > o["max_plans"]:
            raise AnalyticsError(
                f"provision: the quotas give {space:,} plans, more than --max-plans {o['max_plans']:,}: lower the quotas "
                "or raise --max-plans"
            )
        risk = _Risk(prof, con)
        spot = np.array([t.spot_price for t in prof.instances], dtype=float)
        best, fastest, ok_det = self._search(prof, loss, deadline, spot, risk, o["confidence"], quotas, space)
        purchase = "spot"
        price = spot
        fallback_note = None
        if best.row is None:
            od_ok = all(t.on_demand_price is not None for t in prof.instances if t.quota)
            if fastest.row is None:
                raise AnalyticsError(
                    f"provision: the loss model reaches {loss:g} before the first iteration for every plan (j <= 0): "
                    "nothing to train; check [loss]"
                )
            if not ok_det:
                raise AnalyticsError(
                    f"provision: the deadline binds: the fastest plan within quotas ({self._plan(prof, fastest.row)}) "
                    f"takes {fastest.stats['seconds'] / 3600:.3g} h, more than {(deadline or 0) / 3600:.3g} h; raise the quotas "
                    "or the deadline"
                )
            if not (o["on_demand"] and od_ok):
                why = "on-demand fallback off" if not o["on_demand"] else "the price catalogue and profile lack on-demand prices for some types"
                raise AnalyticsError(
                    f"provision: no spot plan meets the deadline with probability >= {o['confidence']:g} under the "
                    f"lifetime fit's revocation rates (the best: {fastest.stats.get('pmax', 0.0):.3g}; {why})"
                )
            price = np.array([t.on_demand_price or 0.0 for t in prof.instances], dtype=float)
            none = _Risk.__new__(_Risk)
            none.rate, none.delay = np.zeros((3, len(quotas))), np.zeros(len(quotas))
            best, _, _ = self._search(prof, loss, deadline, price, none, 0.0, quotas, space)
            assert best.row is not None
            purchase = "on-demand"
            fallback_note = (f"no spot plan meets the deadline with probability >= {o['confidence']:g} (the best: "
                             f"{fastest.stats.get('pmax', 0.0):.3g}): on-demand")
        return [self._answer(prof, loss, deadline, best, price, purchase, risk, fallback_note, space)]

    def _search(self, prof: Profile, loss: float | None, deadline: float | None, price: np.ndarray, risk: _Risk,
                confidence: float, quotas: list[int], space: int) -> tuple[_Best, _Best, bool]:
        best, fastest, ok_det = _Best(), _Best(), False
        for start in range(1, space, CHUNK):
            counts = plans(quotas, start, min(space, start + CHUNK))
            ev = evaluate(prof, counts, loss)
            secs = ev["seconds"]
            exp, p = _expected(secs, counts, risk, 0, deadline)
            hourly = counts @ price
            cost = exp / 3600 * hourly
            fin = np.isfinite(secs)
            if fin.any():
                i = int(np.argmin(np.where(fin, secs, np.inf)))
                if secs[i] < fastest.key:
                    fastest.key, fastest.row = float(secs[i]), counts[i].copy()
                fastest.stats["seconds"] = float(secs[i])
            det = fin & ((secs <= deadline) if deadline else True)
            ok_det |= bool(det.any())
            if det.any():
                fastest.stats["pmax"] = max(fastest.stats.get("pmax", 0.0), float(p[det].max()))
            ok = det & np.isfinite(cost) & ((p >= confidence) if deadline else True)
            if not ok.any():
                continue
            # cheapest expected cost; ties to the sooner finish
            key = np.where(ok, cost + exp * 1e-12, np.inf)
            i = int(np.argmin(key))
            if key[i] < best.key:
                best.key, best.row = float(key[i]), counts[i].copy()
                best.stats = {k: float(v[i]) for k, v in ev.items()} | {
                    "expected": float(exp[i]), "p": float(p[i]), "cost": float(cost[i]), "hourly": float(hourly[i])}
        return best, fastest, ok_det

    @staticmethod
    def _plan(prof: Profile, row: np.ndarray) -> str:
        return ", ".join(f"{int(c)} x {t.type}" for t, c in zip(prof.instances, row, strict=True) if c)

    def _answer(self, prof: Profile, loss: float | None, deadline: float | None, best: _Best, price: np.ndarray,
                purchase: str, risk: _Risk, fallback: str | None, space: int) -> Recommendation:
        row, s = best.row, best.stats
        assert row is not None
        counts = row[None, :]
        hours, exp_h = s["seconds"] / 3600, s["expected"] / 3600
        lo_h, hi_h = exp_h, exp_h
        if purchase == "spot" and risk.counted[row > 0].any():
            lo_h = float(_expected(np.array([s["seconds"]]), counts, risk, 1, deadline)[0][0]) / 3600
            hi_h = float(_expected(np.array([s["seconds"]]), counts, risk, 2, deadline)[0][0]) / 3600
        predicted: dict[str, Any] = {
            "hours": round(exp_h, 4), "hours_without_revocations": round(hours, 4),
            "iterations": round(s["j"], 1), "images_per_second": round(s["speed"], 1),
            "iteration_seconds": round(s["t_exp"], 5), "weighted_batch": round(s["b_w"], 1),
            "heterogeneity_R": round(s["R"], 4),
        }
        interval: dict[str, tuple[float, float]] = {
            "hours": (round(lo_h * (1 - MODEL_ERROR), 4), round(hi_h * (1 + MODEL_ERROR), 4)
                      if math.isfinite(hi_h) else float("inf")),
        }
        predicted["dollars"] = round(s["cost"], 2)
        if math.isfinite(interval["hours"][1]):
            interval["dollars"] = (round(interval["hours"][0] * s["hourly"], 2), round(interval["hours"][1] * s["hourly"], 2))
        used = [t for t, c in zip(prof.instances, row, strict=True) if c]
        as_of = sorted({(t.spot_as_of if purchase == "spot" else t.on_demand_as_of) for t in used})
        cost: dict[str, Any] = {"dollars": round(s["cost"], 2), "dollars_per_hour": round(s["hourly"], 4),
                                "prices_as_of": ", ".join(as_of)}
        if deadline and purchase == "spot" and risk.counted[row > 0].any():
            predicted["p_meet_deadline"] = round(s["p"], 4)
            p_lo = float(_expected(np.array([s["seconds"]]), counts, risk, 2, deadline)[1][0])
            p_hi = float(_expected(np.array([s["seconds"]]), counts, risk, 1, deadline)[1][0])
            interval["p_meet_deadline"] = (round(p_lo, 4), round(p_hi, 4))
        spot = np.array([t.spot_price for t in prof.instances], dtype=float)
        assumptions: dict[str, Any] = {
            "profile": prof.path, "purchase": purchase, "plans_searched": space - 1,
            "loss_target": loss, "iterations_given": prof.iterations, "deadline_hours": round(deadline / 3600, 4) if deadline else None,
            "heterogeneity": prof.heterogeneity,
            "model_extensions": "cmdare heterogeneity coefficient R (opt-in)" if prof.heterogeneity == "share" else None,
            "time_model_error": f"+/-{MODEL_ERROR:.1%} (spotDNN's published error, heterogeneous clusters)",
        }
        for t in prof.instances:
            assumptions[f"quota_{t.type}"] = t.quota
            pr = t.spot_price if purchase == "spot" else t.on_demand_price
            assumptions[f"price_{t.type}"] = pr
        if purchase == "spot":
            sw = sliding_window(prof, loss, deadline, spot)
            if sw is not None:
                assumptions["sliding_window_plan"] = self._plan(prof, sw[0])
                assumptions["sliding_window_dollars_without_revocations"] = round(sw[1], 2)
        for i, note in enumerate(risk.notes if purchase == "spot" else [], 1):
            assumptions[f"note_{i}"] = note
        if risk.counted[row > 0].any() and purchase == "spot":
            assumptions["lifetime_fit_held_out_brier_skill"] = risk.brier_skill
            assumptions.update(lives_summary([risk.lives[m] for m in map(int, np.flatnonzero(row > 0)) if m in risk.lives]))
            assumptions["expected_revocations"] = round(float((counts @ risk.rate[0])[0]) * exp_h, 3)
        binding = self._binding(prof, row, deadline, s)
        why = (f"{self._plan(prof, row)} ({purchase}) reaches "
               + (f"loss {loss:g}" if loss is not None else f"{prof.iterations:g} iterations")
               + f" in {exp_h:.3g} h for ${s['cost']:.2f} (prices as of {', '.join(as_of)}), the cheapest of "
               f"{space - 1:,} plans" + (f" finishing within {deadline / 3600:.3g} h" if deadline else "")
               + (f" with P {s['p']:.2f}" if deadline and purchase == "spot" and risk.counted[row > 0].any() else "")
               + f"; {binding}" + (f"; {fallback}" if fallback else "")
               + ("; model: spotDNN's, with cmdare's heterogeneity extension R = n * sum of squared speed shares "
                  "(opted in: [loss] heterogeneity = \"share\"; spotDNN itself uses R = 1)"
                  if prof.heterogeneity == "share" and loss is not None else ""))
        return Recommendation(
            self.name,
            action={"instances": {t.type: int(c) for t, c in zip(prof.instances, row, strict=True) if c},
                    "purchase": purchase},
            predicted=predicted, interval=interval, cost=cost,
            fit_ids=tuple(risk.fit_ids) if purchase == "spot" else (), assumptions=assumptions, why=why,
        )

    @staticmethod
    def _binding(prof: Profile, row: np.ndarray, deadline: float | None, s: dict[str, float]) -> str:
        at_quota = [t.type for t, c in zip(prof.instances, row, strict=True) if c and c == t.quota]
        if deadline and s["expected"] >= 0.97 * deadline:
            return "the deadline binds (the plan uses nearly all of it)"
        if at_quota:
            return f"quota binds for {', '.join(at_quota)}"
        return "price binds (a faster plan would cost more)"
