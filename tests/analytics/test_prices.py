"""The price catalogue: shipped rows for GCE, AWS and Azure with their as-of dates, extended
or replaced by $CMDARE_PRICES, bad rows refused with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmdare.analytics import catalog, prices
from cmdare.analytics.db import AnalyticsError
from tests.analytics.test_demo_fleet import demo_db  # noqa: F401  (the simulated fleet, a module fixture)

HEADER = "cloud,region,instance_type,accelerator,accelerator_count,on_demand,spot,as_of\n"


def test_shipped_catalogue_covers_three_clouds_with_known_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(prices.ENV, raising=False)
    cat = prices.load()
    assert {c for c, _, _ in cat} == {"aws", "gcp", "azure"}
    accs = catalog.load()
    for p in cat.values():
        if p.accelerator:
            assert catalog.lookup(p.accelerator, accs)  # every accelerator is in the accelerator catalogue
            assert p.accelerator_count >= 1 and p.as_of
        else:  # CPU hosts (parameter servers, input workers)
            assert p.accelerator_count == 0 and p.as_of and p.on_demand
        assert p.spot is None or p.on_demand is None or p.spot < p.on_demand
    assert prices.lookup("c5.2xlarge", cat=cat).on_demand == 0.34  # a PS VM type has a price too
    v100 = prices.lookup("p3.2xlarge", cat=cat)
    assert v100 and v100.on_demand == 3.06 and v100.region == "us-east-1"
    assert prices.lookup("no-such-type", cat=cat) is None


def test_user_rows_add_replace_or_replace_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "p.csv"
    mine.write_text(HEADER + "aws,us-east-1,p3.2xlarge,v100,1,3.06,0.71,2026-11-20\naws,us-west-2,p3.2xlarge,v100,1,3.06,0.65,2026-11-20\n")
    monkeypatch.setenv(prices.ENV, str(mine))
    cat = prices.load()
    assert cat[("aws", "us-east-1", "p3.2xlarge")].spot == 0.71 and cat[("aws", "us-east-1", "p3.2xlarge")].as_of == "2026-11-20"
    assert ("gcp", "us-central1", "a2-highgpu-1g") in cat  # the shipped rows stay
    with pytest.raises(AnalyticsError, match=r"p3.2xlarge has prices in several regions \(us-east-1, us-west-2\): name the region"):
        prices.lookup("p3.2xlarge", cat=cat)
    assert prices.lookup("p3.2xlarge", "us-west-2", cat).spot == 0.65
    mine.write_text("# cmdare-prices: replace\n" + HEADER + "gcp,europe-west4,n1-standard-8+1xv100,v100,1,2.95,0.9,2026-11-20\n")
    assert list(prices.load()) == [("gcp", "europe-west4", "n1-standard-8+1xv100")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cloud,region\n", "header must be cloud,region,instance_type"),
        (HEADER + "aws,us-east-1,x,v100,1,-3,,2026-01\n", "row 2: on_demand must be a price >= 0, got '-3'"),
        (HEADER + "aws,us-east-1,x,v100,1,cheap,,2026-01\n", "row 2: on_demand must be a number of $/hour, got 'cheap'"),
        (HEADER + "aws,us-east-1,x,v100,1,1,,last week\n", "row 2: as_of must be a date (YYYY-MM or YYYY-MM-DD), got 'last week'"),
        (HEADER + "aws,us-east-1,x,v100,one,1,,2026-01\n", "row 2: accelerator_count must be a whole number, got 'one'"),
        (HEADER + "aws,,x,v100,1,1,,2026-01\n", "row 2: cloud, region and instance_type must not be empty"),
        (HEADER + "aws,us-east-1,x,v100,1,,,2026-01\n", "row 2: x has neither an on_demand nor a spot price"),
    ],
)
def test_bad_rows_are_refused_naming_file_row_and_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str) -> None:
    mine = tmp_path / "bad.csv"
    mine.write_text(text)
    monkeypatch.setenv(prices.ENV, str(mine))
    with pytest.raises(AnalyticsError, match="bad.csv: ") as e:
        prices.load()
    assert message in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv(prices.ENV, str(tmp_path / "gone.csv"))
    with pytest.raises(AnalyticsError, match=r"\$CMDARE_PRICES: .*gone.csv: cannot read"):
        prices.load()


def test_gpus_attached_to_a_gce_vm_are_priced_as_gce_bills_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 51: 5 of the demo's 11 simulated jobs had no dollars: their N1 VMs hold 2 or 4
    V100s and the catalogue lists N1 with one. The VM's row plus N times the GPU's price
    (an N1 row with one GPU less the bare N1 row) prices any count; nothing is made up where
    a part is missing."""
    monkeypatch.delenv(prices.ENV, raising=False)
    cat = prices.load()
    gpu = 2.86 - 0.379998  # n1-standard-8+1xv100 less n1-standard-8, on demand
    four = prices.attached("n1-standard-8", "us-central1", "v100", 4, cat)
    assert four is not None and four.instance_type == "n1-standard-8+4xv100" and four.accelerator_count == 4
    assert four.on_demand == pytest.approx(0.379998 + 4 * gpu)
    assert four.spot is None  # the bare VM's spot price is not recorded: no spot total
    one = prices.attached("n1-standard-8", "us-central1", "v100", 1, cat)
    assert one.on_demand == pytest.approx(2.86)  # the listed row, recomposed
    assert prices.attached("n1-standard-8", "us-central1", "h100", 2, cat) is None  # no N1 row with an H100
    assert prices.attached("n1-standard-8", "europe-west4", "v100", 2, cat) is None  # no row in that region
    assert prices.attached("a2-highgpu-1g", "us-central1", "a100-40gb", 2, cat) is None  # a GPU VM, not a bare one
    assert prices.attached("n1-standard-8", "us-central1", "v100", 0, cat) is None


def test_every_simulated_demo_job_is_priced(monkeypatch: pytest.MonkeyPatch, demo_db: Path) -> None:  # noqa: F811
    import json

    from click.testing import CliRunner

    from cmdare.analytics.cli import cli

    monkeypatch.delenv(prices.ENV, raising=False)
    r = CliRunner().invoke(cli, ["goodput", "--fleet", "--by", "job", "--db", str(demo_db), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert rows and all(x["dollars"] is not None and x["dollars"] > 0 for x in rows if x["job"].startswith("sim-")), rows
