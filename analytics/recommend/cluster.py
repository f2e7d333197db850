"""cluster (``analyze recommend cluster``): how many workers and parameter servers for a
job's model and accelerator: the knee (one more worker adds less than 7 %), whether a
second PS pays, and the cheapest counts that meet a deadline."""

from __future__ import annotations

import statistics
from typing import Any

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..db import AnalyticsError
from ..models.fromjob import anchor, measured
from ..models.steady import JobSpeed, job_speeds
from ..units import RECOMMENDERS, Recommendation, Recommender, Scope


def knee(series: dict[int, float], threshold: float) -> tuple[int, bool]:
    """The worker count past which one more worker adds ``threshold`` of speed or less (per
    added worker, compounded over gaps between measured counts); (count, settled): not
    settled when the series ends while still scaling."""
    counts = sorted(series)
    for a, b in zip(counts, counts[1:], strict=False):
        per_worker = (series[b] / series[a]) ** (1.0 / (b - a)) - 1.0
        if per_worker <= threshold:
            return a, True
    return counts[-1], False


@RECOMMENDERS.register
class Cluster(Recommender):
    name = "cluster"
    OPTIONS = {
        "from_job": Option("str", "", "the job whose model and accelerator to size (required)"),
        "max_workers": Option("int", 16, "most workers to consider", lo=1, hi=4096),
        "max_ps": Option("int", 4, "most parameter servers to consider", lo=1, hi=64),
        "knee": Option("float", 0.07, "one more worker must add more than this share of speed", lo=0, hi=1),
        "steps": Option("float", 0.0, "training steps to run (with deadline: the cheapest counts that finish in time)", lo=0),
        "deadline": Option("duration", 0.0, "time the steps must finish in (0: no deadline)"),
        "worker_price": Option("float", 0.0, "$/hour of one worker VM", lo=0),
        "ps_price": Option("float", 0.0, "$/hour of one parameter-server VM", lo=0),
    }
    REQUIRES = (Requirement("table", "steps", "cluster sizes a job measured in this database"),)

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Recommendation]:
        o = self.options
        if not o["from_job"]:
            raise AnalyticsError("cluster: give --from-job J (the job whose model and accelerator to size)")
        j = measured(con, o["from_job"])
        # measured: every job of the same model and accelerator, by PS count and workers
        speeds, _ = job_speeds(con)
        same = [k for k in speeds if k.model == j.model and k.accelerator == j.accelerator]
        singles = [k.speed for k in same if k.workers == 1]
        series: dict[int, dict[int, list[float]]] = {}
        for k in same:
            if 1 < k.workers <= o["max_workers"] and 0 < k.ps <= o["max_ps"]:
                series.setdefault(k.ps, {}).setdefault(k.workers, []).append(k.speed)
        measured_series = {
            p: {**({1: statistics.median(singles)} if singles else {}), **{w: statistics.median(v) for w, v in ws.items()}}
            for p, ws in series.items()
        }
        # predicted: the cluster fit from the job's single-worker time
        predicted: dict[int, dict[int, tuple[float, float, float]]] = {}
        fit_ids: list[str] = []
        cfit = self._latest(con, "cluster")
        if cfit is not None:
            try:
                a = anchor(con, j.job, cfit)
            except AnalyticsError:
                a = None
            if a is not None:
                from ..models.cluster import predict_cluster

                fit_ids.append(cfit["fit_id"])
                for p in range(1, o["max_ps"] + 1):
                    predicted[p] = {}
                    for w in range(1, o["max_workers"] + 1):
                        r = predict_cluster(cfit, [a.t1] * w, p, j.params)
                        predicted[p][w] = (r["steps_per_second"], r["lower"], r["upper"])
        if not measured_series and not predicted:
            raise AnalyticsError(
                f"cluster: {j.job} ({j.model} on {j.accelerator}) has no parameter-server runs at several worker "
                "counts in the database and there is no cluster fit (run analyze fit cluster)"
            )
        return [self._answer(j, measured_series, predicted, fit_ids)]

    def _latest(self, con: duckdb.DuckDBPyConnection, kind: str) -> dict[str, Any] | None:
        from .. import evidence

        return evidence.latest_fit(con, kind)

    def _answer(
        self,
        j: JobSpeed,
        meas: dict[int, dict[int, float]],
        pred: dict[int, dict[int, tuple[float, float, float]]],
        fit_ids: list[str],
    ) -> Recommendation:
        o = self.options
        th = o["knee"]
        # per PS count: the knee, from the measured series where it settles there, else the fit
        knees: dict[int, dict[str, Any]] = {}
        for p in sorted(set(meas) | set(pred)):
            m = meas.get(p, {})
            if len(m) >= 2:
                w, settled = knee(m, th)
                if settled or p not in pred:
                    knees[p] = {"workers": w, "speed": m[w], "settled": settled, "from": "measured"}
                    continue
            if p in pred:
                w, settled = knee({k: v[0] for k, v in pred[p].items()}, th)
                knees[p] = {"workers": w, "speed": pred[p][w][0], "settled": settled, "from": "cluster fit",
                            "interval": pred[p][w][1:]}
        ps_counts = sorted(knees)
        best_p = ps_counts[0]
        for p in ps_counts[1:]:  # another PS pays when its knee is faster by more than the threshold
            if knees[p]["speed"] > (1 + th) * knees[best_p]["speed"]:
                best_p = p
        k = knees[best_p]
        w, p = k["workers"], best_p
        predicted: dict[str, Any] = {"steps_per_second": round(k["speed"], 4)}
        interval = {"steps_per_second": tuple(round(x, 4) for x in k["interval"])} if "interval" in k else {}
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
                    interval = {}
                    price = w * o["worker_price"] + p * o["ps_price"]
                    cost = {"dollars": round(hours * price, 2)} if price else {}
                    why_deadline = f"; the cheapest counts that finish {o['steps']:.0f} steps in {o['deadline'] / 3600:.2g} h ({frm})"
        if price:
            cost["dollars_per_hour"] = round(price, 4)
        knee_txt = "; ".join(
            f"{q} PS: {'knee' if v['settled'] else 'still scaling'} at {v['workers']} workers, {v['speed']:.3g} steps/s ({v['from']})"
            for q, v in sorted(knees.items())
        )
        if not k["settled"]:
            knee_txt += f" (still scaling at the largest count {'measured' if k['from'] == 'measured' else 'considered'}: more workers may pay"
            knee_txt += "; fit a cluster model to predict past it)" if k["from"] == "measured" and not pred else ")"
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
                "from_job": j.job,
                "model": j.model,
                "accelerator": j.accelerator,
                "knee_threshold": th,
                "knee_from": k["from"],
                "knee_settled": k["settled"],
                "measured_ps_counts": ",".join(str(q) for q in sorted(meas)) or None,
                "worker_price_per_hour": o["worker_price"] or None,
                "ps_price_per_hour": o["ps_price"] or None,
            },
            why=knee_txt + second + why_deadline,
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
        for p, ws in meas.items():
            for w, v in ws.items():
                cands[(w, p)] = (v, "measured")
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
