"""Imports stream (hostile-load issue): a file is read a line at a time and stored in
batches, locally in one transaction, through a collector in requests of one batch each;
repeats are numbered across batches, so the records and their ids are the same whichever
way a file arrives; a bad line anywhere stores nothing; memory is the batch's, not the
file's; long imports show where they stand."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from cmdare.analytics import api, csvstream
from cmdare.analytics.cli import cli
from cmdare.analytics.cli import imports as cli_imports
from cmdare.analytics.db import AnalyticsError, Database
from cmdare.analytics.imports import overheads
from cmdare.collector.db import connect
from tests.conftest import serving

HEAD = "model,size_mb,save_s\n"


def run(*args: str, server: str | None = None) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), obj={"server": server} if server else None)
    return r.exit_code, r.stdout, r.stderr


def ids(db: Path) -> list[tuple[str, str, int]]:
    with duckdb.connect(str(db), read_only=True) as c:
        return c.execute("SELECT id, source, line FROM checkpoint_records ORDER BY line").fetchall()


def saves(tmp_path: Path) -> Path:
    """Ten saves, four of them the same save (lines 2, 5, 8, 11): with batches of three the
    repeats fall in different batches."""
    f = tmp_path / "saves.csv"
    rows = ["a,10,3" if i % 3 == 0 else f"b,{i + 1},{i + 2}" for i in range(10)]
    f.write_text(HEAD + "\n".join(rows) + "\n")
    return f


def fresh(path: Path) -> Path:
    connect(path).close()
    return path


def test_batches_give_the_records_one_read_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = saves(tmp_path)
    whole = fresh(tmp_path / "whole.duckdb")
    code, out, _ = run("import", "checkpoints", str(f), "--db", str(whole), "--json")
    assert code == 0 and json.loads(out)["stored"] == 10
    monkeypatch.setattr(overheads, "BATCH", 3)
    parts = fresh(tmp_path / "parts.duckdb")
    code, out, _ = run("import", "checkpoints", str(f), "--db", str(parts), "--json")
    assert code == 0 and json.loads(out) == {"kind": "checkpoints", "records": 10, "stored": 10, "duplicates": 0,
                                             "files": 1}
    assert ids(parts) == ids(whole) and len({i for i, _, _ in ids(parts)}) == 10
    code, out, _ = run("import", "checkpoints", str(f), "--db", str(parts), "--json")
    assert json.loads(out)["duplicates"] == 10 and ids(parts) == ids(whole)
    # through a collector: one request a batch, the repeats numbered by the client across them
    served = fresh(tmp_path / "served.duckdb")
    with serving(served) as url:
        code, out, err = run("import", "checkpoints", str(f), "--db", str(served), "--json", server=url)
        assert code == 0, err
        assert json.loads(out) == {"kind": "checkpoints", "records": 10, "stored": 10, "duplicates": 0, "files": 1}
        code, out, _ = run("import", "checkpoints", str(f), "--db", str(served), "--json", server=url)
        assert json.loads(out)["duplicates"] == 10
    assert ids(served) == ids(whole)


def test_a_bad_line_in_a_later_batch_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overheads, "BATCH", 3)
    good = saves(tmp_path)
    bad = tmp_path / "z_bad.csv"
    bad.write_text(HEAD + "".join(f"c,{i + 1},1\n" for i in range(7)) + "c,5,-1\n")
    db = fresh(tmp_path / "o.duckdb")
    code, out, _ = run("import", "checkpoints", str(good), "--db", str(db))
    assert code == 0
    before = ids(db)
    code, out, err = run("import", "checkpoints", str(good), str(bad), "--db", str(db))
    assert code == 1 and "z_bad.csv: line 9: save_s '-1' is out of range" in err, err
    assert ids(db) == before  # three batches were inserted, then rolled back
    served = fresh(tmp_path / "served.duckdb")
    with serving(served) as url:
        code, out, err = run("import", "checkpoints", str(bad), "--db", str(served), server=url)
        assert code == 1 and "z_bad.csv: line 9" in err
    assert ids(served) == []  # checked whole before the first batch was sent


def test_memory_is_the_batchs_not_the_files(tmp_path: Path) -> None:
    """Measured in a fresh interpreter (tracemalloc counts every thread's allocations, and a
    test process holds other tests' servers and consumers)."""
    import subprocess
    import sys

    f = tmp_path / "big.csv"
    with f.open("w") as out:
        out.write(HEAD)
        for i in range(30_000):
            out.write(f"model-{i % 7},{i % 5000 + 1}.25,{i % 300 + 1}.5\n")
    warm = tmp_path / "warm.csv"  # what a first import loads once (modules, caches) is not the file's
    warm.write_text(HEAD + "m,1,1\n")
    code = f"""
import tracemalloc
from cmdare.analytics.imports import overheads
for _ in overheads.stream("checkpoints", [{str(warm)!r}]):
    pass
tracemalloc.start()
n = sum(len(b) for b in overheads.stream("checkpoints", [{str(f)!r}], batch=1000))
stream = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
tracemalloc.start()
held = len(overheads.read("checkpoints", [{str(f)!r}]).rows)
whole = tracemalloc.get_traced_memory()[1]
print(n, held, stream, whole)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    n, held, stream, whole = (int(x) for x in out.stdout.split())
    assert n == held == 30_000
    # holding the file's records costs ~750 B each (22 MB here); a batch and the repeat
    # numbering's digests (~100 B a distinct row) stay far below (3.9 MB measured)
    assert stream < 10 << 20 and stream * 3 < whole, (stream, whole)


def test_progress_in_a_log_says_where_a_long_import_stands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.csv"
    f.write_text(HEAD + "".join(f"m,{i + 1},2\n" for i in range(3000)))
    monkeypatch.setattr(overheads, "BATCH", 500)
    monkeypatch.setattr(cli_imports.Progress, "every", 0.0)  # a line every batch
    code, out, err = run("import", "checkpoints", str(f), "--db", str(fresh(tmp_path / "o.duckdb")))
    assert code == 0, err
    lines = [x for x in err.splitlines() if x.startswith("reading checkpoints: c.csv (1/1)")]
    pcts = [int(x.rsplit(" ", 2)[1]) for x in lines]
    assert len(pcts) >= 4 and pcts == sorted(pcts) and pcts[-1] <= 100, err


@pytest.mark.parametrize(("content", "message"), [
    (b"size_mb,save_s\n10,3\n" + b"9" * 70_000 + b"\n", "line 3: longer than 65,536 bytes"),
    (b"size_mb,save_s\n10,3\n1\x00,3\n", "line 3"),  # a NUL: not CSV or not a number, one line
    (b"size_mb,save_s\n10,3\n\xc3\x28,3\n", "line 3: not a text file (not UTF-8)"),
    (b"\xef\xbb\xbfsize_mb,save_s\n10,3\n", None),  # a byte-order mark is not part of the first name
])
def test_hostile_lines_are_one_line_with_their_number(tmp_path: Path, content: bytes, message: str | None) -> None:
    f = tmp_path / "h.csv"
    f.write_bytes(content)
    if message is None:
        assert overheads.read("checkpoints", [f]).rows[0]["size_mb"] == 10
        return
    with pytest.raises(AnalyticsError) as e:
        overheads.read("checkpoints", [f])
    assert message in str(e.value) and "h.csv" in str(e.value) and len(str(e.value)) < 200
    assert "\n" not in str(e.value)


def test_a_file_that_grows_while_read_stops_at_the_limit(tmp_path: Path) -> None:
    f = tmp_path / "g.csv"
    f.write_text(HEAD + "m,1,1\n" * 20)
    with csvstream.open_regular(f, 1 << 20, "x") as fh:
        lines = csvstream.Lines(fh, "g.csv", 100)  # as if it had grown past 100 bytes since the check
        with pytest.raises(AnalyticsError, match=r"^g.csv: larger than 100 bytes \(it grew while read\)$"):
            list(lines)
    with pytest.raises(AnalyticsError, match=r"larger than 64 bytes: not x$"):
        csvstream.open_regular(f, 64, "x")
    with pytest.raises(AnalyticsError, match=r"a directory, not a regular file$"):
        csvstream.open_regular(tmp_path, 64, "x")


def test_repeat_numbers_a_client_sends_choose_no_id(tmp_path: Path) -> None:
    """A client's repeat number is one more value of the record: the same record with the
    same number is a duplicate, with another a second record; a number out of range or not
    an integer is ignored (numbered in the request, as without one)."""
    db = Database(tmp_path / "o.duckdb")
    rec = {"size_mb": 10, "save_s": 3}
    assert api.import_overheads(db, "checkpoints", [{**rec, "repeat": 0}])["stored"] == 1
    assert api.import_overheads(db, "checkpoints", [rec])["duplicates"] == 1  # numbered 0 in the request
    assert api.import_overheads(db, "checkpoints", [{**rec, "repeat": 1}])["stored"] == 1
    got = overheads.check("checkpoints", [{**rec, "repeat": r} for r in (True, -1, 10**9, "3", 2.0)])
    assert [g["repeat"] for g in got] == [0, 1, 2, 3, 4]
    local = overheads.parse("checkpoints", "size_mb,save_s\n10,3\n10,3\n", "x.csv")
    assert [r["id"] for r in local] == [r["id"] for r in overheads.check("checkpoints", [rec, {**rec, "repeat": 1}])]


def test_an_empty_record_over_the_api_is_a_bad_line_not_a_crash(tmp_path: Path) -> None:
    db = Database(tmp_path / "o.duckdb")
    with pytest.raises(AnalyticsError, match=r"^import: line 3: size_mb is empty \(it is required\)$"):
        api.import_overheads(db, "checkpoints", [{"size_mb": 1, "save_s": 2}, {}])
    with pytest.raises(AnalyticsError, match=r"^import: each record must be an object$"):
        overheads.check("checkpoints", [{"size_mb": 1, "save_s": 2}, ["not", "a", "dict"]])  # type: ignore[list-item]
    assert api.import_overheads(db, "checkpoints", [{"size_mb": 1, "save_s": 2}])["stored"] == 1


def test_sizes_lines_and_a_bom_at_their_limits(tmp_path: Path) -> None:
    """A line of exactly MAX_LINE bytes and a file of exactly its limit are taken; sizes in
    messages are whole units where they are; a byte-order mark is dropped on line 1 only; a
    long duplicate column is quoted short."""
    assert [csvstream._size(n) for n in (1 << 30, 3 << 30, (1 << 30) + (1 << 20), 3 << 29, 1 << 20, 5 << 20,
                                         512 << 10, 1 << 10, 2048, 1023, 0)] == [
        "1 GiB", "3 GiB", "1025 MiB", "1536 MiB", "1 MiB", "5 MiB", "512 KiB", "1 KiB", "2 KiB", "1023 bytes",
        "0 bytes"]
    with pytest.raises(AnalyticsError, match=r"missing.csv: cannot read: No such file or directory$"):
        csvstream.open_regular(tmp_path / "missing.csv", 10, "x")
    two = tmp_path / "two.csv"
    two.write_text("model\nx\n")
    with pytest.raises(AnalyticsError, match=r"missing required columns size_mb, save_s \(a checkpoints file"):
        overheads.read("checkpoints", [two])
    two.write_text("save_s,model,size_mb,model,save_s\n1,a,2,b,3\n")  # two twice: the first by name is said
    with pytest.raises(AnalyticsError, match=r"line 1: column 'model' appears twice in the header$"):
        overheads.read("checkpoints", [two])
    f = tmp_path / "edge.csv"
    head = "size_mb,save_s,model\n"
    row = "10,3," + "m" * (csvstream.MAX_LINE - len("10,3,") - 1) + "\n"  # exactly MAX_LINE bytes
    f.write_text(head + row)
    with csvstream.open_regular(f, f.stat().st_size, "x") as fh:  # exactly at the limit, both checks
        got = list(csvstream.Lines(fh, "edge.csv", f.stat().st_size))
    assert len(got) == 2 and len(got[1].encode()) == csvstream.MAX_LINE
    g = tmp_path / "bom.csv"
    g.write_bytes(b"size_mb,save_s\n\xef\xbb\xbf10,3\n")  # a BOM that is not the file's first bytes
    with pytest.raises(AnalyticsError) as e:
        overheads.read("checkpoints", [g])
    assert str(e.value).endswith("bom.csv: line 2: size_mb " + repr("\ufeff10") + " is not a number")
    h = tmp_path / "dup.csv"
    h.write_text("size_mb,save_s," + "c" * 50 + "," + "c" * 50 + "\n10,3,a,b\n")
    with pytest.raises(AnalyticsError) as e:
        overheads.read("checkpoints", [h])
    assert str(e.value).endswith("line 1: column " + repr("c" * 37 + "...") + " appears twice in the header")
