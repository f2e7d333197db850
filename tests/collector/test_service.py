"""The collector's API: a real agent writes a spool, a real collector follows it and serves
the database while it writes; analyze finds the collector by itself and prints what it
would print locally; writes (bottlenecks' findings) run inside the collector; user SQL is
read-only and refuses the hostile-query table; tokens off loopback; Arrow results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.analytics.test_sql_safety import HOSTILE
from tests.conftest import BIN, agent_env, wait_for


def start_collector(spool: Path, db: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    p = subprocess.Popen(
        [str(BIN / "cmdare-collector"), "spool", str(spool), "--follow", "--interval", "0.3s", "--db", str(db), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )
    return p


def service(db: Path, p: subprocess.Popen) -> str:
    f = db.with_name(db.name + ".service.json")
    wait_for(lambda: f.exists() or p.poll() is not None, 30, what="the collector's service file")
    assert p.poll() is None, p.stderr.read() if p.stderr else ""
    return json.loads(f.read_text())["url"]


def stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)


def call(url: str, path: str, body: dict | None = None, token: str | None = None,
         accept: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if accept:
        req.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def analyze(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "analyze"), *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, str]]:
    d = tmp_path_factory.mktemp("live")
    spool, db = d / "spool", d / "live.duckdb"
    agent = subprocess.Popen(
        [str(BIN / "cmdare-agent"), "--config", "/dev/null", "--spool-dir", str(spool), "--interval", "0.3s",
         "--node", "live-1", "--set", "sources.gpu.backend=python:tests.fakes.nvml"],
        env=agent_env(CMDARE_FAKE_NVML="gpus=2"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: spool.exists(), 30, what="the agent's spool")
    col = start_collector(spool, db)
    try:
        url = service(db, col)
        yield spool, db, url
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
        if col.poll() is None:
            stop(col)


def test_health_readiness_and_metrics(live) -> None:
    _, _, url = live
    assert call(url, "/healthz") == (200, b'{"status":"ok"}')
    # ready once the input runs (a moment after the API answers)
    wait_for(lambda: json.loads(call(url, "/readyz")[1]) == {"ready": True}, 30, what="ready")
    wait_for(lambda: b"cmdare_collector_events_stored_total 0.0" not in call(url, "/metrics")[1], 30,
             what="events stored")
    code, text = call(url, "/metrics")
    assert code == 200 and b"# TYPE cmdare_collector_events_stored_total counter" in text
    assert b"cmdare_collector_ready 1.0" in text
    # batch time: a summary whose count is the batches committed, and a positive sum
    fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
    bs = {s.name: s.value for s in fams["cmdare_collector_batch_seconds"].samples}
    assert bs["cmdare_collector_batch_seconds_count"] >= 1 and bs["cmdare_collector_batch_seconds_sum"] > 0
    assert bs["cmdare_collector_batch_seconds_count"] == fams["cmdare_collector_batches"].samples[0].value


@pytest.mark.slow  # runs the product end to end, or waits on purpose, for seconds (fast tier: docs/testing.md)
def test_analyze_runs_through_the_collector_while_it_writes(live) -> None:
    _, db, _ = live
    # the file is held by the collector: analyze finds its API and answers live
    wait_for(lambda: "live-1" in analyze("nodes", "--db", str(db)).stdout, 30, what="the node, live")
    r = analyze("gpu", "--db", str(db), "--json")
    assert r.returncode == 0, r.stderr
    assert {g["gpu"] for g in json.loads(r.stdout)} == {0, 1}
    # counts grow between two reads: the database is read while it is written
    q = "SELECT count(*) AS n FROM gpu_samples"
    n1 = json.loads(analyze("sql", q, "--db", str(db), "--json").stdout)[0]["n"]
    wait_for(lambda: json.loads(analyze("sql", q, "--db", str(db), "--json").stdout)[0]["n"] > n1, 30,
             what="more samples")
    # errors come back as the command prints them
    r = analyze("steps", "--job", "nope", "--db", str(db))
    assert r.returncode == 1 and r.stderr.startswith("Error: no steps for job 'nope'") and r.stdout == ""
    r = analyze("sql", "SELECT * FROM host", "--db", str(db))
    assert r.returncode == 1 and 'Table with name host does not exist! Did you mean' in r.stderr


def test_a_write_runs_inside_the_collector(live) -> None:
    _, db, url = live
    # findings are stored by the collector's process on its own connection (no lock error)
    r = analyze("bottlenecks", "--db", str(db), "--json")
    assert r.returncode == 0, r.stderr
    n = len(json.loads(r.stdout))
    assert r.stderr.strip().endswith(f"stored {n} finding{'s' if n != 1 else ''} in {db} (table findings)")
    code, body = call(url, "/api/v1/sql", {"query": "SELECT count(*) AS n FROM findings"})
    assert code == 200 and json.loads(body)["rows"] == [[n]]


@pytest.mark.parametrize(("query", "message"), HOSTILE)
def test_the_sql_endpoint_refuses_the_hostile_queries(live, tmp_path: Path, query: str, message: str) -> None:
    _, _, url = live
    code, body = call(url, "/api/v1/sql", {"query": query.format(tmp=tmp_path)})
    assert code == 400, body
    err = json.loads(body)["error"]
    assert message in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_the_sql_endpoint_returns_json_or_arrow_within_limits(live) -> None:
    import pyarrow as pa

    _, _, url = live
    code, body = call(url, "/api/v1/sql", {"query": "SELECT * FROM range(30) t(i)", "max_rows": 10})
    out = json.loads(body)
    assert code == 200 and out["columns"] == ["i"] and len(out["rows"]) == 10 and out["truncated"] is True
    wait_for(lambda: json.loads(call(url, "/api/v1/sql", {"query": "SELECT count(*) AS n FROM gpu_samples"})[1]
                                )["rows"] != [[0]], 30, what="GPU samples stored")  # the module's first test on its worker
    code, body = call(url, "/api/v1/sql", {"query": "SELECT node, count(*) AS n FROM gpu_samples GROUP BY node"},
                      accept="application/vnd.apache.arrow.stream")
    t = pa.ipc.open_stream(body).read_all()
    assert code == 200 and t.column_names == ["node", "n"] and t.column("node").to_pylist() == ["live-1"]
    for bad in ({"query": 5}, {"query": "SELECT 1", "max_rows": 0}, {"query": "SELECT 1", "timeout": "x"}):
        code, body = call(url, "/api/v1/sql", bad)
        err = json.loads(body)["error"]
        assert code == 422 and "\n" not in err and len(err) < 300, err
    code, body = call(url, "/api/v1/analyze", {"argv": ["nodes"]})
    assert code == 404  # no argv endpoint: commands are resources


@pytest.mark.slow  # runs the product end to end, or waits on purpose, for seconds (fast tier: docs/testing.md)
def test_token_off_loopback_and_http_off(tmp_path: Path) -> None:
    spool, db = tmp_path / "spool", tmp_path / "t.duckdb"
    spool.mkdir()
    r = subprocess.run([str(BIN / "cmdare-collector"), "spool", str(spool), "--follow", "--db", str(db),
                        "--http", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "Error: --http 0.0.0.0:0: off loopback the API needs a bearer token (--http-token-file or $CMDARE_HTTP_TOKEN)")
    assert not db.exists()  # refused before the database was opened
    tok = tmp_path / "token"
    tok.write_text("s3cret-token\n")
    col = start_collector(spool, db, "--http", "127.0.0.1:0", "--http-token-file", str(tok))
    try:
        url = service(db, col)
        assert call(url, "/healthz")[0] == 200  # liveness stays open for probes
        code, body = call(url, "/api/v1/nodes")
        assert code == 401 and json.loads(body) == {"error": "unauthorized"}
        assert call(url, "/metrics")[0] == 401
        code, _ = call(url, "/api/v1/nodes", token="wrong")
        assert code == 401
        code, body = call(url, "/api/v1/nodes", token="s3cret-token")
        assert code == 200 and json.loads(body)["columns"][0] == "node"
        req = urllib.request.Request(url + "/api/v1/nodes", headers={"Authorization": "bEaReR s3cret-token"})
        with urllib.request.urlopen(req, timeout=30) as r:  # the scheme is case-insensitive (RFC 7235)
            assert r.status == 200
        r = analyze("nodes", "--db", str(db))
        assert r.returncode == 1 and "unauthorized: set $CMDARE_HTTP_TOKEN" in r.stderr
        r = analyze("nodes", "--db", str(db), env={**agent_env(), "CMDARE_HTTP_TOKEN": "s3cret-token"})
        assert r.returncode == 0, r.stderr
    finally:
        stop(col)
    assert not db.with_name(db.name + ".service.json").exists()  # removed at exit
    col = start_collector(spool, db, "--http", "off")
    try:
        import time

        time.sleep(2)  # the collector takes the write lock first (a reader then would keep it out)
        assert col.poll() is None, col.stderr.read() if col.stderr else ""
        r = analyze("nodes", "--db", str(db))
        assert r.returncode == 1 and "locked by a running collector without its API (--http off)" in r.stderr
        assert not db.with_name(db.name + ".service.json").exists()
    finally:
        stop(col)


@pytest.mark.slow  # runs the product end to end, or waits on purpose, for seconds (fast tier: docs/testing.md)
def test_the_same_output_as_locally_once_the_collector_stops(live) -> None:
    """Last in this module: stops the live collector."""
    _, db, _ = live
    cut = json.loads(analyze("sql", "SELECT max(ts)::VARCHAR AS t FROM gpu_samples", "--db", str(db), "--json").stdout)[0]["t"]
    q = f"SELECT node, index AS gpu, count(*) AS n, round(avg(util_gpu_ratio), 4) AS u FROM gpu_samples WHERE ts <= '{cut}' GROUP BY ALL ORDER BY ALL"
    through = analyze("sql", q, "--db", str(db))
    assert through.returncode == 0 and "live-1" in through.stdout
    f = db.with_name(db.name + ".service.json")
    pid = json.loads(f.read_text())["pid"]
    import os

    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not f.exists(), 30, what="the collector to stop")

    def gone() -> bool:  # the API stops first; the writer then runs its last rollup and closes the file
        import psutil

        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # exited, not yet reaped
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, 60, what="the collector process to exit")
    locally = analyze("sql", q, "--db", str(db))
    assert locally.returncode == 0, locally.stderr
    assert locally.stdout == through.stdout and locally.stderr == through.stderr


@pytest.mark.slow  # runs the product end to end, or waits on purpose, for seconds (fast tier: docs/testing.md)
def test_tls_with_a_certificate_the_client_trusts(tmp_path: Path) -> None:
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed here")
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    spool, db = tmp_path / "spool", tmp_path / "tls.duckdb"
    spool.mkdir()
    col = start_collector(spool, db, "--http-tls-cert", str(cert), "--http-tls-key", str(key))
    try:
        url = service(db, col)
        assert url.startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(url + "/healthz", context=ctx, timeout=30) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.URLError):  # not trusted without the CA
            urllib.request.urlopen(url + "/healthz", timeout=30)
        r = analyze("sql", "SELECT 7 AS x", "--db", str(db), "--json", env={**agent_env(), "CMDARE_HTTP_CA": str(cert)})
        assert r.returncode == 0 and json.loads(r.stdout) == [{"x": 7}], r.stderr
    finally:
        stop(col)
    r = subprocess.run([str(BIN / "cmdare-collector"), "spool", str(spool), "--follow", "--db", str(db),
                        "--http-tls-cert", str(cert)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--http-tls-cert and --http-tls-key go together" in r.stderr


@pytest.mark.slow  # runs the product end to end, or waits on purpose, for seconds (fast tier: docs/testing.md)
def test_a_service_file_left_by_a_killed_collector_is_ignored(tmp_path: Path) -> None:
    """A collector killed with SIGKILL leaves its service file; analyze must read the file
    itself, not try a dead URL. The control: the same file naming a live process is
    followed (and that URL refuses, said in one line)."""
    from cmdare.collector.db import connect
    from tests.conftest import free_port

    db = tmp_path / "c.duckdb"
    connect(db).close()
    dead = subprocess.Popen(["true"])
    dead.wait()
    f = db.with_name(db.name + ".service.json")

    def leave(pid: int) -> None:
        f.write_text(json.dumps({"url": f"http://127.0.0.1:{free_port()}", "pid": pid, "db": str(db.resolve()),
                                 "token": False}) + "\n")
        f.chmod(0o644)

    leave(dead.pid)
    r = analyze("nodes", "--db", str(db), "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == [] and r.stderr == "", r.stderr
    leave(os.getpid())  # alive: trusted, so analyze goes there
    r = analyze("nodes", "--db", str(db), "--json")
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.slow  # waits for a collector's broker retries
@pytest.mark.serial
def test_not_ready_until_ingest_runs(tmp_path: Path) -> None:
    """The API answers while the collector is still reaching Kafka, and says it is not ready
    (a load balancer or systemd probe must not send queries to a collector that stores
    nothing); then the collector gives up in one line and exits 1."""
    from tests.conftest import free_port

    db = tmp_path / "c.duckdb"
    p = subprocess.Popen(
        [str(BIN / "cmdare-collector"), "kafka", f"kafka://127.0.0.1:{free_port()}/t", "--db", str(db)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = service(db, p)
        assert call(url, "/healthz")[0] == 200
        code, body = call(url, "/readyz")
        assert (code, json.loads(body)) == (503, {"ready": False})
        assert b"cmdare_collector_ready 0.0" in call(url, "/metrics")[1]
        assert p.wait(timeout=60) == 1
        err = p.stderr.read() if p.stderr else ""
        errors = [x for x in err.splitlines() if x.startswith("Error:")]
        assert len(errors) == 1 and "cannot reach a broker" in errors[0], err
    finally:
        if p.poll() is None:
            p.kill()
