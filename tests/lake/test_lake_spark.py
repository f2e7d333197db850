"""Apache Spark (pyspark, local[2], the Iceberg Spark runtime from Maven Central) reads the
lake the collectors wrote through the same catalog: the same counts as DuckDB, the same
fleet-wide aggregate, and each commit's source positions in the snapshots' summaries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cmdare.analytics.lakedb import LakeDatabase
from cmdare.collector.lake import EVENT_TABLES, Lake
from cmdare.collector.lakeingest import LakeSpoolIngest
from tests.conftest import ROOT
from tests.lake.test_lake_equivalence import recording

pytestmark = pytest.mark.slow

# a fleet-wide question as a team asks it of its Spark cluster (docs/scale.md): per job,
# GPU-seconds sampled and mean utilisation, over every GPU sample of the lake
FLEET_SQL = """SELECT job, count(*) AS samples, round(avg(util_gpu_ratio), 9) AS util
FROM {t} WHERE job IS NOT NULL GROUP BY job ORDER BY job"""


def spark_session(lake: Path) -> object:
    if shutil.which("java") is None:
        pytest.skip("Spark needs a JDK 17+ on PATH: apt-get install openjdk-17-jre-headless")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "sparkjars")], capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        pytest.skip(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "scripts/sparkjars failed")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python tasks import cmdare: this venv's Python
    return (SparkSession.builder.master("local[2]").appName("cmdare-lake-test")
            .config("spark.jars", r.stdout.strip())
            .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
            .config("spark.sql.catalog.cmdare", "org.apache.iceberg.spark.SparkCatalog")
            .config("spark.sql.catalog.cmdare.type", "jdbc")
            .config("spark.sql.catalog.cmdare.uri", f"jdbc:sqlite:{lake}/catalog.db")
            .config("spark.sql.catalog.cmdare.warehouse", lake.as_uri())
            .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
            .getOrCreate())


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("lake-spark")
    recording(d / "spool")
    lk = Lake(str(d / "lake"))
    lk.ensure()
    ing = LakeSpoolIngest(lk, d / "spool", max_skew=None, batch_bytes=512 << 10, commit_every=0.05)
    ing.load_available()
    ing.stager.close()
    return d / "lake"


@pytest.fixture(scope="module")
def spark(lake: Path) -> Iterator[object]:
    s = spark_session(lake)
    yield s
    s.stop()


def test_spark_counts_and_a_fleet_aggregate_equal_duckdbs(spark, lake: Path) -> None:
    with LakeDatabase(str(lake)).read() as con:
        want = {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in EVENT_TABLES}
        fleet = [tuple(r) for r in con.execute(FLEET_SQL.format(t="gpu_samples")).fetchall()]
    got = {t: spark.sql(f"SELECT count(*) FROM cmdare.cmdare.{t}").collect()[0][0] for t in EVENT_TABLES}
    assert got == want
    assert sum(want.values()) > 10_000 and want["gpu_samples"] > 1000
    assert [tuple(r) for r in spark.sql(FLEET_SQL.format(t="cmdare.cmdare.gpu_samples")).collect()] == fleet
    assert len(fleet) >= 10


def test_spark_sees_each_commits_source_positions(spark, lake: Path) -> None:
    rows = spark.sql("SELECT summary['cmdare.positions'] AS p FROM cmdare.cmdare.lake_commits.snapshots "
                     "ORDER BY committed_at").collect()
    assert len(rows) > 3
    last = json.loads(rows[-1]["p"])
    assert last == Lake(str(lake)).positions()
    (source,) = last
    assert source.startswith("spool:") and last[source][0] == 4  # the recording's fourth segment, read to its end
