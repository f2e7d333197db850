"""A clone with no ``../shared`` beside it runs the same tests: every file of the shared
data the tests read (or will: the HTA traces) has its vendored copy under ``tests/fixtures`` (issue 66: without
``lifetimes/lives.csv`` a clean clone had 97 errors), byte for byte, and the tests' data
lookups fall back to those copies."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
# shared folder -> its vendored copy (the HTA traces too: the data-parallel work will read them)
VENDORED = {"data/cmdare": "tests/fixtures/cmdare", "ecosystem/dcgm-exporter": "tests/fixtures/dcgm-exporter",
            "data/hta": "tests/fixtures/hta"}


SUMS = "SHA256SUMS"  # in each copy: `sha256sum` of every shared file, as ../shared holds it


def _files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and p.name != SUMS}


def _sums(d: Path) -> dict[str, str]:
    import hashlib

    return {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in sorted(_files(d))}


def _listed(copy: Path) -> dict[str, str]:
    out = {}
    for line in (copy / SUMS).read_text().splitlines():
        digest, name = line.split(None, 1)
        out[name.strip()] = digest
    return out


@pytest.mark.parametrize(("shared", "copy"), sorted(VENDORED.items()))
def test_every_shared_file_the_tests_read_is_vendored_byte_for_byte(shared: str, copy: str) -> None:
    """The copy holds exactly the files its SHA256SUMS lists, byte for byte; where ../shared
    is beside the clone, it holds exactly those too (on a clone without it, as CI's is, the
    list is what the copy is checked against: nothing to skip)."""
    src, dst = SHARED / shared, ROOT / copy
    assert dst.is_dir() and _files(dst), f"{copy}: no vendored copy"
    listed = _listed(dst)
    assert _sums(dst) == listed, f"{copy}: its files differ from its {SUMS} (copy them again from ../shared/{shared})"
    if src.is_dir():
        have = _sums(src)
        missing = sorted(set(have) - set(listed))
        assert not missing, f"{copy} lacks {missing[:5]} (copy them from ../shared/{shared}, then sha256sum)"
        differ = [f for f in sorted(have) if have[f] != listed.get(f)]
        assert not differ, f"{copy}: {differ[:5]} differ from ../shared/{shared}"


def test_the_data_lookups_fall_back_to_the_vendored_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a clone without ../shared: the lookups name the copies under tests/fixtures."""
    import importlib

    import tests.analytics.conftest as aconf
    import tests.conftest as conf

    real_is_file = Path.is_file
    monkeypatch.delenv("CMDARE_REAL_DATA", raising=False)
    monkeypatch.setattr(Path, "is_file", lambda self: "shared" not in self.parts and real_is_file(self))
    try:
        data = importlib.reload(aconf).DATA
        assert data == ROOT / "tests" / "fixtures" / "cmdare"
        assert real_is_file(data / "lifetimes" / "lives.csv") and real_is_file(data / "jobs.csv")
        counters = conf.dcgm_exporter_file("default-counters.csv")
        assert counters == ROOT / "tests" / "fixtures" / "dcgm-exporter" / "default-counters.csv"
        assert real_is_file(counters)
    finally:
        monkeypatch.undo()
        importlib.reload(aconf)
