"""Accounting's numbers to the digit (analytics/goodput/accounting.py): prices node by node from a
catalogue given, the roll-up's and a job table's rounding, evidence that cannot be a share,
stored findings preferred to running the detectors, windows, and what the notes count."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import duckdb
import pytest

from cmdare.analytics import nodecost
from cmdare.analytics.goodput import accounting
from cmdare.analytics.prices import Price
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.analytics.test_accounting import T0, db, ev, job  # noqa: F401  (db: the module fixture)

A100 = "NVIDIA A100-SXM4-40GB"


def price(region: str, itype: str, acc: str, n: int, on_demand: float | None, spot: float | None) -> Price:
    return Price("gce", region, itype, acc, n, on_demand, spot, "2026-11-01")


CAT = {("gce", p.region, p.instance_type): p for p in (
    price("us-central1", "vm-one", "A100", 1, 3.0, 1.0),  # one region only
    price("us-central1", "vm-two", "A100", 1, 2.0, 0.5),
    price("europe-west4", "vm-two", "A100", 1, 2.4, 0.6),  # two regions: a region is needed
    price("us-central1", "vm-x", "A100", 2, 8.0, 4.0),
    price("us-central1", "vm-x+2xa100-40gb", "A100", 2, 10.0, 5.0),  # the type with its GPUs first
    price("us-central1", "cpu-8", "", 0, 0.4, 0.1),  # a CPU host
    price("us-central1", "free-1", "A100", 1, 0.0, 0.0),
)}


def node(itype: str | None, region: str = "us-central1", spot: bool = False, acc: str | None = A100,
         n: int | None = 1, name: str = "n", labels: str = "{}") -> tuple:
    return (name, region, itype, spot, acc, n, labels)


@pytest.mark.parametrize(("nd", "want"), [
    (node(None), None),  # no instance type: no price
    (node("vm-one"), 3.0),
    (node("vm-one", spot=True), 1.0),
    (node("vm-one", region="mars-1"), 3.0),  # a region not listed: the type's only row
    (node("vm-two", region="mars-1"), None),  # listed in two regions: which one is unknown
    (node("vm-two", region="europe-west4", spot=True), 0.6),
    (node("vm-x", n=2), 10.0),  # TYPE+2xA100 before TYPE alone
    (node("cpu-8", n=1), None),  # a CPU host's price does not cover a GPU
    (node("cpu-8", acc=None, n=None), 0.4),  # ... and is the price of a node without one
    (node("nope"), None),
])
def test_a_vms_price_from_the_catalogue(nd: tuple, want: float | None) -> None:
    assert nodecost.vm_price(nd, CAT) == want


def test_a_jobs_price_per_gpu_hour_averages_its_priced_nodes() -> None:
    nodes = [node("vm-x", n=2, name="a"), node("vm-one", spot=True, name="b"), node("nope", name="c"),
             node(None, name="d")]
    usd, why = nodecost.gpu_price(nodes, CAT)  # no memo given: one is made
    assert usd == pytest.approx((10.0 / 2 + 1.0) / 2) and why == "price catalogue (2 of 4 nodes priced)"
    memo: dict = {}
    assert nodecost.gpu_price(nodes, CAT, memo) == (usd, why) and nodecost.gpu_price(nodes, CAT, memo) == (usd, why)
    assert nodecost.gpu_price([node("vm-two", region="mars-1")], CAT) == (
        None, "no catalogue price for the job's instance types")
    assert nodecost.gpu_price([node("free-1")], CAT)[0] == 0.0  # free is a price, not none


def test_groups_keep_an_unknown_accelerators_own_name_and_skip_bad_labels() -> None:
    g = accounting._groups([node("t", acc="Acme X1", name="a", labels="not json"),
                            node("t", acc="Acme X1", name="b", labels='{"team": "vision"}')], None)
    assert g == {"region": "us-central1", "accelerator": "Acme X1", "label:team": "vision"}
    assert accounting._groups([node("t", acc=None, n=2, region="")], "H100")["accelerator"] == "H100"
    assert accounting._groups([node("t", acc=A100)], None)["accelerator"] == "a100-40gb"


@pytest.mark.parametrize("slowdown", [0.0, -2.0])
def test_a_slowdown_that_is_not_a_slowdown_takes_no_share(slowdown: float) -> None:
    sh = accounting.shares([("straggler", {"slowdown": slowdown})], 4)
    assert sh == {"idle_accelerators": 0.0, "straggler": 0.0, "ps_wait": 0.0}


def acct(name: str, usd: float | None, **seconds: float) -> accounting.JobAccount:
    sec = dict.fromkeys(accounting.BUCKETS, 0.0) | seconds
    return accounting.JobAccount(name, 0.0, 1.0, 1, "x", sec, usd, {"region": "r"})


def test_the_roll_up_to_the_digit() -> None:
    accs = [acct("a", 2.0, productive=7000.0, startup=1200.0),  # 8200 s
            acct("b", 0.0, productive=900.0, input_wait=100.0),  # free: $0, and its badput $0
            acct("c", 3.0, startup=600.0),  # no productive time: all of it badput
            acct("d", None, productive=1000.0)]  # unpriced
    cols, rows = accounting.rollup(accs, "fleet")
    r = dict(zip(cols, rows[0], strict=True))
    tot = 8200 + 1000 + 600 + 1000
    assert r["jobs"] == 4 and r["unpriced_jobs"] == 1
    assert r["gpu_hours"] == round(tot / 3600, 4) == 3.0
    assert r["goodput_pct"] == round(100 * 8900 / tot, 2) == 82.41
    assert r["productive_gpu_hours"] == round(8900 / 3600, 4) == 2.4722
    assert r["startup_gpu_hours"] == round(1800 / 3600, 4) == 0.5 and r["input_wait_gpu_hours"] == 0.0278
    assert r["dollars"] == round(8200 / 3600 * 2 + 600 / 3600 * 3, 2) == 5.06
    assert r["badput_dollars"] == round(1200 / 3600 * 2 + 600 / 3600 * 3, 2) == 1.17


def test_a_job_table_to_the_digit(db: Path) -> None:  # noqa: F811
    """c1: 4 GPUs x 380 s, start-up 20 s, 20 % input wait, spot a2-highgpu-1g at $1.1016."""
    with duckdb.connect(str(db), read_only=True) as con:
        cols, rows = accounting.job_table(con, "c1", None, None)
    assert cols == ["category", "seconds", "gpu_hours", "pct", "dollars"]
    by = {r[0]: r[1:] for r in rows}
    assert by["startup"] == [80.0, 0.0222, 5.26, round(80 / 3600 * 1.1016, 4)]
    assert by["input_wait"] == [288.0, 0.08, 18.95, 0.0881]
    assert by["productive"] == [1152.0, 0.32, 75.79, 0.3525]
    assert by["total"] == [1520.0, 0.4222, 100.0, 0.4651]


def _with_finding(db_: Path, tmp: Path, kind: str, evidence: str) -> Path:
    p = tmp / "f.duckdb"
    shutil.copy(db_, p)
    with duckdb.connect(str(p)) as con:
        t0 = dt.datetime.fromtimestamp(T0, dt.timezone.utc).replace(tzinfo=None)
        con.execute("""INSERT INTO findings (kind, job, severity, confidence, window_start, window_end, summary,
                       evidence, first_detected, detected_at) VALUES (?, 'c1', 'warning', 0.9, ?, ?, 's', ?, ?, ?)""",
                    [kind, t0, t0 + dt.timedelta(hours=1), evidence, t0, t0])
    return p


def test_a_job_table_uses_the_stored_evidence_rather_than_running_the_detectors(db: Path, tmp_path: Path) -> None:  # noqa: F811
    p = _with_finding(db, tmp_path, "straggler", '{"slowdown": 1.5}')  # no coverage kept: an older database
    with duckdb.connect(str(p), read_only=True) as con:
        _, rows = accounting.job_table(con, "c1", None, None)
    by = {r[0]: r[1] for r in rows}
    assert by["straggler"] == pytest.approx(1152 / 3) and by["productive"] == pytest.approx(1152 * 2 / 3)


def test_the_fleet_table_counts_unpriced_jobs_and_windows_add_up(db: Path) -> None:  # noqa: F811
    with duckdb.connect(str(db), read_only=True) as con:
        cols, rows, notes = accounting.fleet_table(con, None, None, "fleet", detect=False)
        assert [n for n in notes if "price catalogue has no price" in n] == [
            "1 job(s) run on instance types the price catalogue has no price for: no dollars for them "
            "($CMDARE_PRICES adds prices)"]
        whole = dict(zip(cols, rows[0], strict=True))
        wcols, wrows, _ = accounting.fleet_table(con, None, None, "fleet", every=120.0, detect=False)
    assert len(wrows) >= 3 and wcols[0] == "window"
    total = sum(dict(zip(wcols, r, strict=True))["gpu_hours"] for r in wrows)
    assert total == pytest.approx(whole["gpu_hours"], abs=5e-4 * len(wrows))


def test_the_fleet_table_says_when_no_job_ran_in_the_range(db: Path) -> None:  # noqa: F811
    later = dt.datetime.fromtimestamp(T0 + 86400, dt.timezone.utc).replace(tzinfo=None)
    with duckdb.connect(str(db), read_only=True) as con:
        cols, rows, notes = accounting.fleet_table(con, later, later + dt.timedelta(hours=1), "fleet")
    assert (cols, rows, notes) == (["fleet", "jobs"], [], ["no job ran in the range"])


def test_vm_prices_of_a_jobs_nodes(tmp_path: Path) -> None:
    evs = job("j", "n1", "a2-highgpu-1g", True, A100, "t", 1)
    evs.append(ev(T0 - 5, "n2", "instance", {"cloud": "gce", "region": "us-central1", "zone": "us-central1-a",
                                              "instance_id": "id-n2", "instance_type": "n1-standard-8", "spot": False,
                                              "accelerator": None, "accelerator_count": 2, "boot_time": T0 - 60},
                  "j", {"team": "t"}))
    evs.append(ev(T0, "n2", "train_job", {"run": "j-r", "rank": 1, "world_size": 2, "model": "m"}, "j", {}))
    p = tmp_path / "v.duckdb"
    con = connect(p)
    Writer(con).write([("t", encode_many(evs))])
    con.close()
    with duckdb.connect(str(p), read_only=True) as c:
        got = nodecost.job_vm_prices(c, "j")
    assert got["n1"] == (pytest.approx(1.1016), True, "a2-highgpu-1g")
    assert set(got) == {"n1", "n2"} and got["n2"][1:] == (True, "n1-standard-8")  # GPUs counted, not named


def test_a_catalogue_given_is_the_one_used(db: Path) -> None:  # noqa: F811
    cat = {("gce", "us-central1", "a2-highgpu-1g"): price("us-central1", "a2-highgpu-1g", "A100", 1, 9.0, 7.0)}
    with duckdb.connect(str(db), read_only=True) as con:
        a = accounting.account_many(con, ["c1"], None, None, {}, cat)["c1"]
    assert a.usd_per_gpu_hour == 7.0  # spot, from the catalogue given


def test_a_job_without_gpus_or_a_world_size_counts_its_stepping_nodes(tmp_path: Path) -> None:
    evs = job("s", "n1", "a2-highgpu-1g", False, A100, "t", 0) + job("s", "n2", "a2-highgpu-1g", False, A100, "t", 0)
    p = tmp_path / "s.duckdb"
    con = connect(p)
    Writer(con).write([("t", encode_many(evs))])
    con.close()
    with duckdb.connect(str(p), read_only=True) as c:
        t0, t1 = (dt.datetime.fromtimestamp(x, dt.timezone.utc).replace(tzinfo=None) for x in (T0, T0 + 3600))
        assert accounting._gpus(c, ["s"], t0, t1) == {"s": (2, "stepping nodes")}


def test_a_jobs_nodes_are_its_declared_ones_else_those_it_stepped_on(tmp_path: Path) -> None:
    """``nodecost.job_nodes``: a job that declared its ranks (or whose agents carry its label) is on
    those nodes only; a job with neither is on the nodes it stepped on (read from the steps
    for those jobs alone)."""
    con = connect(tmp_path / "n.duckdb")
    con.execute("""INSERT INTO steps (id, ts, node, job, run, rank, interval_seconds, steps)
                   VALUES ('a', '2026-01-01 00:00:10', 'n1', 'declared', 'r', 0, 10, 5),
                          ('b', '2026-01-01 00:00:10', 'n9', 'declared', 'r', 1, 10, 5),
                          ('c', '2026-01-01 00:00:10', 'n2', 'bare', 'r', 0, 10, 5),
                          ('d', '2026-01-01 00:00:10', 'n3', 'bare', 'r', 1, 10, 5)""")
    con.execute("""INSERT INTO jobs (id, ts, node, job, run, rank, world_size)
                   VALUES ('j', '2026-01-01', 'n1', 'declared', 'r', 0, 2)""")
    got = nodecost.job_nodes(con, ["declared", "bare"])
    assert {j: [n[0] for n in ns] for j, ns in got.items()} == {"declared": ["n1"], "bare": ["n2", "n3"]}
    con.close()
