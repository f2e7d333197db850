"""Tracking overhead: a loop of 1 ms steps with and without cmdare.agent.track, in one run.

Target (issue 3): under 20 microseconds added per step.

    python bench/track_overhead.py [--steps 5000] [--repeat 5]

Each step busy-waits 1 ms (sleep would add scheduler noise). Three receivers: a listening
socket drained by a thread (the agent), no agent at all (every datagram dropped and
counted), and the pure per-step cost with 0 ms steps (the most precise figure).
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator

from common import ROOT  # noqa: F401  (puts the repo on sys.path)

from cmdare.agent import track


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def loader(n: int) -> Iterator[int]:
    yield from range(n)


def plain(n: int, step: float) -> float:
    t = time.perf_counter()
    for _ in loader(n):
        spin(step)
    return time.perf_counter() - t


def tracked(n: int, step: float, sock: str) -> tuple[float, int]:
    run = track.init("bench", socket_path=sock)
    t = time.perf_counter()
    for _ in run.batches(loader(n), examples=32):
        spin(step)
    el = time.perf_counter() - t
    run.close()
    return el, run.dropped


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="cmb-")
    path = os.path.join(d, "t.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    got = [0]

    def drain() -> None:
        while True:
            try:
                got[0] += len(rx.recv(1 << 20))
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    print(f"tracking overhead, {a.steps} steps, best of {a.repeat} (interleaved):")
    for label, step in (("1 ms steps", 1e-3), ("0 ms steps", 0.0)):
        base, with_agent, no_agent, dropped = [], [], [], 0
        for _ in range(a.repeat):
            base.append(plain(a.steps, step))
            with_agent.append(tracked(a.steps, step, path)[0])
            el, dropped = tracked(a.steps, step, os.path.join(d, "absent.sock"))
            no_agent.append(el)
        b = min(base)
        for name, xs in (("agent listening", with_agent), ("no agent (dropped)", no_agent)):
            us = (min(xs) - b) / a.steps * 1e6
            print(f"  {label}, {name:19}: +{us:6.2f} us per step (target < 20 us)")
        print(
            f"  {label}: plain loop {b / a.steps * 1e6:.1f} us per step; records dropped without agent: {dropped}"
        )
    rx.close()
    print(f"  bytes received by the listening socket: {got[0]:,}")


if __name__ == "__main__":
    main()
