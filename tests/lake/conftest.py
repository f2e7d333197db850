"""Fixtures the lake's tests share; a module that needs a lake with data in it defines its
own ``lake``, which takes precedence over this one."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmdare.collector.lake import Lake


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    """An empty lake in this test's directory, its tables made."""
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    return lk
