"""scripts/kafka tells a user exactly what to install when Java or Maven is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_kafka_fetch_without_java_names_what_to_install(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "kafka"), "fetch"],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path), "CMDARE_KAFKA_CACHE": str(tmp_path / "cache")},
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "kafka: 'java' not found on PATH: install a JDK 17 or newer "
        "(Debian: apt-get install openjdk-17-jre-headless)"
    )


def test_kafka_fetch_without_maven_names_what_to_install(tmp_path: Path) -> None:
    import shutil

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "java").symlink_to(shutil.which("java") or "/usr/bin/java")
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "kafka"), "fetch"],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path / "bin"), "CMDARE_KAFKA_CACHE": str(tmp_path / "cache")},
    )
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        == "kafka: 'mvn' not found on PATH: install Apache Maven (Debian: apt-get install maven)"
    )
