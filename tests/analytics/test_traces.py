"""``analyze import trace`` and ``analyze trace`` on the shared PyTorch profiler traces: the
same figures as Holistic Trace Analysis (HTA 0.5.0) within 0.1 percentage point, rank and
world size from the trace, idempotent imports, hostile files refused in one line."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect

ROOT = Path(__file__).resolve().parents[2]
_SHARED = ROOT.parent / "shared" / "data" / "hta"
HTA_DATA = Path(os.environ.get("CMDARE_HTA_DATA")
                or (_SHARED if (_SHARED / "README.md").is_file() else ROOT / "tests" / "fixtures" / "hta"))
TRACES = sorted(d.name for d in HTA_DATA.iterdir() if d.is_dir())
# HTA 0.5.0's own figures on the shared traces (get_temporal_breakdown, get_comm_comp_overlap),
# for a machine without HTA; the live test below computes them again
HTA_FIGURES = {
    "ddp-2ranks": {0: (77.78, 17.26, 4.97, 14.31)},
    "sampled-128ranks": {0: (53.56, 17.71, 28.74, 11.81), 1: (54.72, 22.57, 22.72, 20.05)},
}
FIELDS = ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct")


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("traces") / "t.duckdb"
    connect(db).close()
    for name in TRACES:
        code, out, err = run("import", "trace", str(HTA_DATA / name), "--job", name, "--db", str(db), "--json")
        assert code == 0, err
    return db


def figures(db: Path, job: str) -> dict[int, tuple[float, ...]]:
    code, out, err = run("trace", "--job", job, "--db", str(db), "--json")
    assert code == 0, err
    return {r["rank"]: tuple(r[f] for f in FIELDS) for r in json.loads(out)["ranks"]}


@pytest.mark.parametrize("name", TRACES)
def test_every_shared_trace_gives_htas_figures(imported: Path, name: str) -> None:
    got, want = figures(imported, name), HTA_FIGURES[name]
    assert got.keys() == want.keys()
    for rank, w in want.items():
        assert all(abs(a - b) <= 0.1 for a, b in zip(got[rank], w, strict=True)), (rank, got[rank], w)


def test_the_same_figures_as_hta_itself_computes_now(imported: Path, tmp_path: Path) -> None:
    """HTA run on the same files (in a process of its own: it configures logging)."""
    pytest.importorskip("hta", reason="HolisticTraceAnalysis (scripts/test installs it)")
    script = ("import json, sys, warnings; warnings.filterwarnings('ignore')\n"
              "from hta.trace_analysis import TraceAnalysis\n"
              "out = {}\n"
              "for d in sys.argv[1:]:\n"
              "    t = TraceAnalysis(trace_dir=d)\n"
              "    b = t.get_temporal_breakdown(visualize=False).set_index('rank')\n"
              "    o = t.get_comm_comp_overlap(visualize=False).set_index('rank')\n"
              "    out[d] = {int(r): [b.loc[r, 'idle_time_pctg'], b.loc[r, 'compute_time_pctg'],\n"
              "              b.loc[r, 'non_compute_time_pctg'], o.loc[r, 'comp_comm_overlap_pctg']] for r in b.index}\n"
              "print(json.dumps(out))\n")
    dirs = []
    for name in TRACES:  # HTA wants a folder of .json.gz / .json traces and nothing else
        shutil.copytree(HTA_DATA / name, tmp_path / name, ignore=shutil.ignore_patterns("*.md", "LICENSE"))
        dirs.append(str(tmp_path / name))
    r = subprocess.run([sys.executable, "-c", script, *dirs], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    hta = json.loads(r.stdout.strip().splitlines()[-1])
    for name, d in zip(TRACES, dirs, strict=True):
        got = figures(imported, name)
        for rank, w in hta[d].items():
            assert all(abs(a - b) <= 0.1 for a, b in zip(got[int(rank)], w, strict=True)), (name, rank, got, w)


def test_rank_world_size_steps_and_a_second_import(imported: Path) -> None:
    code, out, _ = run("trace", "--job", "sampled-128ranks", "--db", str(imported), "--json")
    t = json.loads(out)
    assert [(r["rank"], r["world_size"]) for r in t["ranks"]] == [(0, 128), (1, 128)]
    assert all(0 < r["exposed_comm_ms"] <= r["comm_ms"] for r in t["ranks"])
    # the last profiler step is cut short by the profiler's stop: HTA leaves it out, and so do we
    assert [s["step"] for s in t["steps"]] == [551] and t["steps"][0]["slowest_rank"] in (0, 1)
    code, out, err = run("import", "trace", str(HTA_DATA / "sampled-128ranks"), "--job", "sampled-128ranks",
                         "--db", str(imported), "--json")
    assert code == 0 and json.loads(out)["unchanged"] == 2 and json.loads(out)["kernels"] == 0, err
    code, out, err = run("trace", "--job", "sampled-128ranks", "--db", str(imported))
    assert code == 0 and "ranks:" in out and "profiler steps:" in out
    assert all(len(line) <= 120 for line in out.splitlines())


def _trace(tmp: Path, name: str, body: bytes, gz: bool = True) -> Path:
    p = tmp / name
    p.write_bytes(gzip.compress(body) if gz else body)
    return p


def test_hostile_and_broken_trace_files_are_one_line_and_store_nothing(imported: Path, tmp_path: Path) -> None:
    db = tmp_path / "h.duckdb"
    shutil.copy(imported, db)
    before = duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM trace_kernels").fetchone()
    good = HTA_DATA / "sampled-128ranks" / "rank-0.json.gz"
    cases = {
        "not-gzip.json.gz": (b"\x1f\x8bnot really gzip", False, "not a readable gzip file"),
        "text.json": (b"hello", False, "not a PyTorch profiler trace"),
        "noevents.json": (b'{"distributedInfo": {"rank": 0}}', False, "no traceEvents"),
        "norank.json": (b'{"traceEvents": []}', False, "no distributedInfo"),
        "badrank.json": (b'{"distributedInfo": {"rank": -3}, "traceEvents": []}', False, "is not a rank"),
    }
    for name, (body, gz, says) in cases.items():
        bad = _trace(tmp_path, name, body, gz)
        code, _, err = run("import", "trace", str(good), str(bad), "--job", "h", "--db", str(db))
        assert code == 1 and says in err and len(err.strip().splitlines()) <= 3, (name, err)
        assert err.strip().splitlines()[-1].startswith("Error: ") and name in err.strip().splitlines()[-1]
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # nothing writes it: refused without waiting
    code, _, err = run("import", "trace", str(fifo), "--job", "h", "--db", str(db))
    assert code == 1 and "a FIFO, not a regular file" in err
    code, _, err = run("import", "trace", str(good), str(good), "--job", "h", "--db", str(db))
    assert code == 1 and "are both rank 0" in err
    code, _, err = run("import", "trace", str(tmp_path / "nope"), "--job", "h", "--db", str(db))
    assert code == 1 and "no such file or directory" in err
    after = duckdb.connect(str(db), read_only=True).execute("SELECT count(*) FROM trace_kernels").fetchone()
    assert after == before


def test_a_decompression_bomb_stops_at_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cmdare.analytics.imports import traces

    monkeypatch.setattr(traces, "MAX_JSON", 1 << 20)
    body = b'{"distributedInfo": {"rank": 0}, "traceEvents": [{"name": "' + b"x" * (8 << 20) + b'"}]}'
    bomb = _trace(tmp_path, "bomb.json.gz", body)  # 8 MiB of JSON, 8 KiB on disk
    db = tmp_path / "b.duckdb"
    code, _, err = run("import", "trace", str(bomb), "--job", "b", "--db", str(db))
    assert code == 1 and "bomb.json.gz: more than 1 MiB of JSON once decompressed" in err, err
    assert not db.exists() or duckdb.connect(str(db), read_only=True).execute(
        "SELECT count(*) FROM trace_kernels").fetchone() == (0,)


def _rows(db: Path) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as c:
        return c.execute("SELECT job, rank, step, ts, dur, kind, stream FROM trace_kernels ORDER BY ALL").fetchall()


def test_through_a_collector_the_trace_is_stored_as_a_local_import_stores_it(imported: Path, tmp_path: Path) -> None:
    """The collector holds the file: the CLI reads and reduces the traces, then sends each rank."""
    from tests.conftest import serving

    served = tmp_path / "served.duckdb"
    connect(served).close()
    src = HTA_DATA / "sampled-128ranks"
    with serving(served) as url:
        r = CliRunner().invoke(cli, ["import", "trace", str(src), "--job", "sampled-128ranks", "--db", str(served),
                                     "--json"], obj={"server": url})
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["ranks"] == [0, 1] and json.loads(r.stdout)["kernels"] > 1000
        again = CliRunner().invoke(cli, ["import", "trace", str(src), "--job", "sampled-128ranks", "--db",
                                         str(served), "--json"], obj={"server": url})
        assert json.loads(again.stdout)["unchanged"] == 2
    local = [x for x in _rows(imported) if x[0] == "sampled-128ranks"]
    assert _rows(served) == local


@pytest.mark.parametrize(("edit", "says"), [
    (lambda r: r["kernels"].update(ts=r["kernels"]["ts"][:-1]), "kernels.kind must be a list of"),
    (lambda r: r["kernels"]["kind"].__setitem__(0, "gossip"), "kind 'gossip' is not one of"),
    (lambda r: r["kernels"]["dur"].__setitem__(0, -5), "kernels.dur holds -5, not a whole number"),
    (lambda r: r["kernels"]["ts"].__setitem__(0, 1e300), "kernels.ts holds 1e+300"),
    (lambda r: r["kernels"]["stream"].__setitem__(0, "7"), "kernels.stream holds '7'"),
    (lambda r: r.update(rank=-1), "rank -1 is not a rank"),
    (lambda r: r.update(world_size=1), "world_size 1 does not hold rank 1"),
    (lambda r: r.update(sha256="x"), "sha256 must be the file's SHA-256"),
    (lambda r: r.update(steps=None), "steps.ts must be a list"),
])
def test_a_hostile_rank_sent_to_the_collector_is_refused_whole(tmp_path: Path, edit, says: str) -> None:
    import urllib.error
    import urllib.request

    from cmdare.analytics.imports import traces
    from tests.conftest import serving

    with __import__("tempfile").TemporaryDirectory() as tmp:
        t = traces.read(HTA_DATA / "sampled-128ranks" / "rank-1.json.gz", Path(tmp))
    rank = traces.payload(t)
    edit(rank)
    served = tmp_path / "s.duckdb"
    connect(served).close()
    with serving(served) as url:
        req = urllib.request.Request(url + "/api/v1/imports/trace", json.dumps({"job": "h", "rank": rank}).encode(),
                                     {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        body = json.loads(e.value.read())
    assert e.value.code == 400 and says in body["error"] and "\n" not in body["error"], body
    assert _rows(served) == []
