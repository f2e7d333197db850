"""Revocation notice latency: from the moment a (local, fake) cloud metadata server starts
announcing a notice to the row being in DuckDB, through a real Kafka broker, with N agent
processes running (default 20: GCE, AWS and Azure servers in turn, default agent settings:
AWS / Azure polled every second, GCE long-polled).

    python bench/revocation_latency.py [--agents 20] [--rounds 5]

Each round announces one new notice per agent, in random order, a little apart (GCE: a
preemption, then maintenance events; AWS: a spot instance-action with a new time; Azure: a
new Preempt event).  The collector runs in this process (cmdare.collector KafkaIngest into
a DuckDB file); a reader polls the revocations table every 10 ms.  Prints p50 / p90 / p99
/ max.  Target: p99 under 2 s.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from common import ROOT, Broker

from cmdare.collector.consumer import KafkaIngest
from cmdare.collector.db import connect, cursor
from cmdare.wire.kafka import KafkaURL
from tests.fakes.metadata import FakeMetadata

BIN = Path(sys.executable).parent


def start_agent(tmp: Path, node: str, url: str, srv: FakeMetadata) -> subprocess.Popen:
    cfg = tmp / f"{node}.toml"
    cfg.write_text(f"""
node = "{node}"
interval = "10s"
[spool]
dir = "{tmp / ("spool-" + node)}"
[sink]
url = "{url}"
[sources.gpu]
enabled = false
[sources.train]
enabled = false
[sources.cloud]
provider = "auto"
metadata_url = "{srv.url}"
""")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [str(BIN / "cmdare-agent"), "--config", str(cfg)],
        env=env,
        stderr=open(tmp / f"{node}.log", "w"),
        stdout=subprocess.DEVNULL,
    )


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    clouds = ("gce", "aws", "azure")
    with Broker() as b, tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        topic = f"bench-notice-{uuid.uuid4().hex[:6]}"
        url = f"kafka://{b.bootstrap}/{topic}"
        servers = {
            f"vm-{i:02d}": FakeMetadata(clouds[i % 3], name=f"vm-{i:02d}").start() for i in range(a.agents)
        }
        procs = [start_agent(tmp, n, url, s) for n, s in servers.items()]
        con = connect(tmp / "bench.duckdb")
        ing = KafkaIngest(con, KafkaURL([b.bootstrap], topic), group=f"bench-{uuid.uuid4().hex[:6]}")
        ing.open()
        collector = threading.Thread(target=ing.run, daemon=True)
        collector.start()
        reader = cursor(con)
        seen: dict[tuple[str, str], float] = {}  # (node, notice_id) -> when first visible in DuckDB
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                for node, nid in reader.execute("SELECT node, notice_id FROM revocations").fetchall():
                    seen.setdefault((node, nid), time.time())
                time.sleep(0.01)

        def identified() -> int:
            return reader.execute("SELECT count(DISTINCT node) FROM instance_identity").fetchone()[0]

        t0 = time.monotonic()
        while identified() < a.agents:
            if time.monotonic() - t0 > 120:
                raise SystemExit(f"only {identified()} of {a.agents} agents identified in 120 s")
            time.sleep(0.2)
        print(
            f"{a.agents} agents up and identified in {time.monotonic() - t0:.1f}s; "
            f"clouds: {', '.join(f'{c} x{sum(s.cloud == c for s in servers.values())}' for c in clouds)}"
        )
        threading.Thread(target=poll, daemon=True).start()
        rng = random.Random(1)
        lat: list[float] = []
        by: dict[str, list[float]] = {c: [] for c in clouds}
        missing = 0
        for r in range(a.rounds):
            before = set(seen)
            announced: dict[str, float] = {}
            order = list(servers)
            rng.shuffle(order)
            for n in order:
                s = servers[n]
                if s.cloud == "gce":
                    if r == 0:
                        s.preempt()
                    else:
                        s.maintenance(
                            "TERMINATE_ON_HOST_MAINTENANCE" if r % 2 else "MIGRATE_ON_HOST_MAINTENANCE"
                        )
                elif s.cloud == "aws":
                    s.preempt(lead=120 + r)
                else:
                    s.preempt(lead=30)
                announced[n] = s.announced_at or time.time()
                time.sleep(rng.uniform(0.05, 0.15))
            # one notice per node per round: wait for the round to land before the next
            t1 = time.monotonic()
            while len(seen) - len(before) < a.agents and time.monotonic() - t1 < 30:
                time.sleep(0.05)
            new = {k: t for k, t in list(seen.items()) if k not in before}
            for n, t in announced.items():
                got = [v for (node, _), v in new.items() if node == n]
                if len(got) != 1:
                    missing += 1
                    print(f"round {r}: {n}: {len(got)} new notices in DuckDB (expected 1)")
                    continue
                lat.append(got[0] - t)
                by[servers[n].cloud].append(got[0] - t)
        expected = a.agents * a.rounds
        stop.set()
        ing.stop()
        collector.join(10)
        dup = reader.execute(
            "SELECT count(*) - count(DISTINCT (node, notice_id)) FROM revocations"
        ).fetchone()[0]
        con.close()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        for s in servers.values():
            s.stop()
        trouble = [
            f"{f.stem}: {line.strip()}"
            for f in sorted(tmp.glob("*.log"))
            for line in f.read_text().splitlines()
            if "cmdare.agent.cloud" in line
            and ("WARNING" in line or "ERROR" in line)
            and "notice:" not in line
        ]
        for line in trouble[:20]:
            print("agent log:", line)
    print(f"notices: {len(lat)} of {expected} in DuckDB ({missing} missing), {dup} stored twice")
    print(
        f"latency announce -> DuckDB row: p50 {pct(lat, 0.5):.3f}s  p90 {pct(lat, 0.9):.3f}s  "
        f"p99 {pct(lat, 0.99):.3f}s  max {max(lat):.3f}s  (target p99 < 2 s)"
    )
    for c, xs in by.items():
        if xs:
            print(f"  {c:5s}: n={len(xs):3d}  p50 {pct(xs, 0.5):.3f}s  max {max(xs):.3f}s")


if __name__ == "__main__":
    main()
