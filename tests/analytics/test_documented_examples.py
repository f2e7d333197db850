"""Every ``analyze`` example the README, the docs and ``--help`` show, run as written against
a database holding what they name (CM-DARE's runs imported, the demo's simulated fleet with
its jobs renamed as the examples call them, spot VM lives, the four fits) from a folder
holding the files they name. Each must succeed, and what it predicts or recommends must be
physical: finite, not negative where a quantity cannot be, every interval of non-zero width
around its figure."""

from __future__ import annotations

import csv
import glob
import json
import math
import re
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many

from .conftest import DATA

# every documented analyze example, over a fleet and a lake: scripts/test-fast leaves it to the full run
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _from_text(text: str) -> list[str]:
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if pending:
            line, pending = pending + " " + line, ""
        if not line.startswith("analyze ") or "[" in line.split("#")[0]:
            continue
        line = re.split(r"\s#", line)[0].rstrip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        out.append(line)
    return out


def _help_texts(group: Any = cli) -> list[str]:
    import click

    texts = [group.help or ""]
    for cmd in getattr(group, "commands", {}).values():
        texts += _help_texts(cmd) if isinstance(cmd, click.Group) else [cmd.help or ""]
    return texts


def examples() -> list[str]:
    found = _from_text((ROOT / "README.md").read_text())
    for p in sorted((ROOT / "docs").glob("*.md")):
        found += _from_text(p.read_text())
    for t in _help_texts():
        found += _from_text(t.replace("\\\n", "\\\n"))
    return sorted(set(found))


EXAMPLES = examples()

# what the examples call jobs and nodes, and the demo fleet's jobs and nodes that are them
RENAME = {"sim-input-6": "resnet50-a", "sim-healthy-1-n0": "gpu-7"}


@pytest.fixture(scope="module")
def place(real_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fakes.fleet import DemoFleet, Fleet

    d = tmp_path_factory.mktemp("documented")
    db = d / "cmdare.duckdb"
    shutil.copy(real_db, db)
    rows = list(csv.DictReader(open(DATA / "jobs.csv")))

    def imp(job: str, r: dict[str, str]) -> None:
        args = ["import", "tensorboard", str(DATA / r["file"]), "--db", str(db), "--job", job, "--gpu-type",
                r["gpu_type"], "--workers", r["workers"], "--ps", r["ps"], "--model", r["model"], "--flops-per-step",
                r["flops_per_step"], "--params", r["params"], "--tensors", r["tensors"], "--batch-size", r["batch_size"]]
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, res.output

    single = [r for r in rows if r["workers"] == "1" and r["model"] == "resnet15"]
    imp("resnet-1gpu", next(r for r in single if r["gpu_type"] == "P100"))
    imp("resnet-k80", next(r for r in single if r["gpu_type"] == "K80"))
    demo = DemoFleet(seed=1, t0=time.time() - 40 * 60)
    demo.build()
    for e in demo.events:
        for k in ("job", "node"):
            for a, b in RENAME.items():
                if e[k] == a or e[k].startswith(a + "-"):
                    e[k] = b + e[k][len(a):]
        if e["node"].startswith("sim-healthy") or e["node"] == "gpu-7":
            e["labels"] = {**e["labels"], "team": "vision"}
    lives = Fleet(seed=2)
    lives.vm_lives(per_group=40)
    from cmdare.wire.events import EventFactory

    k8s = EventFactory("k8s-n0", "worker", "")  # a Kubernetes pod's idle GPUs, no track: the docs' nlp/bert-0
    pod = [k8s.line("gpu", {"index": i, "uuid": f"GPU-k8s-{i}", "name": "NVIDIA A100-SXM4-40GB", "util_gpu_ratio": 0.0,
                            "mem_used_bytes": 30 << 30, "namespace": "nlp", "pod": "bert-0", "container": "main"},
                    demo.t0 + 10.0 * k, job="nlp/bert-0") for k in range(180) for i in (0, 1)]
    con = connect(db)
    Writer(con).write([("demo", encode_many(demo.events)), ("lives", encode_many(lives.events)), ("pod", b"".join(pod))])
    con.close()
    for kind, f in (("checkpoints", "checkpoints.csv"), ("startups", "startup.csv")):  # CM-DARE's overheads
        res = CliRunner().invoke(cli, ["import", kind, str(DATA / "overheads" / f), "--db", str(db)])
        assert res.exit_code == 0, res.output
    for kind in ("speed", "cluster", "lifetime", "overhead"):
        res = CliRunner().invoke(cli, ["fit", kind, "--db", str(db)])
        assert res.exit_code == 0, (kind, res.output)
    # the trace the examples read (whichever worker runs `analyze trace` before the import example)
    res = CliRunner().invoke(cli, ["import", "trace", str(ROOT / "docs" / "examples" / "traces"), "--job", "ddp-resnet",
                                   "--db", str(db)])
    assert res.exit_code == 0, res.output
    # the files the examples name: the ones docs/examples ships, and the database
    shutil.copytree(ROOT / "docs" / "examples", d, dirs_exist_ok=True)
    shutil.copy(db, d / "fleet.duckdb")
    # the lake the --lake examples name, holding the same (cmdare-collector to-lake)
    from cmdare.collector.lake import Lake, load_database

    lake = Lake(str(d / "lake"))
    lake.ensure()
    con = connect(db, read_only=True)
    load_database(lake, con, str(db))
    con.close()
    return d


@pytest.fixture(scope="module")
def server(place: Path):
    """A live collector API over the examples' database, for the ``--server URL`` examples."""
    from cmdare.analytics.server.service import HttpConfig, Service

    shutil.copy(place / "cmdare.duckdb", place / "served.duckdb")
    con = connect(place / "served.duckdb")
    svc = Service(con, place / "served.duckdb", HttpConfig("127.0.0.1", 0))
    url = svc.start()
    svc.ready = True
    yield url
    svc.stop()
    con.close()


def _argv(example: str, d: Path, server: str | None = None) -> list[str]:
    argv = []
    for a in shlex.split(example)[1:]:
        a = str(d / "lake") if a == "/srv/cmdare-lake" else a
        argv += sorted(glob.glob(str(d / a))) if "*" in a and " " not in a and "/" in a else [a]
    if "--server" in argv:
        argv[argv.index("--server") + 1] = server or ""
    elif "--db" not in argv and _takes_db(argv):
        argv += ["--db", str(d / "cmdare.duckdb")]
    return argv


def _takes_db(argv: list[str]) -> bool:
    import click

    cmd: Any = cli
    for a in argv:
        if not isinstance(cmd, click.Group) or a not in cmd.commands:
            break
        cmd = cmd.commands[a]
    return any(p.name == "db" for p in cmd.params)


NONNEG = re.compile(r"(seconds|hours|per_second|per_hour|dollars|probability|workers|ps|revocations|rate|"
                    r"steps|speed|capacity|batch|iterations|images|share|prediction)")


def _physical(out: Any, where: str) -> None:
    """Finite numbers; quantities that cannot be negative are not; intervals around their
    figure with a width."""
    def walk(x: Any, key: str) -> None:
        if isinstance(x, float):
            assert math.isfinite(x), (where, key, x)
            if NONNEG.search(key) and "gain" not in key and "adds" not in key and "skew" not in key:
                assert x >= 0, (where, key, x)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, k)
        elif isinstance(x, list):
            for v in x:
                walk(v, key)

    walk(out, "")
    items = out if isinstance(out, list) else [out]
    for o in items:
        if not isinstance(o, dict):
            continue
        if "prediction" in o and "interval" in o and None not in o["interval"]:
            lo, hi = o["interval"]
            assert lo < hi and lo <= o["prediction"] <= hi, (where, o["prediction"], lo, hi)
        for k, iv in (o.get("interval") or {}).items() if isinstance(o.get("interval"), dict) else ():
            assert iv[0] < iv[1], (where, k, iv)  # never a zero-width interval
            v = (o.get("predicted") or {}).get(k)
            if v is not None:
                assert iv[0] <= v <= iv[1], (where, k, v, iv)


def test_the_examples_were_found() -> None:
    assert len(EXAMPLES) >= 50
    for must in ("analyze predict speed --gpu-type v100 --flops-per-step 3.1e12 --params 25.6e6",
                 "analyze recommend region --gpu-type v100 --hours 12",
                 "analyze import tensorboard runs/resnet50-k80x4 --job resnet50-k80x4 --gpu-type k80 --workers 4 "
                 "--ps 1 --model resnet50 --batch-size 32"):
        assert must in EXAMPLES, must


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_documented_example_runs_and_answers_in_physical_ranges(place: Path, example: str, request,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(place)
    argv = _argv(example, place, request.getfixturevalue("server") if "--server" in example else None)
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 0, (example, res.output[-800:])
    assert "Traceback" not in res.output
    if not {"--json", "--csv", "--wide"} & set(argv):  # issue 66: every default output within 120 columns
        wide = [x for x in res.output.splitlines() if len(x) > 120 and not x.lstrip().startswith(("{", "["))]
        assert not wide, (example, wide[0])
    if argv[0] in ("predict", "recommend") and "--json" not in argv:
        res = CliRunner().invoke(cli, [*argv, "--json"])
        assert res.exit_code == 0, (example, res.output[-800:])
    if argv[0] in ("predict", "recommend"):  # what it predicts or recommends is physical
        for line in res.stdout.splitlines() if argv[0] == "recommend" else [res.stdout]:
            if line.strip().startswith(("{", "[")):
                _physical(json.loads(line), example)


@pytest.mark.parametrize("bad", [
    {"prediction": 1.0, "interval": [1.0, 1.0]},  # zero width
    {"prediction": 2.0, "interval": [0.5, 1.5]},  # the figure outside its interval
    {"prediction": float("nan"), "interval": [0.5, 1.5]},
    {"predicted": {"steps_per_second": -3.0}},
    {"predicted": {"capacity_per_second": 767.4}, "interval": {"capacity_per_second": [767.4, 767.4]}},
])
def test_the_physical_check_refuses_what_the_issue_found(bad: dict) -> None:
    with pytest.raises(AssertionError):
        _physical(bad, "x")
    _physical({"prediction": 1.0, "interval": [0.5, 1.5], "predicted": {"marginal_gain": -0.1}}, "ok")
