"""Spot VM lives from records (analyze import lives): CM-DARE's measured GCE preemptible lives
and the shape cloud logs give; the lifetime fit, predict revocation and recommend region on
them, each answer saying which lives it used."""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from tests.analytics.conftest import DATA
from tests.conftest import serving

LIVES = DATA / "lifetimes" / "lives.csv"
HOURS = (1, 3, 6, 12, 23, 24)  # the issue's, and the 24 h cap itself (max_lifetime: not revoked)


def run(*args: str, server: str | None = None) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), obj={"server": server} if server else None)
    return r.exit_code, r.stdout, r.stderr


def fractions() -> dict[tuple[str, str], dict[int, float]]:
    """Per (accelerator, region): the file's own fraction of VMs preempted within H hours."""
    by: dict[tuple[str, str], list[tuple[float, bool]]] = defaultdict(list)
    with LIVES.open() as f:
        for r in csv.DictReader(f):
            by[(r["accelerator"], r["region"])].append((float(r["lifetime_s"]), r["ended_by"] == "preempted"))
    return {k: {h: sum(1 for s, p in v if p and s <= h * 3600) / len(v) for h in HOURS} for k, v in by.items()}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("lives") / "l.duckdb"
    connect(db).close()
    code, out, err = run("import", "lives", str(LIVES), "--db", str(db), "--json")
    assert code == 0, err
    assert json.loads(out) == {"kind": "lives", "records": 191, "stored": 191, "duplicates": 0, "files": 1}
    code, out, err = run("fit", "lifetime", "--db", str(db))
    assert code == 0, err
    return db


def test_predictions_are_the_shared_files_own_fractions(fitted: Path) -> None:
    errors = []
    for (acc, region), want in sorted(fractions().items()):
        for h in HOURS:
            code, out, err = run("predict", "revocation", "--region", region, "--gpu-type", acc, "--hours", str(h),
                                 "--db", str(fitted), "--json")
            assert code == 0, err
            got = json.loads(out)
            assert got["lives_used"] == "imported" and got["recorded_lives"] == 0 and got["imported_lives"] >= 8
            errors.append(abs(got["prediction"] - want[h]))
            lo, hi = got["interval"]
            assert lo <= got["prediction"] <= hi
    assert max(errors) < 1e-9, max(errors)  # every group has 8 lives or more: its own Kaplan-Meier curve


def test_regions_are_ranked_by_the_files_fractions(fitted: Path) -> None:
    want = fractions()
    for acc in ("k80", "p100", "v100"):
        code, out, err = run("recommend", "region", "--gpu-type", acc, "--hours", "12", "--db", str(fitted), "--json")
        assert code == 0, err
        rec = json.loads(out)
        a = rec["assumptions"]
        ranked = [a[f"rank_{i}"] for i in range(1, 5)]
        truth = sorted((v[12], region) for (ac, region), v in want.items() if ac == acc)
        assert ranked == [r for _, r in truth], (acc, ranked, truth)
        assert rec["action"]["region"] == truth[0][1]
        assert rec["predicted"]["revocation_probability"] == pytest.approx(truth[0][0], abs=1e-4)
        assert a["lives_used"] == "imported" and a["imported_lives"] == sum(
            1 for r in csv.DictReader(LIVES.open()) if r["accelerator"] == acc)


def test_cloud_log_lives_censor_what_did_not_end_in_a_revocation(tmp_path: Path) -> None:
    """max_lifetime, deleted and running are not revocations: ten VMs, five preempted at 1 h,
    the rest reaching the cap, deleted, or still running: P(revoked) stays 0.5 to the end."""
    f = tmp_path / "gce.csv"
    rows = ["vm,zone,instance_type,accelerator,created,ended,ended_by"]
    for i in range(5):
        rows.append(f"p-{i},us-east1-b,n1-standard-8,T4,2026-11-01T00:00:00Z,2026-11-01T01:00:00Z,preempted")
    rows += ["m-0,us-east1-c,n1-standard-8,t4,2026-11-01T00:00:00Z,2026-11-02T00:00:00Z,max_lifetime",
             "m-1,us-east1-c,n1-standard-8,t4,2026-11-01T00:00:00+02:00,2026-11-01T22:00:00Z,max_lifetime",
             "d-0,us-east1-d,,t4,2026-11-01T00:00:00Z,2026-11-01T20:00:00Z,deleted",
             "r-0,us-east1-b,,t4,2026-11-01T00:00:00Z,,running",
             "r-1,us-east1-b,,t4,2026-11-01T00:00:00Z,,running"]
    f.write_text("\n".join(rows) + "\n")
    as_of = 1793577600  # 2026-11-02T00:00:00Z: the running VMs were alive 24 h in
    os.utime(f, (as_of, as_of))
    db = tmp_path / "g.duckdb"
    connect(db).close()
    code, out, err = run("import", "lives", str(f), "--db", str(db))
    assert code == 0 and "imported 10 spot VM lives from 1 file(s)" in out, err
    with duckdb.connect(str(db), read_only=True) as c:
        got = dict(c.execute("SELECT vm, lifetime_seconds FROM spot_lives").fetchall())
        assert c.execute("SELECT DISTINCT region FROM spot_lives").fetchall() == [("us-east1",)]
    assert got["p-0"] == 3600 and got["m-1"] == 24 * 3600 and got["d-0"] == 20 * 3600 and got["r-0"] == 24 * 3600
    code, out, err = run("fit", "lifetime", "--db", str(db), "--json")
    assert code == 0, err
    for h in (0.5, 1, 12, 23.9, 24, 30):  # past the cap too: a capped life is no revocation
        code, out, err = run("predict", "revocation", "--region", "us-east1", "--gpu-type", "t4", "--hours", str(h),
                             "--db", str(db), "--json")
        assert json.loads(out)["prediction"] == (0.0 if h < 1 else 0.5), (h, out)
    # the same file again stores nothing; a later export of a running VM, now preempted, is
    # that VM's life from then on (one life, its final state)
    code, out, _ = run("import", "lives", str(f), "--db", str(db), "--json")
    assert json.loads(out)["stored"] == 0 and json.loads(out)["duplicates"] == 10
    g = tmp_path / "gce-later.csv"
    g.write_text(rows[0] + "\nr-0,us-east1-b,,t4,2026-11-01T00:00:00Z,2026-11-01T02:00:00Z,preempted\n")
    assert run("import", "lives", str(g), "--db", str(db))[0] == 0
    run("fit", "lifetime", "--db", str(db))
    code, out, _ = run("predict", "revocation", "--region", "us-east1", "--gpu-type", "t4", "--hours", "3",
                       "--db", str(db), "--json")
    assert json.loads(out)["prediction"] == pytest.approx(0.6) and json.loads(out)["lives"] == 10


@pytest.mark.parametrize(("row", "words"), [
    ("x,k80,us-east1,,spot,100,,,revoked", "line 2: ended_by 'revoked' is not one of preempted, max_lifetime"),
    ("x,k80,,,spot,100,,,preempted", "line 2: region is empty (give region, or zone)"),
    ("x,k80,,us-east1,spot,100,,,preempted", "line 2: zone 'us-east1' is not a zone name"),
    ("x,k80,us-west1,us-east1-b,spot,100,,,preempted", "line 2: zone us-east1-b is not in region us-west1"),
    ("x,k80,us-east1,,spot,,,,preempted", "line 2: give lifetime_s, or created and ended"),
    ("x,k80,us-east1,,spot,,2026-11-01T00:00:00Z,,preempted", "line 2: ended is empty (only a running VM"),
    ("x,k80,us-east1,,spot,,2026-11-01T02:00:00Z,2026-11-01T01:00:00Z,preempted", "line 2: ended is not after created"),
    ("x,k80,us-east1,,spot,,yesterday,2026-11-01T01:00:00Z,preempted", "line 2: created 'yesterday' is not an ISO 8601"),
    ("x,k80,us-east1,,spot,,1900-01-01T00:00:00,1900-01-02T00:00:00,preempted", "line 2: created '1900-01-01T00:00:00' is out of range"),
    ("x,k80,us-east1,,spot,nan,,,preempted", "line 2: lifetime_s 'nan' is out of range"),
    ("x,k80,us-east1,,spot,99999999,,,preempted", "line 2: lifetime_s '99999999' is out of range"),
    ("x,k 80,us-east1,,spot,100,,,preempted", "line 2: accelerator 'k 80' is not a name"),
    ("x,k80,us-east1,,reserved,100,,,preempted", "line 2: purchase 'reserved' is not spot or on-demand"),
])
def test_bad_lives_are_one_line_and_nothing_is_half_imported(tmp_path: Path, row: str, words: str) -> None:
    db = tmp_path / "b.duckdb"
    connect(db).close()
    good = tmp_path / "a.csv"
    good.write_text("vm,accelerator,region,zone,purchase,lifetime_s,created,ended,ended_by\n"
                    "g,k80,us-east1,,spot,100,,,preempted\n")
    bad = tmp_path / "b.csv"
    bad.write_text("vm,accelerator,region,zone,purchase,lifetime_s,created,ended,ended_by\n" + row + "\n")
    code, _, err = run("import", "lives", str(good), str(bad), "--db", str(db))
    last = err.strip().splitlines()[-1]  # after a progress line a file
    assert code == 1 and words in last and "b.csv" in last and err.count("Error") == 1, err
    with duckdb.connect(str(db), read_only=True) as c:
        assert c.execute("SELECT count(*) FROM spot_lives").fetchall() == [(0,)]


def test_a_file_without_ended_by_says_the_format(tmp_path: Path) -> None:
    f = tmp_path / "x.csv"
    f.write_text("vm,accelerator,region,lifetime_s\nx,k80,us-east1,100\n")
    code, _, err = run("import", "lives", str(f), "--db", str(tmp_path / "x.duckdb"))
    assert code == 1 and "missing required column ended_by (a lives file has accelerator, ended_by)" in err


def test_through_a_collector_lives_arrive_as_a_local_import_stores_them(tmp_path: Path) -> None:
    f = tmp_path / "gce.csv"
    f.write_text("vm,zone,accelerator,created,ended,ended_by\n"
                 "a,us-east1-b,v100,2026-11-01T00:00:00Z,2026-11-01T03:00:00Z,preempted\n"
                 "b,us-east1-b,v100,2026-11-01T00:00:00Z,,running\n")
    os.utime(f, (1793577600, 1793577600))
    local, served = tmp_path / "l.duckdb", tmp_path / "s.duckdb"
    connect(local).close()
    connect(served).close()
    assert run("import", "lives", str(f), "--db", str(local))[0] == 0
    with serving(served) as url:
        code, out, err = run("import", "lives", str(f), "--db", str(served), "--json", server=url)
        assert code == 0 and json.loads(out)["stored"] == 2, err
    q = "SELECT id, vm, lifetime_seconds, ended_by FROM spot_lives ORDER BY vm"
    with duckdb.connect(str(local), read_only=True) as a, duckdb.connect(str(served), read_only=True) as b:
        assert a.execute(q).fetchall() == b.execute(q).fetchall()
        assert b.execute(q).fetchall()[1][2] == 24 * 3600  # censored at the file's time, sent along


def test_recorded_and_imported_lives_fit_together_and_say_so(tmp_path: Path) -> None:
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import encode_many
    from tests.fakes.fleet import Fleet

    db = tmp_path / "both.duckdb"
    f = Fleet(seed=3)
    f.vm_lives(per_group=20)
    con = connect(db)
    Writer(con).write([("lives", encode_many(f.events))])
    con.close()
    assert run("import", "lives", str(LIVES), "--db", str(db))[0] == 0
    code, out, err = run("fit", "lifetime", "--db", str(db), "--json")
    assert code == 0, err
    code, out, _ = run("predict", "revocation", "--region", "us-central1", "--gpu-type", "v100", "--hours", "3",
                       "--db", str(db), "--json")
    got = json.loads(out)
    assert got["lives_used"] == "both" and got["imported_lives"] == 15 and got["recorded_lives"] >= 10
    code, out, _ = run("predict", "revocation", "--region", "us-west1", "--gpu-type", "p100", "--hours", "3",
                       "--db", str(db), "--json")
    assert json.loads(out)["lives_used"] == "imported"


def test_provisioning_counts_revocations_from_imported_lives(fitted: Path, tmp_path: Path) -> None:
    from tests.analytics.recommend.test_provision import GCE

    prof = tmp_path / "p.toml"
    prof.write_text(GCE)
    code, out, err = run("recommend", "provision", "--profile", str(prof), "--loss", "0.8", "--deadline", "45m",
                         "--db", str(fitted), "--json")
    assert code == 0, err
    a = json.loads(out)["assumptions"]
    assert a["lives_used"] == "imported" and a["imported_lives"] >= 15 and a["recorded_lives"] == 0
    assert a["expected_revocations"] > 0


def test_lives_over_the_api_check_what_a_client_sends(tmp_path: Path) -> None:
    from cmdare.analytics import api
    from cmdare.analytics.db import AnalyticsError, Database

    db = Database(tmp_path / "a.duckdb")
    run_ = {"vm": "r", "accelerator": "v100", "zone": "us-east1-b", "created": "2026-11-01T00:00:00Z",
            "ended_by": "running"}
    for as_of, words in (("soon", "import: line 2: as_of 'soon' is not an ISO 8601 time"),
                         ("2026-10-01T00:00:00Z", "import: line 2: ended is not after created"),
                         ("9999-01-01T00:00:00", "import: line 2: as_of '9999-01-01T00:00:00' is out of range")):
        with pytest.raises(AnalyticsError) as e:
            api.import_overheads(db, "lives", [{**run_, "as_of": as_of}])
        assert str(e.value).startswith(words), str(e.value)
    got = api.import_overheads(db, "lives", [{**run_, "as_of": "2026-11-01T06:00:00Z"}])
    assert got["stored"] == 1
    with duckdb.connect(str(tmp_path / "a.duckdb"), read_only=True) as c:
        assert c.execute("SELECT lifetime_seconds, region FROM spot_lives").fetchall() == [(6 * 3600.0, "us-east1")]


def test_on_demand_lives_never_enter_the_spot_fit(tmp_path: Path) -> None:
    """Issue 67: with the purchase filter dropped, on-demand VMs (never revoked) entered the
    spot fit: P(revoked by 3 h) fell from 0.5 to 0.25. Ten spot lives, five preempted at 1 h;
    ten on-demand lives deleted at 10 h."""
    f = tmp_path / "mixed.csv"
    rows = ["vm,accelerator,region,purchase,lifetime_s,ended_by"]
    rows += [f"s-{i},t4,us-east1,spot,{3600 if i < 5 else 36000},{'preempted' if i < 5 else 'deleted'}"
             for i in range(10)]
    rows += [f"o-{i},t4,us-east1,on-demand,36000,deleted" for i in range(10)]
    f.write_text("\n".join(rows) + "\n")
    db = tmp_path / "m.duckdb"
    connect(db).close()
    assert run("import", "lives", str(f), "--db", str(db))[0] == 0
    assert run("fit", "lifetime", "--db", str(db))[0] == 0
    code, out, err = run("predict", "revocation", "--region", "us-east1", "--gpu-type", "t4", "--hours", "3",
                         "--db", str(db), "--json")
    assert code == 0, err
    assert json.loads(out)["prediction"] == pytest.approx(0.5) and json.loads(out)["lives"] == 10
