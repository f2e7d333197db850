"""region: regions ranked by the lifetime fit's revocation rate (with intervals that hold the
simulator's true hazards), start-up from the overhead fit, prices shown, thin regions
listed and not ranked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics import models
from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import Fleet


@pytest.fixture(scope="module")
def lives(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Fleet]:
    f = Fleet(seed=2)
    f.vm_lives(per_group=80)
    db = tmp_path_factory.mktemp("rg") / "rg.duckdb"
    con = connect(db)
    Writer(con).write([("sim", encode_many(f.events))])
    models.save(con, models.fit_lifetime(con))
    models.save(con, models.fit_overhead(con))
    con.close()
    return db, f


def rec(db: Path, *args: str) -> tuple[int, object, str]:
    r = CliRunner().invoke(cli, ["recommend", "region", "--db", str(db), *args])
    return r.exit_code, json.loads(r.stdout) if r.exit_code == 0 and "--json" in args else r.stdout, r.stderr


def test_regions_ranked_by_revocations_with_intervals_holding_the_truth(lives) -> None:
    db, f = lives
    code, out, err = rec(db, "--gpu-type", "v100", "--hours", "12", "--price", "us-central1=0.74", "--json")
    assert code == 0, err
    assert out["kind"] == "region" and out["action"] == {"region": "us-central1", "zone": "us-central1-a"}
    truth = f.truth.hazard_per_hour
    lo, hi = out["interval"]["revocations_per_hour"]
    assert lo <= truth[("us-central1", "v100")] <= hi
    assert out["assumptions"]["rank_2"] == "europe-west4"
    assert out["assumptions"]["rank_2_revocations_per_hour"] > out["predicted"]["revocations_per_hour"]
    assert out["predicted"]["expected_revocations"] == pytest.approx(12 * out["predicted"]["revocations_per_hour"], rel=1e-2)
    assert 30 <= out["predicted"]["startup_seconds"] <= 90  # the simulator boots agents 30-90 s after the VM
    assert out["cost"] == {"dollars_per_hour": 0.74} and len(out["fit_ids"]) == 2
    code, out, _ = rec(db, "--gpu-type", "k80", "--json")
    lo, hi = out["interval"]["revocations_per_hour"]
    assert lo <= truth[("us-central1", "k80")] <= hi


def test_thin_regions_and_missing_accelerators_are_said(lives) -> None:
    db, _ = lives
    code, _, err = rec(db, "--gpu-type", "v100", "--min-lives", "100")
    assert code == 1 and "too few v100 lives to rank regions (europe-west4: 80, us-central1: 80; --min-lives 100)" in err
    code, _, err = rec(db, "--gpu-type", "t4")
    assert code == 1 and "has no t4 lives (it has: k80, v100)" in err
    code, _, err = rec(db, "--gpu-type", "v100", "--price", "cheap")
    assert code == 1 and "--price 'cheap': expected REGION=DOLLARS_PER_HOUR" in err


def test_without_a_lifetime_fit_it_says_what_to_run(tmp_path: Path) -> None:
    db = tmp_path / "e.duckdb"
    connect(db).close()
    code, _, err = rec(db, "--gpu-type", "v100")
    assert code == 1 and "no lifetime model fitted yet (run analyze fit lifetime)" in err


def test_zones_of_the_best_region_are_ranked_and_prices_come_from_the_catalogue(tmp_path: Path) -> None:
    f = Fleet(seed=4)
    # us-central1's V100 lives split over two zones: -a at the region's 0.08 per hour, -b at 0.3
    f.vm_lives(per_group=160, zone_b={("us-central1", "v100"): 0.3})
    db = tmp_path / "z.duckdb"
    con = connect(db)
    Writer(con).write([("sim", encode_many(f.events))])
    models.save(con, models.fit_lifetime(con))
    con.close()
    code, out, err = rec(db, "--gpu-type", "v100", "--json")
    assert code == 0, err
    assert out["action"] == {"region": "us-central1", "zone": "us-central1-a"}
    a = out["assumptions"]
    assert a["zone_rank_1"] == "us-central1-a" and a["zone_rank_2"] == "us-central1-b"
    lo, hi = out["interval"]["zone_revocations_per_hour"]
    assert lo <= 0.08 <= hi
    assert a["zone_rank_2_revocations_per_hour"] > 0.15
    # no --price: the catalogue's cheapest spot V100 VM in the region, per accelerator, with its date
    assert out["cost"]["dollars_per_hour"] == 0.82 and out["cost"]["prices_as_of"] == "2025-01"
    code, out, _ = rec(db, "--gpu-type", "v100", "--min-lives", "100", "--json")
    assert code == 0 and "zone" not in out["action"]
    assert "zones of us-central1 have too few lives to rank" in out["why"]


def test_start_up_is_measured_only_where_the_boot_started_the_agent_and_one_start_has_no_interval(
        tmp_path: Path) -> None:
    """An agent started by hand hours after boot says nothing about start-up (left out and
    counted); a region with one measured start-up gets its figure and no interval (it used
    to crash on round(None)); the cloud's launch time adds the launch phase."""
    f = Fleet(seed=2)
    f.vm_lives(per_group=40)
    kept = None
    for e in f.events:
        d = e["data"]
        if e["type"] == "lifecycle" and d.get("event") == "agent_start" and "us-central1-v100" in e["node"]:
            if kept is None and d["during_boot"]:
                kept = e["node"]
            elif e["node"] != kept:
                d["during_boot"] = False  # all others of the group: started later by hand
        if e["type"] == "instance" and "europe-west4-v100" in e["node"]:
            d["launched_at"] = d["boot_time"] - 40.0  # the cloud's launch, 40 s before the kernel
    db = tmp_path / "s.duckdb"
    con = connect(db)
    Writer(con).write([("sim", encode_many(f.events))])
    models.save(con, models.fit_lifetime(con))
    fit = models.fit_overhead(con)
    models.save(con, fit)
    con.close()
    st = fit.model["vm_startup_seconds"]
    one = st["us-central1/v100/spot"]
    assert one["n"] == 1 and one["lower"] is None and 30 <= one["mean"] <= 90
    eu = st["europe-west4/v100/spot"]
    assert eu["covers"] == "launch to agent ready" and eu["n"] == 36  # 4 of 40 started by hand
    assert eu["phases"]["launch_to_boot"]["mean"] == pytest.approx(40.0, abs=1)  # lives are keyed by whole seconds
    assert 70 <= eu["mean"] <= 130 and eu["lower"] < eu["mean"] < eu["upper"]
    assert any("VM lives left out: the boot did not start the agent" in n for n in fit.notes)
    code, out, err = rec(db, "--gpu-type", "v100", "--hours", "12", "--json")
    assert code == 0, err
    assert out["action"]["region"] == "us-central1"  # the region with one start-up measured
    assert "startup_seconds" not in out["interval"] and 30 <= out["predicted"]["startup_seconds"] <= 90
    assert out["assumptions"]["startup_covers"] == "kernel boot to agent ready, 1 VM starts"
    code, text, err = rec(db, "--gpu-type", "v100")
    assert code == 0, err
    r = CliRunner().invoke(cli, ["fit", "overhead", "--db", str(db)])
    assert "vm start-up us-central1/v100/spot: mean" in r.stdout and "one sample: no interval" in r.stdout


def test_imported_start_ups_in_the_clouds_phases_rank_regions_and_replace_the_agents_view(lives, tmp_path: Path) -> None:
    """Start-ups a team imported (request to guest ready, the cloud's phases) are what a region's
    start-up is, where they measured its spot VMs of that accelerator; the agents' kernel-boot
    figure stays for the others."""
    import shutil

    src, _ = lives
    db = tmp_path / "rg.duckdb"
    shutil.copy(src, db)
    csv = tmp_path / "starts.csv"
    csv.write_text("region,purchase,gpu_type,provisioning_s,staging_s,booting_s\n"
                   + "".join(f"us-central1,spot,Tesla V100,1.5,{40 + i},41\n" for i in range(5))
                   + "us-central1,on-demand,v100,1.5,26,41\n")
    assert CliRunner().invoke(cli, ["import", "startups", str(csv), "--db", str(db)]).exit_code == 0
    r = CliRunner().invoke(cli, ["fit", "overhead", "--db", str(db)])
    assert r.exit_code == 0, r.output
    code, out, err = rec(db, "--gpu-type", "v100", "--json")
    assert code == 0, err
    assert out["action"]["region"] == "us-central1"
    # phase medians: 1.5 + staging 42 (shrunk toward the v100 spot median, the same VMs) + 41
    assert out["predicted"]["startup_seconds"] == pytest.approx(84.5, abs=0.1)
    assert out["assumptions"]["startup_covers"].startswith("request to guest ready (the cloud's phases), 5 VM starts")
