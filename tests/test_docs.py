"""Docs that must stay true: every wire-format field documented, every source documented,
every console command in the README."""

from __future__ import annotations

from pathlib import Path

from cmdare.agent.sources import REGISTRY
from cmdare.wire.events import DATA_FIELDS

ROOT = Path(__file__).resolve().parent.parent


def test_every_data_field_is_in_the_wire_format_doc() -> None:
    doc = (ROOT / "docs" / "wire-format.md").read_text()
    for type_, fields in DATA_FIELDS.items():
        assert f"### `{type_}`" in doc
        for name in fields:
            assert f"| `{name}` |" in doc, f"{type_}.{name} missing from docs/wire-format.md"


def test_every_source_and_option_is_documented() -> None:
    doc = (ROOT / "docs" / "sources.md").read_text()
    sample = (ROOT / "agent" / "packaging" / "agent.sample.toml").read_text()
    for name, cls in REGISTRY.items():
        assert f"## {name}" in doc and f"[sources.{name}]" in sample
        for opt in cls.OPTIONS:
            assert f"`{opt}`" in doc and f"{opt} =" in sample, f"sources.{name}.{opt} undocumented"


def test_readme_has_the_two_commands_and_ci_runs_the_second() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "scripts/demo" in readme and "scripts/test" in readme
    assert "exec scripts/test" in (ROOT / ".ci" / "run").read_text()
    for cmd in ("cmdare-agent --check", "cmdare-collector kafka", "cmdare-collector spool"):
        assert cmd in readme
