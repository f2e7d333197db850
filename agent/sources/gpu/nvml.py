"""The NVML binding: loading it (``pynvml``, or any module with its functions: the seam the
tests and benchmarks use), its return codes, and the one place an NVML error gets its
meaning (nvitop's habit): a call a GPU cannot answer is absent, and not asked again; a GPU
off the bus is lost; anything else is absent for this tick and said once."""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

# NVML return codes (stable across driver versions; see nvml.h)
UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION = 1, 2, 3, 4
NOT_FOUND, DRIVER_NOT_LOADED, TIMEOUT, LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND, GPU_IS_LOST = 6, 9, 10, 12, 13, 15
UNAVAILABLE_AT_INIT = {DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND, NO_PERMISSION, 999}
# a call answered with one of these is the GPU's nature, not a moment's: never asked again
NEVER = {NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION, INVALID_ARGUMENT}

# nvidia-ml-py raises this (not an NVMLError) when an unversioned call it maps to a newer
# versioned function (processes -> _v3) meets a driver without it
MISMATCH: tuple[type[BaseException], ...] = ()
try:
    from pynvml import NVMLLibraryMismatchError

    MISMATCH = (NVMLLibraryMismatchError,)
except ImportError:  # an older binding, or none: then nothing raises it
    pass


class GpuLost(Exception):
    pass


def load_backend(spec: str) -> Any:
    """``pynvml`` or ``python:some.module`` (a module with pynvml's functions)."""
    if spec == "pynvml":
        import pynvml

        return pynvml
    if spec.startswith("python:"):
        return importlib.import_module(spec[len("python:") :])
    raise ValueError(f"sources.gpu.backend: unknown backend {spec!r} (use 'pynvml' or 'python:module')")


def code(e: BaseException) -> int | None:
    """An NVML error's return code (None for a binding mismatch and the like)."""
    return getattr(e, "value", None)


def never_again(e: BaseException) -> bool:
    """Whether a failed call is the GPU's (or the binding's) nature: not asked again."""
    return code(e) in NEVER or isinstance(e, (*MISMATCH, AttributeError, TypeError))


def text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def handle_key(h: Any) -> int:
    """What identifies a device handle: pynvml's handles are ctypes pointers, and the
    binding builds a new pointer object for each answer (an event's device), so the
    address it holds; any other binding's handle, the object itself."""
    try:
        return ctypes.cast(h, ctypes.c_void_p).value or 0
    except (ctypes.ArgumentError, TypeError):
        return id(h)
