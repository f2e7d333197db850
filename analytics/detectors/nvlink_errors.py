"""nvlink_errors: NVLink replay, recovery and CRC errors counted on a GPU in scope."""

from __future__ import annotations

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..units import DETECTORS, Detector, Finding, Scope
from . import evidence


@DETECTORS.register
class NvlinkErrors(Detector):
    name = "nvlink_errors"
    ORDER = 100  # where analyze bottlenecks runs and lists it
    FINDS = "NVLink errors"
    ACTION = 'drain the node and have its NVLink checked (nvidia-smi nvlink -e); until then keep multi-GPU jobs off it'  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        "min_errors": Option("int", 10, "NVLink errors on one GPU in scope that make a finding", lo=1),
        "critical_errors": Option("int", 1000, "errors that make it critical (a link degrading: collectives slow down)", lo=1),
    }
    REQUIRES = (Requirement("table", "gpu_samples"),)

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        if not evidence.has_view(con, "gpu_5m") or not evidence.has_column(con, "gpu_5m", "nvl_err_max"):
            return []
        where, params = Scope(None, scope.since, scope.until).where(ts="last_ts")
        rows = con.execute(
            f"""SELECT node, "index", any_value(uuid), max(nvl_err_max) - min(nvl_err_min) AS errors,
                       min(bucket) FILTER (nvl_err_max > nvl_err_min), max(last_ts), any_value(job)
                FROM gpu_5m WHERE {where} AND nvl_err_max IS NOT NULL
                GROUP BY node, "index" HAVING errors >= {int(o['min_errors'])} ORDER BY node, "index" """,
            params,
        ).fetchall()
        if not rows:
            return []
        jobs: dict[str, set[str]] = {}
        if evidence.has_rows(con, "steps"):
            s = evidence.spans(con, Scope(None, scope.since, scope.until, scope.cache))
            for job, node in con.execute(f"SELECT DISTINCT job, node FROM {s}").fetchall():
                jobs.setdefault(node, set()).add(job)
        out = []
        for node, index, uuid, errors, t0, t1, env_job in rows:
            on = sorted(jobs.get(node, set())) or ([env_job] if env_job else [])
            job = on[0] if len(on) == 1 else None
            if scope.job is not None and scope.job not in on:
                continue
            hit = f", under job{'s' if len(on) > 1 else ''} {', '.join(on)}" if on else ""
            out.append(Finding(
                self.name, job,
                f"GPU {index} on {node}: {errors} NVLink errors (replay, recovery, CRC){hit}: a degrading link "
                "slows every collective of the jobs across it; check `nvidia-smi nvlink -e` and reseat or replace",
                severity="critical" if errors >= o["critical_errors"] else "warning", confidence=1.0,
                node=node, subject=f"{index}:{uuid}" if uuid else str(index),
                evidence={"nvlink_errors": int(errors)}, window_start=t0, window_end=t1,
            ))
        return out
