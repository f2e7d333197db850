"""Time each NVML call the GPU source makes, on a real GPU (the `device` machine): CPU and
wall microseconds per call, median of 200. Tells which calls a tick's cost is made of."""

from __future__ import annotations

import statistics
import time

import pynvml as n

n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
pid_ts = [0]
smp = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
calls = {
    "UtilizationRates": lambda: n.nvmlDeviceGetUtilizationRates(h),
    "MemoryInfo": lambda: n.nvmlDeviceGetMemoryInfo(h),
    "PowerUsage": lambda: n.nvmlDeviceGetPowerUsage(h),
    "EnforcedPowerLimit": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
    "Temperature": lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
    "ClockInfo": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
    "PcieThroughput": lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES),
    "ClocksEventReasons": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
    "TotalEccErrors": lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
    "ComputeRunningProcesses": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
    "TotalEnergyConsumption": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
    "RemappedRows": lambda: n.nvmlDeviceGetRemappedRows(h),
    "GpmSampleGet": lambda: n.nvmlGpmSampleGet(h, smp[0]),
    "ProcessUtilization": lambda: n.nvmlDeviceGetProcessUtilization(h, pid_ts[0]),
}
rows = []
for name, f in calls.items():
    cpu, wall = [], []
    for _ in range(200):
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            f()
        except n.NVMLError:
            pass
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    rows.append((name, statistics.median(cpu) * 1e6, statistics.median(wall) * 1e6))
for name, c, w in sorted(rows, key=lambda r: -r[2]):
    print(f"{name:26s} CPU {c:9.1f} us   wall {w:9.1f} us")
