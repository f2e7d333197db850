"""What a real GPU and driver answer to the NVML calls cmdare uses and those issue 38 plans
(profiling metrics through GPM, NVLink, MIG, per-process use, energy, row remapping), as
JSON: each call's answer, or the NVML error it raised. Run on a machine with a GPU:

    python scripts/nvml_probe.py [--load SECONDS] [--out FILE]

With --load, a bf16 matrix-product loop (PyTorch, where installed) runs meanwhile in a child
process, so the activity counters show a busy GPU and the process lists hold a process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""


def call(f: Any, *args: Any) -> Any:
    import pynvml

    try:
        v = f(*args)
    except pynvml.NVMLError as e:
        return {"error": str(e)}
    except Exception as e:  # noqa: BLE001 (a binding without the call: say so)
        return {"error": f"{type(e).__name__}: {e}"}
    return plain(v)


def plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if hasattr(v, "_fields_"):
        return {k: plain(getattr(v, k)) for k, _ in v._fields_}
    return repr(v)


GPM = {  # name -> pynvml constant name
    "graphics_activity": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "sm_active": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_bw_util": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "fp64_active": "NVML_GPM_METRIC_FP64_UTIL",
    "fp32_active": "NVML_GPM_METRIC_FP32_UTIL",
    "fp16_active": "NVML_GPM_METRIC_FP16_UTIL",
    "pcie_tx_bytes_per_second": "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
    "pcie_rx_bytes_per_second": "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
    "nvlink_tx_bytes_per_second": "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
    "nvlink_rx_bytes_per_second": "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",
}


def gpm(h: Any, interval: float) -> Any:
    import pynvml

    sup = call(pynvml.nvmlGpmQueryDeviceSupport, h)
    out: dict[str, Any] = {"support": sup}
    if isinstance(sup, dict) and sup.get("isSupportedDevice"):
        try:
            s1 = pynvml.nvmlGpmSampleAlloc()
            s2 = pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmSampleGet(h, s1)
            time.sleep(interval)
            pynvml.nvmlGpmSampleGet(h, s2)
            names = [k for k, c in GPM.items() if hasattr(pynvml, c)]
            mg = pynvml.c_nvmlGpmMetricsGet_t()
            mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(names)
            mg.sample1, mg.sample2 = s1, s2
            for i, k in enumerate(names):
                mg.metrics[i].metricId = getattr(pynvml, GPM[k])
            pynvml.nvmlGpmMetricsGet(mg)
            out["metrics"] = {k: {"value": mg.metrics[i].value, "nvmlReturn": mg.metrics[i].nvmlReturn}
                              for i, k in enumerate(names)}
            pynvml.nvmlGpmSampleFree(s1)
            pynvml.nvmlGpmSampleFree(s2)
        except Exception as e:  # noqa: BLE001
            out["metrics_error"] = f"{type(e).__name__}: {e}"
    return out


def device(h: Any, interval: float) -> dict[str, Any]:
    import pynvml

    d: dict[str, Any] = {}
    for name, f in (("name", pynvml.nvmlDeviceGetName), ("uuid", pynvml.nvmlDeviceGetUUID),
                    ("utilization", pynvml.nvmlDeviceGetUtilizationRates), ("memory", pynvml.nvmlDeviceGetMemoryInfo),
                    ("power_mw", pynvml.nvmlDeviceGetPowerUsage), ("energy_mj", pynvml.nvmlDeviceGetTotalEnergyConsumption),
                    ("mig_mode", pynvml.nvmlDeviceGetMigMode), ("max_mig_devices", pynvml.nvmlDeviceGetMaxMigDeviceCount),
                    ("remapped_rows", pynvml.nvmlDeviceGetRemappedRows),
                    ("compute_processes", pynvml.nvmlDeviceGetComputeRunningProcesses),
                    ("throttle_reasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons),
                    ("pcie_link_gen", pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
                    ("architecture", pynvml.nvmlDeviceGetArchitecture)):
        d[name] = call(f, h)
    d["retired_pages_dbe"] = call(pynvml.nvmlDeviceGetRetiredPages, h,
                                  pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    d["process_utilization"] = call(pynvml.nvmlDeviceGetProcessUtilization, h, 0)
    links = {}
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        st = call(pynvml.nvmlDeviceGetNvLinkState, h, link)
        if isinstance(st, dict):  # an error: no such link here
            links[link] = st
            continue
        links[link] = {"state": st,
                       "replay_errors": call(pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link,
                                             pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
                       "crc_flit_errors": call(pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link,
                                               pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)}
    d["nvlink"] = links
    d["gpm"] = gpm(h, interval)
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", type=float, default=0.0, help="seconds of bf16 matrix products meanwhile")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between the two GPM samples")
    ap.add_argument("--out", help="write the JSON here (default: stdout)")
    a = ap.parse_args()
    import pynvml

    child = None
    if a.load > 0:
        child = subprocess.Popen([sys.executable, "-c", LOAD, str(a.load)])
        time.sleep(min(8.0, a.load / 2))  # CUDA up and the products running
    pynvml.nvmlInit()
    try:
        out = {"driver": call(pynvml.nvmlSystemGetDriverVersion), "nvml": call(pynvml.nvmlSystemGetNVMLVersion),
               "binding": getattr(pynvml, "__version__", None) or "nvidia-ml-py", "load_seconds": a.load,
               "gpus": [device(pynvml.nvmlDeviceGetHandleByIndex(i), a.interval)
                        for i in range(pynvml.nvmlDeviceGetCount())]}
    finally:
        pynvml.nvmlShutdown()
        if child is not None:
            child.wait(timeout=a.load + 60)
    text = json.dumps(out, indent=1, default=str)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text if not a.out else f"wrote {a.out}")


if __name__ == "__main__":
    main()
