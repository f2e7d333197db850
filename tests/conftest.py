"""Shared fixtures: a real Kafka broker (one per test session, from scripts/kafka), the
repo root, and helpers to run the real console commands."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KAFKA = ROOT / "scripts" / "kafka"
BIN = Path(sys.executable).parent


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short private directory for Unix sockets (AF_UNIX paths are limited to 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="cms-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def under_ci() -> bool:
    """Whether the suite runs in CI (``CI=true``, as CI services set it; .ci/run sets it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _ci_failure(rep: pytest.CollectReport | pytest.TestReport, where: str) -> None:
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    rep.outcome = "failed"
    rep.longrepr = (f"{where} would be skipped, and CI=true does not pass without it: {reason.removeprefix('Skipped: ')} "
                    "(install what it names, or run outside CI)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Under CI a test that cannot run (a tool, a data set, a permission missing) fails with
    its reason instead of skipping; outside CI it skips as before. Tests marked ``gpu`` may
    skip anywhere (CI has no GPU; they run on a GPU machine: ``pytest -m gpu``)."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and under_ci() and not hasattr(rep, "wasxfail") and item.get_closest_marker("gpu") is None:
        _ci_failure(rep, "this test")


# costly session fixtures: on two workers (scripts/test-fast: pytest -n 2 --dist loadgroup)
# the tests that share one run on one worker, so each is made once
SHARED = {"kafka_broker": "kafka", "real_db": "real_db", "postgres": "postgres", "browser": "browser",
          "both": "lake_eq"}  # (both: tests/lake/test_lake_equivalence.py's file and lake of one recording)


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads xdist_group to place each test
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("kafka") and item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.serial)  # broker outages and pipelines timed end to end
        for fixture, group in SHARED.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
                break


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """The same for a whole module skipped at import (``pytest.importorskip``)."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and under_ci():
        _ci_failure(rep, f"{collector.nodeid or 'a module'}")


# scripts/test-fast sets CMDARE_FAST_TIER: property tests draw a fifth of their examples
# (the explicit examples each keeps still run); CI and scripts/test draw them all.
FAST_TIER = bool(os.environ.get("CMDARE_FAST_TIER"))


def examples(n: int) -> int:
    """How many random examples a property test draws in this tier."""
    return max(5, n // 5) if FAST_TIER else n


class KafkaBroker:
    """A real single-node KRaft broker.  stop()/start() keep its port and data."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.bootstrap = ""

    def _run(self, cmd: str) -> str:
        r = subprocess.run(
            [sys.executable, str(KAFKA), cmd, "--dir", str(self.dir)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        if r.returncode != 0:
            raise RuntimeError(f"scripts/kafka {cmd} failed: {r.stderr.strip()[-2000:]}")
        return r.stdout.strip()

    def start(self) -> str:
        self.bootstrap = self._run("start").splitlines()[-1]
        return self.bootstrap

    def stop(self) -> None:
        self._run("stop")

    def kill(self) -> None:
        """SIGKILL the broker (no clean shutdown: as a crash or an OOM kill leaves it)."""
        import signal

        pid = int(self._run("status").split("pid=")[1].split()[0])
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in _proc_state(pid), 10, what="broker gone")

    def url(self, topic: str) -> str:
        return f"kafka://{self.bootstrap}/{topic}"


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


@pytest.fixture(scope="session")
def kafka_broker():
    d = Path(tempfile.mkdtemp(prefix="cmdare-test-kafka-"))
    broker = KafkaBroker(d)
    broker.start()
    yield broker
    broker.stop()


def agent_env(**extra: str) -> dict[str, str]:
    """Environment for agent subprocesses: the fake NVML importable as tests.fakes.nvml."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("NOTIFY_SOCKET", None)
    # never the system's /run/cmdare/train.sock: tests that want the train source set a path
    env["CMDARE_AGENT_SOURCES__TRAIN__ENABLED"] = "false"
    # never the machine's own metadata service (CI may run in a cloud): tests that want the
    # cloud source point it at a local fake
    env["CMDARE_AGENT_SOURCES__CLOUD__PROVIDER"] = "none"
    env.update(extra)
    return env


def dcgm_exporter_file(name: str) -> Path:
    """One of dcgm-exporter's public files (its default counter list, NVIDIA's dashboard): the
    checkout's sibling ../shared/ecosystem/dcgm-exporter, else the copy in
    tests/fixtures/dcgm-exporter (Apache-2.0, unchanged), so the tests run on every clone."""
    shared = ROOT.parent / "shared" / "ecosystem" / "dcgm-exporter" / name
    return shared if shared.is_file() else ROOT / "tests" / "fixtures" / "dcgm-exporter" / name


def wait_for(pred, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture()
def tmpfs(tmp_path: Path):
    """``tmpfs(size)``: a small filesystem of its own (a tmpfs mounted for the test, and
    unmounted after), for full and read-only disks.  Skipped, saying why, where it cannot
    be mounted (not root, or a sandbox that does not allow it)."""
    mounted: list[Path] = []

    def mount(size: str = "1m") -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        mnt = tmp_path / f"fs{len(mounted)}"
        mnt.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(mnt: Path, leave: int) -> Path:
    """A ballast file that leaves about ``leave`` bytes free on ``mnt``; remove it to free them."""
    st = os.statvfs(mnt)
    ballast = mnt / "ballast"
    ballast.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return ballast


GOBUILD = ROOT / "scripts" / "gobuild"


def go_tool(name: str) -> Path:
    """The real server ``name`` (scripts/gobuild: built once from the Go module proxy into
    .cache/go); the test is skipped, saying why, where Go is absent."""
    r = subprocess.run([sys.executable, str(GOBUILD), name], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        if "Go is not on PATH" in r.stderr:
            pytest.skip(r.stderr.strip())
        raise RuntimeError(f"scripts/gobuild {name} failed: {r.stderr.strip()[-2000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _GoServer:
    """A server built by scripts/gobuild, started on a free loopback port with its log in
    the work folder; ready once its ``/-/ready`` answers 200 (Prometheus and Alertmanager)."""

    name = ""

    def _start(self, workdir: Path, args: list[str]) -> None:
        self.log = open(workdir / f"{self.name}.log", "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self._ready, 60, what=f"{self.name} ready")

    def _ready(self) -> bool:
        import urllib.request

        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {Path(self.log.name).read_text()[-2000:]}")
        try:
            return urllib.request.urlopen(self.url + "/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Prometheus(_GoServer):
    """A real Prometheus server on loopback scraping ``targets`` ({job: [host:port]}) every
    second, with its HTTP API for the tests to query."""

    name = "prometheus"

    def __init__(self, binary: Path, workdir: Path, targets: dict[str, list[str]]) -> None:
        import json

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = workdir / "prometheus.yml"
        jobs = [
            # honor_labels: the agent's own job label (the training job) wins over the scrape job's name
            {"job_name": j, "honor_labels": True, "static_configs": [{"targets": t}]} for j, t in targets.items()
        ]
        cfg.write_text(json.dumps({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                                   "scrape_configs": jobs}))  # JSON is YAML
        self._start(workdir, [str(binary), f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
                              f"--web.listen-address=127.0.0.1:{self.port}"])

    def query(self, expr: str) -> list[dict]:
        """Instant query through the HTTP API: [{"metric": {labels}, "value": float}]."""
        import json
        import urllib.parse
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}",
                                    timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return [{"metric": x["metric"], "value": float(x["value"][1])} for x in body["data"]["result"]]


class Alertmanager(_GoServer):
    """A real Alertmanager on loopback (one route to a receiver that sends nothing), its v2
    API for the tests to read the alerts it holds."""

    name = "alertmanager"

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = workdir / "alertmanager.yml"
        cfg.write_text("route:\n  receiver: none\n  group_wait: 1s\nreceivers:\n  - name: none\n")
        self._start(workdir, [str(binary), f"--config.file={cfg}", f"--storage.path={workdir / 'am-data'}",
                              f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="])

    def alerts(self) -> list[dict]:
        """The active alerts it holds (GET /api/v2/alerts)."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as r:
            return json.loads(r.read())


@contextlib.contextmanager
def serving(src: Path, db: Path | None = None, token: str | None = None) -> Iterator[str]:
    """Database ``src`` (or a copy of it at ``db``) served by a live collector's API, with
    ``token`` when given: its URL."""
    import shutil

    from cmdare.analytics.server.service import HttpConfig, Service
    from cmdare.collector.db import connect
    from cmdare.dashboards.pages import mount

    if db is not None:
        shutil.copy(src, db)
    path = db or src
    con = connect(path)
    svc = Service(con, path, HttpConfig("127.0.0.1", 0, token), ui=mount)
    url = svc.start()
    svc.ready = True
    try:
        yield url
    finally:
        svc.stop()
        con.close()


def _pg_bindir() -> Path | None:
    """Debian's PostgreSQL server programs (the newest installed), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name)
                   if p.parent.parent.name.isdigit() else 0)
    return found[-1].parent if found else None


class Postgres:
    """A real PostgreSQL server on a loopback port, its data in a temporary folder (run as
    the ``postgres`` user when the suite runs as root: the server refuses root)."""

    def __init__(self, bindir: Path, d: Path) -> None:
        self.bin, self.dir, self.port = bindir, d, free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        r = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed: {(r.stderr or r.stdout).strip()[-1500:]}")

    def start(self) -> str:
        if self.as_user:
            subprocess.run(["chown", "postgres", str(self.dir)], check=True)
        self._run(str(self.bin / "initdb"), "-D", str(self.dir / "data"), "-A", "trust", "-U", "cmdare",
                  "--no-sync", "-E", "UTF8")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-l", str(self.dir / "server.log"), "-w",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        self._run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "cmdare", "cmdare")
        return self.url

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://cmdare@127.0.0.1:{self.port}/cmdare"

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed: apt-get install postgresql (scripts/test installs it)")
    pg = Postgres(bindir, Path(tempfile.mkdtemp(prefix="cmdare-test-pg-")))
    pg.start()
    yield pg
    pg.stop()
