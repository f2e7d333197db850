"""Queries through the collector's API while it ingests from Kafka.

    python bench/live_query.py [--rate 100000] [--seconds 30] [--backlog 2000000]

1. Latency: a producer sends gpu samples (fake NVML, 20 nodes x 8 GPUs, the agent's
   message format) to a real broker at a steady ``--rate`` samples/s for ``--seconds``; a
   real ``cmdare-collector kafka ... --http 127.0.0.1:0`` process consumes them; a client
   meanwhile runs ``analyze nodes`` and ``analyze bottlenecks --job bench`` through the API
   back to back. Prints p50 / p99 / max per command, and whether ingest kept up (stored vs
   produced at the end). Target: p99 under 1 s. Run a third time with a deliberately slow
   SQL query (``POST /api/v1/sql``, a count over 10^11 rows, cut by its timeout) running
   beside them, again and again: reads must not wait behind it.
2. Slowdown: a backlog of ``--backlog`` samples is loaded by a fresh collector alone, then
   (same topic, a new group and database) with the query client running; prints both
   times and the slowdown. Target: under 10 %.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from common import ROOT, Broker

from cmdare.agent.sinks.shipper import pack
from cmdare.agent.sources.gpu import GpuSource
from cmdare.wire.events import EventFactory
from cmdare.wire.spool import Position
from tests.fakes.nvml import FakeNvml

BIN = Path(sys.executable).parent


def messages(samples: int, nodes: int = 20, gpus: int = 8, start: float | None = None) -> list[tuple[bytes, bytes, int]]:
    """(key, value, samples) messages as agents send them, one tick a second from ``start``,
    with a job declaration and step aggregates of job 'bench' on every node."""
    ticks = max(1, samples // (nodes * gpus))
    start = float(int(time.time())) - ticks if start is None else start
    out = []
    for n in range(nodes):
        src = GpuSource(GpuSource.parse_config("g", {}), nvml=FakeNvml(gpus=gpus))
        src.start()
        f = EventFactory(f"node-{n:03d}", "worker", "bench", rows=True)
        lines: list[bytes] = [f.line("train_job", {"run": "r1", "rank": n, "world_size": nodes, "model": "m"}, start, job="bench")]
        for t in range(ticks):
            src.collect(lambda ty, d, ts=None, lines=lines, f=f, t=t: lines.append(f.line(ty, d, start + t)))
            if t % 10 == 9:
                lines.append(f.line("train_steps", {"run": "r1", "rank": n, "interval_seconds": 10.0, "steps": 50,
                                                    "step_mean_seconds": 0.2, "wait_mean_seconds": 0.01,
                                                    "steps_per_second": 5.0}, start + t, job="bench"))
        data = b"".join(lines)
        for msg, cnt, _ in pack([(data, Position(1, len(data)))], 256 << 10, True):
            out.append((f.node.encode(), msg, cnt))
    return out


def send(bootstrap: str, topic: str, msgs: list[tuple[bytes, bytes, int]], rate: float | None) -> None:
    """Send ``msgs``; paced to ``rate`` samples/s (None: as fast as possible)."""
    from kafka import KafkaProducer

    prod = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=5, compression_type="gzip",
                         max_request_size=4 << 20, batch_size=512 << 10)
    t0, sent = time.monotonic(), 0
    order = sorted(msgs, key=lambda m: hash(m[1]) & 0xFFFF)  # nodes interleaved, as a fleet sends
    for key, value, cnt in order:
        prod.send(topic, key=key, value=value)
        sent += cnt
        if rate:
            ahead = sent / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    prod.flush()
    prod.close()


def collector(bootstrap: str, topic: str, db: Path, idle_exit: str | None = None) -> subprocess.Popen:
    args = [str(BIN / "cmdare-collector"), "kafka", f"kafka://{bootstrap}/{topic}", "--db", str(db),
            "--group", f"bench-{uuid.uuid4().hex[:6]}", "--http", "127.0.0.1:0", "--progress-every", "1h"]
    if idle_exit:
        args += ["--idle-exit", idle_exit]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def url_of(db: Path, p: subprocess.Popen) -> str:
    f = db.with_name(db.name + ".service.json")
    t = time.monotonic()
    while not f.exists():
        if p.poll() is not None or time.monotonic() - t > 60:
            raise SystemExit(f"collector did not start: {p.stderr.read() if p.stderr else ''}")
        time.sleep(0.05)
    return json.loads(f.read_text())["url"]


def api(url: str, route: str, body: dict | None = None) -> tuple[float, dict]:
    """One resource of the collector's API (GET, or POST with a JSON body): seconds, answer."""
    req = urllib.request.Request(url + route, method="GET" if body is None else "POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            out = json.loads(r.read())
    except urllib.error.HTTPError as e:
        out = {"error": e.read()[:300].decode(errors="replace")}
    return time.perf_counter() - t, out


def stored(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("cmdare_collector_events_stored_total "):
                return int(float(line.split()[1]))
    return 0


def query_loop(url: str, stop: threading.Event, lat: dict[str, list[float]]) -> None:
    cmds = {"nodes": ("/api/v1/nodes", None),
            "bottlenecks --job bench": ("/api/v1/findings/run", {"job": "bench", "store": False})}
    while not stop.is_set():
        for name, (route, body) in cmds.items():
            if stop.is_set():
                break
            dt, out = api(url, route, body)
            if isinstance(out, dict) and "error" in out:
                raise SystemExit(f"{name} failed: {out['error']}")
            lat[name].append(dt)


SLOW_SQL = "SELECT count(*) FROM range(100000000000) a"


def slow_loop(url: str, stop: threading.Event, runs: list[float]) -> None:
    """The slow query, again and again (each stopped by its 20 s timeout)."""
    while not stop.is_set():
        dt, _ = api(url, "/api/v1/sql", {"query": SLOW_SQL, "timeout": 20})
        runs.append(dt)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (all threads), from /proc."""
    import os

    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=100_000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--backlog", type=int, default=2_000_000)
    a = ap.parse_args()
    with Broker() as b, tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        # 1. latency under a steady rate; the same load without queries for the lag
        msgs = messages(int(a.rate * a.seconds))
        total = sum(m[2] for m in msgs)
        for with_queries, with_slow in ((False, False), (True, False), (True, True)):
            topic = f"live-{int(with_queries)}{int(with_slow)}"
            db = d / f"{topic}.duckdb"
            col = collector(b.bootstrap, topic, db)
            url = url_of(db, col)
            lat: dict[str, list[float]] = {"nodes": [], "bottlenecks --job bench": []}
            stop = threading.Event()
            prod = mp.get_context("fork").Process(target=send, args=(b.bootstrap, topic, msgs, a.rate))
            t0 = time.monotonic()
            prod.start()
            time.sleep(2.0)  # some data first
            q = threading.Thread(target=query_loop, args=(url, stop, lat), daemon=True)
            slow_runs: list[float] = []
            sq = threading.Thread(target=slow_loop, args=(url, stop, slow_runs), daemon=True)
            if with_slow:
                sq.start()
                time.sleep(0.5)  # it is running before the first read
            if with_queries:
                q.start()
            prod.join()
            sent_s = time.monotonic() - t0
            deadline = time.monotonic() + 60
            while stored(url) < total and time.monotonic() < deadline:
                time.sleep(0.05)
            caught_up = time.monotonic() - t0 - sent_s
            stop.set()
            if with_queries:
                q.join(timeout=120)
            n = stored(url)
            cpu = _cpu_seconds(col.pid)
            col.terminate()
            col.wait(timeout=60)
            what = ("with queries and a slow SQL query beside them" if with_slow
                    else "with queries" if with_queries else "without queries")
            print(f"steady {a.rate:,.0f} samples/s for {sent_s:.1f} s ({total:,} events), "
                  f"{what}: stored {n:,}, the last {caught_up:.2f} s after "
                  f"the producer's last send; collector CPU {cpu:.1f} s")
            if with_slow:
                print(f"  slow SQL: {len(slow_runs)} runs ended (each cut at its 20 s timeout) while the reads ran")
            for name, xs in lat.items():
                if xs:
                    print(f"  {name:<24} through the API: {len(xs)} runs, p50 {statistics.median(xs) * 1000:.0f} ms, "
                          f"p99 {pct(xs, 0.99) * 1000:.0f} ms, max {max(xs) * 1000:.0f} ms")
        # 2. backlog drain, alone and with queries
        back = messages(a.backlog)
        send(b.bootstrap, "backlog", back, None)
        nb = sum(m[2] for m in back)
        times = []
        for with_queries in (False, True, False, True):
            db = d / f"b{len(times)}.duckdb"
            col = collector(b.bootstrap, "backlog", db)
            url = url_of(db, col)
            stop = threading.Event()
            lat2: dict[str, list[float]] = {"nodes": [], "bottlenecks --job bench": []}
            q = threading.Thread(target=query_loop, args=(url, stop, lat2), daemon=True)
            t = time.monotonic()
            if with_queries:
                q.start()
            while stored(url) < nb:
                time.sleep(0.05)
            dt = time.monotonic() - t
            stop.set()
            if with_queries:
                q.join(timeout=120)
            col.terminate()
            col.wait(timeout=60)
            times.append((with_queries, dt, sum(len(v) for v in lat2.values())))
            done = [x for v in lat2.values() for x in v]
            print(f"  backlog {nb:,} events {'with' if with_queries else 'without'} queries: {dt:.2f} s "
                  f"({nb / dt:,.0f}/s)" + (f", {len(done)} queries answered meanwhile, the slowest in {max(done):.2f} s"
                                           if done else ""))
        alone = statistics.median([t for w, t, _ in times if not w])
        busy = statistics.median([t for w, t, _ in times if w])
        print(f"backlog drain: {alone:.2f} s alone, {busy:.2f} s with queries back to back: slowdown {busy / alone - 1:+.1%}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
