"""What a job's nodes cost: each node's region, instance type, spot flag and accelerators
(from the agents' instance identity, else the GPUs' own name and count) and its price in
the price catalogue, per GPU-hour or per VM-hour.  Read by the goodput accounts (dollars)
and by ``recommend placement`` (a job's own hosts' prices)."""

from __future__ import annotations

import functools
from typing import Any

import duckdb

from . import catalog, prices
from .db import AnalyticsError


def job_nodes(con: duckdb.DuckDBPyConnection, jobs: list[str], held: bool = False) -> dict[str, list[tuple]]:
    """job -> its stepping nodes: (node, region, instance type, spot, accelerator, its count,
    labels); ``held``: ``jobs`` are jobs a scheduler gave GPUs to, on the nodes their GPU
    samples name."""
    out: dict[str, list[tuple]] = {}
    # the nodes each rank declared and those whose agent is labelled with the job (small
    # tables); a job with neither: the nodes it stepped on (a scan of the steps, so only for them)
    declared = {j for (j,) in con.execute(
        """SELECT DISTINCT job FROM jobs WHERE job IN (SELECT unnest($1::VARCHAR[]))
           UNION SELECT DISTINCT job FROM nodes WHERE job IN (SELECT unnest($1::VARCHAR[]))""", [jobs]).fetchall()}
    bare = [j for j in jobs if j not in declared]
    for r in con.execute(
        """WITH dj AS (SELECT job, node FROM jobs WHERE job IN (SELECT unnest($1::VARCHAR[]))
                      UNION SELECT job, node FROM nodes WHERE job IN (SELECT unnest($1::VARCHAR[]))),
           jn AS (SELECT * FROM dj UNION ALL SELECT DISTINCT job, node FROM steps
                  WHERE job IN (SELECT unnest($2::VARCHAR[]))
                  UNION ALL SELECT DISTINCT job, node FROM gpu_5m
                  WHERE $3 AND (namespace IS NOT NULL OR slurm_job IS NOT NULL)
                    AND job IN (SELECT unnest($1::VARCHAR[]))),
           n AS (SELECT DISTINCT node FROM jn),
           i AS (SELECT node, arg_max(region, ts) AS region, arg_max(instance_type, ts) AS itype,
                        arg_max(spot, ts) AS spot, arg_max(accelerator, ts) AS acc,
                        arg_max(accelerator_count, ts) AS acc_n
                 FROM instance_identity WHERE node IN (SELECT node FROM n) GROUP BY node),
           -- the GPUs' own name and count, only where the cloud's identity lacks them
           g AS (SELECT node, any_value(name) AS gname, count(DISTINCT "index") AS gn FROM gpu_5m
                 WHERE node IN (SELECT node FROM n WHERE node NOT IN
                                (SELECT node FROM i WHERE acc IS NOT NULL AND acc_n IS NOT NULL)) GROUP BY node)
           SELECT jn.job, jn.node, i.region, i.itype, i.spot, coalesce(i.acc, g.gname), coalesce(i.acc_n, g.gn),
                  coalesce(nd.labels::VARCHAR, '{}')
           FROM jn LEFT JOIN i USING (node) LEFT JOIN g USING (node) LEFT JOIN nodes nd USING (node)
           ORDER BY jn.job, jn.node""",
        [jobs, bare, held]).fetchall():
        out.setdefault(r[0], []).append(r[1:])
    return out


@functools.lru_cache(maxsize=4096)
def accelerator_name(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return catalog.lookup(name).name
    except AnalyticsError:
        return None


def gpu_price(nodes: list[tuple], cat: dict[Any, Any], memo: dict[tuple, float | None] | None = None
           ) -> tuple[float | None, str]:
    """$/GPU-hour averaged over the priced nodes: the catalogue's row for the node's instance
    type in its region, or (GCE: GPUs attached to a VM) for ``TYPE+NxACC``."""
    per: list[float] = []
    memo = {} if memo is None else memo  # one catalogue pass per kind of node
    for _node, region, itype, spot, acc, acc_n, _labels in nodes:
        if not itype:
            continue
        key = (region, itype, spot, acc, acc_n)
        if key in memo:
            if (known := memo[key]) is not None:
                per.append(known)
            continue
        p = None
        short = accelerator_name(acc)
        for name in (*([f"{itype}+{acc_n}x{short}"] if short and acc_n else []), itype):
            try:
                p = prices.lookup(name, region, cat) or prices.lookup(name, None, cat)
            except AnalyticsError:
                p = None
            if p is not None and not p.accelerator_count and acc_n:
                p = None  # a CPU host's price does not cover the node's GPUs
            if p is not None:
                break
        if p is None and short and acc_n:  # GCE: the VM and its GPUs billed apart
            p = prices.attached(itype, region, short, int(acc_n), cat)
        usd = None if p is None else (p.spot if spot else p.on_demand)
        count = p.accelerator_count if p is not None and p.accelerator_count else acc_n
        memo[key] = each = usd / count if usd is not None and count else None
        if each is not None:
            per.append(each)
    if not per:
        return None, "no catalogue price for the job's instance types"
    return sum(per) / len(per), f"price catalogue ({len(per)} of {len(nodes)} nodes priced)"


def vm_price(node: tuple, cat: dict[Any, Any] | None = None) -> float | None:
    """$/hour of one node's VM (a row of ``job_nodes``): its instance type with its GPUs in the
    catalogue (``TYPE+NxACC``, else the VM plus N GPUs as GCE bills them), the CPU type alone
    for a node without GPUs; spot or on-demand as the node runs; None: not in the catalogue."""
    _node, region, itype, spot, acc, acc_n, _labels = node
    if not itype:
        return None
    short = accelerator_name(acc) if acc_n else None
    p = None
    for name in (*([f"{itype}+{acc_n}x{short}"] if short else []), itype):
        try:
            p = prices.lookup(name, region, cat) or prices.lookup(name, None, cat)
        except AnalyticsError:
            p = None
        if p is not None and acc_n and not p.accelerator_count:
            p = None  # a CPU host's price does not cover the node's GPUs
        if p is not None:
            break
    if p is None and short:
        p = prices.attached(itype, region, short, int(acc_n), cat)
    return None if p is None else (p.spot if spot else p.on_demand)


def job_vm_prices(con: duckdb.DuckDBPyConnection, job: str) -> dict[str, tuple[float | None, bool, str]]:
    """node -> ($/hour of its VM or None, whether it holds accelerators, its instance type) for
    every node of ``job`` (its ranks' and its input workers')."""
    cat = prices.load()
    return {n[0]: (vm_price(n, cat), bool(n[5]), n[2] or "(no instance type)") for n in job_nodes(con, [job]).get(job, [])}
