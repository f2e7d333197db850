"""A simulated fleet through Kafka into a lake: 10,000 agents (one process multiplexing
them, each sending what a real agent sends per tick: its GPUs' samples, a host sample and a
heartbeat, packed as the agent packs them) at a 10 s interval into a real Kafka topic,
through one and then two collectors in lake mode (real `cmdare-collector` processes in
one consumer group).

    python bench/fleet.py [--agents 10000] [--gpus 8] [--interval 10] [--seconds 120]
                          [--partitions 6] [--collectors 1,2] [--commit-every 10s]

Prints, per phase: events and GPU samples per second stored, the consumer lag over time
(records not yet in the lake: the partitions' ends less the lake's positions, every 5 s),
each collector's CPU (share of one core) and peak RSS, and the files and snapshots the lake
gained, per hour at that rate.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from common import Broker

from cmdare.agent.sinks.shipper import pack
from cmdare.wire.events import EventFactory
from cmdare.wire.spool import Position

BIN = Path(sys.executable).parent


class Producer(threading.Thread):
    """Every ``interval`` seconds, one message per agent with its tick's events."""

    def __init__(self, bootstrap: str, topic: str, agents: int, gpus: int, interval: float, seconds: float) -> None:
        super().__init__(daemon=True)
        from kafka import KafkaProducer

        self.prod = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=50, compression_type="gzip",
                                  batch_size=512 << 10, max_request_size=4 << 20)
        self.topic, self.agents, self.gpus, self.interval, self.seconds = topic, agents, gpus, interval, seconds
        self.factories = [EventFactory(f"node-{i:05d}", "worker", f"job-{i // 8}", rows=True) for i in range(agents)]
        self.events = self.gpu_samples = self.late_ticks = 0
        self.done = threading.Event()

    def tick_lines(self, f: EventFactory, i: int, ts: float) -> bytes:
        lines = [f.line("gpu", {"index": g, "uuid": f"GPU-{i:05d}-{g}", "name": "NVIDIA A100-SXM4-40GB",
                                       "util_gpu_ratio": ((i * 7 + g * 13 + int(ts)) % 100) / 100,
                                       "util_mem_ratio": 0.3, "mem_used_bytes": 30 << 30, "mem_total_bytes": 40 << 30,
                                       "power_watts": 310.5, "temp_celsius": 61.0, "sm_clock_hz": 1410e6,
                                       "throttle_mask": 0}, ts) for g in range(self.gpus)]
        lines.append(f.line("host", {"cpu_util_ratio": 0.42, "load1": 3.1, "mem_used_bytes": 60 << 30,
                                            "mem_total_bytes": 128 << 30}, ts))
        lines.append(f.line("heartbeat", {"seq": int(ts), "interval_seconds": self.interval}, ts))
        return b"".join(lines)

    def run(self) -> None:
        t0 = time.time()
        tick = 0
        while time.time() - t0 < self.seconds:
            start = time.time()
            for i, f in enumerate(self.factories):
                data = self.tick_lines(f, i, start)
                for msg, cnt, _ in pack([(data, Position(1, len(data)))], 256 << 10, True):
                    self.prod.send(self.topic, value=msg, key=f.node.encode())
                    self.events += cnt
            self.gpu_samples += self.agents * self.gpus
            tick += 1
            left = t0 + tick * self.interval - time.time()
            if left > 0:
                time.sleep(left)
            else:
                self.late_ticks += 1  # this process could not keep up with the fleet
        self.prod.flush()
        self.done.set()


def proc_cpu(pid: int) -> float:
    """CPU seconds of a process (user + system)."""
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def proc_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    return 0


def lake_files(lake: Path) -> tuple[int, int]:
    """(data files, snapshots) across the lake's tables."""
    from cmdare.collector.lake import Lake

    lk = Lake(str(lake), create=False)
    files = sum(1 for _ in lake.rglob("*.parquet"))
    snaps = sum(len(lk.table(n).snapshots()) for _, n in lk.catalog.list_tables("cmdare"))
    return files, snaps


def phase(b: Broker, a: argparse.Namespace, n: int, tmp: Path) -> dict:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    from cmdare.collector.lake import Lake

    topic = f"fleet-{n}-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    admin.create_topics([NewTopic(topic, a.partitions, 1)])
    admin.close()
    lake = tmp / f"lake-{n}"
    Lake(str(lake)).ensure()
    logs = [open(tmp / f"collector-{n}-{i}.log", "w") for i in range(n)]
    procs = [subprocess.Popen([str(BIN / "cmdare-collector"), "kafka", f"kafka://{b.bootstrap}/{topic}",
                               "--lake", str(lake), "--group", f"g-{topic}", "--commit-every", a.commit_every,
                               "--progress-every", "30s"], stdout=subprocess.DEVNULL, stderr=logs[i])
             for i in range(n)]
    time.sleep(8)  # the group forms
    files0, snaps0 = lake_files(lake)
    cpu0 = [proc_cpu(p.pid) for p in procs]
    prod = Producer(b.bootstrap, topic, a.agents, a.gpus, a.interval, a.seconds)
    t0 = time.time()
    prod.start()
    ends = KafkaConsumer(bootstrap_servers=b.bootstrap)
    tps = [TopicPartition(topic, p) for p in range(a.partitions)]
    lags: list[tuple[float, int]] = []
    lk = Lake(str(lake), create=False)
    caught = None
    while True:
        time.sleep(5)
        end = ends.end_offsets(tps)
        pos = lk.positions()
        lag = sum(end[tp] - (pos.get(f"{topic}/{tp.partition}") or [0])[0] for tp in tps)
        lags.append((time.time() - t0, lag))
        if prod.done.is_set() and lag == 0:
            caught = time.time() - t0
            break
        if time.time() - t0 > a.seconds + 300:
            break
    wall = time.time() - t0
    cpu = [(proc_cpu(p.pid) - c) / wall for p, c in zip(procs, cpu0, strict=True)]
    rss = [proc_hwm(p.pid) for p in procs]
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(timeout=120)
    files1, snaps1 = lake_files(lake)
    from cmdare.analytics.lakedb import LakeDatabase

    with LakeDatabase(str(lake)).read() as con:
        stored = con.execute("SELECT count(*) FROM gpu_samples").fetchall()[0][0]
    return {"collectors": n, "gpu_samples": prod.gpu_samples, "stored": stored, "events": prod.events,
            "seconds": a.seconds, "caught_up": caught, "lags": lags, "cpu": cpu, "rss": rss,
            "files": files1 - files0, "snapshots": snaps1 - snaps0, "wall": wall, "late_ticks": prod.late_ticks}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=10_000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=120.0, help="how long the fleet sends")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--collectors", default="1,2")
    ap.add_argument("--commit-every", default="10s")
    a = ap.parse_args()
    print(f"fleet: {a.agents} agents x {a.gpus} GPUs every {a.interval:g}s for {a.seconds:g}s "
          f"({a.agents * (a.gpus + 2) / a.interval:,.0f} events/s), {a.partitions} partitions, "
          f"commits every {a.commit_every}; cores: {len(os.sched_getaffinity(0))}", flush=True)
    with Broker() as b, tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in a.collectors.split(",")):
            r = phase(b, a, n, Path(tmp))
            per_hour = 3600 / r["wall"]
            print(f"\n{n} collector(s): {r['stored']:,} of {r['gpu_samples']:,} GPU samples stored "
                  f"({r['events']:,} events; {r['events'] / r['seconds']:,.0f} events/s, "
                  f"{r['gpu_samples'] / r['seconds']:,.0f} GPU samples/s sent)"
                  + (f"; the producer missed {r['late_ticks']} ticks" if r["late_ticks"] else ""))
            print(f"  caught up {r['caught_up']:.0f}s after the fleet started (it sent for {r['seconds']:g}s)"
                  if r["caught_up"] else "  did not catch up within 5 minutes of the fleet stopping")
            print("  lag (records not in the lake) every 5s: " + " ".join(f"{lag}" for _, lag in r["lags"]))
            for i, (c, m) in enumerate(zip(r["cpu"], r["rss"], strict=True)):
                print(f"  collector {i + 1}: CPU {c:.0%} of a core, peak RSS {m / 2**20:.0f} MiB")
            print(f"  lake: {r['files']} data files and {r['snapshots']} snapshots in {r['wall']:.0f}s "
                  f"-> {r['files'] * per_hour:,.0f} files and {r['snapshots'] * per_hour:,.0f} snapshots per hour "
                  f"(cmdare-collector maintain compacts and expires them)")


if __name__ == "__main__":
    main()
