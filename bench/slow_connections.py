"""Ordinary requests during a slow-header attack on the collector's API.

    python bench/slow_connections.py [--slow 1100] [--requests 200] [--db FILE]

A real collector API (``Service``, the default 256-connection cap) over a database (the
golden demo fleet's, made once, or ``--db``) is attacked by ``--slow`` connections from
loopback that each send a header line every 4 s and never finish, re-opened as soon as
they are closed (issue 52's attack). Meanwhile a client sends ``--requests`` ordinary
requests (``GET /api/v1/nodes``, a new connection each, half of them from 127.0.0.2), one
after another. Prints p50 / p99 / max and failures, with the same requests first without
the attack. Target: p99 under 1 s, no failure.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def attacker(port: int, n: int, stop: threading.Event, counts: dict[str, int]) -> None:
    def open_() -> socket.socket | None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(b"GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\n")
            counts["opened"] += 1
            return s
        except OSError:
            counts["refused"] += 1
            return None

    socks = [open_() for _ in range(n)]
    while not stop.is_set():
        for i, s in enumerate(socks):
            if s is None:
                socks[i] = open_()
                continue
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:
                s.close()
                socks[i] = open_()
        stop.wait(4.0)
    for s in socks:
        if s is not None:
            s.close()


def ordinary(port: int, n: int) -> tuple[list[float], int]:
    times, failed = [], 0
    for i in range(n):
        t = time.monotonic()
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=10,
                                         source_address=("127.0.0.2" if i % 2 else "127.0.0.1", 0))
            c.sendall(b"GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            body = b""
            while chunk := c.recv(65536):
                body += chunk
            c.close()
            if not body.startswith(b"HTTP/1.1 200"):
                failed += 1
        except OSError:
            failed += 1
        times.append(time.monotonic() - t)
    return times, failed


def summary(name: str, times: list[float], failed: int) -> None:
    q = statistics.quantiles(times, n=100)
    print(f"{name:16} n={len(times)}  p50 {q[49] * 1e3:7.1f} ms  p99 {q[98] * 1e3:7.1f} ms  "
          f"max {max(times) * 1e3:7.1f} ms  failed {failed}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slow", type=int, default=1100)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--db", help="a cmdare database (default: the golden demo fleet, made once)")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, a.slow + 1024)), hard))

    from common import served

    with served(a.db) as (svc, url):
        port = int(url.rsplit(":", 1)[1])
        summary("no attack", *ordinary(port, a.requests))
        stop, counts = threading.Event(), {"opened": 0, "refused": 0}
        th = threading.Thread(target=attacker, args=(port, a.slow, stop, counts), daemon=True)
        th.start()
        time.sleep(3.0)
        summary(f"{a.slow} slow", *ordinary(port, a.requests))
        stop.set()
        th.join(15)
        print(f"attacker: {counts['opened']} connections opened, {counts['refused']} refused at connect; "
              f"open now: {len(svc.server.server_state.connections)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
