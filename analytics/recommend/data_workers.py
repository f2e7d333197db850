"""data_workers (``analyze recommend data-workers``): how many input (data) workers a job
needs, by the tf.data service auto-scaler's rule, and Cachew's knee when the job has run at
several worker counts. For a job (``--job``) one answer: the knee once it has settled, else
the tf.data rule; the answer names the rule it used and what the other said."""

from __future__ import annotations

import math
import statistics
from typing import Any

import duckdb

from cmdare.wire.plugin import Option

from ..db import AnalyticsError
from ..units import RECOMMENDERS, Recommendation, Recommender, Scope

GROWTH_FACTOR, GROWTH_STEP = 4, 500  # tf.data service: never past min(4 x current, current + 500)


def replace_outliers(xs: list[float]) -> tuple[list[float], int]:
    """tf.data service: values outside mean +/- 1 standard deviation (population) replaced by
    the median; and how many were."""
    if len(xs) < 3:
        return list(xs), 0
    mean, sd, med = statistics.fmean(xs), statistics.pstdev(xs), statistics.median(xs)
    out = [x if mean - sd <= x <= mean + sd else med for x in xs]
    return out, sum(1 for a, b in zip(xs, out, strict=True) if a != b)


def tfdata_workers(consumer_s: list[float], worker_s: list[float], current: int = 0) -> dict[str, Any]:
    """The tf.data service auto-scaler: N = max(1, ceil(sum of consumption rates / mean
    worker throughput)), from consumers' target times and workers' processing times per
    element (seconds), outliers replaced first; the growth from ``current`` bounded."""
    c, c_out = replace_outliers(consumer_s)
    w, w_out = replace_outliers(worker_s)
    consumption = sum(1.0 / x for x in c)
    throughput = statistics.fmean(1.0 / x for x in w)
    wanted = max(1, math.ceil(consumption / throughput - 1e-9))
    n, bounded = wanted, False
    if current > 0:
        cap = min(GROWTH_FACTOR * current, current + GROWTH_STEP)
        if wanted > cap:
            n, bounded = cap, True
    return {
        "workers": n,
        "wanted": wanted,
        "bounded": bounded,
        "consumption_per_second": consumption,
        "worker_throughput_per_second": throughput,
        "throughputs": [1.0 / x for x in w],
        "consumer_outliers": c_out,
        "worker_outliers": w_out,
    }


def cachew_knee(batch_s: dict[int, float], threshold: float) -> tuple[int, bool, list[tuple[int, float]]]:
    """Cachew's scale-up: from the smallest worker count, add one while one more improves
    the batch time by more than ``threshold`` (r = 1 - now / before); settle on the last
    count that did.  Returns (count, settled, [(count, r)]); not settled: the series ended
    while still improving (try the next count)."""
    counts = sorted(batch_s)
    rs = []
    for prev, cur in zip(counts, counts[1:], strict=False):
        if cur != prev + 1:
            raise AnalyticsError(f"--batch-ms: worker counts must be consecutive (Cachew adds one at a time), {prev} then {cur}")
        r = 1.0 - batch_s[cur] / batch_s[prev]
        rs.append((cur, r))
        if r <= threshold:
            return prev, True, rs
    return counts[-1], False, rs


def _floats(key: str, xs: list[str]) -> list[float]:
    out = []
    for x in xs:
        try:
            v = float(x)
        except ValueError:
            raise AnalyticsError(f"{key}: expected numbers of milliseconds, got {x!r}") from None
        if not v > 0 or not math.isfinite(v):
            raise AnalyticsError(f"{key}: times must be positive milliseconds, got {x!r}")
        out.append(v / 1000.0)
    return out


def _series(xs: list[str]) -> dict[int, float]:
    out: dict[int, float] = {}
    for x in xs:
        k, sep, v = x.partition(":")
        try:
            n, ms = int(k), float(v)
        except ValueError:
            raise AnalyticsError(f"--batch-ms: expected WORKERS:MS pairs like 1:120,2:70, got {x!r}") from None
        if not sep or n < 0 or not ms > 0 or not math.isfinite(ms):
            raise AnalyticsError(f"--batch-ms: expected WORKERS:MS with a positive time, got {x!r}")
        if n in out:
            raise AnalyticsError(f"--batch-ms: {n} workers given twice")
        out[n] = ms / 1000.0
    return out


def one_answer(tf: Recommendation, knee: Recommendation) -> Recommendation:
    """One answer for a job measured both ways. Cachew's knee, once settled, stands: it is
    what more workers were measured to give. The tf.data rule divides rates and assumes
    each worker adds its throughput; it stands while the knee has not settled (the series
    still improving). The answer names the rule it used and what the other said, and why."""
    settled = bool(knee.assumptions.get("settled"))
    chosen, other = (knee, tf) if settled else (tf, knee)
    n, m = chosen.action["workers"], other.action["workers"]
    if settled:
        because = ("measured batch times stop improving past there (Cachew's knee); the tf.data rule divides "
                   "rates as if each worker added its throughput")
    else:
        because = (f"Cachew's knee has not settled: batch times still improve at the largest count measured "
                   f"(measure {m} to settle it); the tf.data rule sizes from the rates meanwhile")
    differ = "agrees" if n == m else f"would say {m}"
    rates = {k: tf.predicted[k] for k in ("consumption_per_second", "worker_throughput_per_second")}  # measured
    return Recommendation(
        chosen.kind, action=chosen.action, predicted={**chosen.predicted, **rates}, interval=chosen.interval,
        cost=chosen.cost,
        fit_ids=chosen.fit_ids,
        assumptions={**chosen.assumptions, "rule_chosen_because": because, "other_rule": other.assumptions["rule"],
                     "other_rule_workers": m},
        why=f"{chosen.assumptions['rule']}: {chosen.why}; {other.assumptions['rule']} {differ} ({because})",
    )


@RECOMMENDERS.register
class DataWorkers(Recommender):
    """How many input (data) workers: the tf.data service auto-scaler's rule on consumers'
    target times and workers' processing times (values outside mean +/- 1 standard
    deviation replaced by the median; N = max(1, ceil(sum of consumption rates / mean
    worker throughput)); growth bounded to min(4 x current, current + 500)), or Cachew's
    knee on the batch times a job saw at consecutive worker counts (add one while it
    improves batch time by more than 7 %).

    \b
    Examples:
      analyze recommend data-workers --consumer-ms 10,10 --worker-ms 40,40,40,400
      analyze recommend data-workers --batch-ms 1:120,2:70,3:62,4:60 --json
      analyze recommend data-workers --job resnet50-a --worker-price 0.19

    With --job, from the job's telemetry: consumers' target time per batch is the training
    ranks' step compute time (step time minus input wait), workers' processing time per
    batch comes from its input workers (track.init(role="data"), run.produced(...)), per
    element where both report examples; and Cachew's knee when the job ran at several
    input-worker counts.
    """

    name = "data_workers"
    DATABASE = "job"
    OPTIONS = {
        "consumer_ms": Option("list", [], "consumers' target time per element, ms (one per consumer)"),
        "worker_ms": Option("list", [], "data workers' processing time per element, ms (one per worker)"),
        "current": Option("int", 0, "data workers running now: growth is bounded to min(4 x current, current + 500); 0: unbounded"),
        "batch_ms": Option("list", [], "batch time the job saw at each worker count, WORKERS:MS (Cachew's knee)"),
        "knee": Option("float", 0.07, "Cachew: stop when one more worker improves batch time by this share or less", lo=0, hi=1),
        "worker_price": Option("float", 0.0, "price of one data worker, $/hour (0: cost not given)", lo=0),
        "job": Option("str", "", "a job in the database: the figures from its telemetry (training ranks and role-data workers)"),
        "window": Option("duration", 600.0, "with job: the telemetry window the rule reads, ending at the job's last report"),
    }

    def run(self, con: duckdb.DuckDBPyConnection | None, scope: Scope) -> list[Recommendation]:
        o = self.options
        out = []
        if o["job"]:
            if o["consumer_ms"] or o["worker_ms"] or o["batch_ms"]:
                raise AnalyticsError("data-workers: give --job (figures from telemetry) or figures, not both")
            if con is None:
                raise AnalyticsError("data-workers --job needs the database")
            return self._from_job(con, o["job"])
        if (o["consumer_ms"] or o["worker_ms"]) and o["batch_ms"]:
            raise AnalyticsError("data-workers: give --consumer-ms and --worker-ms (the tf.data rule) or --batch-ms (Cachew's knee), not both")
        if o["consumer_ms"] or o["worker_ms"]:
            if not o["consumer_ms"] or not o["worker_ms"]:
                raise AnalyticsError("data-workers: give both --consumer-ms and --worker-ms (one time per consumer / worker)")
            out.append(self._tfdata(_floats("--consumer-ms", o["consumer_ms"]), _floats("--worker-ms", o["worker_ms"])))
        if o["batch_ms"]:
            out.append(self._cachew(_series(o["batch_ms"])))
        if not out:
            raise AnalyticsError(
                "data-workers needs figures: --consumer-ms and --worker-ms (the tf.data rule), or --batch-ms (Cachew's knee)"
            )
        return out

    def _from_job(self, con: duckdb.DuckDBPyConnection, job: str) -> list[Recommendation]:
        from .. import inputs

        tel = inputs.read(con, job, self.options["window"])
        per_element = all(x > 0 for x in tel.consumer_examples + tel.worker_elements)
        if per_element:
            consumer = [t / e for t, e in zip(tel.consumer_s, tel.consumer_examples, strict=True)]
            worker = [t / e for t, e in zip(tel.worker_s, tel.worker_elements, strict=True)]
        else:  # batches on both sides: the same batch a worker makes is the one a rank eats
            consumer, worker = tel.consumer_s, tel.worker_s
        rec = self._tfdata(consumer, worker, current=tel.current, source=f"telemetry of {job}",
                           unit="elements" if per_element else "batches", window=tel.window_seconds)
        out = [rec]
        totals: dict[int, list[float]] = {}
        for (rem, loc), b in tel.configs.items():
            if loc == 0:  # Cachew scales remote workers; configurations with local ones are placement's
                totals.setdefault(rem, []).append(b)
        series = {k: statistics.median(v) for k, v in totals.items()}
        run = sorted(series)
        # the longest stretch of consecutive counts from the smallest (Cachew adds one at a time)
        keep = [run[0]] if run else []
        for k in run[1:]:
            if k != keep[-1] + 1:
                break
            keep.append(k)
        if len(keep) < 2:
            rec.assumptions["other_rule"] = "Cachew knee: not measured (needs batch times at two consecutive remote counts)"
            return out
        knee = self._cachew({k: series[k] for k in keep}, source=f"telemetry of {job}")
        return [one_answer(rec, knee)]

    def _cost(self, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
        p = self.options["worker_price"]
        if p <= 0:
            return {}, {"worker_price": None}
        return {"dollars_per_hour": round(n * p, 4)}, {"worker_price_per_hour": p}

    def _tfdata(self, consumer_s: list[float], worker_s: list[float], current: int | None = None,
                source: str = "figures", unit: str = "elements", window: float | None = None) -> Recommendation:
        current = self.options["current"] if current is None else current
        r = tfdata_workers(consumer_s, worker_s, current)
        n, thr = r["workers"], r["worker_throughput_per_second"]
        cost, price = self._cost(n)
        lo, hi = min(r["throughputs"]), max(r["throughputs"])
        why = (
            f"N = max(1, ceil({r['consumption_per_second']:.4g} {unit}/s consumed / {thr:.4g} per worker)) = {r['wanted']}"
            + (f", bounded by min(4 x {current}, {current} + 500)" if r["bounded"] else "")
            + (f"; from the last {window:g} s of telemetry, {current} input worker(s) running" if window else "")
            + (f"; outliers replaced by the median: {r['consumer_outliers']} consumer(s), {r['worker_outliers']} worker(s)"
               if r["consumer_outliers"] or r["worker_outliers"] else "")
        )
        # the spread of the workers' throughputs; workers measured alike give none (no zero-width interval)
        interval = {"capacity_per_second": (round(n * lo, 4), round(n * hi, 4))} if hi - lo > 1e-3 * hi else {}
        return Recommendation(
            self.name,
            action={"workers": n},
            predicted={
                "capacity_per_second": round(n * thr, 4),
                "consumption_per_second": round(r["consumption_per_second"], 4),
                "worker_throughput_per_second": round(thr, 4),
            },
            interval=interval,
            cost=cost,
            assumptions={
                "rule": "tf.data service auto-scaler",
                "consumers": len(consumer_s),
                "workers_measured": len(worker_s),
                "consumer_outliers_replaced": r["consumer_outliers"],
                "worker_outliers_replaced": r["worker_outliers"],
                "current_workers": current or None,
                "growth_bounded": r["bounded"],
                "wanted_workers": r["wanted"],
                "rate_unit": unit,
                "source": source,
                **price,
            },
            why=why,
        )

    def _cachew(self, series: dict[int, float], source: str = "figures") -> Recommendation:
        if len(series) < 2:
            raise AnalyticsError("--batch-ms: Cachew's knee needs batch times at two worker counts or more")
        n, settled, rs = cachew_knee(series, self.options["knee"])
        cost, price = self._cost(n if settled else n + 1)
        steps = ", ".join(f"{k}: {r:+.1%}" for k, r in rs)
        if settled:
            why = f"one more worker past {n} improves batch time by {self.options['knee']:.0%} or less (r per count: {steps})"
            action = {"workers": n}
        else:
            why = f"still improving at {n} workers (r per count: {steps}): try {n + 1} and measure again"
            action = {"workers": n + 1}
        return Recommendation(
            self.name,
            action=action,
            predicted={"batch_seconds": round(series[n], 6)},
            cost=cost,
            assumptions={"rule": "Cachew knee", "threshold": self.options["knee"], "settled": settled,
                         "measured_counts": len(series), "source": source, **price},
            why=why,
        )
