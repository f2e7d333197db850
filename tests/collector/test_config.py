"""The collector's one typed config (collector/cli/config.py): flags, a TOML file, receivers
by kind (notify/receivers.py), and what is refused, each error one line."""

from __future__ import annotations

import base64
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.alerting.notify.receivers import RECEIVERS, kinds
from cmdare.analytics.server.schedule import load
from cmdare.collector.cli import cli, config
from cmdare.collector.db import connect
from cmdare.wire.units import ConfigError
from tests.analytics.alerting.test_schedule import RULES


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
    ({"detect_every": "1s"}, r"^--detect-every: '1s' must not be under 5 s; or 'off'$"),
    ({"detect_every": "inf"}, r"^--detect-every: expected a duration"),
    ({"detect_window": "10s"}, r"^--detect-window: '10s' must be from 1m to 1d$"),
    ({"detect_window": "off"}, r"^--detect-window: expected a duration"),
    ({"lake": "/l", "retain_raw": "7d"}, r"^--retain-raw: a lake's retention is cmdare-collector maintain's$"),
    ({"lake": "/l", "rules": ("default",), "follow": True}, r"^--lake: --rules belong to a database file"),
    ({"lake": "/l", "commit_every": "2h"}, r"^--commit-every: '2h' must be from 50ms to 1h$"),
])
def test_bad_settings_are_one_line_errors(flags, error) -> None:
    with pytest.raises(ConfigError, match=error):
        _build(**flags)


@pytest.mark.parametrize(("text", "error"), [
    ("[ingest\n", r"not TOML: "),
    ("[nope]\nx = 1\n", r"unknown table \[nope\] \(known: alerting, findings, http, ingest, kafka, lake, storage, receivers\)"),
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


# every setting's default, as --help and docs/collector.md say it (a changed default is a
# user-visible change: it fails here first)
DEFAULTS = {
    "kafka": {"db": "cmdare.duckdb", "group": "cmdare-collector", "batch_bytes": 64 << 20, "max_wait": 1.0,
              "idle_exit": None, "progress_every": 10.0, "max_clock_skew": 86400.0, "retain_raw": 7 * 86400.0,
              "retain_rollups": 400 * 86400.0, "lake": None, "catalog": None, "commit_every": 10.0,
              "http": "127.0.0.1:0", "http_token_file": None, "http_tls_cert": None, "http_tls_key": None,
              "session_ttl": 43200.0, "ui_url": None, "security_protocol": None, "sasl_mechanism": None, "sasl_username": None,
              "sasl_password_file": None, "ssl_cafile": None, "ssl_certfile": None, "ssl_keyfile": None,
              "ssl_no_check_hostname": False, "rules": [], "inhibit_window": 1800.0, "liveness_grace": 45.0,
              "resend": 60.0, "detect_every": 60.0, "detect_window": 900.0},
    "spool": {"db": "cmdare.duckdb", "follow": False, "interval": 1.0, "max_clock_skew": 86400.0,
              "retain_raw": 7 * 86400.0, "retain_rollups": 400 * 86400.0, "lake": None, "catalog": None,
              "commit_every": 10.0, "http": "127.0.0.1:0", "http_token_file": None, "http_tls_cert": None,
              "http_tls_key": None, "session_ttl": 43200.0, "ui_url": None, "rules": [], "inhibit_window": 1800.0, "liveness_grace": 45.0,
              "resend": 60.0, "detect_every": 60.0, "detect_window": 900.0},
}


@pytest.mark.parametrize("command", ["kafka", "spool"])
def test_every_default_is_the_documented_one(command: str) -> None:
    cfg = _build(command, "kafka://b:9092/t" if command == "kafka" else "/tmp")
    assert cfg.values == DEFAULTS[command]
    shown = {s.key: s.shown for s in config.SETTINGS if s.shown}
    assert shown == {"db": "cmdare.duckdb", "group": "cmdare-collector", "batch_bytes": "64MiB", "max_wait": "1s",
                     "progress_every": "10s", "interval": "1s", "max_clock_skew": "1d", "retain_raw": "7d",
                     "retain_rollups": "400d", "commit_every": "10s", "http": "127.0.0.1:0", "inhibit_window": "30m",
                     "liveness_grace": "45s", "resend": "1m", "detect_every": "1m", "detect_window": "15m",
                     "session_ttl": "12h"}
    for s in config.SETTINGS:  # what --help shows is what the setting parses to
        if s.shown:
            assert config.parse_value(s, s.flag, s.shown) == DEFAULTS["kafka"].get(s.key, DEFAULTS["spool"].get(s.key))


def test_the_commands_flags_are_the_table_and_each_commands_own() -> None:
    for command in ("kafka", "spool"):
        flags = {o for p in cli.commands[command].params for o in p.opts if o.startswith("--")}
        want = {s.flag for s in config.SETTINGS if command in s.commands}
        want |= {c.FLAG for _, c in kinds().items()} | {f for _, f, _ in config.SECRET_FLAGS} | {"--config"}
        assert flags == want, command


@pytest.mark.parametrize(("text", "ok"), [("50ms", True), ("49ms", False), ("1h", True), ("3601s", False)])
def test_commit_every_is_from_50ms_to_1h(text: str, ok: bool) -> None:
    if ok:
        assert _build(commit_every=text).commit_every == config.parse_value(config.BY_KEY["commit_every"], "x", text)
    else:
        with pytest.raises(ConfigError, match="must be from 50ms to 1h"):
            _build(commit_every=text)


def test_retention_is_at_least_five_minutes_or_off() -> None:
    assert _build(retain_raw="5m", retain_rollups="off").retention.raw == 300.0
    assert _build(retain_rollups="off").retention.rollups is None
    with pytest.raises(ConfigError, match="under 300 s"):
        _build(retain_rollups="299s")
    assert config.duration_or_off("--x", "0s") == 0.0 and config.duration_or_off("--x", " OFF ") is None
    with pytest.raises(ConfigError, match=r"^--x: '10s' must not be under 300 s; 'off' keeps all$"):
        config.duration_or_off("--x", "10s", 300)


def test_kafka_security_is_the_kafka_commands_only(tmp_path: Path) -> None:
    assert _build("spool", "/tmp").security is None
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    sec = _build("kafka", "kafka://b:9092/t").security
    assert sec is not None and sec.protocol == "PLAINTEXT"
    sec = _build("kafka", "kafka://b:9092/t", sasl_username="c", sasl_password_file=str(pw),
                 ssl_no_check_hostname=True).security
    assert (sec.protocol, sec.username, sec.mechanism, sec.check_hostname) == ("SASL_SSL", "c", "SCRAM-SHA-512", False)


def test_a_long_hostile_name_is_cut_in_the_error(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text(f"[{'t' * 500}]\nx = 1\n")
    with pytest.raises(ConfigError) as e:
        _build(file=str(f))
    assert f"[{'t' * 40}]" in str(e.value) and "t" * 41 not in str(e.value)
    f.write_text(f"[ingest]\n{'k' * 500} = 1\n")
    with pytest.raises(ConfigError) as e:
        _build(file=str(f))
    assert f"ingest.{'k' * 40} " in str(e.value) and "k" * 41 not in str(e.value)
    with pytest.raises(ConfigError) as e:
        _build(token_files=("x" * 500,))
    assert len(str(e.value)) < 140


def test_receiver_flags_secrets_and_their_edges(tmp_path: Path, con) -> None:
    rules = tmp_path / "r.yml"
    rules.write_text(RULES)
    # a URL whose query holds '=' is a URL, not NAME=URL
    cfg = _build(rules=(str(rules),), follow=True, receiver_webhook=("http://h:9/x?a=b",))
    assert [(r.name, r.options["url"], r.options["name"]) for r in cfg.receivers] == [("h:9", "http://h:9/x?a=b", "")]
    # a Kafka receiver takes no token file by its name
    with pytest.raises(ConfigError, match=r"^receiver 'kafka://h:9/t': no --alertmanager / --alert-webhook"):
        _build(rules=(str(rules),), follow=True, receiver_kafka=("kafka://h:9/t",), token_files=("kafka://h:9/t=/x",))
    good, ctrl, empty = tmp_path / "good", tmp_path / "ctrl", tmp_path / "empty"
    good.write_text("tok en\n")  # a space inside is a character of the token
    ctrl.write_text("tok\x1fen\n")
    empty.write_text("")
    cfg = _build(rules=(str(rules),), follow=True, receiver_webhook=("ops=http://h:9/",), token_files=(f"ops={good}",))
    al = load(con, tuple(cfg.rules), 1800, cfg.receivers, cfg.resend)
    try:
        assert al.senders[0].token == "tok en"
    finally:
        al.stop()
    for bad in (ctrl, empty):
        cfg = _build(rules=(str(rules),), follow=True, receiver_webhook=("ops=http://h:9/",), token_files=(f"ops={bad}",))
        with pytest.raises(Exception, match="empty, or holds control characters"):
            load(con, tuple(cfg.rules), 1800, cfg.receivers, cfg.resend)


def test_a_refused_value_is_quoted_to_its_first_20_characters(tmp_path: Path) -> None:
    long = "0" * 25 + "2h"  # 2 hours, written long
    for flags, tail in (({"commit_every": long}, "must be from 50ms to 1h"),
                        ({"detect_window": "0" * 25 + "2d"}, "must be from 1m to 1d"),
                        ({"retain_raw": "0" * 25 + "1s"}, "must not be under 300 s; 'off' keeps all")):
        with pytest.raises(ConfigError) as e:
            _build(**flags)
        assert str(e.value).endswith(f": '{'0' * 20}' {tail}"), str(e.value)
    with pytest.raises(ConfigError) as e:
        config.duration_or_off("--x", "0" * 25 + "1s", 300)
    assert str(e.value) == f"--x: '{'0' * 20}' must not be under 300 s; 'off' keeps all"
    with pytest.raises(ConfigError) as e:
        _build(token_files=("x" * 50,))
    assert str(e.value) == f"--alert-token-file: expected NAME=FILE (NAME: the receiver's name), got '{'x' * 40}'"


@pytest.mark.parametrize("spec", ["ops", "ops=", "=/tok", " =/tok", "="])
def test_a_secret_flag_needs_a_name_and_a_file(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"^--alert-token-file: expected NAME=FILE"):
        _build(token_files=(spec,))


def test_the_clock_skew_bound_takes_any_positive_duration() -> None:
    assert _build(max_clock_skew="0.5s").max_clock_skew == 0.5
    assert _build(max_clock_skew="off").max_clock_skew is None
    with pytest.raises(ConfigError, match=r"^--max-clock-skew: '0s' must be more than 0 \(or off\)$"):
        _build(max_clock_skew="0s")


def test_the_settings_table_cannot_be_changed_and_a_config_has_only_its_keys() -> None:
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        config.SETTINGS[0].default = "x"  # type: ignore[misc]
    cfg = _build()
    assert not hasattr(cfg, "no_such_setting") and getattr(cfg, "group", "absent") == "absent"
    assert cfg.follow is False and cfg.interval == 1.0


def _captured(command: str, args: list[str]) -> tuple[int, dict, str]:
    """What a command decorated with ``click_options(command)`` receives for ``args``."""
    import click

    got: dict = {}

    @click.command()
    @config.click_options(command)
    def cmd(**kw):  # noqa: ANN003
        got.update(kw)

    r = CliRunner().invoke(cmd, args)
    return r.exit_code, got, r.output


def test_the_generated_flags_parse_as_their_settings_say(tmp_path: Path) -> None:
    code, got, out = _captured("spool", ["--follow", "--rules", "a.yml", "--rules", "b.yml", "--interval", "5s",
                                         "--alert-webhook", "ops=http://h/", "--alert-webhook", "b=http://i/",
                                         "--alert-token-file", "ops=/t", "--alert-token-file", "b=/u"])
    assert code == 0, out
    assert got["follow"] is True and got["rules"] == ("a.yml", "b.yml") and got["interval"] == "5s"
    assert got["receiver_webhook"] == ("ops=http://h/", "b=http://i/") and got["token_files"] == ("ops=/t", "b=/u")
    code, got, out = _captured("spool", [])
    assert code == 0 and got["follow"] is False and got["rules"] == () and got["interval"] == "1s"
    assert got["db"] == "cmdare.duckdb" and got["config_file"] is None
    code, got, out = _captured("kafka", ["--ssl-no-check-hostname"])
    assert code == 0 and got["ssl_no_check_hostname"] is True
    code, _, out = _captured("spool", ["--config", str(tmp_path)])  # a directory is not a config file
    assert code == 2 and "is a directory" in out
    # a setting from a flag, the file or its default, as build() reads what click gave
    code, got, _ = _captured("spool", ["--rules", "a.yml", "--follow"])
    cfg = config.build("spool", "/tmp", got, {"rules", "follow"})
    assert cfg.rules == ["a.yml"] and cfg.follow is True


def test_help_shows_the_defaults_that_are_the_tables() -> None:
    code, _, out = _captured("spool", ["--help"])
    assert code == 0
    flat = " ".join(out.split())
    assert "--db TEXT" in flat and "[default: cmdare.duckdb]" in flat
    assert "[default: 1s]" in flat and "[default: 400d]" in flat
    assert "default: None" not in flat and "[default: False]" not in flat


def test_a_config_file_of_exactly_the_bound_is_read(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    body = '[ingest]\ninterval = "2s"\n'
    f.write_text(body + "#" * (config.MAX_CONFIG_BYTES - len(body) - 1) + "\n")
    assert f.stat().st_size == config.MAX_CONFIG_BYTES
    assert _build(file=str(f)).interval == 2.0
    f.write_text(body + "#" * (config.MAX_CONFIG_BYTES - len(body)) + "\n")
    with pytest.raises(ConfigError, match="over 1,048,576 bytes"):
        _build(file=str(f))
