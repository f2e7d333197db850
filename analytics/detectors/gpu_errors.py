"""gpu_errors: Xid and ECC error bursts and row remappings pending or failed per GPU, with the
job they hit."""

from __future__ import annotations

import duckdb

from cmdare.wire.plugin import Option, Requirement

from ..units import DETECTORS, Detector, Finding, Scope
from . import evidence


@DETECTORS.register
class GpuErrors(Detector):
    name = "gpu_errors"
    ORDER = 60  # where analyze bottlenecks runs and lists it
    FINDS = "failing GPUs"
    ACTION = 'drain the node and have the GPU reset or replaced before it takes the job down (nvidia-smi -q shows its retired pages and Xid history)'  # what to do, where no recommender answers it ({evidence} filled in)
    OPTIONS = {
        "critical_xids": Option(
            "list",
            ["48", "61", "62", "63", "64", "74", "79", "92", "94", "95", "119", "120"],
            "Xid codes that make a finding critical (double-bit ECC, row remapping, NVLink, fallen off the bus, GSP)",
        ),
        "ignore_xids": Option("list", ["43"], "Xid codes left out (43: a user application's fault, not the GPU)"),
        "min_corrected": Option("int", 100, "corrected ECC errors on a GPU in scope that make a finding", lo=1),
        "burst_gap": Option("duration", 600.0, "errors closer than this belong to one burst"),
    }
    REQUIRES = (Requirement("table", "gpu_events"),)

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        o = self.options
        where, params = Scope(None, scope.since, scope.until).where(ts="e.ts")
        ignore = [int(x) for x in o["ignore_xids"] if x.strip().isdigit()]
        critical = {int(x) for x in o["critical_xids"] if x.strip().isdigit()}
        join, held_sql = "", "nullif(e.job, '')"
        if evidence.has_rows(con, "steps"):
            s = evidence.spans(con, Scope(None, scope.since, scope.until, scope.cache))
            join = f"LEFT JOIN {s} s ON s.node = e.node AND e.ts BETWEEN s.t0 AND s.t1"
            held_sql = "coalesce(s.job, nullif(e.job, ''))"
        rows = con.execute(
            f"""WITH ev AS (
                    SELECT e.ts, e.node, e."index", any_value(e.uuid) AS uuid, any_value({held_sql}) AS job,
                           any_value(e.kind) AS kind, any_value(e.count) AS count, any_value(e.xid) AS xid
                    FROM gpu_events e {join}
                    WHERE {where} AND NOT (e.kind = 'xid' AND coalesce(e.xid, -1) IN (SELECT unnest(?)))
                    GROUP BY e.id, e.ts, e.node, e."index"),
                b AS (
                    SELECT *, CASE WHEN lag(ts) OVER p IS NULL OR ts - lag(ts) OVER p > INTERVAL {float(o['burst_gap'])} SECOND
                                   THEN 1 ELSE 0 END AS new_burst
                    FROM ev WINDOW p AS (PARTITION BY node, "index" ORDER BY ts))
                SELECT node, "index", any_value(uuid), coalesce(job, ''),
                       sum(count) FILTER (kind = 'xid'), list(DISTINCT xid) FILTER (kind = 'xid'),
                       coalesce(sum(count) FILTER (kind = 'ecc_corrected'), 0),
                       coalesce(sum(count) FILTER (kind = 'ecc_uncorrected'), 0),
                       count(*) FILTER (kind = 'lost'), sum(new_burst), min(ts), max(ts),
                       count(*) FILTER (kind = 'row_remap_pending'), count(*) FILTER (kind = 'row_remap_failed'),
                       count(*) FILTER (kind = 'retired_pages_pending')
                FROM b GROUP BY node, "index", coalesce(job, '') ORDER BY node, "index" """,
            [*params, ignore],
        ).fetchall()
        out = []
        for node, index, uuid, held, xids, codes, corr, unc, lost, bursts, t0, t1, pending, failed, pages in rows:
            job = held or None
            if scope.job is not None and job != scope.job:
                continue
            xids = int(xids or 0)
            codes = sorted(c for c in (codes or []) if c is not None)
            if not (xids or unc or lost or pending or failed or pages or corr >= o["min_corrected"]):
                continue
            crit = bool(unc or lost or failed or critical.intersection(codes))
            parts = []
            if xids:
                parts.append(f"{xids} Xid {','.join(map(str, codes))}")
            if unc:
                parts.append(f"{unc} uncorrected ECC")
            if corr:
                parts.append(f"{corr} corrected ECC")
            if lost:
                parts.append("fell off the bus")
            if failed:
                parts.append("a memory row remapping failed (the GPU needs service)")
            elif pending:
                parts.append("a memory row remapping pending (reset the GPU to apply it)")
            if pages:
                parts.append("a memory page retirement pending (reset the GPU to apply it)")
            hit = f", hitting job {job}" if job else " (no job stepping on it)"
            out.append(
                Finding(
                    self.name,
                    job,
                    f"GPU {index} on {node}: {', '.join(parts)} in {bursts} burst{'s' if bursts != 1 else ''}{hit}",
                    severity="critical" if crit else "warning",
                    confidence=1.0,
                    node=node,
                    subject=f"{index}:{uuid}" if uuid else str(index),
                    evidence={
                        "xid_events": xids,
                        "xid_codes": ",".join(map(str, codes)),
                        "ecc_corrected": int(corr),
                        "ecc_uncorrected": int(unc),
                        "lost": int(lost),
                        "row_remap_pending": int(pending),
                        "row_remap_failed": int(failed),
                        "retired_pages_pending": int(pages),
                        "bursts": int(bursts),
                    },
                    window_start=t0,
                    window_end=t1,
                )
            )
        return out
