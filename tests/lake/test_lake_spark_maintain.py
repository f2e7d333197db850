"""``cmdare-collector maintain --engine spark`` (collector/lakespark.py) on Spark local[2],
a lake whose catalog is a real PostgreSQL: Spark writes the rollup rows DuckDB's build
writes, compacts what DuckDB's compaction does, and ``analyze --lake`` reads the same
before and after; the tables' source positions survive Spark's commits; a second run has
nothing to do; snapshot expiry keeps the current snapshot and what it reads; bad settings
(an SQLite catalog among them) fail in one line."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.lakedb import LakeDatabase
from cmdare.collector import lakerollup, lakespark, rollup
from cmdare.collector.cli import cli as collector
from cmdare.collector.lake import APPENDED, Lake, day_partitions
from cmdare.collector.lakeingest import LakeSpoolIngest
from tests.collector.test_rollups_wide import cols
from tests.conftest import Postgres
from tests.lake.test_lake_equivalence import recording
from tests.lake.test_lake_spark import spark_session

pytestmark = pytest.mark.slow


def _load(d: Path, catalog: str) -> Lake:
    """The recording into a lake in small rounds: many files per day, as collectors leave them."""
    spool = d / "spool"
    recording(spool)
    lk = Lake(str(d / "lake"), catalog)
    lk.ensure()
    ing = LakeSpoolIngest(lk, spool, max_skew=None, batch_bytes=256 << 10, commit_every=0.05)
    ing.load_available()
    ing.stager.close()
    return lk


def _database(pg: Postgres, name: str) -> str:
    """A database of its own on the suite's PostgreSQL server: a lake's catalog."""
    pg._run(str(pg.bin / "createdb"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "cmdare", name)
    return pg.url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, postgres: Postgres) -> Lake:
    return _load(tmp_path_factory.mktemp("by-spark"), _database(postgres, f"spark_{uuid.uuid4().hex[:8]}"))


@pytest.fixture(scope="module")
def spark(lake: Lake) -> Iterator[object]:
    s = spark_session(Path(lake.location.local))  # the JVM, jars and extensions (its catalog unused)
    yield s
    s.stop()


def _db(lk: Lake) -> LakeDatabase:
    return LakeDatabase(str(lk.location.local), lk.location.catalog)


def _raw(lk: Lake) -> dict[str, list[tuple]]:
    """Each rollup as DuckDB's build makes it (collector/rollup.py's SQL over the raw rows)."""
    with _db(lk).read() as con:
        return {r.table: cols(con, r, f"({r.from_raw()} GROUP BY ALL)") for r in rollup.ROLLUPS}


def _rolled(lk: Lake) -> dict[str, list[tuple]]:
    with _db(lk).read() as con:
        return {r.table: cols(con, r, r.table) for r in rollup.ROLLUPS}


def _starts(lk: Lake, raw: bool) -> list[tuple]:
    """The step rollup's first interval starts (goodput's sweep reads each run's from them)."""
    r = rollup.BY_VIEW["steps_5m"]
    src = f"({r.from_raw()} GROUP BY ALL)" if raw else r.table
    with _db(lk).read() as con:
        return sorted(con.execute(f"SELECT bucket, job, run, rank, node, start_min FROM {src}").fetchall(), key=repr)


def _views(lk: Lake) -> dict[str, list[tuple]]:
    with _db(lk).read() as con:
        return {r.table: cols(con, r, r.view) for r in rollup.ROLLUPS} | {
            t: con.execute(f"SELECT count(*), count(DISTINCT id) FROM {t}").fetchall() for t in
            ("gpu_samples", "host_samples", "steps", "heartbeats")}


def test_spark_maintenance_writes_what_duckdbs_does(lake: Lake, spark) -> None:
    positions = {t: lake.positions(t) for t in APPENDED if lake.exists(t)}
    files = {t: {d: len(fs) for d, fs in day_partitions(lake.table(t)).items()} for t in ("gpu_samples", "steps")}
    assert max(files["gpu_samples"].values()) > 8  # something to compact
    want, before, starts = _raw(lake), _views(lake), _starts(lake, True)
    assert all(want.values())
    rep = lakespark.maintain(lake, lakespark.session(lake), retain_raw=None, compact_files=4, expire_after=None)
    assert rep.skipped == []
    assert set(rep.rolled) == {r.table for r in rollup.ROLLUPS} and min(rep.rolled.values()) >= 1
    assert rep.compacted["gpu_samples"][1] < rep.compacted["gpu_samples"][0]
    for t, per_day in files.items():  # a day over 4 files is one file now; the others as they were
        after = {d: len(fs) for d, fs in day_partitions(lake.table(t)).items()}
        assert after == {d: 1 if n > 4 else n for d, n in per_day.items()}, t
    # the rollup rows DuckDB's build writes (floats to 9 digits: sums in another order), every
    # day held; what analyze --lake reads is unchanged, now from the files Spark wrote
    assert _rolled(lake) == want
    assert _starts(lake, False) == starts  # exactly: epoch seconds (9 digits above are whole seconds)
    for src in rollup.SOURCES:
        assert lakerollup.pending_days(lake, src)[1] == set(), src
    assert _views(lake) == before
    with _db(lake).read() as con:
        assert "read_parquet" in con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'gpu_rollup_5m'"
                                             ).fetchall()[0][0]
    # Spark's commits carried every table's source positions forward
    assert {t: lake.positions(t) for t in positions} == positions and any(positions.values())
    # nothing left to do
    again = lakespark.maintain(lake, lakespark.session(lake), retain_raw=None, compact_files=4, expire_after=None)
    assert again.rolled == {} and again.compacted == {}


def test_spark_snapshot_expiry_keeps_the_current_snapshot(lake: Lake, spark) -> None:
    """The expiry step (maintain runs it per table) on the tables the reads below use."""
    from cmdare.collector.lakemaint import Report

    lk = lake
    before = _views(lk)
    s = lakespark.session(lk)
    rep = Report()
    for name in ("gpu_samples", "steps", "host_samples"):
        n = len(list(lk.table(name).snapshots()))
        assert n > 1, name
        cur = lk.table(name).current_snapshot().snapshot_id
        lakespark._expire(lk, s, name, dt.datetime.now(dt.timezone.utc).replace(tzinfo=None), rep)
        assert [x.snapshot_id for x in lk.table(name).snapshots()] == [cur], name
        assert rep.expired_snapshots >= n - 1
    assert _views(lk) == before
    n = rep.expired_snapshots
    lakespark._expire(lk, s, "gpu_samples", dt.datetime.now(dt.timezone.utc).replace(tzinfo=None), rep)
    assert rep.expired_snapshots == n  # nothing left to expire: no Spark job


def test_the_cli_runs_spark_and_refuses_bad_settings(lake: Lake, spark, tmp_path: Path) -> None:
    lk = lake
    where = str(lk.location.local)
    r = CliRunner().invoke(collector, ["maintain", "--lake", where, "--catalog", lk.location.catalog,
                                       "--engine", "spark", "--retain-raw", "off", "--expire-snapshots", "off"])
    assert r.exit_code == 0, r.output
    assert "snapshots expired: 0" in r.output
    for bad, says in [(["--engine", "hadoop"], "'hadoop' is not one of"),
                      (["--engine", "spark", "--spark-master", "x" * 300], "at most 256 characters"),
                      (["--engine", "spark", "--spark-master", "local[2]\nspark.jars=evil"], "at most 256 characters"),
                      (["--spark-master", "local[2]"], "only with --engine spark")]:
        r = CliRunner().invoke(collector, ["maintain", "--lake", where, "--catalog", lk.location.catalog, *bad])
        assert r.exit_code == 2 and says in r.output and len(r.output.strip().splitlines()) <= 4, r.output
    # a lake that is not there: one line, nothing made
    r = CliRunner().invoke(collector, ["maintain", "--lake", str(tmp_path / "none"), "--engine", "spark"])
    assert r.exit_code == 1 and "no such lake" in r.output and not (tmp_path / "none" / "catalog.db").exists()
    # a one-host lake (SQLite catalog): refused in one line, before Spark opens the file
    one = tmp_path / "one"
    Lake(str(one)).ensure()
    r = CliRunner().invoke(collector, ["maintain", "--lake", str(one), "--engine", "spark"])
    assert r.exit_code == 1 and "catalog must be PostgreSQL" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_without_the_runtime_jars_it_says_what_to_run(lake: Lake, monkeypatch, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(lakespark, "JARS", tmp_path / "no-jars")
    with pytest.raises(Exception, match="run scripts/sparkjars"):
        lakespark.session(lake)
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_failed_spark_job_is_one_line(lake: Lake, spark, monkeypatch) -> None:
    from cmdare.collector.lake import LakeError

    s = lakespark.session(lake)
    monkeypatch.setattr(lakespark, "build", lambda lk, sp, skipped: sp.sql("SELECT * FROM cmdare.cmdare.no_such").collect())
    with pytest.raises(LakeError) as e:
        lakespark.maintain(lake, s, retain_raw=None, compact_files=None, expire_after=None)
    msg = str(e.value)
    assert msg.startswith("Spark: ") and "\n" not in msg and "no_such" in msg and len(msg) < 260, msg


def test_spark_submit_runs_maintain_through_collector_submit(lake: Lake) -> None:
    """As on a cluster: ``spark-submit`` (here --master local[2]) runs collector/cli/submit.py,
    which is cmdare-collector's commands under spark-submit's session and jars."""
    import os
    import subprocess
    import sys

    from cmdare.collector.cli import submit

    venv = Path(sys.executable).parent
    jars = ",".join(str(p) for p in sorted(lakespark.JARS.glob("*.jar")))
    env = {**os.environ, "PATH": f"{venv}:{os.environ.get('PATH', '')}", "PYSPARK_PYTHON": sys.executable}
    r = subprocess.run([str(venv / "spark-submit"), "--master", "local[2]", "--jars", jars, submit.__file__,
                        "maintain", "--engine", "spark", "--lake", str(lake.location.local), "--catalog",
                        lake.location.catalog, "--retain-raw", "off", "--expire-snapshots", "off"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "snapshots expired: 0; unreferenced data files deleted: 0" in r.stdout, r.stdout


def test_spark_executors_compute_the_lakes_goodput_hours(spark, postgres: Postgres, tmp_path: Path) -> None:
    """maintain --engine spark: the goodput hours are computed by Spark's tasks (a job's
    hours to one task), stored by the driver; the rows equal the DuckDB computation's."""
    from cmdare.analytics.goodput import goodhours
    from cmdare.collector.cli.root import lake_goodput
    from cmdare.collector.db import connect
    from cmdare.collector.lake import load_database
    from tests.analytics.test_goodhours import _bench

    db = tmp_path / "f.duckdb"
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, minute=0, second=0, microsecond=0)
    _bench().generate(db, 24, 1, 300, end=now - dt.timedelta(hours=1) + dt.timedelta(seconds=1234))
    lk = Lake(str(tmp_path / "lake"), _database(postgres, f"gp_{uuid.uuid4().hex[:8]}"))
    lk.ensure()
    con = connect(db, read_only=True)
    load_database(lk, con, str(db))
    con.close()
    s = lakespark.session(lk)
    rep = lakespark.maintain(lk, s, retain_raw=None, compact_files=None, expire_after=None, derive=lake_goodput(s))
    assert rep.goodput_hours and rep.goodput_hours >= 60  # three jobs, 22-23 whole hours each
    with _db(lk).read() as c:
        kept = c.execute(f"SELECT job, hour, fp, whole, {', '.join(goodhours.KEPT)} FROM goodput_hours "
                         "ORDER BY job, hour").fetchall()
        assert goodhours.plan(c)[0] == []  # every hour held as its data now is
        want = goodhours.compute(c, [(j, h, fp) for j, h, fp, *_ in kept])
    assert len({j for j, *_ in kept}) == 3 and len(kept) == len(want)  # (one day: no job revoked yet)
    for got, w in zip(kept, sorted(want, key=lambda r: (r[0], r[1])), strict=True):
        assert got[:4] == tuple(w[:4])
        assert got[4:] == pytest.approx(tuple(w[4:]), rel=1e-9, abs=1e-6)


def test_spark_tasks_find_what_one_duckdb_run_finds(lake: Lake, spark) -> None:
    """maintain --engine spark --findings: a Spark task per detector over the whole
    window, merged and stored by the driver: the findings one DuckDB run finds."""
    from cmdare.analytics import findings
    from cmdare.analytics.units import Scope
    from cmdare.collector.cli.root import lake_findings

    since = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(days=400)
    with _db(lake).read() as con:
        one = findings.run(con, Scope(None, since, None))
    s = lakespark.session(lake)
    rep = lakespark.maintain(lake, s, retain_raw=None, compact_files=None, expire_after=None,
                             findings=lake_findings(400 * 86400, s))
    assert rep.findings == len(one.findings) and len({f.kind for f in one.findings}) >= 3
    with _db(lake).read() as con:
        rows = con.execute("SELECT kind, job, node, rank, subject, severity, confidence, summary, "
                           "evidence::VARCHAR FROM findings").fetchall()
    stored = sorted(((k, j, n, r, sub, sev, round(c, 9), summ, json.loads(ev)) for k, j, n, r, sub, sev, c, summ, ev
                     in rows), key=repr)
    want = sorted(((f.kind, f.job, f.node, f.rank, f.subject, f.severity, round(f.confidence, 9), f.summary,
                    json.loads(json.dumps(f.evidence))) for f in one.findings), key=repr)
    assert stored == want
