"""The detectors read whole 5-minute buckets from the rollups (``gpu_5m``, ``host_5m``,
``steps_5m``) and the scope's partial edges from the raw rows: every finding, summary,
number and window equals the same run reading every raw row, at scope edges inside and on
bucket boundaries, for one job and the fleet, with part of the rollups pending."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from cmdare.analytics import findings
from cmdare.analytics.units import Scope
from cmdare.collector import rollup
from cmdare.collector.db import connect
from tests.analytics.test_golden_output import build
from tests.fixtures.analyze_golden.cases import T0


def at(x: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(x, dt.timezone.utc).replace(tzinfo=None)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build(tmp_path_factory.mktemp("rolled") / "f.duckdb")
    con = connect(path)
    rollup.run(con)
    # one node's steps and samples pending again: the views read them raw
    (node,) = con.execute("SELECT node FROM steps WHERE job IS NOT NULL ORDER BY node LIMIT 1").fetchone()
    for src in rollup.SOURCES:
        con.execute(f"INSERT INTO rollup_dirty (node, lo, hi, src) SELECT node, min(ts), max(ts) + INTERVAL 1 SECOND, "
                    f"'{src}' FROM {src} WHERE node = ? GROUP BY node", [node])
    con.close()
    return path


def found(con, scope: Scope) -> list[dict]:
    out = findings.run(con, scope)
    return [dataclasses.asdict(f) for f in out.findings]


SCOPES = [
    (None, None, None),
    (None, 95.0, None),  # starts inside a bucket
    (None, None, 3 * 3600 + 1234.0),  # ends inside one
    (None, 600.0 - T0 % 300, 2 * 3600 - T0 % 300),  # both on bucket boundaries
    (None, 1801.5, 5 * 3600 + 7.0),
]


@pytest.mark.parametrize("job,since,until", SCOPES)
def test_findings_from_the_rollups_equal_those_from_every_raw_row(db: Path, job, since, until) -> None:
    con = connect(db, read_only=True)
    scope = lambda: Scope(job, None if since is None else at(T0 + since), None if until is None else at(T0 + until))  # noqa: E731
    got = found(con, scope())
    con.close()
    con = connect(db)  # the same database without the rollup views: every detector reads the raw rows
    for r in rollup.ROLLUPS:
        con.execute(f"DROP VIEW {r.view}")
    want = found(con, scope())
    con.close()
    con = connect(db)  # (views back for the next case)
    con.close()
    assert got == want
    assert want or since is not None  # the whole fleet has findings of every kind
    if since is None and until is None:
        assert {f["kind"] for f in want} >= {"straggler", "input_bound", "gpu_idle", "ps_bound"}


def test_one_job_scope_reads_the_same(db: Path) -> None:
    con = connect(db, read_only=True)
    jobs = [j for (j,) in con.execute("SELECT DISTINCT job FROM steps WHERE job LIKE 'sim-%' ORDER BY 1").fetchall()]
    got = {j: found(con, Scope(j, at(T0 + 95.0), None)) for j in jobs}
    con.close()
    con = connect(db)
    for r in rollup.ROLLUPS:
        con.execute(f"DROP VIEW {r.view}")
    want = {j: found(con, Scope(j, at(T0 + 95.0), None)) for j in jobs}
    con.close()
    connect(db).close()
    assert got == want and any(want.values())


def test_a_rank_restarted_on_another_node_inside_a_window_is_judged_from_its_raw_rows(tmp_path: Path) -> None:
    """Rank 3's windows hold two rollup rows each (it moved node): its median step time per
    window comes from the raw rows, as without rollups; reading one of the rows instead
    (a deliberate ``k >= 1``) misses the straggler or mis-measures it."""
    from cmdare.collector.writer import Writer
    from tests.collector.test_rollups_wide import steps

    t = 1.75e9 + 17
    con = connect(tmp_path / "s.duckdb")
    w = Writer(con, max_skew=None, rollup_every=None)
    lines = b"".join(steps(f"n{r}", r, t, 180, job="job-s") for r in range(3))
    # rank 3: every other interval on n3 (normal speed) and on n4 (3x slower)
    lines += b"".join(steps(f"n{3 + k % 2}", 3, t + 5 + 10 * k, 1, slow=1.0 + 2.0 * (k % 2), job="job-s")
                      for k in range(180))
    w.write([("m", lines)])
    rollup.run(con)
    assert con.execute("SELECT count(*) FROM step_rollup_5m WHERE rank = 3 GROUP BY bucket LIMIT 1").fetchone() == (2,)
    got = found(con, Scope("job-s"))
    for r in rollup.ROLLUPS:
        con.execute(f"DROP VIEW {r.view}")
    want = found(con, Scope("job-s"))
    con.close()
    assert got == want
    assert [f["rank"] for f in want if f["kind"] == "straggler"] == [3]


@pytest.mark.parametrize("job,since,until", [*SCOPES, ("one", None, None), ("one", 95.0, 3 * 3600 + 1234.0)])
@pytest.mark.parametrize("idle_util,min_mem", [(0.05, 1 << 30), (0.5, 1)])
def test_the_gpu_summary_equals_summing_the_joined_buckets(db: Path, job, since, until, idle_util, min_mem) -> None:
    """``gpu_summary`` (one pass: buckets joined to the spans and summed per job, node and
    GPU) holds what the detectors used to sum from every joined bucket: the same numbers
    per job and GPU, and for buckets outside every span (``job`` NULL) the same allocated
    time the anti-join found."""
    from cmdare.analytics.detectors import evidence

    con = connect(db, read_only=True)
    if job == "one":  # one job's scope: every other job's GPUs are outside its spans
        (job,) = con.execute("SELECT min(job) FROM steps WHERE job LIKE 'sim-%'").fetchone()
    scope = Scope(job, None if since is None else at(T0 + since), None if until is None else at(T0 + until))
    g = evidence.gpu_summary(con, scope, idle_util, min_mem)
    b = evidence.gpu_buckets(con, scope)
    s = evidence.spans(con, scope)
    nodes = [n for (n,) in con.execute(f"SELECT DISTINCT node FROM {b}").fetchall()]
    j = evidence.job_gpus(con, scope, nodes)
    got = con.execute(
        f"""SELECT job, node, "index", kind, samples, idle, round(util_n, 6), round(mem, 3), b0, b1, max_n,
                   thr_n, mask_n, thr_mask, thr_b0, thr_b1
            FROM {g} WHERE job IS NOT NULL ORDER BY ALL""").fetchall()
    want = con.execute(
        f"""SELECT job, node, "index", kind, sum(n), sum(n) FILTER (util < {idle_util}), round(sum(util * n), 6),
                   round(avg(mem), 3), min(b), max(b), max(n), sum(thr_n), sum(mask_n), bit_or(thr_mask),
                   min(b) FILTER (thr_n > 0), max(b) FILTER (thr_n > 0)
            FROM {j} GROUP BY job, node, "index", kind ORDER BY ALL""").fetchall()
    assert got == want
    assert want or since is not None  # GPUs in jobs are compared
    got = con.execute(
        f"""SELECT node, "index", sum(alloc_n), round(sum(alloc_mem_sum) / sum(alloc_rows), 3), min(alloc_b0),
                   max(alloc_b1)
            FROM {g} WHERE job IS NULL AND alloc_rows > 0 GROUP BY ALL ORDER BY ALL""").fetchall()
    want = con.execute(
        f"""SELECT node, "index", sum(n), round(avg(mem), 3), min(b), max(b) FROM {b} g
            WHERE util < {idle_util} AND mem >= {min_mem}
              AND NOT EXISTS (SELECT 1 FROM {s} s WHERE s.node = g.node AND g.b + INTERVAL 300 SECOND > s.t0
                              AND g.b <= s.t1)
            GROUP BY ALL ORDER BY ALL""").fetchall()
    assert got == want
    if job is not None and since is None and min_mem == 1:
        assert len(want) > 10  # other jobs' GPUs: the allocated side is compared
    con.close()
