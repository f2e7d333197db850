"""Alert latency: from the moment a (local, fake) cloud metadata server starts announcing a
revocation to a real Alertmanager holding the alert, through real agents, a real Kafka
broker and a real collector process evaluating the shipped rules (``--rules default``).

    python bench/alert_latency.py [--agents 20] [--rounds 3] [--slow-rule] [--lake]

Each round starts ``--agents`` agent processes (GCE, AWS and Azure metadata servers in
turn, default agent settings) with fresh node names, waits until the collector has seen them
all, then announces one revocation per agent in random order, a little apart; a poller
reads Alertmanager's ``GET /api/v2/alerts`` every 20 ms for ``RevocationNotice`` alerts.
Prints p50 / p90 / p99 / max.  Target: p99 under 3 s (SkyPilot polls every 15-20 s; a
Prometheus + Alertmanager chain with default intervals takes about a minute).
With ``--slow-rule``, a user rule file is loaded beside the shipped pack: one group of four
rules that each scan for about 12 s (the case where one evaluation thread delayed a real
preemption's alert by 25 s): revocation alerts must not wait for it.
With ``--lake``: two ingest collectors write a lake (``--commit-every 10s``, the default)
and two ``cmdare-collector serve --lake`` servers read it, one of them the ruler
(``--rules default --notices URL``): notices reach it by its fast path, not the commits.
Needs Go (scripts/gobuild alertmanager).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from common import ROOT, Broker
from revocation_latency import pct, start_agent  # the same agents, the same percentile

from tests.conftest import Alertmanager, go_tool
from tests.fakes.metadata import FakeMetadata

BIN = Path(sys.executable).parent


def analyze_json(db: Path, *args: str) -> object:
    r = subprocess.run([str(BIN / "analyze"), *args, "--db", str(db), "--json"], capture_output=True, text=True,
                       timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slow-rule", action="store_true", help="also load a group of four slow user rules")
    ap.add_argument("--lake", action="store_true", help="lake mode: ingest collectors, two servers, one ruler")
    a = ap.parse_args()
    clouds = ("gce", "aws", "azure")
    with Broker() as b, tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        am = Alertmanager(go_tool("alertmanager"), tmp)
        topic = f"bench-alert-{uuid.uuid4().hex[:6]}"
        url = f"kafka://{b.bootstrap}/{topic}"
        db = tmp / "alerts.duckdb"
        extra: list[str] = []
        if a.slow_rule:
            slow = tmp / "slow.yml"
            slow.write_text("groups:\n  - name: slow-user-rules\n    interval: 15s\n    rules:\n" + "".join(
                f"      - alert: Slow{i}\n        expr: SELECT 'x' AS k, count(*) AS value"
                f" FROM range(360000) a, range(360000) b\n" for i in range(4)))
            extra = ["--rules", str(slow)]
        if a.lake:
            cols, nodes_of = lake_mode(tmp, url, am.url, extra)
        else:
            cols = [subprocess.Popen(
                [str(BIN / "cmdare-collector"), "kafka", url, "--db", str(db), "--max-wait", "0.2s",
                 "--rules", "default", *extra, "--alertmanager", am.url],
                stdout=subprocess.DEVNULL, stderr=open(tmp / "collector.log", "w"),
            )]

            def nodes_of() -> object:
                return analyze_json(db, "nodes")
        seen: dict[str, float] = {}  # node -> when Alertmanager first listed its RevocationNotice
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                try:
                    with urllib.request.urlopen(am.url + "/api/v2/alerts", timeout=5) as r:
                        now = time.time()
                        for x in json.loads(r.read()):
                            if x["labels"].get("alertname") == "RevocationNotice":
                                seen.setdefault(x["labels"]["node"], now)
                except OSError:
                    pass
                time.sleep(0.02)

        threading.Thread(target=poll, daemon=True).start()
        rng = random.Random(1)
        lat: list[float] = []
        by: dict[str, list[float]] = {c: [] for c in clouds}
        missing = 0
        try:
            for rnd in range(a.rounds):
                servers = {f"vm-{rnd}-{i:02d}": FakeMetadata(clouds[i % 3], name=f"vm-{rnd}-{i:02d}").start()
                           for i in range(a.agents)}
                procs = [start_agent(tmp, n, url, s) for n, s in servers.items()]
                t0 = time.monotonic()
                while True:
                    nodes = nodes_of() or []
                    up = {n["node"] for n in nodes if n.get("cloud")} & set(servers)  # type: ignore[union-attr]
                    if len(up) == a.agents:
                        break
                    if time.monotonic() - t0 > 180:
                        raise SystemExit(f"round {rnd}: only {len(up)} of {a.agents} agents identified in 180 s")
                    time.sleep(0.5)
                announced: dict[str, float] = {}
                order = list(servers)
                rng.shuffle(order)
                for n in order:
                    s = servers[n]
                    if s.cloud == "gce":
                        s.preempt()
                    else:
                        s.preempt(lead=120 if s.cloud == "aws" else 30)
                    announced[n] = s.announced_at or time.time()
                    time.sleep(rng.uniform(0.05, 0.15))
                t1 = time.monotonic()
                while not set(announced) <= set(seen) and time.monotonic() - t1 < 60:
                    time.sleep(0.05)
                for n, t in announced.items():
                    if n not in seen:
                        missing += 1
                        print(f"round {rnd}: {n}: no RevocationNotice in Alertmanager after 60 s")
                        continue
                    lat.append(seen[n] - t)
                    by[servers[n].cloud].append(seen[n] - t)
                print(f"round {rnd}: {len(announced)} notices, {sum(n in seen for n in announced)} alerts in Alertmanager")
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(10)
                for s in servers.values():
                    s.stop()
        finally:
            stop.set()
            for col in cols:
                col.send_signal(signal.SIGTERM)
            for col in cols:
                col.wait(30)
            am.stop()
        if a.slow_rule and not a.lake:  # the slow rules really were slow: their last evaluation's time
            for r in (analyze_json(db, "alerts") or {}).get("rules", []):  # type: ignore[union-attr]
                if r["rule"].startswith("slow-user-rules/"):
                    print(f"slow rule {r['rule']}: health {r['health']}, last evaluation {r['eval_seconds']:.1f} s")
        errors = [line for f in tmp.glob("*.log") for line in f.read_text().splitlines() if " ERROR " in line]
        for line in errors[:10]:
            print("collector log:", line)
    print(f"alerts: {len(lat)} of {a.agents * a.rounds} notices reached Alertmanager ({missing} missing)")
    if lat:
        print(f"latency announce -> Alertmanager: p50 {pct(lat, 0.5):.3f}s  p90 {pct(lat, 0.9):.3f}s  "
              f"p99 {pct(lat, 0.99):.3f}s  max {max(lat):.3f}s  (target p99 < 3 s)")
        for c, xs in by.items():
            if xs:
                print(f"  {c:5s}: n={len(xs):3d}  p50 {pct(xs, 0.5):.3f}s  max {max(xs):.3f}s")


def lake_mode(tmp: Path, url: str, am: str, extra: list[str]) -> tuple[list[subprocess.Popen], object]:
    """Two ingest collectors into a lake, two servers over it (the rules on both: one
    rules); the nodes as the first server answers them."""
    import re

    lake = tmp / "lake"
    procs = [subprocess.Popen([str(BIN / "cmdare-collector"), "kafka", url, "--lake", str(lake), "--group", "ingest"],
                              stdout=subprocess.DEVNULL, stderr=open(tmp / f"ingest-{i}.log", "w")) for i in range(2)]
    t0 = time.monotonic()
    while not (lake / "catalog.db").exists():
        if time.monotonic() - t0 > 120:
            raise SystemExit("no lake in 120 s")
        time.sleep(0.5)
    logs = [tmp / f"server-{i}.log" for i in range(2)]
    for i in range(2):
        procs.append(subprocess.Popen(
            [str(BIN / "cmdare-collector"), "serve", "--lake", str(lake), "--http", "127.0.0.1:0", "--rules", "default",
             *extra, "--alertmanager", am, "--notices", url, "--detect-every", "off"],
            stdout=subprocess.DEVNULL, stderr=open(logs[i], "w")))
    found = None
    while found is None:
        m = re.search(r"serving the lake \S+ on (http://[0-9.]+:\d+) ", logs[0].read_text())
        found = m.group(1) if m else None
        if time.monotonic() - t0 > 180:
            raise SystemExit("the server did not start in 180 s")
        time.sleep(0.5)
    api: str = found

    def nodes() -> object:
        r = subprocess.run([str(BIN / "analyze"), "--server", api, "nodes", "--json"], capture_output=True, text=True,
                           timeout=60)
        return json.loads(r.stdout) if r.returncode == 0 else None

    return procs, nodes


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
