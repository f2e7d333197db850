"""Fixtures shared by the agent tests."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cmdare.agent.sources.train import TrainSource


@pytest.fixture
def source() -> Iterator[tuple[TrainSource, Path]]:
    """A started train source on a fresh socket (short path: AF_UNIX limits its length)."""
    sock = Path(tempfile.mkdtemp(prefix="cmt-")) / "t.sock"
    src = TrainSource(TrainSource.parse_config("sources.train", {"socket": str(sock)}))
    src.start()
    yield src, sock
    src.close()
