"""Fixtures of the analytics tests: CM-DARE's real measurements imported as a user would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from tests.conftest import serving  # noqa: F401  (re-exported for the analytics tests)

ROOT = Path(__file__).resolve().parents[2]
# CM-DARE's shared half: $CMDARE_REAL_DATA (another copy, the held-out half), else the
# checkout's sibling ../shared/data/cmdare, else the copy in tests/fixtures/cmdare
# (Apache-2.0, unchanged), so that the real-data tests run on every clone
_SHARED = ROOT.parent / "shared" / "data" / "cmdare"
DATA = Path(os.environ.get("CMDARE_REAL_DATA")
            or (_SHARED if (_SHARED / "jobs.csv").is_file() else ROOT / "tests" / "fixtures" / "cmdare"))


def _import_real(db: Path) -> None:
    """jobs.csv is a manifest (file, job and each job's declaration): one command."""
    res = CliRunner().invoke(cli, ["import", "tensorboard", "--manifest", str(DATA / "jobs.csv"), "--db", str(db)])
    assert res.exit_code == 0, res.output


@pytest.fixture(scope="session")
def real_db(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """Every run of the data, imported through the CLI with the flags its README gives.
    Under xdist the first worker to need it imports it into the run's shared temporary
    directory (a lock file: pytest-xdist's recipe for a session fixture made once) and
    each worker reads a copy of its own."""
    import fcntl
    import shutil

    db = tmp_path_factory.mktemp("real") / "real.duckdb"
    if worker_id == "master":
        _import_real(db)
        return db
    shared = tmp_path_factory.getbasetemp().parent / "real-shared.duckdb"
    with open(shared.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not shared.exists():
            part = shared.with_suffix(".part")
            _import_real(part)
            part.rename(shared)
    shutil.copyfile(shared, db)
    return db



