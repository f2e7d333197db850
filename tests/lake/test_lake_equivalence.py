"""The same recording loaded into a database file and into an Iceberg lake gives the same
answer to every analyze command of the golden cases (text and JSON, errors included),
the write commands (fits, stored findings) in the same order."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.consumer import SpoolIngest
from cmdare.collector.db import connect
from cmdare.collector.lake import Lake
from cmdare.collector.lakeingest import LakeSpoolIngest
from cmdare.wire.events import encode_many
from cmdare.wire.spool import seg_name
from tests.analytics.test_golden_output import FIT_ID, LONG_FLOAT, fleets
from tests.fixtures.analyze_golden.cases import CASES

# every golden command again over a lake: scripts/test-fast leaves it to the full run
pytestmark = pytest.mark.slow


def recording(spool: Path, segments: int = 4) -> int:
    """scripts/demo's fleet and the fits' jobs as an agent's spool (``segments`` files)."""
    f, fits = fleets()
    for e in fits.events:  # the two fleets number their events alike: ids are unique in a real fleet
        e["id"] = "fits-" + e["id"]
    lines = (encode_many(f.events) + encode_many(fits.events)).splitlines(keepends=True)
    spool.mkdir()
    n = -(-len(lines) // segments)
    for i in range(segments):
        (spool / seg_name(i + 1)).write_bytes(b"".join(lines[i * n:(i + 1) * n]))
    return len(lines)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("lake-eq")
    recording(d / "spool")
    con = connect(d / "fleet.duckdb")
    SpoolIngest(con, d / "spool", max_skew=None).load_available()
    con.close()
    (d / "spool" / "cursor.collected").unlink()
    lake = Lake(str(d / "lake"))
    lake.ensure()
    # small batches and a round per batch: many commits and files, as a running collector makes
    ing = LakeSpoolIngest(lake, d / "spool", max_skew=None, batch_bytes=256 << 10, commit_every=0.05)
    ing.load_available()
    ing.stager.close()
    assert ing.stager.rounds > 3
    return d / "fleet.duckdb", d / "lake"


def norm(text: str, *paths: Path) -> str:
    for p in paths:  # (where findings were stored is said: the file, or "the lake DIR")
        text = text.replace(f"the lake {p}", "DB").replace(str(p), "DB")
    return LONG_FLOAT.sub(lambda m: f"{float(m.group()):.9g}", FIT_ID.sub(r"\1-ID", text))


def test_every_golden_command_answers_the_same_over_the_lake(both: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from cmdare.analytics.db import Database

    # the same answers from the file read here and from a live collector (or a lake): judged
    # as of now on each side (a file no collector writes: tests/analytics/test_offline_liveness.py)
    monkeypatch.setattr(Database, "OFFLINE_AFTER", float("inf"))
    db, lake = both
    runner = CliRunner()
    differ = []
    for argv in CASES:
        a = runner.invoke(cli, ["--db", str(db), *argv], env={"CMDARE_LAKE": ""})
        b = runner.invoke(cli, ["--lake", str(lake), *argv])
        if (a.exit_code, norm(a.stdout, db), norm(a.stderr, db)) != (b.exit_code, norm(b.stdout, lake),
                                                                       norm(b.stderr, lake)):
            differ.append((argv, a.exit_code, b.exit_code, norm(a.output, db)[:600], norm(b.output, lake)[:600]))
    assert not differ, "\n\n".join(map(str, differ[:3])) + f"\n({len(differ)} of {len(CASES)} differ)"
