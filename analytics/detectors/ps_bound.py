"""ps_bound: parameter-server jobs whose added workers no longer add speed."""

from __future__ import annotations

import json
from typing import Any

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..models.steady import JobSpeed, job_speeds
from ..units import DETECTORS, Detector, Finding, Scope
from . import evidence


def _nic_rates(con: duckdb.DuckDBPyConnection, scope: Scope, nodes: list[str]) -> dict[str, tuple[float, float | None]]:
    """PS node -> (mean CPU utilisation, peak NIC bytes/s (rx + tx) between two samples)."""
    if not nodes:
        return {}
    where, params = Scope(None, scope.since, scope.until).where()
    rows = con.execute(
        f"""SELECT node, ts, cpu_util_ratio, net FROM host_samples
            WHERE node IN (SELECT unnest(?)) AND {where} ORDER BY node, ts""",
        [nodes, *params],
    ).fetchall()
    out: dict[str, tuple[float, float | None]] = {}
    cpu: dict[str, list[float]] = {}
    peak: dict[str, float] = {}
    prev: dict[str, tuple[Any, int]] = {}
    for node, ts, c, net in rows:
        if c is not None:
            cpu.setdefault(node, []).append(c)
        try:
            total = sum(int(n.get("rx_bytes_total", 0)) + int(n.get("tx_bytes_total", 0)) for n in json.loads(net or "[]"))
        except (TypeError, ValueError, AttributeError):
            continue
        if node in prev:
            t0, b0 = prev[node]
            dt_s = (ts - t0).total_seconds()
            if dt_s > 0 and total >= b0:
                peak[node] = max(peak.get(node, 0.0), (total - b0) / dt_s)
        prev[node] = (ts, total)
    for node, cs in cpu.items():
        out[node] = (sum(cs) / len(cs), peak.get(node))
    return out


@DETECTORS.register
class PsBound(Detector):
    name = "ps_bound"
    ORDER = 10  # where analyze bottlenecks runs and lists it
    FINDS = "PS-bound jobs"
    ACTION = "add parameter servers or spread the model's tensors over them (analyze recommend cluster)"  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        "min_efficiency": Option(
            "float", 0.8, "scaling efficiency (speed / (workers x single-worker speed)) below which a job is suspect", lo=0, hi=1
        ),
        "max_marginal_gain": Option(
            "float", 0.5, "the last workers' gain, as a share of a single worker's speed each, below which they add too little", lo=-10, hi=1
        ),
        "near_limit": Option("float", 0.85, "share of the cluster fit's PS limit at which a job is near it", lo=0, hi=1),
        "ps_busy_cpu": Option("float", 0.9, "PS host CPU utilisation that counts as saturated", lo=0, hi=1),
        "nic_gbps": Option("float", 0.0, "PS NIC capacity in Gbit/s (0: unknown; throughput is then shown, not judged)", lo=0),
        "nic_busy": Option("float", 0.8, "share of nic_gbps that counts as saturated", lo=0, hi=1),
    }
    REQUIRES = (Requirement("table", "jobs", "ps_bound reads parameter-server job declarations"), Requirement("table", "steps"))

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        decl = evidence.declarations(con, scope)
        s = evidence.spans(con, scope)
        stepping = {j for (j,) in con.execute(f"SELECT DISTINCT job FROM {s}").fetchall()}  # in the window
        targets = [d.job for d in decl.values() if d.ps > 0 and d.workers >= 2 and d.job in stepping]
        if not targets:
            return []
        # the targets and every job of the same model and accelerator (references measured
        # in other jobs count, whatever the scope): only those jobs' steady states are computed
        pairs = {(decl[j].model, decl[j].accelerator) for j in targets}
        refs = [
            j
            for j, m, a in con.execute(
                "SELECT job, arg_max(model, ts), arg_max(accelerator, ts) FROM jobs GROUP BY job"
            ).fetchall()
            if (m, a) in pairs
        ]
        speeds, _ = job_speeds(con, jobs=sorted(set(refs) | set(targets)))
        by_job = {j.job: j for j in speeds}
        speed_fit = evidence.latest_fit(con, "speed")
        cluster_fit = evidence.latest_fit(con, "cluster")
        ps_nodes = {
            job: [n for (n,) in con.execute("SELECT node FROM nodes WHERE role = 'ps' AND job = ?", [job]).fetchall()]
            for job in targets
        }
        hw = _nic_rates(con, scope, sorted({n for ns in ps_nodes.values() for n in ns}))
        out = []
        for job in targets:
            j = by_job.get(job)
            if j is None or j.acc is None:
                continue
            f = self._judge(j, speeds, speed_fit, cluster_fit, [hw[n] for n in ps_nodes[job] if n in hw], ps_nodes[job])
            if f is not None:
                out.append(f)
        return out

    @staticmethod
    def _single_worker(j: JobSpeed, same: list[JobSpeed], speed_fit: dict[str, Any] | None,
                       fits: list[str]) -> tuple[float | None, str | None]:
        """One worker's speed for ``j``'s model and accelerator: the median of measured
        single-worker runs, else the speed fit's (its id added to ``fits``), else None."""
        singles = sorted(k.speed for k in same if k.workers == 1)
        if singles:
            return singles[len(singles) // 2], "measured"
        if speed_fit is not None and j.acc is not None:
            try:
                from ..models.speed import predict_speed

                s1 = predict_speed(speed_fit, j.acc, j.flops_per_step, j.params, j.tensors)[0]
            except Exception:  # noqa: BLE001 - a fit of another family layout: go without
                return None, None
            fits.append(speed_fit["fit_id"])
            return s1, "speed fit"
        return None, None

    def _judge(
        self,
        j: JobSpeed,
        speeds: list[JobSpeed],
        speed_fit: dict[str, Any] | None,
        cluster_fit: dict[str, Any] | None,
        ps_hw: list[tuple[float, float | None]],
        ps_nodes: list[str],
    ) -> Finding | None:
        o = self.options
        same = [k for k in speeds if k.model == j.model and k.accelerator == j.accelerator and k.job != j.job]
        ev: dict[str, Any] = {"workers": j.workers, "ps": j.ps, "steps_per_second": round(j.speed, 4)}
        fits: list[str] = []
        used: list[str] = []
        s1, s1_from = self._single_worker(j, same, speed_fit, fits)
        if s1 is None:
            return None  # no reference: nothing to say how well it scales
        eff = j.speed / (j.workers * s1)
        ev.update(single_worker_steps_per_second=round(s1, 4), single_worker_from=s1_from, efficiency=round(eff, 3))
        if eff >= o["min_efficiency"]:
            return None
        votes, available = 0, 0
        # marginal gain: from the smaller worker count (same model, accelerator and PS count,
        # or single workers whatever their PS) whose runs were fastest (their median): what
        # fewer workers already reached. Not simply the next smaller count: one slow run
        # there (a noisy neighbour) would make the last workers look as if they paid.
        lower = [k for k in same if k.workers < j.workers and (k.ps == j.ps or k.workers == 1)]
        if lower:
            import statistics

            med = {w: statistics.median(k.speed for k in lower if k.workers == w) for w in {k.workers for k in lower}}
            w0 = max(med, key=lambda w: (med[w], w))
            v0 = med[w0]
            gain = (j.speed - v0) / ((j.workers - w0) * s1)
            ev.update(marginal_from_workers=w0, marginal_gain=round(gain, 3))
            available += 1
            used.append(f"marginal gain {gain:.2f} per worker from {w0} to {j.workers} workers")
            votes += gain < o["max_marginal_gain"]
        if cluster_fit is not None:
            from ..models.cluster import ps_limit

            try:
                lim = ps_limit(cluster_fit, j.ps, j.params)
            except Exception:  # noqa: BLE001 - a fit of another family layout: go without
                lim = None
            if lim:
                share = j.speed / lim
                ev.update(ps_limit_steps_per_second=round(lim, 4), share_of_ps_limit=round(share, 3))
                fits.append(cluster_fit["fit_id"])
                available += 1
                used.append(f"{share:.0%} of the cluster fit's PS limit")
                votes += share >= o["near_limit"]
        if ps_hw:
            cpu = max(c for c, _ in ps_hw)
            ev["ps_cpu_util_ratio"] = round(cpu, 3)
            available += 1
            busy = cpu >= o["ps_busy_cpu"]
            peak = max((n for _, n in ps_hw if n is not None), default=None)
            if peak is not None:
                ev["ps_nic_bytes_per_second"] = round(peak)
                if o["nic_gbps"] > 0:
                    share = peak * 8 / (o["nic_gbps"] * 1e9)
                    ev["ps_nic_share"] = round(share, 3)
                    busy = busy or share >= o["nic_busy"]
            used.append(f"PS host CPU {cpu:.0%}" + (" (saturated)" if busy else ""))
            votes += busy
        if available and not votes:
            return None  # the low efficiency has another cause: nothing points at the PS
        ev["evidence_available"] = available
        ev["evidence_agreeing"] = votes
        conf = 0.5 if not available else min(0.95, 0.55 + 0.4 * votes / available)
        critical = eff < 0.5 or ("marginal_gain" in ev and ev["marginal_gain"] <= 0)
        severity = "critical" if critical else "warning" if available else "info"
        how = "; ".join(used) if used else "no other evidence (no runs at other worker counts, no cluster fit, no PS agent)"
        acc = j.acc.name if j.acc else j.accelerator
        return Finding(
            self.name,
            j.job,
            f"{j.workers} workers x {j.ps} PS on {acc} run at {eff:.0%} of linear scaling "
            f"({j.speed:.3g} vs {j.workers * s1:.3g} steps/s); {how}",
            severity=severity,
            confidence=conf,
            subject=",".join(ps_nodes) or None,
            evidence=ev,
            suggests=("cluster",),
            window_start=j.t0,
            window_end=j.t1,
            fit_ids=tuple(fits),
        )
