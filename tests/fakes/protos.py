"""Python modules compiled with grpcio-tools from a ``.proto`` of this folder at test time
(once per test session), so the agent's hand-written protobuf decoders are checked against
protoc's encoders."""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
_compiled: dict[str, tuple[Any, Any]] = {}


def compiled(stem: str) -> tuple[Any, Any]:
    """(``<stem>_pb2``, ``<stem>_pb2_grpc``) from ``<stem>.proto``."""
    if stem not in _compiled:
        from grpc_tools import protoc

        out = tempfile.mkdtemp(prefix="cmdare-proto-")
        rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={out}", f"--grpc_python_out={out}",
                          str(HERE / f"{stem}.proto")])
        assert rc == 0, f"protoc failed on {stem}.proto"
        sys.path.insert(0, out)
        _compiled[stem] = (importlib.import_module(f"{stem}_pb2"), importlib.import_module(f"{stem}_pb2_grpc"))
    return _compiled[stem]
