"""Agent cost benchmark: CPU seconds per 1,000 sampling rounds (host source + a fake NVML
with 8 GPUs), as a ratio to a bare loop making the same psutil / NVML calls, and the
peak RSS of a real agent process.

Targets (issue 2): ratio <= 1.5x; peak RSS < 80 MB.

    python bench/agent_cost.py [--rounds 1000] [--gpus 8]

The fake NVML answers from memory, so the bare loop is cheaper than on a real GPU host
(real NVML calls cost tens of microseconds each): the ratio printed here is the harsh one.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import psutil
from common import ROOT

from cmdare.agent.config import load
from cmdare.agent.runtime import Agent
from tests.fakes.nvml import FakeNvml


def bare_round(nvml: FakeNvml, handles: list) -> None:
    psutil.cpu_times()
    psutil.cpu_times(percpu=True)
    os.getloadavg()
    psutil.virtual_memory()
    psutil.swap_memory()
    psutil.net_io_counters(pernic=True)
    psutil.disk_io_counters(perdisk=True)
    psutil.pids()
    n = nvml
    for h in handles:
        n.nvmlDeviceGetUtilizationRates(h)
        n.nvmlDeviceGetMemoryInfo(h)
        n.nvmlDeviceGetPowerUsage(h)
        n.nvmlDeviceGetEnforcedPowerLimit(h)
        n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
        n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
        n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)
        n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES)
        n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES)
        n.nvmlDeviceGetCurrentClocksEventReasons(h)
        n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)
        n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
        n.nvmlDeviceGetComputeRunningProcesses(h)
    try:
        n.nvmlEventSetWait_v2(None, 0)
    except n.NVMLError:
        pass


def measure(fn, rounds: int) -> float:
    c0 = time.process_time()  # clock_gettime(CLOCK_PROCESS_CPUTIME_ID): ns, not os.times' 10 ms ticks
    for _ in range(rounds):
        fn()
    return time.process_time() - c0


def interleaved(bare, ours, rounds: int, chunk: int) -> tuple[float, float, list[float]]:
    """CPU seconds of ``rounds`` rounds of each, run in alternating chunks so that both see
    the same machine (this VM's speed moves by 1.5x within minutes), and each pair's ratio."""
    b = o = 0.0
    ratios = []
    for _ in range(max(1, rounds // chunk)):
        tb, to = measure(bare, chunk), measure(ours, chunk)
        b, o = b + tb, o + to
        ratios.append(to / tb)
    return b, o, ratios


def peak_rss_of_agent(gpus: int, seconds: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(ROOT), CMDARE_FAKE_NVML=f"gpus={gpus}")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "cmdare.agent.cli",
                "--spool-dir",
                f"{tmp}/sp",
                "--interval",
                "0.05s",
                "--duration",
                str(seconds),
                "--log-level",
                "warning",
                "--set",
                "sources.gpu.backend=python:tests.fakes.nvml",
            ],
            env=env,
            check=True,
        )
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=50, help="rounds per interleaved chunk")
    a = ap.parse_args()
    nvml = FakeNvml(gpus=a.gpus)
    nvml.nvmlInit()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(a.gpus)]
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for fsync in (False, True):
            cfg = load(
                None,
                env={"CMDARE_AGENT_CONFIG": f"{tmp}/none.toml"},
                overrides={
                    "spool.dir": f"{tmp}/sp-{fsync}",
                    "spool.fsync": fsync,
                    "node": "bench",
                    "sources.train.enabled": False,  # host + GPUs, as the bare loop
                    "sources.tpu.enabled": False,
                    "sources.cloud.enabled": False,
                },
            )
            agent = Agent(cfg, adapters={"nvml": FakeNvml(gpus=a.gpus)})
            agent.open()
            measure(agent.tick, a.chunk)  # warm
            bare, ours, ratios = [], [], []
            for _ in range(a.repeat):  # the machine is shared and noisy: best of N, and pairs
                b, o, r = interleaved(lambda: bare_round(nvml, handles), agent.tick, a.rounds, a.chunk)
                bare.append(b)
                ours.append(o)
                ratios += r
            agent.close()
            results[fsync] = (min(bare), min(ours), statistics.median(ratios), len(ratios))
    print(
        f"agent cost, {a.rounds} rounds, host + {a.gpus} fake GPUs (best of {a.repeat}, chunks of {a.chunk}):"
    )
    for fsync, (b, o, med, pairs) in results.items():
        print(
            f"  spool fsync={str(fsync):5} (fsync_interval 1s): bare loop {b:.3f} CPU-s, agent {o:.3f} CPU-s "
            f"-> {o / b:.2f}x; median of {pairs} chunk pairs {med:.2f}x (target <= 1.5x); "
            f"{o / a.rounds * 1e3:.2f} ms CPU per round, {(o - b) / a.rounds * 1e6:.0f} us of it the agent's own"
        )
    t = time.perf_counter()
    rss = peak_rss_of_agent(a.gpus, 10.0)
    print(
        f"  peak RSS of a real agent process (10 s at 50 ms, {a.gpus} fake GPUs): {rss:.1f} MB (target < 80 MB)"
        f" [{time.perf_counter() - t:.0f}s]"
    )


if __name__ == "__main__":
    main()
