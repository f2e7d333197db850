"""region (``analyze recommend region``): where to run spot VMs of an accelerator: regions
ranked by expected revocations per hour (lifetime fit), with VM start-up time (overhead
fit) and price where given; a region with too few lives is listed, not ranked."""

from __future__ import annotations

import math
from typing import Any

import duckdb

from cmdare.wire.plugin import Option, Requirement

from .. import catalog, evidence
from ..db import AnalyticsError
from ..units import RECOMMENDERS, Recommendation, Recommender, Scope


def revocation_rate(curve: dict[str, Any]) -> tuple[float, float, float] | None:
    """Revocations per hour of a Kaplan-Meier curve's lives, with a 95 % interval: the
    cumulative hazard -ln S(t) at the curve's last time with lives at risk, over that time (the constant hazard
    that gives the same survival; unbiased under censoring, unlike events over observed time
    when owners stop VMs), the interval by the delta method on -ln S from the curve's
    standard error.  None for a curve without times."""
    times, surv, se = curve.get("times") or [], curve.get("surv") or [], curve.get("se") or []
    # the last point with lives still at risk (a curve that reaches 0 has no error there)
    pts = [
        (t, s_, e) for t, s_, e in zip(times, surv, se or [None] * len(times), strict=False)
        if t and t > 0 and s_ is not None and s_ > 0 and e is not None and math.isfinite(e)
    ]
    if not pts:
        return None
    t, s_, e = pts[-1]
    h = -math.log(s_)
    if h <= 0:  # nothing revoked yet: the rule of three over the lives at risk
        return 0.0, 0.0, 3.0 / (curve["n"] * t)
    dh = 1.96 * e / s_
    return h / t, max(0.0, h - dh) / t, (h + dh) / t


@RECOMMENDERS.register
class Region(Recommender):
    name = "region"
    OPTIONS = {
        "gpu_type": Option("str", "", "the accelerator (catalogue name or alias, e.g. v100)"),
        "min_lives": Option("int", 10, "VM lives a region needs before it is ranked", lo=1),
        "hours": Option("float", 0.0, "plan length in hours: adds the expected revocations over it", lo=0),
        "prices": Option("list", [], "spot $/hour per region, REGION=PRICE"),
    }
    REQUIRES = (Requirement("fit", "lifetime", "regions are ranked by the lifetime fit's revocation rates"),)

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Recommendation]:
        o = self.options
        if not o["gpu_type"]:
            raise AnalyticsError("region: give --gpu-type (e.g. v100)")
        acc = catalog.lookup(o["gpu_type"]).name
        prices = self._prices(o["prices"])
        life = evidence.latest_fit(con, "lifetime")
        assert life is not None  # REQUIRES
        over = evidence.latest_fit(con, "overhead")
        starts = self._startups(over, acc) if over else {}
        ranked, thin = [], []
        for key, curve in sorted(life["model"]["curves"].items()):
            region, _, a = key.partition("/")
            if a != acc:
                continue
            rate = revocation_rate(curve)
            row = {"region": region, "lives": curve["n"], "revoked": curve["events"], "rate": rate,
                   "startup": starts.get(region), "price": prices.get(region)}
            (ranked if curve["n"] >= o["min_lives"] and rate is not None else thin).append(row)
        if not ranked and not thin:
            have = sorted({k.partition("/")[2] for k in life["model"]["curves"]})
            raise AnalyticsError(f"region: the lifetime fit {life['fit_id']} has no {acc} lives (it has: {', '.join(have)})")
        if not ranked:
            counts = ", ".join(f"{r['region']}: {r['lives']}" for r in thin)
            raise AnalyticsError(f"region: too few {acc} lives to rank regions ({counts}; --min-lives {o['min_lives']})")
        ranked.sort(key=lambda r: (r["rate"][0], r["startup"]["mean"] if r["startup"] else float("inf"), r["price"] or 0))
        best = ranked[0]
        fits = [life["fit_id"]] + ([over["fit_id"]] if over and any(r["startup"] for r in ranked) else [])
        rate, lo, hi = best["rate"]
        predicted: dict[str, Any] = {"revocations_per_hour": round(rate, 5)}
        interval: dict[str, tuple[float, float]] = {"revocations_per_hour": (round(lo, 5), round(hi, 5))}
        if best["startup"]:
            predicted["startup_seconds"] = round(best["startup"]["mean"], 1)
            if best["startup"].get("lower") == best["startup"].get("lower"):  # not NaN
                interval["startup_seconds"] = (round(best["startup"]["lower"], 1), round(best["startup"]["upper"], 1))
        if o["hours"] > 0:
            predicted["expected_revocations"] = round(rate * o["hours"], 3)
            interval["expected_revocations"] = (round(lo * o["hours"], 3), round(hi * o["hours"], 3))
        cost = {"dollars_per_hour": best["price"]} if best["price"] is not None else {}
        assumptions: dict[str, Any] = {"accelerator": acc, "min_lives": o["min_lives"], "ranked_regions": len(ranked)}
        for i, r in enumerate(ranked, 1):
            assumptions[f"rank_{i}"] = r["region"]
            assumptions[f"rank_{i}_revocations_per_hour"] = round(r["rate"][0], 5)
        if thin:
            assumptions["too_few_lives"] = ", ".join(f"{r['region']} ({r['lives']})" for r in thin)
        overlap = len(ranked) > 1 and ranked[1]["rate"][1] <= hi
        why = "; ".join(
            f"{r['region']}: {r['rate'][0]:.3g}/h ({r['rate'][1]:.3g}..{r['rate'][2]:.3g}) from {r['lives']} lives"
            + (f", start-up {r['startup']['mean']:.0f} s" if r["startup"] else "")
            + (f", ${r['price']:g}/h" if r["price"] is not None else "")
            for r in ranked
        )
        if overlap:
            why += f"; the intervals of {best['region']} and {ranked[1]['region']} overlap: the ranking is not sure"
        if thin:
            why += f"; not ranked, too few lives: {assumptions['too_few_lives']}"
        return [
            Recommendation(self.name, action={"region": best["region"]}, predicted=predicted, interval=interval,
                           cost=cost, fit_ids=tuple(fits), assumptions=assumptions, why=why)
        ]

    def _prices(self, items: list[str]) -> dict[str, float]:
        out = {}
        for it in items:
            region, eq, v = it.partition("=")
            try:
                p = float(v)
            except ValueError:
                p = -1.0
            if not eq or not region or not p >= 0:
                raise AnalyticsError(f"--price {it!r}: expected REGION=DOLLARS_PER_HOUR with a price >= 0, e.g. us-central1=0.74")
            out[region.strip()] = p
        return out

    def _startups(self, over: dict[str, Any], acc: str) -> dict[str, dict[str, float]]:
        """region -> start-up seconds of spot VMs with this accelerator (overhead fit)."""
        out = {}
        cat = catalog.load()
        for key, m in over["model"].get("vm_startup_seconds", {}).items():
            region, a, kind = (key.split("/") + ["", ""])[:3]
            try:
                name = catalog.lookup(a, cat).name
            except AnalyticsError:
                continue
            if name == acc and kind == "spot":
                out[region] = m
        return out
