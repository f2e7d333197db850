"""Build the stand-in ``libnvidia-ml.so.1`` (nvml_stub.c) that the real nvidia-ml-py
bindings load on a machine without an NVIDIA driver.

    from tests.fakes import nvml_stub
    libdir = nvml_stub.build()              # .cache/nvml-stub/<hash>/libnvidia-ml.so.1
    env["LD_LIBRARY_PATH"] = str(libdir)    # a child process: pynvml finds it as the driver's
    pynvml = nvml_stub.load()               # this process: pynvml bound to the stub

The scenario and GPU count come from ``$CMDARE_FAKE_NVML`` when nvmlInit runs, as for
the Python fake (tests/fakes/nvml.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("nvml_stub.c")
ROOT = Path(__file__).resolve().parents[2]
LIBNAME = "libnvidia-ml.so.1"


class NoCompiler(RuntimeError):
    """No C compiler to build the stub with."""


DRIVERS = {"current": [], "r470": ["-DNVML_STUB_R470"]}  # r470: a driver older than the binding


def build(cache: Path | None = None, driver: str = "current") -> Path:
    """The folder holding the compiled stub (built once per source version and driver)."""
    flags = DRIVERS[driver]
    src = SOURCE.read_bytes()
    out = (cache or ROOT / ".cache" / "nvml-stub") / (driver + "-" + hashlib.sha256(src).hexdigest()[:16])
    lib = out / LIBNAME
    if lib.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NoCompiler("no C compiler (cc or gcc) on PATH to build the NVML stub; install gcc")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{LIBNAME}.{os.getpid()}"
    r = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", *flags, "-o", str(tmp), str(SOURCE)],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise RuntimeError(f"building the NVML stub failed: {r.stderr.strip()}")
    os.replace(tmp, lib)  # atomic: a parallel build never sees half a library
    return out


def load(cache: Path | None = None, driver: str = "current") -> Any:
    """The real ``pynvml`` module bound to the stub in this process (its library handle is
    process-wide: use a child process where other code must see no driver)."""
    import pynvml

    pynvml.nvmlLib = ctypes.CDLL(str(build(cache, driver) / LIBNAME))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml
