"""Jobs as Kubernetes sees them (issue 55): one simulated node whose four GPUs two pods hold,
the real GPU source asking a real kubelet pod-resources server (tests/fakes/kubelet.py) and
an API server for the pods' labels, its samples written through the collector's writer.
With no ``track`` anywhere, ``analyze gpu --processes`` names each process by its pod's job,
``gpu_idle`` finds the pod whose GPUs idle, ``analyze goodput --fleet --by namespace``
splits the GPU time by namespace, and the job page's API answers for a pod's job. A rank's
own declaration still wins over the pod (one process, one job)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import EventFactory
from tests.analytics.detectors.conftest import T0, found
from tests.fakes.kubelet import ApiServer, FakeKubelet, FakePod, serve
from tests.fakes.nvml import FakeNvml

KF = "training.kubeflow.org/job-name"
TICKS, EVERY = 180, 10.0  # 30 minutes


class IdleAbove(FakeNvml):
    """GPUs from ``idle_from`` on run nothing (utilisation 0)."""

    def __init__(self, idle_from: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.idle_from = idle_from

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:  # noqa: N802 (NVML's name)
        u = super().nvmlDeviceGetUtilizationRates(h)
        return SimpleNamespace(gpu=0, memory=0) if h.index >= self.idle_from else u


def node(tmp_path: Path, declare: bool = False, rollup: bool = True, tracked: bool = False) -> Path:
    """The node's database: pod vision/resnet-worker-0 (Kubeflow job resnet50-a) holds GPUs 0
    and 1 and works them; pod nlp/bert-0 (no job label) holds GPUs 2 and 3 and idles.
    ``tracked``: resnet's pod has no job label, and its code calls track as job
    resnet-tracked (declared, stepping)."""
    from cmdare.agent.sources.gpu import GpuSource

    nv = IdleAbove(2, gpus=4, model="a100")
    g = [d.uuid for d in nv.devs]
    k = FakeKubelet([FakePod("vision", "resnet-worker-0", {"trainer": g[:2]}, labels={} if tracked else {KF: "resnet50-a"}),
                     FakePod("nlp", "bert-0", {"main": g[2:]})])
    sock = tmp_path / "kubelet.sock"
    server, api = serve(k, sock), ApiServer(k)
    agent = EventFactory("k8s-n0", "worker", "", rows=True)
    lines: list[bytes] = []
    if declare:  # resnet's rank 0 declares its PID (the fake's process on GPU 0) with track
        lines.append(agent.line("train_job", {"run": "r", "rank": 0, "pid": 4000, "world_size": 2}, T0, job="resnet50-a"))
    if tracked:
        lines.append(agent.line("train_job", {"run": "r", "rank": 0, "pid": 4000, "world_size": 2}, T0,
                                job="resnet-tracked"))
        lines += [agent.line("train_steps", {"run": "r", "rank": 0, "steps": 10, "steps_per_second": 1.0,
                                             "interval_seconds": EVERY}, T0 + i * EVERY, job="resnet-tracked")
                  for i in range(1, TICKS)]
    src = GpuSource(GpuSource.parse_config("sources.gpu", {"kubelet_socket": str(sock), "apiserver": api.url}), nvml=nv)
    try:
        for i in range(TICKS):
            ts = T0 + i * EVERY
            src.collect(lambda t, d, ts=ts, job=None: lines.append(agent.line(t, d, ts, job)))
    finally:
        src.close()
        server.stop(None)
        api.close()
    path = tmp_path / "k8s.duckdb"
    con = connect(path)
    assert Writer(con, rollup_every=None).write([("agent", b"".join(lines))]).dead == 0
    if rollup:
        from cmdare.collector import rollup as r

        r.run(con)
    con.close()
    return path


def analyze(db: Path, *args: str) -> Any:
    r = CliRunner().invoke(cli, ["--db", str(db), *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return node(tmp_path_factory.mktemp("k8s"))


def test_gpu_processes_are_named_by_their_pods_jobs(db: Path) -> None:
    rows = analyze(db, "gpu", "--processes")
    by = {r["gpu"]: r for r in rows}
    assert {g: (r["job"], r["named_by"], r["namespace"], r["pod"]) for g, r in by.items()} == {
        0: ("resnet50-a", "kubernetes", "vision", "resnet-worker-0"),
        1: ("resnet50-a", "kubernetes", "vision", "resnet-worker-0"),
        2: ("nlp/bert-0", "kubernetes", "nlp", "bert-0"),  # no job label: namespace/pod
        3: ("nlp/bert-0", "kubernetes", "nlp", "bert-0")}
    assert by[0]["container"] == "trainer"
    assert [r["pid"] for r in analyze(db, "gpu", "--job", "nlp/bert-0")] == [4002, 4003]


def test_analyze_gpu_says_which_pod_holds_each_gpu(db: Path) -> None:
    """The question platform teams ask: which pod holds idle GPUs. The per-GPU listing names
    the pod's job (held_by), shown by default where any GPU has one."""
    rows = {r["gpu"]: r for r in analyze(db, "gpu")}
    assert {g: (r["held_by"], r["namespace"], r["pod"], r["util_pct"] > 50) for g, r in rows.items()} == {
        0: ("resnet50-a", "vision", "resnet-worker-0", True), 1: ("resnet50-a", "vision", "resnet-worker-0", True),
        2: ("nlp/bert-0", "nlp", "bert-0", False), 3: ("nlp/bert-0", "nlp", "bert-0", False)}
    r = CliRunner().invoke(cli, ["--db", str(db), "gpu"])
    assert r.exit_code == 0 and "held_by" in r.stdout.splitlines()[0] and "nlp/bert-0" in r.stdout
    every = analyze(db, "gpu", "--every", "5m")  # per bucket too (the rollup's early buckets alike)
    assert {x["held_by"] for x in every if x["gpu"] == 2} == {"nlp/bert-0"}


def test_a_declaration_wins_over_the_pod(tmp_path: Path) -> None:
    rows = analyze(node(tmp_path, declare=True), "gpu", "--processes")
    by = {r["pid"]: (r["job"], r["named_by"], r["rank"]) for r in rows}
    assert by[4000] == ("resnet50-a", "track", 0) and by[4001] == ("resnet50-a", "kubernetes", None)


@pytest.mark.parametrize("rolled", [True, False])
def test_gpu_idle_names_the_idle_pod_with_no_steps_anywhere(db: Path, tmp_path: Path, rolled: bool) -> None:
    path = db if rolled else node(tmp_path, rollup=False)  # the rollup's buckets and the raw samples alike
    con = connect(path)
    try:
        assert con.execute("SELECT count(*) FROM steps").fetchone() == (0,)
        f = found(con, "gpu_idle")
    finally:
        con.close()
    assert sorted(f) == ["nlp/bert-0"]  # resnet's GPUs work
    (x,) = f["nlp/bert-0"]
    assert (x.node, x.subject, x.severity) == ("k8s-n0", "2,3", "critical")  # every GPU of the pod: stalled?
    assert x.evidence["idle_gpus"] == 2 and x.evidence["gpu_hours_wasted"] == pytest.approx(1.0, abs=0.01)
    assert x.summary.startswith("2 of 2 GPUs on k8s-n0 idle while the job ran")
    assert (x.evidence["namespace"], x.evidence["pod"], x.evidence["container"]) == ("nlp", "bert-0", "main")


def test_goodput_by_namespace_splits_the_pods_gpu_time(db: Path) -> None:
    r = CliRunner().invoke(cli, ["--db", str(db), "goodput", "--fleet", "--by", "namespace", "--json"])
    assert r.exit_code == 0, r.output
    rows = {x["namespace"]: x for x in json.loads(r.stdout)}
    assert sorted(rows) == ["nlp", "vision"]
    v, n = rows["vision"], rows["nlp"]
    assert v["gpu_hours"] == pytest.approx(1.0, abs=0.01) and v["goodput_pct"] == 100.0  # 2 GPUs x 30 min, busy
    assert n["gpu_hours"] == pytest.approx(1.0, abs=0.01) and n["goodput_pct"] == 0.0
    assert n["idle_accelerators_gpu_hours"] == pytest.approx(1.0, abs=0.01)
    assert "Kubernetes pods or Slurm jobs that sent no step telemetry" in r.stderr
    jobs = {x["job"]: x["jobs"] for x in analyze(db, "goodput", "--fleet", "--by", "job")}
    assert jobs == {"nlp/bert-0": 1, "resnet50-a": 1}


def test_a_pod_that_ran_a_tracked_job_is_that_job_not_counted_twice(tmp_path: Path) -> None:
    """resnet's pod has no job label (its GPUs say vision/resnet-worker-0) but its code calls
    track as resnet-tracked: its GPU time is resnet-tracked's, from its steps, not a second
    account for the pod; the untracked pod beside it is still accounted."""
    db = node(tmp_path, tracked=True)
    rows = {r["job"]: r for r in analyze(db, "goodput", "--fleet", "--by", "job")}
    assert sorted(rows) == ["nlp/bert-0", "resnet-tracked"]
    assert rows["resnet-tracked"]["gpu_hours"] == pytest.approx(1.0, abs=0.05)
    ns = {r["namespace"]: r["jobs"] for r in analyze(db, "goodput", "--fleet", "--by", "namespace")}
    assert ns == {"nlp": 1, "vision": 1}  # the tracked job is in its pod's namespace
    procs = {r["pid"]: (r["job"], r["named_by"]) for r in analyze(db, "gpu", "--processes")}
    assert procs[4000] == ("resnet-tracked", "track") and procs[4001] == ("vision/resnet-worker-0", "kubernetes")


def test_the_job_page_answers_for_a_pods_job(db: Path) -> None:
    from fastapi.testclient import TestClient

    from cmdare.analytics.db import Database
    from cmdare.analytics.server.http import create_app

    with TestClient(create_app(Database(db))) as c:
        q = "nlp%2Fbert-0"
        d = c.get(f"/api/v1/jobs/{q}")
        assert d.status_code == 200, d.text
        s = c.get(f"/api/v1/jobs/{q}/series").json()
        assert s["gpus"]["allocated"] == 2 and s["gpus"]["active"] == 0
        assert {(r["node"], r["gpu"]) for r in s["gpus"]["rows"]} == {("k8s-n0", 2), ("k8s-n0", 3)}
        gp = c.get(f"/api/v1/jobs/{q}/goodput")
        assert gp.status_code == 200, gp.text
