"""cluster (``analyze recommend cluster``): how many workers and parameter servers for a
job's model and accelerator: the knee (one more worker adds less than 7 %), whether a
second PS pays, and the cheapest counts that meet a deadline; for a data-parallel job
(no PS), the world size and nodes from the all-reduce model (recommend/allreduce.py)."""

from __future__ import annotations

import statistics
from typing import Any

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..db import AnalyticsError
from ..models.fromjob import anchor, measured
from ..models.steady import job_speeds
from ..units import RECOMMENDERS, Recommendation, Recommender, Scope


def knee(series: dict[int, float], threshold: float) -> tuple[int, bool]:
    """Cachew's rule: the first worker count past which one more worker adds ``threshold`` of
    speed or less (per added worker, compounded over gaps between measured counts), whatever
    later counts do (a worker that loses speed ends the scaling: a later gain past a dip is
    noise or luck, not a reason to pay for both); (count, settled): not settled when the
    series ends while still scaling."""
    w, settled, _ = knee_next(series, threshold)
    return w, settled


def knee_next(series: dict[int, float], threshold: float) -> tuple[int, bool, float | None]:
    """``knee`` and what the next count adds per worker there (None: nothing measured past it)."""
    counts = sorted(series)
    for a, b in zip(counts, counts[1:], strict=False):
        per_worker = (series[b] / series[a]) ** (1.0 / (b - a)) - 1.0
        if per_worker <= threshold:
            return a, True, per_worker
    return counts[-1], False, None


def _knees(meas: dict[int, dict[int, float]], pred: dict[int, dict[int, tuple[float, float, float]]],
           th: float) -> dict[int, dict[str, Any]]:
    """Per PS count, the knee: from the measured series where it settles there, else the fit."""
    knees: dict[int, dict[str, Any]] = {}
    for p in sorted(set(meas) | set(pred)):
        m = meas.get(p, {})
        if len(m) >= 2:
            w, settled, nxt = knee_next(m, th)
            if settled or p not in pred:
                knees[p] = {"workers": w, "speed": m[w], "settled": settled, "from": "measured", "next": nxt}
                continue
        if p in pred:
            w, settled, nxt = knee_next({k: v[0] for k, v in pred[p].items()}, th)
            knees[p] = {"workers": w, "speed": pred[p][w][0], "settled": settled, "from": "cluster fit",
                        "interval": pred[p][w][1:], "next": nxt}
    return knees


def _best_measured(meas: dict[int, dict[int, float]], th: float) -> tuple[int, int, float] | None:
    """The best measured configuration by the knee rule over measured series only (the
    knee of each PS count's series; another PS where its knee is faster by more than the
    threshold): (workers, ps, speed), or None when no PS count has two measured sizes."""
    knees = {p: knee(m, th)[0] for p, m in meas.items() if len(m) >= 2}
    if not knees:
        return None
    best = min(knees)
    for p in sorted(knees)[1:]:
        if meas[p][knees[p]] > (1 + th) * meas[best][knees[best]]:
            best = p
    return knees[best], best, meas[best][knees[best]]


def _with_evidence(meas: dict[int, dict[int, float]], knees: dict[int, dict[str, Any]], k: dict[str, Any], w: int,
                   p: int, interval: dict[str, Any], th: float,
                   beyond: str = "") -> tuple[int, int, dict[str, Any], dict[str, Any]] | None:
    """Advice stays with the evidence: when the chosen (w, p) was never measured and either
    its interval does not lie wholly above the best measured configuration, or the fit
    extrapolates to it (``beyond``: why; an interval there rests on no run like it), the
    best measured one instead (workers, ps, its knee) and the unmeasured one named as the
    experiment to run next, with its predicted gain and interval; else None."""
    stay = _best_measured(meas, th) if w not in meas.get(p, {}) else None
    above = bool(interval) and interval["steps_per_second"][0] > (stay[2] if stay else 0)
    if stay is None or (above and not beyond):
        return None
    mw, mp, ms = stay
    band = (f"; interval {interval['steps_per_second'][0]:.3g} .. {interval['steps_per_second'][1]:.3g}"
            if interval else "")
    evidence = {"stays_with_measured": True,
                "experiment": f"measure {w} workers with {p} PS next: the fit predicts {k['speed'] / ms - 1:+.0%} "
                              f"({k['speed']:.3g} vs {ms:.3g} steps/s measured{band})"
                              + (f", past what it was fitted on ({beyond})" if beyond else "")}
    _, settled, nxt = knee_next(meas[mp], th)  # (the measured series' own: still scaling where it ends so)
    knee_ = {**knees.get(mp, {}), "workers": mw, "speed": ms, "from": "measured", "settled": settled, "next": nxt}
    return mw, mp, knee_, evidence


def _extrapolation(fitted: tuple[dict[str, Any] | None, float, str], w: int, p: int, predicted: dict[str, Any],
                   interval: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a configuration predicted by the cluster fit says of the fit's ranges: whether
    it extrapolates and why, and its interval widened by the distance, or dropped past the
    limit (``rough``)."""
    from ..models.ranges import check, rough, widen

    cfit, params, acc_name = fitted
    assert cfit is not None
    inputs = {"workers": w, "ps": p, "workers_per_ps": w / p, "params": params, "accelerator": acc_name}
    ex, reasons, decades = check(cfit, **inputs)
    out: dict[str, Any] = {"extrapolated": ex}
    if reasons:
        out["extrapolated_because"] = "; ".join(reasons)
    if why := rough(cfit, **inputs):
        return {**out, "rough": why}, {}  # too far for any interval: the prediction is a rough guide
    if ex and decades > 0 and "steps_per_second" in interval:
        lo, hi = interval["steps_per_second"]
        lo_v, hi_v = widen(predicted["steps_per_second"], lo, hi, decades)
        interval = {**interval, "steps_per_second": (round(lo_v, 4), round(hi_v, 4))}
    return out, interval


def _knee_text(knees: dict[int, dict[str, Any]], k: dict[str, Any], predicted: bool) -> str:
    """The knees in words, and what an unsettled one means."""
    txt = "; ".join(
        f"{q} PS: {'knee' if v['settled'] else 'still scaling'} at {v['workers']} workers, {v['speed']:.3g} steps/s ({v['from']}"
        + (f"; the next worker adds {v['next']:+.1%}" if v.get("next") is not None else "") + ")"
        for q, v in sorted(knees.items())
    )
    if not k["settled"]:
        txt += f" (still scaling at the largest count {'measured' if k['from'] == 'measured' else 'considered'}: more workers may pay"
        txt += "; fit a cluster model to predict past it)" if k["from"] == "measured" and not predicted else ")"
    return txt


@RECOMMENDERS.register
class Cluster(Recommender):
    """How many workers and parameter servers for job J's model and accelerator: per PS
    count, the knee (the count past which one more worker adds 7 % or less), from the
    model's measured runs at several worker counts where they show it, else from the
    cluster fit; whether a second PS pays (its knee is faster by more than the threshold);
    with --steps and --deadline, the cheapest counts that finish in time.

    With --gpu-type, the job's model sized on another accelerator (its single-worker time
    carried there by the speed fit). Without a job: a declaration (--flops-per-step,
    --params, --tensors) and --gpu-type, through the speed and cluster fits.

    A data-parallel job (no parameter server; it reports its all-reduce: DDP, FSDP): the
    world size and nodes from the all-reduce cost model fitted to its model's runs, and
    what hides its communication (gradient accumulation, one node, fp16 compression),
    each with its predicted gain (docs/recommendations.md).

    \b
    Examples:
      analyze recommend cluster --from-job resnet-1gpu
      analyze recommend cluster --from-job resnet-k80 --gpu-type p100
      analyze recommend cluster --flops-per-step 3.1e12 --params 25.6e6 --gpu-type v100
      analyze recommend cluster --from-job resnet-1gpu --steps 1e6 --deadline 8h --worker-price 0.9 --ps-price 0.2
    """

    name = "cluster"
    NEEDS = {"deadline": "steps"}
    OPTIONS = {
        "from_job": Option("str", "", "the job whose model and accelerator to size (required)"),
        "max_workers": Option("int", 16, "most workers to consider", lo=1, hi=4096),
        "max_ps": Option("int", 4, "most parameter servers to consider", lo=1, hi=64),
        "knee": Option("float", 0.07, "one more worker must add more than this share of speed", lo=0, hi=1),
        "steps": Option("float", 0.0, "training steps to run (with deadline: the cheapest counts that finish in time)", lo=0),
        "deadline": Option("duration", 0.0, "time the steps must finish in (0: no deadline)"),
        "worker_price": Option("float", 0.0, "$/hour of one worker VM (with ps_price: both or neither)", lo=0),
        "ps_price": Option("float", 0.0, "$/hour of one parameter-server VM (with worker_price: both or neither)", lo=0),
        "worker_type": Option("str", "", "instead of worker_price: the worker VM type in the price catalogue"),
        "ps_type": Option("str", "", "instead of ps_price: the PS VM type in the price catalogue"),
        "region": Option("str", "", "with worker_type / ps_type: the catalogue region (needed where a type has several)"),
        "purchase": Option("str", "on-demand", "with worker_type / ps_type: which catalogue price", choices=("on-demand", "spot")),
        "gpu_type": Option("str", "", "the accelerator to size for (default: the job's)"),
        "flops_per_step": Option("float", 0.0, "instead of from_job: the model's FLOPs per step", lo=0),
        "params": Option("float", 0.0, "instead of from_job: the model's parameter count", lo=0),
        "tensors": Option("int", 0, "instead of from_job: parameter tensors (default params / 1e5)", lo=0),
    }
    REQUIRES = (Requirement("table", "steps", "cluster sizes a job measured in this database"),)

    def _catalogue_prices(self) -> str | None:
        """worker_price / ps_price from the price catalogue for worker_type / ps_type; the
        rows' as-of dates, or None when no type was named."""
        from .. import prices

        o = self.options
        dates = []
        for key, price in (("worker_type", "worker_price"), ("ps_type", "ps_price")):
            if not o[key]:
                continue
            if o[price]:
                raise AnalyticsError(f"cluster: give --{price.replace('_', '-')} or --{key.replace('_', '-')}, not both")
            row = prices.lookup(o[key], o["region"] or None)
            if row is None:
                raise AnalyticsError(
                    f"cluster: {o[key]} is not in the price catalogue" + (f" for {o['region']}" if o["region"] else "")
                    + f" (add it with ${prices.ENV}=prices.csv)"
                )
            v = row.spot if o["purchase"] == "spot" else row.on_demand
            if v is None:
                raise AnalyticsError(f"cluster: the price catalogue has no {o['purchase']} price for {o[key]} in {row.region}")
            o[price] = v
            dates.append(row.as_of)
        return ", ".join(sorted(set(dates))) or None

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Recommendation]:
        o = self.options
        self.as_of = self._catalogue_prices()
        if (o["worker_price"] > 0) != (o["ps_price"] > 0):  # one price alone would make the other VMs free
            given, missing = ("worker", "ps") if o["worker_price"] > 0 else ("ps", "worker")
            raise AnalyticsError(
                f"cluster: --{given}-price without --{missing}-price (or --{missing}-type): "
                f"a {'parameter server' if missing == 'ps' else 'worker'} is not free; give both prices, or neither"
            )
        declared = o["flops_per_step"] > 0 or o["params"] > 0
        if o["from_job"] and declared:
            raise AnalyticsError("cluster: give --from-job J, or a declaration (--flops-per-step, --params) with --gpu-type, not both")
        if not o["from_job"] and not declared:
            raise AnalyticsError(
                "cluster: give --from-job J (the job whose model and accelerator to size), or a declaration: "
                "--flops-per-step, --params and --gpu-type"
            )
        if o["from_job"] and (ring := self._data_parallel(con, o["from_job"])) is not None:
            return [ring]
        from .. import catalog

        sfit = cfit = None
        if o["from_job"]:
            j = measured(con, o["from_job"])
            acc = catalog.lookup(o["gpu_type"]) if o["gpu_type"] else j.acc
            model, acc_name, params = j.model, (acc.name if acc else j.accelerator), j.params
            subject: dict[str, Any] = {"from_job": j.job, "model": j.model, "accelerator": acc_name}
            if acc is not None and j.acc is not None and acc.name != j.acc.name:
                subject["measured_accelerator"] = j.accelerator
        else:
            if not (o["flops_per_step"] > 0 and o["params"] > 0 and o["gpu_type"]):
                raise AnalyticsError("cluster: a declaration needs --flops-per-step, --params and --gpu-type")
            j, acc = None, catalog.lookup(o["gpu_type"])
            model, acc_name, params = "", acc.name, o["params"]
            subject = {"from_job": None, "model": "(declared)", "accelerator": acc.name}
        # measured: every job of the same model and accelerator, by PS count and workers
        speeds, _ = job_speeds(con)
        same = [k for k in speeds if j is not None and k.model == model
                and (k.acc.name if k.acc else k.accelerator) == acc_name]
        singles = [k.speed for k in same if k.workers == 1]
        series: dict[int, dict[int, list[float]]] = {}
        for k in same:
            if 1 < k.workers <= o["max_workers"] and 0 < k.ps <= o["max_ps"]:
                series.setdefault(k.ps, {}).setdefault(k.workers, []).append(k.speed)
        measured_series = {
            p: {**({1: statistics.median(singles)} if singles else {}), **{w: statistics.median(v) for w, v in ws.items()}}
            for p, ws in series.items()
        }
        # predicted: the cluster fit from the single-worker time (measured, or through the speed fit)
        predicted: dict[int, dict[int, tuple[float, float, float]]] = {}
        fit_ids: list[str] = []
        cfit = self._latest(con, "cluster")
        t1 = None
        if cfit is not None:
            if j is not None:
                try:
                    a = anchor(con, j.job, cfit)
                except AnalyticsError:
                    a = None
                if a is not None and acc is not None and j.acc is not None and acc.name != j.acc.name:
                    sfit = self._latest(con, "speed")
                    if sfit is None:
                        raise AnalyticsError(f"cluster: sizing {j.job} on {acc.name} needs a speed fit (run analyze fit speed)")
                    t1 = a.t1_on(acc, sfit)
                elif a is not None:
                    t1 = a.t1
            else:
                sfit = self._latest(con, "speed")
                if sfit is None:
                    raise AnalyticsError("cluster: a declaration needs a speed fit (run analyze fit speed)")
                from ..models.speed import predict_speed

                tensors = o["tensors"] or max(1, round(params / 1e5))
                assert acc is not None  # a declaration names its accelerator
                t1 = 1.0 / predict_speed(sfit, acc, o["flops_per_step"], params, tensors)[0]
        if t1 is not None and cfit is not None:  # (t1 comes from the cluster fit)
            from ..models.cluster import predict_cluster

            fit_ids.append(cfit["fit_id"])
            if sfit is not None:
                fit_ids.append(sfit["fit_id"])
            for p in range(1, o["max_ps"] + 1):
                predicted[p] = {}
                for w in range(1, o["max_workers"] + 1):
                    r = predict_cluster(cfit, [t1] * w, p, params)
                    predicted[p][w] = (r["steps_per_second"], r["lower"], r["upper"])
        if not measured_series and not predicted:
            what = f"{j.job} ({model} on {acc_name})" if j is not None else f"the declared model on {acc_name}"
            raise AnalyticsError(
                f"cluster: {what} has no parameter-server runs at several worker "
                "counts in the database and there is no cluster fit (run analyze fit cluster)"
            )
        errors = {f"held_out_mape_{f['fit_id'].split('-')[0]}": f.get("cv_mape")
                  for f in (cfit, sfit) if f is not None and predicted}
        rec = self._answer(subject, measured_series, predicted, fit_ids, errors, (cfit, params, acc_name))
        if j is not None and (acc is None or j.acc is None or acc.name == j.acc.name) and not o["steps"]:
            bound = self._ps_bound(con, j.job)
            if bound is not None:
                return [self._remove_ps_bottleneck(rec, bound, predicted, cfit)]
        return [rec]

    def _data_parallel(self, con: duckdb.DuckDBPyConnection, job: str) -> Recommendation | None:
        """A job without parameter servers that reports its all-reduce (DDP, FSDP): sized by
        the all-reduce cost model (recommend/allreduce.py); None: not such a job."""
        from ..models.allreduce import shape
        from .allreduce import advise

        sh = shape(con, job)
        if sh is None:
            return None
        o = self.options
        given = [f"--{k.replace('_', '-')}" for k in ("gpu_type", "steps", "deadline", "worker_price", "worker_type")
                 if o[k]]
        if given:
            raise AnalyticsError(f"cluster: {job} is data-parallel (no parameter server): the all-reduce model sizes it "
                                 f"on its own accelerator, without {', '.join(given)} (not yet)")
        return advise(con, job, sh, o["knee"], o["max_workers"])

    def _ps_bound(self, con: duckdb.DuckDBPyConnection, job: str) -> dict[str, Any] | None:
        """The ps_bound detector's evidence on ``job`` as it runs now (None: not PS-bound)."""
        from ..detectors import DETECTORS
        from ..units import Scope as S
        from ..units import run_unit

        try:
            found = run_unit(DETECTORS, "ps_bound", con, S(job), {})
        except AnalyticsError:
            return None
        return dict(found[0].evidence, summary=found[0].summary) if found else None

    def _remove_ps_bottleneck(self, rec: Recommendation, ev: dict[str, Any],
                              pred: dict[int, dict[int, tuple[float, float, float]]],
                              cfit: dict[str, Any] | None) -> Recommendation:
        """A PS-bound job keeps its workers and gets the PS count that removes the bottleneck:
        with a cluster fit, the fewest PS past which one more adds no more than the knee
        threshold at these workers; without one, the PS capacity measured (its speed over
        its PS count, the PS saturated) times the PS count must carry the workers at the
        single-worker speed (the load split evenly over the PS: an assumption, said)."""
        import math

        o = self.options
        w, p0, speed = int(ev["workers"]), int(ev["ps"]), float(ev["steps_per_second"])
        s1 = float(ev["single_worker_steps_per_second"])
        linear = w * s1
        interval: dict[str, Any] = {}
        if pred and w in pred.get(p0, {}):
            p = p0
            while p + 1 in pred and pred[p + 1][w][0] > (1 + o["knee"]) * pred[p][w][0]:
                p += 1
            if p == p0:  # the fit sees no gain from more PS here: the finding and the fit disagree
                p = p0 + 1
            v = pred[p][w]
            predicted: dict[str, Any] = {"steps_per_second": round(v[0], 4)}
            if v[2] > v[1]:
                interval = {"steps_per_second": (round(v[1], 4), round(v[2], 4))}
            how = (f"the cluster fit {cfit['fit_id'] if cfit else ''} predicts {v[0]:.3g} steps/s with {p} PS "
                   f"at {w} workers; one more PS would add {o['knee']:.0%} or less")
            source = "cluster fit"
        else:
            per_ps = speed / p0
            p = max(p0 + 1, math.ceil(linear / per_ps - 1e-9))
            p = min(p, o["max_ps"])
            predicted = {"steps_per_second": round(min(linear, p * per_ps), 4)}
            how = (f"{p} PS carry {min(linear, p * per_ps):.3g} steps/s: {p} x {per_ps:.3g} steps/s per saturated PS "
                   f"(measured) >= {w} workers x {s1:.3g} steps/s (linear scaling); assumes the load splits evenly "
                   "over the PS (no cluster fit: run analyze fit cluster for a fitted answer)")
            source = "PS capacity measured on this job"
        measured_ps = str(rec.assumptions.get("measured_ps_counts") or "").split(",")
        assumptions = {**rec.assumptions, "ps_bound": True, "current_workers": w, "current_ps": p0,
                       "ps_count_from": source, "extrapolated": str(p) not in measured_ps}
        if assumptions["extrapolated"]:
            assumptions["extrapolated_because"] = f"{p} PS never measured for this model and accelerator"
        return Recommendation(
            self.name, action={"workers": w, "ps": p}, predicted=predicted, interval=interval, cost=rec.cost,
            fit_ids=rec.fit_ids, assumptions=assumptions,
            why=(f"PS-bound now ({ev['summary']}): keep {w} workers, {p} PS remove the bottleneck: {how}. "
                 f"Knees for sizing anew: {rec.why}"),
        )

    def _latest(self, con: duckdb.DuckDBPyConnection, kind: str) -> dict[str, Any] | None:
        from ..detectors import evidence

        return evidence.latest_fit(con, kind)

    def _answer(
        self,
        subject: dict[str, Any],
        meas: dict[int, dict[int, float]],
        pred: dict[int, dict[int, tuple[float, float, float]]],
        fit_ids: list[str],
        errors: dict[str, Any],
        fitted: tuple[dict[str, Any] | None, float, str] = (None, 0.0, ""),
    ) -> Recommendation:
        """``fitted``: (the cluster fit, the model's parameters, the accelerator), to say
        when the answer lies outside what the fit was fitted on."""
        o = self.options
        th = o["knee"]
        knees = _knees(meas, pred, th)
        ps_counts = sorted(knees)
        best_p = ps_counts[0]
        for p in ps_counts[1:]:  # another PS pays when its knee is faster by more than the threshold
            if knees[p]["speed"] > (1 + th) * knees[best_p]["speed"]:
                best_p = p
        k = knees[best_p]
        w, p = k["workers"], best_p
        predicted: dict[str, Any] = {"steps_per_second": round(k["speed"], 4)}
        interval = {"steps_per_second": tuple(round(x, 4) for x in k["interval"])} if "interval" in k else {}
        evidence: dict[str, Any] = {}
        shown = interval  # the interval as it will be reported: widened past the fit, none past the limit
        beyond = ""
        if fitted[0] is not None and w in pred.get(p, {}) and w not in meas.get(p, {}):
            ex, shown = _extrapolation(fitted, w, p, predicted, interval)
            beyond = ex.get("extrapolated_because", "") if ex.get("extrapolated") else ""
        if (stay := _with_evidence(meas, knees, k, w, p, shown, th, beyond)) is not None:
            w, p, k, evidence = stay
            predicted, interval = {"steps_per_second": round(k["speed"], 4)}, {}
        price = w * o["worker_price"] + p * o["ps_price"]
        cost: dict[str, Any] = {}
        why_deadline = ""
        if o["steps"] > 0:
            hours = o["steps"] / k["speed"] / 3600
            predicted["hours"] = round(hours, 4)
            if price:
                cost["dollars"] = round(hours * price, 2)
            if o["deadline"] > 0:
                pick = self._cheapest(meas, pred)
                if pick is None:
                    why_deadline = f"; no count up to {o['max_workers']} workers x {o['max_ps']} PS finishes {o['steps']:.0f} steps in {o['deadline'] / 3600:.2g} h"
                else:
                    w, p, speed, frm = pick
                    hours = o["steps"] / speed / 3600
                    predicted = {"steps_per_second": round(speed, 4), "hours": round(hours, 4)}
                    interval = ({"steps_per_second": tuple(round(x, 4) for x in pred[p][w][1:])}
                                if frm == "cluster fit" else {})
                    price = w * o["worker_price"] + p * o["ps_price"]
                    cost = {"dollars": round(hours * price, 2)} if price else {}
                    why_deadline = f"; the cheapest counts that finish {o['steps']:.0f} steps in {o['deadline'] / 3600:.2g} h ({frm})"
        if "hours" in predicted and "steps_per_second" in interval:
            lo_v, hi_v = interval["steps_per_second"]
            if lo_v > 0:  # the speed's interval carried to the time (and the cost)
                interval["hours"] = (round(o["steps"] / hi_v / 3600, 4), round(o["steps"] / lo_v / 3600, 4))
        if "hours" in predicted and price:
            predicted["dollars"] = round(predicted["hours"] * price, 2)
            if "hours" in interval:
                interval["dollars"] = (round(interval["hours"][0] * price, 2), round(interval["hours"][1] * price, 2))
        if price:
            cost["dollars_per_hour"] = round(price, 4)
            if self.as_of:
                cost["prices_as_of"] = self.as_of
        extrapolation: dict[str, Any] = {}
        if fitted[0] is not None and w in pred.get(p, {}) and (w not in meas.get(p, {})):
            extrapolation, interval = _extrapolation(fitted, w, p, predicted, interval)
        knee_txt = _knee_text(knees, k, bool(pred))
        second = ""
        if 1 in knees and 2 in knees:
            pays = best_p >= 2
            second = f"; a second PS {'pays' if pays else 'does not pay'} ({knees[2]['speed']:.3g} vs {knees[1]['speed']:.3g} steps/s at the knees)"
        return Recommendation(
            self.name,
            action={"workers": w, "ps": p},
            predicted=predicted,
            interval=interval,
            cost=cost,
            fit_ids=tuple(fit_ids),
            assumptions={
                **subject,
                **errors,
                "knee_threshold": th,
                "knee_from": k["from"],
                "knee_settled": k["settled"],
                "next_worker_adds": None if k.get("next") is None else round(k["next"], 4),
                "measured_ps_counts": ",".join(str(q) for q in sorted(meas)) or None,
                "worker_type": o["worker_type"] or None,
                "ps_type": o["ps_type"] or None,
                "worker_price_per_hour": o["worker_price"] or None,
                "ps_price_per_hour": o["ps_price"] or None,
                **extrapolation,
                **evidence,
            },
            why=(f"the best measured configuration, {w} workers x {p} PS; to settle the rest, "
                 f"{evidence['experiment']}. " if evidence and not why_deadline else "") + knee_txt + second + why_deadline,
        )

    def _cheapest(
        self, meas: dict[int, dict[int, float]], pred: dict[int, dict[int, tuple[float, float, float]]]
    ) -> tuple[int, int, float, str] | None:
        """The (workers, ps, speed, source) finishing the steps by the deadline at the least
        cost (without prices: the fewest VMs); measured speeds stand before predicted ones."""
        o = self.options
        cands: dict[tuple[int, int], tuple[float, str]] = {}
        for p, ws in pred.items():
            for w, v in ws.items():
                cands[(w, p)] = (v[0], "cluster fit")
        for p, speeds in meas.items():
            for w, s in speeds.items():
                cands[(w, p)] = (s, "measured")
        ok = [
            (w, p, s, frm)
            for (w, p), (s, frm) in cands.items()
            if w <= o["max_workers"] and p <= o["max_ps"] and o["steps"] / s <= o["deadline"]
        ]
        if not ok:
            return None

        def cost(c: tuple[int, int, float, str]) -> tuple[float, int]:
            w, p, s, _ = c
            price = w * o["worker_price"] + p * o["ps_price"]
            return (o["steps"] / s * price if price else w + p, w + p)

        return min(ok, key=cost)
