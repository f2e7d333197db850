"""``analyze import tensorboard`` over a directory of runs: each run its own run, one job
per run from a ``{run}`` pattern or per row of a manifest (CM-DARE's jobs.csv is one), in
one command, idempotent, checked whole before anything is stored."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from tests.analytics.conftest import DATA

ROWS = list(csv.DictReader(open(DATA / "jobs.csv")))
# three runs of two experiments: a 1-GPU run and two cluster runs
PICK = [r for r in ROWS if r["file"].endswith(("k80-ps1-w1-resnet15.csv", "p100-ps2-w4-resnet15.csv"))]


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def runs_dir(tmp: Path) -> Path:
    d = tmp / "runs"
    d.mkdir()
    for r in PICK:
        shutil.copy(DATA / r["file"], d)
    return d


def manifest(tmp: Path, rows: list[dict[str, str]], name: str = "jobs.csv") -> Path:
    m = tmp / name
    with open(m, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return m


def stored(db: Path) -> dict[str, tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {j: (n, runs, acc, ws, ps) for j, n, runs, acc, ws, ps in con.execute(
            "SELECT s.job, count(*), list(DISTINCT s.run ORDER BY s.run), any_value(j.accelerator), "
            "any_value(j.world_size), any_value(j.ps) FROM steps s JOIN jobs j USING (job) GROUP BY s.job").fetchall()}
    finally:
        con.close()


def test_a_folder_of_csv_exports_is_one_run_per_file_not_one_run_named_dot(tmp_path: Path) -> None:
    d = runs_dir(tmp_path)
    db = tmp_path / "t.duckdb"
    code, out, _ = run("import", "tensorboard", str(d), "--job", "j", "--db", str(db), "--json")
    assert code == 0, out
    res = json.loads(out)
    stems = sorted(Path(r["file"]).stem for r in PICK)
    assert res["runs"] == stems and res["files"] == len(PICK)
    assert stored(db)["j"][1] == stems


def test_a_run_pattern_makes_one_job_per_run_in_one_command(tmp_path: Path) -> None:
    d = runs_dir(tmp_path)
    db = tmp_path / "t.duckdb"
    code, out, err = run("import", "tensorboard", str(d), "--job", "cmdare-{run}", "--gpu-type", "k80",
                         "--db", str(db))
    assert code == 0, out + err
    want = sorted(r["job"] for r in PICK)  # jobs.csv names each job cmdare-<file stem>
    assert sorted(stored(db)) == want
    assert out.strip().splitlines()[-1].startswith(f"{len(PICK)} jobs, {len(PICK)} file(s): ")
    assert all(v[2] == "k80" for v in stored(db).values())  # a flag applies to every job
    assert err.count("reading: ") == len(PICK)  # progress: one line a file in a log


def test_a_manifest_declares_each_job_as_importing_each_file_by_hand_does(tmp_path: Path) -> None:
    """CM-DARE's jobs.csv, as shipped, is a manifest: the same rows as one command per file."""
    m = manifest(tmp_path, [{**r, "file": str(DATA / r["file"])} for r in PICK])
    one = tmp_path / "one.duckdb"
    code, out, err = run("import", "tensorboard", "--manifest", str(m), "--db", str(one), "--json")
    assert code == 0, out + err
    res = json.loads(out)
    assert [j["job"] for j in res["jobs"]] == [r["job"] for r in PICK]
    assert res["steps"] == sum(j["steps"] for j in res["jobs"]) > 0 and res["duplicates"] == 0

    each = tmp_path / "each.duckdb"
    for r in PICK:
        code, out, _ = run("import", "tensorboard", str(DATA / r["file"]), "--job", r["job"], "--gpu-type",
                           r["gpu_type"], "--workers", r["workers"], "--ps", r["ps"], "--db", str(each))
        assert code == 0, out
    assert stored(one) == stored(each)
    assert {j: (v[2], v[3], v[4]) for j, v in stored(one).items()} == {
        r["job"]: (r["gpu_type"], int(r["workers"]), int(r["ps"])) for r in PICK}

    code, out, _ = run("import", "tensorboard", "--manifest", str(m), "--db", str(one), "--json")
    again = json.loads(out)
    assert code == 0 and again["steps"] == 0 and again["duplicates"] == res["steps"] + len(PICK)
    assert stored(one) == stored(each)


def test_manifest_paths_are_relative_to_the_manifest_and_flags_are_defaults(tmp_path: Path) -> None:
    runs_dir(tmp_path)
    rows = [{"file": f"runs/{Path(r['file']).name}", "job": r["job"], "workers": r["workers"]} for r in PICK]
    rows[0]["workers"] = ""  # an empty cell keeps the flag's value
    m = manifest(tmp_path, rows)
    db = tmp_path / "t.duckdb"
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    old = os.getcwd()
    os.chdir(elsewhere)
    try:
        code, out, _ = run("import", "tensorboard", "--manifest", str(m), "--workers", "3", "--ps", "2",
                           "--db", str(db))
    finally:
        os.chdir(old)
    assert code == 0, out
    got = stored(db)
    assert got[PICK[0]["job"]][3:] == (3, 2)
    assert got[PICK[1]["job"]][3:] == (int(PICK[1]["workers"]), 2)


def test_the_whole_cmdare_manifest_is_one_command(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    code, out, _ = run("import", "tensorboard", "--manifest", str(DATA / "jobs.csv"), "--db", str(db), "--json")
    assert code == 0, out
    res = json.loads(out)
    assert len(res["jobs"]) == len(ROWS) == len(stored(db)) and res["files"] == len(ROWS)


def _counts(db: Path) -> tuple[int, int]:
    if not db.exists():
        return (0, 0)
    con = duckdb.connect(str(db), read_only=True)
    try:
        return tuple(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("jobs", "steps"))
    finally:
        con.close()


BAD = [
    # (manifest rows after the header "file,job,workers", extra args, the error's end)
    ("{a},ja,nan\n", [], "line 2: workers must be a whole number of at least 1, got 'nan'"),
    ("{a},ja,0\n", [], "line 2: workers must be a whole number of at least 1, got '0'"),
    ("{a},ja,1e400\n", [], "line 2: workers must be a whole number of at least 1, got '1e400'"),
    ("{a},ja,2\n{b},,2\n", [], "line 3: the job is empty (or give --job with {{run}} for rows with none)"),
    ("{a},ja,2\nnope.csv,jb,2\n", [], "line 3: " + "{tmp}/nope.csv: no such file or directory"),
    ("{a},ja,2\n{ra},jb,2\n", [], "line 3: {ra} is listed again (line 2)"),
    ("{a},ja,2\n{b},ja,4\n", [], "line 3: job 'ja' is declared differently on line 2"),
    (",ja,2\n", [], "line 2: the file is empty"),
    ("{a},ja,2\n", ["{a}"], "give PATHS or --manifest, not both (the manifest names the files)"),
    ("{a},ja,2\n", ["--job", "x"], "--job with --manifest must be a pattern with {{run}} (for rows with no job), "
                                   "or be left out"),
]


@pytest.mark.parametrize("body, extra, message", BAD)
def test_a_bad_manifest_is_one_line_and_nothing_is_stored(tmp_path: Path, body: str, extra: list[str],
                                                          message: str) -> None:
    d = runs_dir(tmp_path)
    a, b = (str(d / Path(r["file"]).name) for r in PICK[:2])
    db = tmp_path / "t.duckdb"
    assert run("import", "tensorboard", a, "--job", "before", "--db", str(db))[0] == 0
    before = _counts(db)
    m = tmp_path / "m.csv"
    ra = f"runs/{Path(a).name}"  # the same file, relative to the manifest
    m.write_text("file,job,workers\n" + body.format(a=a, b=b, ra=ra))
    args = [x.format(a=a) for x in extra]
    code, out, err = run("import", "tensorboard", *args, "--manifest", str(m), "--db", str(db))
    assert code == 1, out
    where = f"{m}: " if message.startswith("line") else ""  # a row's error names the manifest and line
    assert err.strip().splitlines() == ["Error: " + where + message.format(a=a, ra=ra, tmp=tmp_path)], err
    assert _counts(db) == before


def test_hostile_manifests_are_refused_without_waiting_or_reading_far(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    fifo = tmp_path / "m.csv"
    os.mkfifo(fifo)  # nothing writes it: the import must not wait
    code, _, err = run("import", "tensorboard", "--manifest", str(fifo), "--db", str(db))
    assert code == 1 and err.strip().endswith("m.csv: a FIFO, not a regular file")

    big = tmp_path / "big.csv"
    with open(big, "wb") as f:
        f.truncate(5 << 20)
    code, _, err = run("import", "tensorboard", "--manifest", str(big), "--db", str(db))
    assert code == 1 and err.strip().endswith("big.csv: larger than 4 MiB: not a manifest CSV")

    nohead = tmp_path / "nojob.csv"
    nohead.write_text("file,model\nx.csv,m\n")
    code, _, err = run("import", "tensorboard", "--manifest", str(nohead), "--db", str(db))
    assert code == 1 and "missing required column job" in err
    assert _counts(db) == (0, 0)


def test_a_bad_pattern_and_a_malformed_later_file_store_nothing(tmp_path: Path) -> None:
    d = runs_dir(tmp_path)
    db = tmp_path / "t.duckdb"
    code, _, err = run("import", "tensorboard", str(d), "--job", "x-{model}", "--db", str(db))
    assert code == 1 and err.strip() == "Error: --job 'x-{model}': the one placeholder is {run} (the run's name)"
    (d / "zz-broken.csv").write_text("Wall time,Step,Value\n1790000000,100,fast\n")
    code, _, err = run("import", "tensorboard", str(d), "--job", "cm-{run}", "--db", str(db))
    assert code == 1 and "zz-broken.csv: line 2: not numbers" in err.strip().splitlines()[-1]
    assert _counts(db) == (0, 0)  # the three good runs before it were not stored either


def test_a_log_directory_with_a_run_per_subdirectory_is_a_job_per_run(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    for i, r in enumerate(PICK[:2]):  # one CSV export alone in each run's directory
        (logs / f"lr-{i}").mkdir(parents=True)
        shutil.copy(DATA / r["file"], logs / f"lr-{i}" / "steps.csv")
    db = tmp_path / "t.duckdb"
    code, out, _ = run("import", "tensorboard", str(logs), "--job", "sweep-{run}", "--db", str(db), "--json")
    assert code == 0, out
    assert {j["job"]: j["runs"] for j in json.loads(out)["jobs"]} == {"sweep-lr-0": ["lr-0"], "sweep-lr-1": ["lr-1"]}
    # a single run directory given itself: {run} is its name, the run stays "."
    code, out, _ = run("import", "tensorboard", str(logs / "lr-0"), "--job", "one-{run}", "--db", str(db), "--json")
    assert code == 0 and [j["job"] for j in json.loads(out)["jobs"]] == ["one-lr-0"], out


def test_through_a_collector_each_job_is_one_call_and_rows_with_no_job_take_the_pattern(tmp_path: Path) -> None:
    from cmdare.collector.db import connect
    from tests.conftest import serving

    rows = [{"file": str(DATA / r["file"]), "job": "", "workers": r["workers"]} for r in PICK]
    rows[0]["job"] = "named"
    m = manifest(tmp_path, rows)
    served = tmp_path / "served.duckdb"
    connect(served).close()
    with serving(served) as url:
        r = CliRunner().invoke(cli, ["import", "tensorboard", "--manifest", str(m), "--job", "cm-{run}",
                                     "--db", str(served), "--json"], obj={"server": url})
        assert r.exit_code == 0, r.output
        again = CliRunner().invoke(cli, ["import", "tensorboard", "--manifest", str(m), "--job", "cm-{run}",
                                         "--db", str(served), "--json"], obj={"server": url})
    want = {"named", *(f"cm-{Path(r['file']).stem}" for r in PICK[1:])}
    assert {j["job"] for j in json.loads(r.stdout)["jobs"]} == want == set(stored(served))
    assert json.loads(again.stdout)["steps"] == 0
