"""Process attribution: which training job and rank each process on a GPU is (its PID on
its node, as the job's rank declared it), what it used of the GPU, and the notes the
goodput answer gives from them.  The agent lists a GPU's processes in each sample
(``gpu_samples.processes``, JSON); ``process_rows`` is the one place that reads that list."""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb

from .queries import Result, _run, _where

# The job a process on a GPU is (``p``: a ``process_rows`` row, ``j``: the jobs table's
# declaration of its (node, pid)): the rank's own declaration (``track``), else the scheduler's:
# the Kubernetes pod holding the GPU (its job label, else namespace/pod: the sample's job),
# else the Slurm job the agent found the process in, named ``slurm-<id>`` (a Slurm job name is
# not unique; its id is), else the Slurm job holding the GPU (a prolog's GPU map: the
# sample's job), else none. One process is one job.
JOB_OF = """CASE WHEN j.job IS NOT NULL AND j.job <> '' THEN j.job
                 WHEN p.pod IS NOT NULL AND p.held_job IS NOT NULL THEN p.held_job
                 WHEN p.slurm_job IS NOT NULL THEN 'slurm-' || p.slurm_job
                 WHEN p.held_job IS NOT NULL THEN p.held_job END"""
NAMED_BY = """CASE WHEN j.job IS NOT NULL AND j.job <> '' THEN 'track'
                   WHEN p.pod IS NOT NULL AND p.held_job IS NOT NULL THEN 'kubernetes'
                   WHEN p.slurm_job IS NOT NULL OR p.held_job IS NOT NULL THEN 'slurm' ELSE '' END"""


def process_rows(cond: str) -> str:
    """SQL of the processes the GPU samples matching ``cond`` list, one row each (node,
    "index", ts, uuid, parent_index, pid, used, sm, mem, the Slurm job, step, job name and
    user the agent read from /proc, the Kubernetes namespace, pod, container holding the GPU,
    and the job the scheduler gave the GPU to, ``held_job``: the pod's or the Slurm job's).  What an agent cannot have meant costs that value
    only: a pid that is not a positive integer leaves its entry out, an SM / memory share
    outside 0..1 or a negative memory reads as null, a Slurm job id not of digits as none."""
    return f"""SELECT node, "index", ts, uuid, parent_index, p.pid AS pid,
                      CASE WHEN p.used_bytes >= 0 THEN p.used_bytes END AS used,
                      CASE WHEN p.sm_ratio BETWEEN 0 AND 1 THEN p.sm_ratio END AS sm,
                      CASE WHEN p.mem_ratio BETWEEN 0 AND 1 THEN p.mem_ratio END AS mem,
                      CASE WHEN regexp_full_match(p.slurm_job, '[0-9]{{1,20}}') THEN p.slurm_job END AS slurm_job,
                      left(p.slurm_step, 16) AS slurm_step, left(p.slurm_job_name, 128) AS slurm_job_name,
                      left(p.slurm_user, 64) AS slurm_user, namespace, pod, container,
                      CASE WHEN (pod IS NOT NULL OR held_slurm IS NOT NULL) AND job <> '' THEN job END AS held_job
               FROM (SELECT node, "index", ts, uuid, parent_index, namespace, pod, container, job,
                            slurm_job AS held_slurm,
                            unnest(from_json(processes, '[{{"pid":"BIGINT","used_bytes":"BIGINT","sm_ratio":"DOUBLE","mem_ratio":"DOUBLE",
                                                            "slurm_job":"VARCHAR","slurm_step":"VARCHAR","slurm_job_name":"VARCHAR",
                                                            "slurm_user":"VARCHAR"}}]')) AS p
                     FROM gpu_samples WHERE ({cond}) AND processes IS NOT NULL AND processes <> '[]')
               WHERE p.pid > 0"""


def gpu_processes(con: duckdb.DuckDBPyConnection, node: str | None = None, cutoff: dt.datetime | None = None,
                  until: dt.datetime | None = None, job: str | None = None) -> Result:
    """Per GPU and process over [cutoff, until): the training job and rank it is, and what
    named it (``named_by``): its PID as the job's rank declared it on that node (``track``),
    else the Kubernetes pod holding its GPU (``kubernetes``: the pod's job label, else
    namespace/pod), else the Slurm job the agent found it in (``slurm``: job ``slurm-<id>``),
    else none; the share of the GPU's samples it was listed in, its mean SM and
    memory-interface share where NVML sampled it, its peak memory, its Slurm job, step and
    user, its pod's namespace, name and container; ``job``: that job's processes only. One
    process is one job: a declaration wins over the scheduler."""
    where, params = _where(node, cutoff, until)
    jp: list[Any] = []
    jfilter = ""
    if job is not None:
        jfilter, jp = "WHERE a.job = ?", [job]
    return _run(
        con,
        f"""WITH g AS (SELECT node, "index", count(*) AS n FROM gpu_samples{where} GROUP BY ALL),
                 p AS (SELECT node, "index", any_value(uuid) AS uuid, any_value(parent_index) AS parent, pid,
                              count(DISTINCT ts) AS n, avg(sm) AS sm, avg(mem) AS mem, max(used) AS used,
                              arg_max(slurm_job, ts) AS slurm_job, arg_max(slurm_step, ts) AS slurm_step,
                              arg_max(slurm_job_name, ts) AS slurm_job_name, arg_max(slurm_user, ts) AS slurm_user,
                              arg_max(namespace, ts) AS namespace, arg_max(pod, ts) AS pod,
                              arg_max(container, ts) AS container, arg_max(held_job, ts) AS held_job
                       FROM ({process_rows(where.removeprefix(" WHERE ") or "true")})
                       GROUP BY node, "index", pid),
                 j AS (SELECT node, pid, any_value(job) AS job, any_value(rank) AS rank, any_value(run) AS run
                       FROM jobs WHERE pid IS NOT NULL GROUP BY node, pid),
                 a AS (SELECT p.*, j.rank, j.run, coalesce({JOB_OF}, '') AS job, {NAMED_BY} AS named_by
                       FROM p LEFT JOIN j ON j.node = p.node AND j.pid = p.pid)
            SELECT a.node, a."index" AS gpu, a.parent, a.pid, a.job, a.rank, a.run,
                   round(a.n / g.n * 100, 1) AS present_pct, round(a.sm * 100, 1) AS sm_pct,
                   round(a.mem * 100, 1) AS mem_pct, round(a.used / 2^30, 2) AS mem_used_gib,
                   a.named_by, a.slurm_job, a.slurm_step, a.slurm_user, a.namespace, a.pod, a.container
            FROM a JOIN g USING (node, "index")
            {jfilter}
            ORDER BY a.node, a."index", a.pid""",
        params + params + jp,
    )


def gpu_use_notes(con: duckdb.DuckDBPyConnection, job: str, since: dt.datetime | None, until: dt.datetime | None) -> list[str]:
    """What the job's own processes used of the GPUs they ran on (by PID), and GPUs its
    processes shared with processes of no rank of it: the goodput buckets count allocated
    GPU time, this says how much of it the job really used."""
    try:
        _, rows = gpu_processes(con, None, since, until, None)
    except Exception:  # a database from before per-process fields, no jobs table: nothing to say
        return []
    own = [r for r in rows if r[4] == job]
    if not own:
        return []
    gpus = {(r[0], r[1]) for r in own}
    sm = [r[8] for r in own if r[8] is not None]
    others = {(r[0], r[1], r[3]) for r in rows if (r[0], r[1]) in gpus and r[4] != job}
    out = [f"the job's processes used {sum(sm) / len(sm):.0f} % of the SMs of its {len(gpus)} GPU(s) on average "
           f"(per process: analyze gpu --job {job})" if sm else
           f"the job's processes ran on {len(gpus)} GPU(s) (no per-process utilisation sampled)"]
    if others:
        out.append(f"{len(others)} process(es) of no rank of this job held the same GPUs")
    return out
