"""``analyze`` prints exactly the same, byte for byte, as when the golden files were made
(before the CLI became a layer over cmdare.analytics.api), and the same through a live
collector's API as locally. The cases: tests/fixtures/analyze_golden/cases.py; rewrite the
expected output after a deliberate change with ``CMDARE_UPDATE_GOLDEN=1``."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import MODELS, DemoFleet, Fleet, Truth
from tests.fixtures.analyze_golden.cases import CASES, T0

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "analyze_golden" / "expected.json"


def fleets() -> tuple[DemoFleet, Fleet]:
    """scripts/demo's fleet, and enough configurations and VM lives for every fit."""
    f = DemoFleet(seed=1, t0=T0)
    f.build()
    fits = Fleet(Truth(), seed=7)
    for m in MODELS[:4]:
        for a in ("k80", "v100"):
            fits.job(m, a)
        for w, p in ((2, 1), (4, 1), (4, 2)):
            fits.job(m, "k80", workers=w, ps=p, intervals=8)
    fits.vm_lives(per_group=12)
    return f, fits


def build(path: Path) -> Path:
    f, fits = fleets()
    con = connect(path)
    Writer(con).write([("sim", encode_many(f.events)), ("fits", encode_many(fits.events))])
    con.close()
    return path


@pytest.fixture(scope="module")
def fleet_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("golden") / "base.duckdb")


@pytest.fixture(autouse=True)
def _judged_as_of_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same output read from the file and through a live collector: the file (made an
    hour ago) is judged as of now here, as the collector judges it, not as of its end
    (a file no collector writes: tests/analytics/test_offline_liveness.py)."""
    from cmdare.analytics.db import Database

    monkeypatch.setattr(Database, "OFFLINE_AFTER", float("inf"))


FIT_ID = re.compile(r"\b(speed|cluster|overhead|lifetime)-\d{14}-[0-9a-f]{6}\b")
LONG_FLOAT = re.compile(r"-?\d+\.\d{9,}(e[-+]?\d+)?")  # DuckDB's parallel sums differ in the last bits


def case(argv: list[str], code: int, out: str, err: str, db: Path) -> dict[str, Any]:
    """One command's outcome, with what differs between runs (the fit ids: their time and
    a random suffix; the database's path) put in words, long floats to 9 digits."""
    def norm(s: str) -> str:
        s = FIT_ID.sub(r"\1-ID", s.replace(str(db), "DB"))
        return LONG_FLOAT.sub(lambda m: f"{float(m.group()):.9g}", s)

    return {"argv": argv, "exit_code": code, "stdout": norm(out), "stderr": norm(err)}


NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")
# the fitted models' figures (the cluster fit's exponent k sits on a flat optimum) move in
# the 4th digit with the BLAS kernels of the CPU and numpy / scipy's versions, and an
# extrapolation's interval (widened by its distance from the fit) carries that further:
# 8.54 .. 577 on one install, 8.56 .. 575 on a fresh one of the same day (0.35 %).  A number
# may differ by this much, relatively; every other character must be the same
FIT_TOLERANCE = 5e-3
# an interval's ends are fitted figures even where 3 significant digits print no decimal
# point ("interval 8.54 .. 577"): compared as numbers, never as text
INTERVAL = re.compile(r"(interval )(-?[\d.e+]+)( \.\. )(-?[\d.e+]+)")


def _ends_as_numbers(s: str) -> str:
    return INTERVAL.sub(lambda m: f"{m[1]}{float(m[2])!r}{m[3]}{float(m[4])!r}", s)


def same(got: dict[str, Any], want: dict[str, Any]) -> bool:
    """One command's outcome equal to the golden one: exit code and text exactly, decimal
    numbers to FIT_TOLERANCE."""
    if (got["argv"], got["exit_code"]) != (want["argv"], want["exit_code"]):
        return False
    for k in ("stdout", "stderr"):
        a, b = _ends_as_numbers(got[k]), _ends_as_numbers(want[k])
        if a == b:
            continue
        if NUMBER.split(a) != NUMBER.split(b):
            return False
        na, nb = (float(x) for x in NUMBER.findall(a)), (float(x) for x in NUMBER.findall(b))
        if not all(abs(x - y) <= FIT_TOLERANCE * max(abs(x), abs(y)) + 1e-12 for x, y in zip(na, nb, strict=True)):
            return False
    return True


def run_local(db: Path) -> list[dict[str, Any]]:
    out = []
    for argv in CASES:
        r = CliRunner().invoke(cli, [*argv, "--db", str(db)])
        out.append(case(argv, r.exit_code, r.stdout, r.stderr, db))
    return out


def test_local_output_is_unchanged(fleet_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "fleet.duckdb"
    shutil.copy(fleet_db, db)
    got = run_local(db)
    if os.environ.get("CMDARE_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert [c["argv"] for c in want] == CASES, "cases.py changed: rewrite the golden file"
    for g, w in zip(got, want, strict=True):
        assert same(g, w), (g["argv"], g, w)


@pytest.mark.slow  # runs the product end to end, or waits on purpose, for seconds (fast tier: docs/testing.md)
def test_the_same_output_through_a_live_collectors_api(fleet_db: Path, tmp_path: Path) -> None:
    from tests.analytics.conftest import serving

    db = tmp_path / "fleet.duckdb"
    got = []
    with serving(fleet_db, db) as url:
        for argv in CASES:
            r = CliRunner().invoke(cli, [*argv, "--db", str(db)], obj={"server": url})
            got.append(case(argv, r.exit_code, r.stdout, r.stderr, db))
    want = json.loads(GOLDEN.read_text())
    for g, w in zip(got, want, strict=True):
        assert same(g, w), (g["argv"], g, w)


def test_every_default_text_output_is_at_most_120_characters_wide() -> None:
    """Issue 51: bottlenecks printed 281-character lines, recommend cluster 538. Every
    command of the golden set (the demo fleet), as text, on stdout and stderr (an error is
    one line whatever its length: it quotes what failed)."""
    long = []
    for c in json.loads(GOLDEN.read_text()):
        if "--json" in c["argv"]:
            continue
        for stream in ("stdout", "stderr"):
            long += [(c["argv"], stream, len(x)) for x in c[stream].splitlines()
                     if len(x) > 120 and not x.startswith("Error: ")]
    assert long == []


def test_the_golden_comparison_tolerates_fit_noise_and_nothing_else() -> None:
    base = {"argv": ["fit"], "exit_code": 0, "stdout": '"k": 23.1640577, "n": 12', "stderr": ""}
    assert same({**base, "stdout": '"k": 23.1804089, "n": 12'}, base)  # 7e-4: the BLAS of another CPU
    assert same({**base, "stdout": '"k": 23.2640577, "n": 12'}, base)  # 0.4 %: an extrapolation's noise
    assert not same({**base, "stdout": '"k": 23.3640577, "n": 12'}, base)  # 0.9 %: a changed model
    band = {**base, "stdout": "interval 8.54 .. 577; workers 13"}
    assert same({**band, "stdout": "interval 8.56 .. 575; workers 13"}, band)  # ends are figures
    assert not same({**band, "stdout": "interval 8.54 .. 597; workers 13"}, band)
    assert not same({**band, "stdout": "interval 8.54 .. 577; workers 14"}, band)
    assert not same({**base, "stdout": '"k": 23.1640577, "n": 13'}, base)  # an integer: exact
    assert not same({**base, "stdout": '"K": 23.1640577, "n": 12'}, base)
    assert not same({**base, "exit_code": 1}, base)
