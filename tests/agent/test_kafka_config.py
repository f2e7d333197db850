"""Kafka security settings (SASL, TLS) as the agent's [sink] and the collector's options
take them: defaults that never send a password in clear, one-line errors naming the key,
and the password kept out of every printed form."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from cmdare.agent.config import ConfigError, load
from cmdare.wire.kafka import parse_kafka_security
from tests.conftest import BIN


def sink(tmp_path: Path, **keys: Any) -> Any:
    return load(None, env={"CMDARE_AGENT_CONFIG": str(tmp_path / "none.toml")},
                overrides={"sink.url": "kafka://b1:9093/t", **{f"sink.{k}": v for k, v in keys.items()}}).sink


def test_a_user_and_a_password_file_mean_scram_over_tls_and_the_password_is_never_printed(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret-pw\n")
    k = sink(tmp_path, sasl_username="agent", sasl_password_file=str(pw))
    sec = k.kafka.security
    assert (sec.protocol, sec.mechanism, sec.username, sec.password) == ("SASL_SSL", "SCRAM-SHA-512", "agent", "s3cret-pw")
    opts = k.kafka.client_options()
    assert opts["security_protocol"] == "SASL_SSL" and opts["sasl_plain_password"] == "s3cret-pw"
    assert opts["ssl_check_hostname"] is True
    for text in (repr(k), repr(k.kafka), str(sec), sec.describe()):
        assert "s3cret-pw" not in text
    assert sec.describe() == f"SASL_SSL, SCRAM-SHA-512 as 'agent' (password from {pw}), CA system"


def test_password_from_the_environment_and_tls_files(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    s = parse_kafka_security("--", {"sasl_username": "c", "sasl_mechanism": "plain", "ssl_cafile": str(ca)},
                             env={"CMDARE_KAFKA_PASSWORD": "pw-from-env"})
    assert (s.protocol, s.mechanism, s.password, s.password_from) == ("SASL_SSL", "PLAIN", "pw-from-env",
                                                                      "$CMDARE_KAFKA_PASSWORD")
    assert s.client_options()["ssl_cafile"] == str(ca)
    # TLS files alone: SSL; nothing: PLAINTEXT, no options at all
    assert parse_kafka_security("--", {"ssl_cafile": str(ca)}, env={}).protocol == "SSL"
    assert parse_kafka_security("--", {}, env={}).client_options() == {}


@pytest.mark.parametrize(
    ("keys", "msg"),
    [
        ({"sasl_username": "u"}, "sink.sasl_password_file: SASL_SSL needs a password file (or $CMDARE_KAFKA_PASSWORD)"),
        ({"security_protocol": "SASL_SSL"}, "sink.sasl_username: SASL_SSL needs a user name"),
        ({"security_protocol": "TLS"}, "sink.security_protocol: must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
        ({"sasl_username": "u", "sasl_mechanism": "GSSAPI"}, "sink.sasl_mechanism: must be one of PLAIN"),
        ({"sasl_username": "u", "sasl_password_file": "/nonexistent/pw"}, "sink.sasl_password_file: /nonexistent/pw: no such file"),
        ({"security_protocol": "PLAINTEXT", "sasl_username": "u"}, "sink.sasl_mechanism: SASL settings need security_protocol"),
        ({"ssl_cafile": "/nonexistent/ca.pem"}, "sink.ssl_cafile: /nonexistent/ca.pem: no such file"),
        ({"ssl_check_hostname": "yes"}, "sink.ssl_check_hostname: expected true or false"),
    ],
)
def test_bad_security_settings_name_the_key(tmp_path: Path, keys: dict[str, Any], msg: str) -> None:
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("$", r"\$")):
        sink(tmp_path, **keys)


def test_empty_password_file_and_key_without_certificate(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("\n")
    with pytest.raises(ConfigError, match="the password is empty"):
        sink(tmp_path, sasl_username="u", sasl_password_file=str(pw))
    key = tmp_path / "k.pem"
    key.write_text("x")
    with pytest.raises(ConfigError, match="sink.ssl_keyfile: a client key needs its certificate"):
        sink(tmp_path, ssl_keyfile=str(key))


def test_credentials_in_the_url_are_refused_without_echoing_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(None, env={"CMDARE_AGENT_CONFIG": str(tmp_path / "none.toml")},
             overrides={"sink.url": "kafka://agent:hunter2@b1:9093/t"})
    assert "credentials do not go in the URL" in str(e.value) and "hunter2" not in str(e.value)
    r = subprocess.run([str(BIN / "cmdare-collector"), "kafka", "kafka://c:hunter2@b1:9093/t", "--db",
                        str(tmp_path / "x.duckdb")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "credentials do not go in the URL" in r.stderr and "hunter2" not in r.stderr


def test_collector_security_option_errors_are_usage_errors(tmp_path: Path) -> None:
    r = subprocess.run([str(BIN / "cmdare-collector"), "kafka", "kafka://b1:9093/t", "--db", str(tmp_path / "x.duckdb"),
                        "--sasl-username", "c"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2
    assert "--sasl-password-file: SASL_SSL needs a password file (or $CMDARE_KAFKA_PASSWORD)" in r.stderr
    assert not (tmp_path / "x.duckdb").exists()  # refused before the database is opened
