"""Lake locations with spaces, unicode, URL characters and relative parts store and read
back the same (a property test over odd directory names); a location that cannot be a
lake is one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmdare.analytics.cli import cli as analyze
from cmdare.collector.cli import cli as collector
from cmdare.collector.lake import Lake, LakeError, Location, sqlite_url
from tests.conftest import examples
from tests.lake.test_lake_unit import count, samples

# a file name's characters that a URL or a glob would read otherwise, and some unicode
NAME = st.text(alphabet=st.sampled_from(list(" %#?&=;'\"[]*!$@+,~é模") + list("ab01-_")), min_size=1,
               max_size=16).filter(lambda s: s.strip() not in ("", ".", "..") and not s.startswith("-"))


@pytest.mark.slow  # a lake made per example (6 s): the full run
@settings(max_examples=examples(8), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAME, relative=st.booleans())
def test_any_directory_name_stores_and_reads_back_the_same(tmp_path: Path, name: str, relative: bool) -> None:
    import tempfile

    base = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example
    where = base / "lakes" / name.rstrip()  # the location's outer blanks are not part of it (docs/lake.md)
    given_as = str(base / "lakes" / name)
    if relative:  # with a detour: "lakes/x/../NAME", relative to the working directory
        given_as = os.path.relpath(base / "lakes" / "x") + "/../" + name
    lk = Lake(given_as)
    lk.ensure()
    lk.append("gpu_samples", samples(0, 7), {"t/0": ([0], [1])}, "a")
    assert count(Lake(str(where), create=False)) == (7, 7)
    # every file of the lake is under the directory named, none under an escaped twin
    assert sorted(p.name for p in (base / "lakes").iterdir() if p.name != "x") == [name.rstrip()]
    assert any(p.suffix == ".parquet" for p in where.rglob("*"))


def test_the_catalog_url_of_an_odd_path_is_that_path(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text

    for name in ("pct%20x", "q?x=1", "h#x", "sp ace"):
        (tmp_path / name).mkdir()
        with create_engine(sqlite_url(tmp_path / name / "c.db")).connect() as c:
            c.execute(text("CREATE TABLE t (x INT)"))
        assert (tmp_path / name / "c.db").is_file()
    assert Location.parse(str(tmp_path / "sp ace")).warehouse == str(tmp_path / "sp ace")


@pytest.mark.parametrize(("where", "error"), [
    ("/proc/cmdare-lake", "--lake /proc/cmdare-lake: cannot make the directory: "),
    ("", "--lake: give a directory or an object-store URI"),
    ("  ", "--lake: give a directory or an object-store URI"),
])
def test_a_location_that_cannot_be_a_lake_is_one_line(where: str, error: str) -> None:
    with pytest.raises(LakeError) as e:
        Lake(where)
    assert str(e.value).startswith(error) and "\n" not in str(e.value)


def test_the_commands_refuse_an_empty_or_impossible_lake_in_one_line(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    r = CliRunner().invoke(collector, ["spool", str(spool), "--lake", "", "--db", str(tmp_path / "x.duckdb")])
    assert r.exit_code == 2 and "--lake: empty" in r.output and not (tmp_path / "x.duckdb").exists()
    r = CliRunner().invoke(collector, ["spool", str(spool), "--lake", "/proc/cmdare-lake"])
    assert r.exit_code != 0 and "cannot make the directory" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(analyze, ["--lake", "", "nodes"])
    assert r.exit_code == 2 and "--lake" in r.output and "empty" in r.output


def test_a_lake_with_a_space_written_by_the_collector_is_read_by_analyze(tmp_path: Path) -> None:
    from cmdare.wire.events import encode_many
    from cmdare.wire.spool import seg_name
    from tests.analytics.test_accounting import job

    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / seg_name(1)).write_bytes(encode_many(job("j", "n1", "a2-highgpu-1g", False, "A100", "t", 1)))
    lake = str(tmp_path / "lakes" / "sp ace")
    r = CliRunner().invoke(collector, ["spool", str(spool), "--lake", lake])
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "lakes" / "sp%20ace").exists()
    r = CliRunner().invoke(analyze, ["--lake", lake, "sql", "SELECT count(*) AS n FROM steps", "--json"])
    assert r.exit_code == 0, r.output
    assert '"n": ' in r.output and '"n": 0' not in r.output


def test_location_lengths_at_the_limit_and_a_file_in_the_way(tmp_path: Path) -> None:
    """A location or catalog of 1,024 characters is taken, 1,025 is not; a file where the
    lake's directory would be is one line quoting at most 80 characters of its path."""
    deep = tmp_path.joinpath(*["d" * 100] * ((1024 - len(str(tmp_path))) // 101 - 1))
    deep = deep / ("e" * (1024 - len(str(deep)) - 1))  # 101 to 202 characters
    assert len(str(deep)) == 1024, len(str(deep))
    assert Location.parse(str(deep)).local == deep
    with pytest.raises(LakeError, match="give a directory"):
        Location.parse(str(deep) + "x")
    cat = "sqlite:///" + "c" * 1014
    assert Location.parse(str(tmp_path), cat).catalog == cat
    with pytest.raises(LakeError, match=r"^--catalog: a postgresql:// or sqlite:/// URL"):
        Location.parse(str(tmp_path), cat + "c")
    with pytest.raises(LakeError) as e:
        Location.parse(str(tmp_path), "mysql://" + "h" * 100)
    assert str(e.value) == "--catalog: a postgresql:// or sqlite:/// URL, not " + repr(("mysql://" + "h" * 100)[:40])
    f = tmp_path / ("f" * 100)
    f.write_text("x")
    with pytest.raises(LakeError) as e:
        Location.parse(str(f))
    assert str(e.value) == f"--lake {str(f)[:80]}: not a directory"
    with pytest.raises(LakeError, match=r"^--lake .{80}: File name too long$"):  # a name over 255 bytes
        Location.parse(str(tmp_path / ("n" * 300)))


def test_a_lake_file_that_cannot_be_read_is_its_errors_first_line() -> None:
    from cmdare.collector.lake import lake_io

    e = OSError("No such file: /lake/data/" + "p" * 300 + "\nsecond line: more detail")
    msg = lake_io(e)
    assert msg.startswith("cannot read the lake's files (No such file: /lake/data/pp")
    assert "second line" not in msg and msg.count("p" * 100) == 1
    quoted = msg[len("cannot read the lake's files ("):msg.index("); Iceberg")]
    assert quoted == ("No such file: /lake/data/" + "p" * 300)[:160]
    assert lake_io(OSError()).startswith("cannot read the lake's files (OSError); ")
