"""GPU source (NVML through nvidia-ml-py, imported as ``pynvml``): one package, a module a
concern, one sample path.

- ``nvml``: the binding (``backend = "pynvml"`` or ``"python:pkg.module"``, the seam tests
  and benchmarks use), its return codes and what an error means;
- ``fields``: the field table (each NVML call, the fields it answers and their place in
  the row form) for the fixed fields and the health counters;
- ``gpm``: profiling activity (Hopper and later); ``nvlink``: links, their errors and
  throughput; ``mig``: MIG instances as GPUs of their own; ``processes``: per-process
  memory and SM / memory shares;
- ``source``: the ``gpu`` source itself (``GpuSource``), registered by name.

Per GPU per tick (one ``gpu`` event each): utilisation of GPU and memory, memory
used/total, power draw and limit, temperature, SM and memory clocks, PCIe tx/rx
throughput, clock-throttle reasons, volatile ECC totals, per-process memory; and where the
GPU answers them: profiling activity, energy, row remapping, retired pages, NVLink state /
errors / throughput, per-process SM and memory use. Xid critical errors, increases of the
ECC totals and a row remapping or page retirement turning pending or failed are sent as
``gpu_event`` events.

Failure handling (the scenarios tests/fakes/nvml.py names):
- NVML library or driver missing, or no GPU: the source is *unavailable*; that is
  reported once and start is retried every ``retry_interval``.
- A call the GPU does not answer (not supported, no permission, a function the binding or
  driver lacks): its fields are left out and it is not asked again.
- A GPU that falls off the bus (NVML_ERROR_GPU_IS_LOST): a ``gpu_event`` of kind ``lost``
  is sent once (for its MIG instances too), that GPU is skipped, the others keep reporting.
- Any other error: that call's fields are left out of this tick, said once in the log.
"""

from __future__ import annotations

from .fields import throttle_names
from .gpm import GPM_LINK_RX0, GPM_METRICS, metrics_view
from .nvml import load_backend
from .source import GpuSource

_metrics_view = metrics_view  # the name tests/agent/test_gpu.py checks the view by

__all__ = ["GPM_LINK_RX0", "GPM_METRICS", "GpuSource", "load_backend", "metrics_view", "throttle_names"]
