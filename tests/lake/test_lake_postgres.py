"""A lake whose catalog is PostgreSQL (many hosts): collectors on several hosts commit
through it concurrently, each event once; analyze reads the lake through it."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from cmdare.analytics.cli import cli as analyze
from cmdare.collector.lake import Lake
from tests.conftest import Postgres
from tests.lake.test_lake_unit import concurrent_rounds


def test_concurrent_collectors_through_a_postgresql_catalog(postgres: Postgres, tmp_path: Path) -> None:
    lakes = [Lake(str(tmp_path / "lake"), postgres.url) for _ in range(3)]  # three processes' views of it
    for lk in lakes:
        lk.ensure()  # all three create the tables at once: one wins, none fails
    n = concurrent_rounds(lakes)
    assert lakes[0].positions("gpu_samples") == {"t/0": [4], "t/1": [4], "t/2": [4]}
    r = CliRunner().invoke(analyze, ["--lake", str(tmp_path / "lake"), "--catalog", postgres.url, "sql",
                                     "SELECT count(*) AS n, count(DISTINCT id) AS d FROM gpu_samples", "--json"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f'[{{"n": {n}, "d": {n}}}]'
    # no catalog.db was made in the directory: the catalog is the server's
    assert not (tmp_path / "lake" / "catalog.db").exists()


def test_an_unreachable_catalog_is_one_line_without_its_password(tmp_path: Path) -> None:
    r = CliRunner().invoke(analyze, ["--lake", str(tmp_path), "--catalog",
                                     "postgresql+psycopg2://u:hunter2@127.0.0.1:1/x", "nodes"])
    assert r.exit_code == 1
    assert "hunter2" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
