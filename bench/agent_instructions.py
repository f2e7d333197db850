"""Agent cost in instructions: user-space instructions per sampling round of the agent and
of the bare loop (bench/agent_cost.py's), counted by valgrind's callgrind.

CPU time on a shared VM moves by 1.5x within minutes; an instruction count does not, so a
5 % change in the agent's own work shows here when bench/agent_cost.py cannot see it. It
leaves out what the kernel does for psutil's /proc reads (a large part of the bare loop's
CPU time), so its ratio is not the CPU ratio of the issue's target: use it to compare
versions of the agent.

    python bench/agent_instructions.py [--rounds 150] [--gpus 8] [--nvml binding|python]

Needs valgrind (apt install valgrind); about a minute per run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from agent_cost import bare_round, make_agent, nvml_of
from common import ROOT


def child(mode: str, rounds: int, gpus: int, kind: str) -> None:
    nvml = nvml_of(kind, gpus)
    nvml.nvmlInit()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
    with tempfile.TemporaryDirectory() as tmp:
        agent = make_agent(kind, gpus, f"{tmp}/sp")
        for _ in range(20):  # both modes warm the same way: the difference is the rounds
            agent.tick()
            bare_round(nvml, handles)
        fn = agent.tick if mode == "tick" else (lambda: bare_round(nvml, handles))
        for _ in range(rounds):
            fn()


def count(mode: str, rounds: int, a: argparse.Namespace) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'bench'}")
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__]
    cmd += ["--child", mode, "--rounds", str(rounds), "--gpus", str(a.gpus), "--nvml", a.nvml]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stderr
    m = re.search(r"Collected : (\d+)", out)
    if not m:
        raise SystemExit(f"callgrind printed no instruction count:\n{out[-2000:]}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--nvml", choices=("binding", "python"), default="binding")
    ap.add_argument("--child", choices=("bare", "tick"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.rounds, a.gpus, a.nvml)
        return
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind not found: install it (apt install valgrind) to count instructions")
    base = count("bare", 0, a)  # start-up and warm-up alone
    bare = (count("bare", a.rounds, a) - base) / a.rounds
    tick = (count("tick", a.rounds, a) - base) / a.rounds
    print(
        f"agent instructions per round, host + {a.gpus} GPUs ({a.nvml} NVML), user space, {a.rounds} rounds:"
    )
    print(
        f"  bare loop {bare / 1e6:.3f}M, agent tick {tick / 1e6:.3f}M -> {tick / bare:.2f}x; "
        f"the agent's own {(tick - bare) / 1e6:.3f}M"
    )


if __name__ == "__main__":
    main()
