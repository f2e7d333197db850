"""region (``analyze recommend region``): where to run spot VMs of an accelerator: regions
ranked by expected revocations per hour (lifetime fit), with VM start-up time (overhead
fit) and price where given; a region with too few lives is listed, not ranked."""

from __future__ import annotations

import math
from typing import Any

import duckdb

from cmdare.wire.plugin import Option, Requirement

from .. import catalog
from ..db import AnalyticsError
from ..detectors import evidence
from ..models.lifetime import lives_summary, revocation_probability
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
    # S holds from the last revocation on while lives are still followed (3, or a tenth, of
    # them: e.g. at a 24 h cap): the hazard is spread over that time too
    t = max(t, curve.get("followed_hours") or t)
    h = -math.log(s_)
    if h <= 0:  # nothing revoked yet: the rule of three over the lives at risk
        return 0.0, 0.0, 3.0 / (curve["n"] * t)
    dh = 1.96 * e / s_
    return h / t, max(0.0, h - dh) / t, (h + dh) / t


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


@RECOMMENDERS.register
class Region(Recommender):
    """Where to run spot VMs of an accelerator: regions ranked by expected revocations per
    hour (the lifetime fit: the cumulative hazard -ln S(t) over t at the survival curve's
    last point with lives at risk, with a 95 % interval), then spot VM start-up time (the
    overhead fit), then the price (given, or the price catalogue's). A region with fewer
    than --min-lives lives is listed, not ranked; overlapping intervals are said. The zones
    of the best region are ranked the same way (Kaplan-Meier on the lives stored now).

    \b
    Example:
      analyze recommend region --gpu-type v100 --hours 12 --price us-central1=0.74
    """

    name = "region"
    TERMINAL = {"gpu_type": {"required": True},
                "prices": {"decls": ["--price"], "multiple": True, "metavar": "REGION=DOLLARS",
                           "help": "spot $/hour in a region (repeatable; default: the price catalogue's, per accelerator)"}}
    OPTIONS = {
        "gpu_type": Option("str", "", "the accelerator (catalogue name or alias, e.g. v100)"),
        "min_lives": Option("int", 5, "VM lives a region needs before it is ranked", lo=1),
        "hours": Option("float", 0.0, "plan length in hours: ranks by P(revoked within it) (Kaplan-Meier) and "
                        "adds the expected revocations; 0: by revocations per hour", lo=0),
        "prices": Option("list", [], "spot $/hour per region, REGION=PRICE (default: the price catalogue's, per accelerator)"),
        "zones": Option("bool", True, "also rank the zones of the best region (Kaplan-Meier on the lives stored now)"),
    }
    REQUIRES = (Requirement("fit", "lifetime", "regions are ranked by the lifetime fit's revocation rates"),)

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Recommendation]:
        o = self.options
        if not o["gpu_type"]:
            raise AnalyticsError("region: give --gpu-type (e.g. v100)")
        acc = catalog.lookup(o["gpu_type"]).name
        prices = self._prices(o["prices"])
        as_of = None
        if not o["prices"]:
            prices, as_of = self._catalogue(acc)
        life = evidence.latest_fit(con, "lifetime")
        assert life is not None  # REQUIRES
        over = evidence.latest_fit(con, "overhead")
        starts = self._startups(over, acc) if over else {}
        ranked: list[Any] = []
        thin: list[Any] = []
        for key, curve in sorted(life["model"]["curves"].items()):
            region, _, a = key.partition("/")
            if a != acc:
                continue
            rate = revocation_rate(curve)
            row = {"region": region, "lives": curve["n"], "revoked": curve["events"], "rate": rate,
                   "startup": starts.get(region), "price": prices.get(region),
                   "p": revocation_probability(curve, o["hours"]) if o["hours"] > 0 else None}
            (ranked if curve["n"] >= o["min_lives"] and rate is not None else thin).append(row)
        if not ranked and not thin:
            have = sorted({k.partition("/")[2] for k in life["model"]["curves"]})
            raise AnalyticsError(f"region: the lifetime fit {life['fit_id']} has no {acc} lives (it has: {', '.join(have)})")
        if not ranked:
            counts = ", ".join(f"{r['region']}: {r['lives']}" for r in thin)
            raise AnalyticsError(f"region: too few {acc} lives to rank regions ({counts}; --min-lives {o['min_lives']})")
        ranked.sort(key=lambda r: (r["p"][0] if r["p"] else r["rate"][0],
                                   r["startup"]["mean"] if r["startup"] else float("inf"), r["price"] or 0))
        best = ranked[0]
        fits = [life["fit_id"]] + ([over["fit_id"]] if over and any(r["startup"] for r in ranked) else [])
        rate, lo, hi = best["rate"]
        predicted: dict[str, Any] = {"revocations_per_hour": round(rate, 5)}
        interval: dict[str, tuple[float, float]] = {"revocations_per_hour": (round(lo, 5), round(hi, 5))}
        if best["startup"]:
            st = best["startup"]
            predicted["startup_seconds"] = round(st["mean"], 1)
            lo_s, hi_s = st.get("lower"), st.get("upper")
            if _finite(lo_s) and _finite(hi_s) and hi_s > lo_s:  # one start-up measured: no interval
                interval["startup_seconds"] = (round(lo_s, 1), round(hi_s, 1))
            assumptions_startup = f"{st.get('covers', 'kernel boot to agent ready')}, {st['n']} VM starts"
        if o["hours"] > 0:
            predicted["expected_revocations"] = round(rate * o["hours"], 3)
            interval["expected_revocations"] = (round(lo * o["hours"], 3), round(hi * o["hours"], 3))
            p, p_lo, p_hi = best["p"]
            predicted["revocation_probability"] = round(p, 4)
            interval["revocation_probability"] = (round(p_lo, 4), round(p_hi, 4))
        cost: dict[str, Any] = {"dollars_per_hour": best["price"]} if best["price"] is not None else {}
        if cost and as_of:
            cost["per"] = "accelerator-hour, the cheapest spot VM type of the price catalogue"
            cost["prices_as_of"] = as_of
        assumptions: dict[str, Any] = {"accelerator": acc, "min_lives": o["min_lives"], "ranked_regions": len(ranked),
                                       "lifetime_fit_held_out_brier_skill": (life.get("cv") or {}).get("brier_skill")}
        if best["startup"]:
            assumptions["startup_covers"] = assumptions_startup
        assumptions.update(lives_summary([life["model"]["curves"][f"{r['region']}/{acc}"] for r in ranked]))
        for i, r in enumerate(ranked, 1):
            assumptions[f"rank_{i}"] = r["region"]
            assumptions[f"rank_{i}_revocations_per_hour"] = round(r["rate"][0], 5)
            if r["p"]:
                assumptions[f"rank_{i}_revocation_probability"] = round(r["p"][0], 4)
        if thin:
            assumptions["too_few_lives"] = ", ".join(f"{r['region']} ({r['lives']})" for r in thin)
        overlap = len(ranked) > 1 and (ranked[1]["p"][1] <= best["p"][2] if best["p"] else ranked[1]["rate"][1] <= hi)
        why = "; ".join(
            (f"{r['region']}: P(revoked within {o['hours']:g} h) {r['p'][0]:.0%} ({r['p'][1]:.0%}..{r['p'][2]:.0%}), "
             if r["p"] else f"{r['region']}: ")
            + f"{r['rate'][0]:.3g}/h ({r['rate'][1]:.3g}..{r['rate'][2]:.3g}) from {r['lives']} lives"
            + (f", start-up {r['startup']['mean']:.0f} s" if r["startup"] else "")
            + (f", ${r['price']:g}/h" if r["price"] is not None else "")
            for r in ranked
        )
        if overlap:
            why += f"; the intervals of {best['region']} and {ranked[1]['region']} overlap: the ranking is not sure"
        if thin:
            why += f"; not ranked, too few lives: {assumptions['too_few_lives']}"
        action: dict[str, Any] = {"region": best["region"]}
        if o["zones"]:
            why += self._zone_ranking(con, acc, best["region"], o["min_lives"], action, predicted, interval,
                                      assumptions)
        return [
            Recommendation(self.name, action=action, predicted=predicted, interval=interval,
                           cost=cost, fit_ids=tuple(fits), assumptions=assumptions, why=why)
        ]

    def _zone_ranking(self, con: duckdb.DuckDBPyConnection, acc: str, region: str, min_lives: int,
                      action: dict[str, Any], predicted: dict[str, Any], interval: dict[str, Any],
                      assumptions: dict[str, Any]) -> str:
        """The zones of the best region ranked (into ``action``, ``predicted``, ``interval``
        and ``assumptions``); what to add to ``why``."""
        why = ""
        zones, zthin = self._zones(con, acc, region, min_lives)
        for i, (z, n, r) in enumerate(zones, 1):
            assumptions[f"zone_rank_{i}"] = z
            assumptions[f"zone_rank_{i}_revocations_per_hour"] = round(r[0], 5)
            assumptions[f"zone_rank_{i}_interval"] = f"{r[1]:.3g}..{r[2]:.3g} from {n} lives"
        if zthin:
            assumptions["zones_too_few_lives"] = ", ".join(f"{z} ({n})" for z, n in zthin)
        if len(zones) >= 1 and (len(zones) > 1 or not zthin):
            action["zone"] = zones[0][0]
            predicted["zone_revocations_per_hour"] = round(zones[0][2][0], 5)
            interval["zone_revocations_per_hour"] = (round(zones[0][2][1], 5), round(zones[0][2][2], 5))
            why += f"; in {region}: " + ", ".join(f"{z} {r[0]:.3g}/h ({r[1]:.3g}..{r[2]:.3g})" for z, _, r in zones)
            if len(zones) > 1 and zones[1][2][1] <= zones[0][2][2]:
                why += f" (the intervals of {zones[0][0]} and {zones[1][0]} overlap)"
        elif zthin:
            why += f"; zones of {region} have too few lives to rank ({assumptions['zones_too_few_lives']})"
        return why

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

    def _catalogue(self, acc: str) -> tuple[dict[str, float], str | None]:
        """region -> the cheapest spot $/accelerator-hour of a catalogue VM type with this
        accelerator; the rows' as-of dates."""
        from .. import prices

        cat = catalog.load()
        out: dict[str, float] = {}
        dates = set()
        for p in prices.load().values():
            if p.spot is None or not p.accelerator_count:
                continue
            try:
                if catalog.lookup(p.accelerator, cat).name != acc:
                    continue
            except AnalyticsError:
                continue
            per = p.spot / p.accelerator_count
            if p.region not in out or per < out[p.region]:
                out[p.region] = round(per, 4)
                dates.add(p.as_of)
        return out, ", ".join(sorted(dates)) or None

    def _zones(self, con: duckdb.DuckDBPyConnection, acc: str, region: str, min_lives: int) -> tuple[list, list]:
        """The zones of ``region`` with lives of ``acc``: [(zone, lives, (rate, lo, hi))]
        ranked, and [(zone, lives)] with too few; Kaplan-Meier on the lives stored now, by
        the same rate rule as the regions."""
        import numpy as np
        import statsmodels.api as sm

        rows = con.execute(
            """SELECT zone, accelerator, lifetime_seconds / 3600.0, end_reason = 'revoked'
               FROM instance_lives() WHERE spot AND lifetime_seconds > 0 AND region = ? AND zone IS NOT NULL""",
            [region],
        ).fetchall()
        cat = catalog.load()
        by: dict[str, tuple[list[float], list[int]]] = {}
        for zone, a, hours, ev in rows:
            try:
                if catalog.lookup(a or "", cat).name != acc:
                    continue
            except AnalyticsError:
                continue
            t, e = by.setdefault(zone, ([], []))
            t.append(hours)
            e.append(1 if ev else 0)
        ranked, thin = [], []
        for zone, (t, e) in sorted(by.items()):
            if len(t) < min_lives:
                thin.append((zone, len(t)))
                continue
            sf = sm.SurvfuncRight(np.array(t), np.array(e))
            r = revocation_rate({"n": len(t), "times": list(sf.surv_times), "surv": list(sf.surv_prob),
                                 "se": list(sf.surv_prob_se)})
            if r is None:
                thin.append((zone, len(t)))
            else:
                ranked.append((zone, len(t), r))
        ranked.sort(key=lambda z: z[2][0])
        return ranked, thin

    def _startups(self, over: dict[str, Any], acc: str) -> dict[str, dict[str, float]]:
        """region -> start-up seconds of spot VMs with this accelerator (overhead fit): the
        cloud's phases where imported start-ups measured the group, else what agents saw."""
        out = {}
        cat = catalog.load()
        agents: dict[str, dict[str, Any]] = {}
        vs = over["model"].get("vm_startup")
        if vs:
            from ..models.overhead_records import predict_startup

            for region in sorted({g.split("/")[0] for g in vs.get("groups", {})}):
                p = predict_startup(vs, region, "spot", acc)
                if not p["extrapolates"] and p["group_vms"] >= 2:  # one VM: the agents' figures say more
                    out[region] = {"mean": p["seconds"], "lower": p["interval"][0], "upper": p["interval"][1],
                                   "n": p["group_vms"], "covers": "request to guest ready (the cloud's phases)"}
        for key, m in over["model"].get("vm_startup_seconds", {}).items():
            region, a, kind = (key.split("/") + ["", ""])[:3]
            try:
                name = catalog.lookup(a, cat).name
            except AnalyticsError:
                continue
            if name == acc and kind == "spot" and (region not in agents or m["n"] > agents[region]["n"]):
                agents[region] = m  # two spellings of one accelerator: the group with more VM starts
        return agents | out  # the cloud's phases where imported start-ups measured the group
