"""The table of invalid configs with their exact one-line errors (the OpenTelemetry
Collector habit), plus precedence: defaults < file < environment < flags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cmdare.agent.config import ConfigError, load, parse_kafka_url

INVALID = [
    (
        'nodee = "x"',
        "unknown key 'nodee' (known: interval, job, labels, log_level, node, otlp, prometheus, role, sample_format, sink, sources, spool)",
    ),
    ('role = "boss"', "role: must be one of worker, ps, chief, data, client, got 'boss'"),
    ('interval = "10 parsecs"', "interval: expected a duration like 500ms, 10s, 5m or 24h, got '10 parsecs'"),
    ('interval = "10ms"', "interval: must be between 50ms and 1h, got '10ms'"),
    ('sample_format = "csv"', "sample_format: must be one of rows, json, got 'csv'"),
    (
        "[spool]\nmaxbytes = 5",
        "unknown key 'spool.maxbytes' (known: dir, fsync, fsync_interval, max_age, max_bytes, segment_bytes)",
    ),
    (
        '[spool]\nfsync_interval = "soon"',
        "spool.fsync_interval: expected a duration like 500ms, 10s, 5m or 24h, got 'soon'",
    ),
    (
        '[spool]\nmax_bytes = "1KiB"',
        "spool.max_bytes: must be at least twice spool.segment_bytes (16777216 bytes)",
    ),
    ('[spool]\nmax_bytes = "lots"', "spool.max_bytes: expected a size like 512MiB or 1GB, got 'lots'"),
    ('[spool]\nfsync = "sometimes"', "spool.fsync: expected true or false, got 'sometimes'"),
    (
        '[sink]\nurl = "http://x:9092/t"',
        "sink.url: 'http://x:9092/t' is not a kafka:// URL (expected kafka://host:port[,host:port]/topic)",
    ),
    (
        '[sink]\nurl = "kafka://x/t"',
        "sink.url: broker 'x' in 'kafka://x/t' must be host:port with a port 1-65535",
    ),
    (
        '[sink]\nurl = "kafka://x:99999/t"',
        "sink.url: broker 'x:99999' in 'kafka://x:99999/t' must be host:port with a port 1-65535",
    ),
    (
        '[sink]\nurl = "kafka://x:9092/"',
        "sink.url: 'kafka://x:9092/' needs a topic name of letters, digits, '.', '_' or '-' after the '/'",
    ),
    (
        '[sink]\nurl = "kafka:///t"',
        "sink.url: 'kafka:///t' names no broker (expected kafka://host:port[,host:port]/topic)",
    ),
    (
        '[sink]\ncompression = "brotli"',
        "sink.compression: must be one of none, gzip, snappy, lz4, zstd, got 'brotli'",
    ),
    ("[sink]\nlinger_ms = -1", "sink.linger_ms: must be between 0 and 60000, got -1"),
    (
        '[sink]\nmessage_format = "parquet"',
        "sink.message_format: must be one of columns, lines, got 'parquet'",
    ),
    (
        "[sources.gpuu]",
        "unknown key 'sources.gpuu' (known: cloud, gpu, heartbeat, host, tensorboard, tpu, train)",
    ),
    (
        "[sources.gpu]\nretry = 5",
        "unknown key 'sources.gpu.retry' (known: apiserver, backend, enabled, job_labels, kubelet_socket, kubernetes, kubernetes_interval, mig, nvlink, processes, profiling, retry_interval, slurm, slurm_gpu_map, xid_events)",
    ),
    (
        '[sources.gpu]\nbackend = "cuda"',
        "sources.gpu.backend: must be 'pynvml' or 'python:<module>', got 'cuda'",
    ),
    ('[sources.host]\nenabled = "maybe"', "sources.host.enabled: expected true or false, got 'maybe'"),
    ("labels = {team = 5}", "labels.team: label values must be strings, got 5"),
    ("sources = 3", "sources: expected a table, got int"),
]


@pytest.mark.parametrize("text,error", INVALID, ids=[e.split(":")[0][:40] for _, e in INVALID])
def test_invalid_config_gives_exact_one_line_error(tmp_path: Path, text: str, error: str) -> None:
    f = tmp_path / "agent.toml"
    f.write_text(text + "\n")
    with pytest.raises(ConfigError) as e:
        load(f, env={})
    assert str(e.value) == error
    assert "\n" not in str(e.value)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text("x = [\n")
    with pytest.raises(ConfigError, match=rf"^{f}: invalid TOML: "):
        load(f, env={})


def test_missing_named_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load(tmp_path / "nope.toml", env={})


def test_defaults_without_a_file(tmp_path: Path) -> None:
    cfg = load(None, env={"CMDARE_AGENT_CONFIG": str(tmp_path / "absent.toml")})
    assert cfg.role == "worker" and cfg.interval == 10.0 and cfg.sink.kafka is None
    assert cfg.spool.max_bytes == 1 << 30 and cfg.sources["gpu"]["enabled"] is True


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text('node = "from-file"\njob = "file-job"\ninterval = "30s"\n[spool]\nmax_bytes = "64MiB"\n')
    env = {
        "CMDARE_AGENT_JOB": "env-job",
        "CMDARE_AGENT_SPOOL__MAX_BYTES": '"128MiB"',
        "CMDARE_AGENT_SOURCES__GPU__ENABLED": "false",
    }
    cfg = load(f, env=env, overrides={"interval": "2s"})
    assert cfg.node == "from-file"
    assert cfg.job == "env-job"
    assert cfg.spool.max_bytes == 128 << 20
    assert cfg.sources["gpu"]["enabled"] is False
    assert cfg.interval == 2.0


def test_kafka_url_with_several_brokers() -> None:
    u = parse_kafka_url("sink.url", "kafka://a:9092,b:9093/cmdare.events")
    assert u.bootstrap == ["a:9092", "b:9093"] and u.topic == "cmdare.events"


def test_cli_config_error_exit_code_and_single_line(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text('[sink]\nurl = "kafka://nohost/t"\n')
    r = subprocess.run(
        [sys.executable, "-m", "cmdare.agent.cli", "--config", str(f), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "cmdare-agent: config error: sink.url: broker 'nohost' in 'kafka://nohost/t' "
        "must be host:port with a port 1-65535"
    )


def test_cli_check_reports_unreachable_broker(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cmdare.agent.cli",
            "--check",
            "--spool-dir",
            str(tmp_path / "sp"),
            "--set",
            "sources.gpu.enabled=false",
            "--sink",
            f"kafka://127.0.0.1:{port}/t",
            "--set",
            "sink.request_timeout=2s",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    err = [line for line in r.stdout.splitlines() if line.startswith("sink")]
    assert len(err) == 1 and "error" in err[0] and f"kafka://127.0.0.1:{port}/t" in err[0]


def test_check_creates_no_directories_or_files(tmp_path: Path) -> None:
    spool, run_dir = tmp_path / "var" / "spool", tmp_path / "run" / "cmdare"
    r = subprocess.run(
        [sys.executable, "-m", "cmdare.agent.cli", "--config", "/dev/null", "--check", "--spool-dir", str(spool),
         "--set", "sources.gpu.enabled=false", "--set", "sources.train.enabled=true",
         "--set", f"sources.train.socket={run_dir / 'train.sock'}"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(tmp_path.iterdir()) == []  # neither the spool nor /run/cmdare made by a check
    lines = r.stdout.splitlines()
    assert any(x.startswith("spool     ok") and "(to be created in" in x for x in lines), lines
    assert any(x.startswith("source    ok     train: would listen on") and "to be created" in x for x in lines), lines
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    r = subprocess.run(
        [sys.executable, "-m", "cmdare.agent.cli", "--config", "/dev/null", "--check", "--spool-dir", str(ro / "f"),
         "--set", "sources.gpu.enabled=false"],
        capture_output=True, text=True, timeout=60,
    )
    if os.geteuid() != 0:  # root writes anywhere
        assert r.returncode == 1 and f"{ro} is not writable by this user" in r.stdout
    assert list(ro.iterdir()) == []
