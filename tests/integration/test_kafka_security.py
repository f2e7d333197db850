"""Kafka with authentication and encryption, against the real broker started with a
SASL_SSL listener (PLAIN and SCRAM-SHA-512 users) and an SSL listener that requires a
client certificate, all certificates made here with openssl: the agent ships and the
collector consumes over each; a wrong password is a one-line error, loses nothing from
the spool, and no password reaches a log, a status event or the database."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from tests.conftest import BIN, KAFKA, agent_env
from tests.fakes.tls import make_pki

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ALICE, BOB = "alice-Pl41n-secret", "bob-Scr4m-secret"  # PLAIN / SCRAM-SHA-512 passwords
STOPPED = re.compile(r"stopped in [\d.]+s \(spooled (\d+), shipped (\d+), pending (\d+)\)")


class SecureBroker:
    def __init__(self, d: Path) -> None:
        import sys

        self.dir, self.tls = d / "run", make_pki(d / "tls")
        r = subprocess.run(
            [sys.executable, str(KAFKA), "start", "--dir", str(self.dir), "--secure", str(self.tls),
             "--user", f"alice:{ALICE}", "--user", f"bob:{BOB}"],
            capture_output=True, text=True, timeout=180,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        lines = dict(x.split("=", 1) for x in r.stdout.splitlines() if "=" in x)
        self.sasl_ssl, self.ssl = lines["sasl_ssl"], lines["ssl"]

    def stop(self) -> None:
        import sys

        subprocess.run([sys.executable, str(KAFKA), "stop", "--dir", str(self.dir)], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def broker() -> Iterator[SecureBroker]:
    d = Path(tempfile.mkdtemp(prefix="cmdare-test-kafka-sec-"))
    b = SecureBroker(d)
    yield b
    b.stop()
    shutil.rmtree(d, ignore_errors=True)


def password_file(d: Path, name: str, pw: str) -> Path:
    f = d / f"{name}.pw"
    f.write_text(pw + "\n")
    f.chmod(0o600)
    return f


def run_agent(tmp: Path, node: str, sink: str, duration: float, log_level: str = "info") -> tuple[int, int, int, str]:
    cfg = tmp / f"{node}.toml"
    cfg.write_text(f"""
node = "{node}"
interval = "0.3s"
log_level = "{log_level}"
[spool]
dir = "{tmp / ('spool-' + node)}"
fsync = false
[sink]
{sink}
request_timeout = "3s"
retry_backoff = "0.3s"
retry_backoff_max = "1s"
[sources.gpu]
backend = "python:tests.fakes.nvml"
""")
    r = subprocess.run([str(BIN / "cmdare-agent"), "--config", str(cfg), "--duration", str(duration)],
                       env=agent_env(CMDARE_FAKE_NVML="gpus=1"), capture_output=True, text=True, timeout=120)
    m = STOPPED.search(r.stderr)
    assert m, r.stderr[-3000:]
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), r.stderr


def collect(broker: SecureBroker, topic: str, db: Path, *args: str, env: dict[str, str] | None = None,
            idle: str = "4s") -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "cmdare-collector"), "kafka", f"kafka://{broker.sasl_ssl}/{topic}", "--db", str(db),
         "--max-wait", "0.3s", "--idle-exit", idle, "--http", "off", *args],
        capture_output=True, text=True, timeout=180, env=env,
    )


def stored(db: Path, node: str) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            "SELECT (SELECT count(*) FROM heartbeats WHERE node = $n) + (SELECT count(*) FROM gpu_samples WHERE node = $n)",
            {"n": node},
        ).fetchone()[0]
    finally:
        con.close()


def no_secret_in(*texts: str) -> None:
    for t in texts:
        assert ALICE not in t and BOB not in t


def test_agent_over_sasl_plain_and_client_certificate_collector_over_scram(broker: SecureBroker, tmp_path: Path) -> None:
    import os

    topic = "sec-ok"
    pw = password_file(tmp_path, "alice", ALICE)
    # SASL_SSL with PLAIN, the password from a file; DEBUG logging (kafka-python's debug log
    # prints PLAIN's bytes: they must come out redacted)
    spooled, shipped, pending, log = run_agent(
        tmp_path, "sasl-node",
        f'url = "kafka://{broker.sasl_ssl}/{topic}"\nsasl_mechanism = "PLAIN"\nsasl_username = "alice"\n'
        f'sasl_password_file = "{pw}"\nssl_cafile = "{broker.tls / "ca.pem"}"',
        3.0, log_level="debug",
    )
    assert shipped == spooled > 0 and pending == 0, log[-2000:]
    assert "SaslAuthenticateRequest" in log  # the debug log was on ...
    no_secret_in(log)  # ... and still never showed the password
    # SSL with a client certificate (the listener requires one)
    spooled2, shipped2, pending2, log2 = run_agent(
        tmp_path, "mtls-node",
        f'url = "kafka://{broker.ssl}/{topic}"\nssl_cafile = "{broker.tls / "ca.pem"}"\n'
        f'ssl_certfile = "{broker.tls / "client.crt"}"\nssl_keyfile = "{broker.tls / "client.key"}"',
        2.0,
    )
    assert shipped2 == spooled2 > 0 and pending2 == 0, log2[-2000:]
    # the collector: SCRAM-SHA-512, the password from the environment
    db = tmp_path / "sec.duckdb"
    env = {**os.environ, "CMDARE_KAFKA_PASSWORD": BOB}
    r = collect(broker, topic, db, "--sasl-username", "bob", "--ssl-cafile", str(broker.tls / "ca.pem"), env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "over SASL_SSL, SCRAM-SHA-512 as 'bob' (password from $CMDARE_KAFKA_PASSWORD)" in r.stderr
    assert stored(db, "sasl-node") > 0 and stored(db, "mtls-node") > 0
    no_secret_in(r.stderr)
    con = duckdb.connect(str(db), read_only=True)
    try:
        msgs = con.execute("SELECT coalesce(string_agg(message, ' '), '') FROM agent_status").fetchone()[0]
        assert con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0
    finally:
        con.close()
    no_secret_in(msgs)


def test_wrong_password_is_one_line_and_the_spool_keeps_everything(broker: SecureBroker, tmp_path: Path) -> None:
    topic = "sec-wrong"
    ca = broker.tls / "ca.pem"
    wrong = password_file(tmp_path, "wrong", "not-" + BOB)
    right = password_file(tmp_path, "bob", BOB)
    sink = f'url = "kafka://{broker.sasl_ssl}/{topic}"\nsasl_username = "bob"\nssl_cafile = "{ca}"\n'
    spooled, shipped, pending, log = run_agent(tmp_path, "node-w", sink + f'sasl_password_file = "{wrong}"', 3.0)
    assert shipped == 0 and pending == spooled > 0
    assert "authentication failed: " in log
    no_secret_in(log)
    assert "not-" + BOB not in log
    # fixed: the same spool ships everything it kept (its status events saying why included)
    spooled2, shipped2, pending2, log2 = run_agent(tmp_path, "node-w", sink + f'sasl_password_file = "{right}"', 2.0)
    assert pending2 == 0 and shipped2 == spooled2 + spooled
    # the collector with a wrong password: one line, exit 1, nothing written
    db = tmp_path / "w.duckdb"
    r = collect(broker, topic, db, "--sasl-username", "bob", "--sasl-password-file", str(wrong), "--ssl-cafile", str(ca))
    assert r.returncode == 1
    err = [x for x in r.stderr.splitlines() if x.startswith("Error:")]
    # kafka-python sometimes sees the broker's error response, sometimes only the close that
    # follows it: either way the line says authentication failed
    assert len(err) == 1 and err[0].startswith(f"Error: kafka://{broker.sasl_ssl}/{topic}: authentication failed: "), r.stderr
    assert "not-" + BOB not in r.stderr
    # and with the right one, every event the agent spooled is there, the failure included
    r = collect(broker, topic, db, "--sasl-username", "bob", "--sasl-password-file", str(right), "--ssl-cafile", str(ca))
    assert r.returncode == 0, r.stderr[-2000:]
    con = duckdb.connect(str(db), read_only=True)
    try:
        status = con.execute(
            "SELECT message FROM agent_status WHERE node = 'node-w' AND source = 'sink.kafka' AND NOT ok"
        ).fetchall()
    finally:
        con.close()
    assert stored(db, "node-w") > 0
    assert status and all("authentication failed" in m for (m,) in status), status


def test_untrusted_broker_certificate_is_named(broker: SecureBroker, tmp_path: Path) -> None:
    r = collect(broker, "sec-ca", tmp_path / "x.duckdb", "--sasl-username", "bob", "--sasl-password-file",
                str(password_file(tmp_path, "bob", BOB)), "--ssl-cafile", str(broker.tls / "other-ca.pem"))
    assert r.returncode == 1
    assert "TLS: the broker's certificate is not trusted (check ssl_cafile)" in r.stderr
