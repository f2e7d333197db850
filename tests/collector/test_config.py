"""The collector's one typed config (collector/config.py): flags, a TOML file, receivers
by kind (notify/receivers.py), and what is refused, each error one line."""

from __future__ import annotations

import base64
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.alerting.notify.receivers import RECEIVERS, kinds
from cmdare.analytics.alerting.schedule import load
from cmdare.collector import config
from cmdare.collector.cli import cli
from cmdare.collector.db import connect
from cmdare.wire.units import ConfigError

RULES = """
groups:
  - name: hourly
    interval: 1h
    rules:
      - alert: Always
        expr: SELECT 'x' AS k, 1 AS value
"""


def _build(command: str = "spool", target: str = "/tmp", file: str | None = None, **flags):
    return config.build(command, target, flags, set(flags), file)


@pytest.fixture
def con(tmp_path: Path):
    c = connect(str(tmp_path / "s.duckdb"))
    yield c
    c.close()


def test_defaults_are_the_option_tables_and_flags_beat_the_file(tmp_path: Path) -> None:
    cfg = _build("kafka", "kafka://b:9092/t")
    assert (cfg.db, cfg.group, cfg.batch_bytes, cfg.max_wait, cfg.idle_exit, cfg.max_clock_skew) == (
        "cmdare.duckdb", "cmdare-collector", 64 << 20, 1.0, None, 86400.0)
    assert (cfg.retention.raw, cfg.retention.rollups, cfg.rules, cfg.receivers) == (7 * 86400.0, 400 * 86400.0, [], [])
    f = tmp_path / "c.toml"
    f.write_text('[ingest]\ngroup = "g1"\nbatch_bytes = "16MiB"\nmax_clock_skew = "off"\n'
                 '[storage]\ndb = "f.duckdb"\nretain_raw = "1h"\n')
    cfg = _build("kafka", "kafka://b:9092/t", str(f), group="g2")
    assert (cfg.group, cfg.batch_bytes, cfg.max_clock_skew, cfg.db, cfg.retention.raw) == (
        "g2", 16 << 20, None, "f.duckdb", 3600.0)


def test_receivers_from_flags_with_secrets_by_name_and_from_a_file(tmp_path: Path, con) -> None:
    tok, pw = tmp_path / "tok", tmp_path / "pw"
    tok.write_text("t0ken\n")
    pw.write_text("u:p\n")
    rules = tmp_path / "r.yml"
    rules.write_text(RULES)
    cfg = _build(rules=(str(rules),), follow=True, receiver_alertmanager=("am=http://127.0.0.1:9/",),
                 receiver_webhook=("ops=http://127.0.0.1:9/h",), receiver_kafka=("kafka://127.0.0.1:9/alerts",),
                 token_files=(f"ops={tok}",), password_files=(f"am={pw}",))
    assert [(r.kind, r.name) for r in cfg.receivers] == [
        ("alertmanager", "am"), ("webhook", "ops"), ("kafka", "kafka://127.0.0.1:9/alerts")]
    al = load(con, tuple(cfg.rules), 1800, cfg.receivers, cfg.resend)
    try:
        am, ops, kafka = al.senders
        assert (am.kind, am.url, am.resend, am.label, am.token, am.basic) == (
            "alertmanager", "http://127.0.0.1:9", 60.0, "am", None, base64.b64encode(b"u:p").decode())
        assert (ops.kind, ops.url, ops.label, ops.token, ops.basic) == ("webhook", "http://127.0.0.1:9/h", "ops",
                                                                        "t0ken", "")
        assert kafka.kind == "kafka" and kafka.generator == f"http://{socket.gethostname()}/cmdare"
    finally:
        al.stop()
    f = tmp_path / "c.toml"
    f.write_text(f'[alerting]\nrules = ["{rules}"]\nresend = "5m"\n[ingest]\nfollow = true\n'
                 f'[[receivers]]\nkind = "webhook"\nname = "ops"\nurl = "https://hooks.example/x"\n'
                 f'token_file = "{tok}"\n')
    cfg = _build(file=str(f))
    assert (cfg.resend, [(r.kind, r.name, r.options["token_file"]) for r in cfg.receivers]) == (
        300.0, [("webhook", "ops", str(tok))])


def test_every_receiver_kind_is_a_unit_with_a_flag_and_docs() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "alerts.md").read_text()
    assert sorted(kinds()) == ["alertmanager", "kafka", "webhook"]
    for name, cls in RECEIVERS.items():
        assert cls.FLAG.startswith("--") and cls.FLAG_HELP and "url" in cls.OPTIONS
        assert f"### Receiver `{name}`" in docs, name


@pytest.mark.parametrize(("flags", "error"), [
    ({"receiver_alertmanager": ("ftp://am:9093",)}, r"^receiver 'am:9093': alert receivers are \[NAME=\]http:// or "
                                                   r"https:// URLs with a host$"),
    ({"receiver_webhook": ("https:///api",)}, "alert receivers are"),
    ({"receiver_webhook": ("am=file:///etc/passwd",)}, "alert receivers are"),
    ({"rules": ("default",), "follow": True, "token_files": ("ops=/x",)},
     r"^receiver 'ops': no --alertmanager / --alert-webhook of that name \(names: none\)$"),
    ({"rules": ("default",), "follow": True, "receiver_webhook": ("am=http://h/",), "token_files": ("b=/x", "a=/x")},
     r"^receiver 'a': .* \(names: am\)$"),
    ({"token_files": ("nofile",)}, r"^--alert-token-file: expected NAME=FILE"),
    ({"receiver_webhook": ("http://h/",)}, r"give the rules to evaluate with --rules$"),
    ({"rules": ("default",)}, r"^--rules: alert rules are evaluated while collecting: add --follow$"),
    ({"max_clock_skew": "0s"}, r"^--max-clock-skew: '0s' must be more than 0 \(or off\)$"),
    ({"max_clock_skew": "nan"}, r"^--max-clock-skew: expected a duration"),
    ({"retain_raw": "10s"}, r"^--retain-raw: '10s' must not be under 300 s; 'off' keeps all$"),
    ({"lake": "/l", "retain_raw": "7d"}, r"^--retain-raw: a lake's retention is cmdare-collector maintain's$"),
    ({"lake": "/l", "rules": ("default",), "follow": True}, r"^--lake: --rules belong to a database file"),
    ({"lake": "/l", "commit_every": "2h"}, r"^--commit-every: '2h' must be from 50ms to 1h$"),
])
def test_bad_settings_are_one_line_errors(flags, error) -> None:
    with pytest.raises(ConfigError, match=error):
        _build(**flags)


@pytest.mark.parametrize(("text", "error"), [
    ("[ingest\n", r"not TOML: "),
    ("[nope]\nx = 1\n", r"unknown table \[nope\] \(known: alerting, http, ingest, kafka, lake, storage, receivers\)"),
    ("[ingest]\nbatch_size = 1\n", r"unknown key ingest.batch_size \(known: group, batch_bytes"),
    ("[ingest]\ngroup = \"g\"\n", r"ingest.group: the spool command does not take it"),
    ("[ingest]\ninterval = -1\n", r"ingest.interval: duration must not be negative"),
    ("[ingest]\ninterval = true\n", r"ingest.interval: expected a duration"),
    ("[[receivers]]\nkind = \"pager\"\nurl = \"x\"\n", r"unknown receiver 'pager' \(known: alertmanager, kafka, "
                                                       r"webhook\)"),
    ("[[receivers]]\nkind = \"webhook\"\nurl = \"http://h/\"\nheaders = 1\n", r"unknown key '.*receivers\[0\]\.headers' "
                                                                           r"\(known: name, password_file"),
    ("[[receivers]]\nurl = \"http://h/\"\n", r"receivers\[0\]\.kind: expected one of"),
    ("receivers = 3\n", r"receivers: expected \[\[receivers\]\] tables"),
    ("[[receivers]]\nkind = \"webhook\"\nurl = \"http://h/\"\ntoken_file = \"/a\"\npassword_file = \"/b\"\n",
     r"a bearer token or a password, not both"),
])
def test_a_hostile_config_file_is_refused_in_one_line(tmp_path: Path, text: str, error: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=error) as e:
        _build(file=str(f))
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


def test_an_unreadable_oversized_or_special_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        _build(file=str(tmp_path))
    with pytest.raises(ConfigError, match="not a regular file"):
        _build(file=str(tmp_path / "missing.toml"))
    big = tmp_path / "big.toml"
    big.write_text("#" * (config.MAX_CONFIG_BYTES + 10))
    with pytest.raises(ConfigError, match="over 1,048,576 bytes"):
        _build(file=str(big))
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe[ingest]")
    with pytest.raises(ConfigError, match="not TOML"):
        _build(file=str(bad))


def test_a_secret_file_never_reaches_the_error(tmp_path: Path, con) -> None:
    s = tmp_path / "tok"
    s.write_text("\x01hunter2\n")
    rules = tmp_path / "r.yml"
    rules.write_text(RULES)
    cfg = _build(rules=(str(rules),), follow=True, receiver_webhook=("ops=http://h/",), token_files=(f"ops={s}",))
    with pytest.raises(Exception, match="empty, or holds control characters") as e:
        load(con, tuple(cfg.rules), 1800, cfg.receivers, cfg.resend)
    assert "hunter2" not in str(e.value)


def test_the_commands_take_the_config_file(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    f = tmp_path / "c.toml"
    f.write_text(f'[storage]\ndb = "{tmp_path / "from-file.duckdb"}"\n')
    r = CliRunner().invoke(cli, ["spool", str(spool), "--config", str(f)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "from-file.duckdb").exists()
    f.write_text("[storage]\nretain_raw = \"1s\"\n")
    r = CliRunner().invoke(cli, ["spool", str(spool), "--config", str(f)])
    assert r.exit_code == 2 and f"{f}: storage.retain_raw: '1s' must not be under 300 s" in r.output
