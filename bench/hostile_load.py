"""The collector under issue 69's hostile load: parallel memory attacks beside ingest, and
the interleaved sign-in attack.

    python bench/hostile_load.py [--rounds 8] [--parallel 6] [--guess-seconds 10]

Part 1: a real collector API (``Service``, its defaults: the SQL budget of
$CMDARE_SQL_MEMORY_TOTAL or 2 GiB, 1 GiB a query) over the golden demo fleet's database,
in this process, while an ingest thread stores a 5,000-sample batch every 50 ms through
the collector's own writer (with its storage retry). ``--rounds`` rounds of ``--parallel``
parallel ``SELECT length(string_agg(repeat('x', 10000000), '')) FROM range(85)`` (the
attack that ended the collector) and one ordinary query each round. Prints each round's
answers by status, the process's peak resident memory above its start (sampled every
5 ms), the ordinary query's time, and the batches stored and lost.

Part 2: the interleaved throttle attack of the same issue on one token-protected API:
four wrong tokens then one valid request, over and over from one address, for
``--guess-seconds``; prints the wrong guesses checked per second (answered 401, not 429)
and how many of 20 requests from fresh addresses with the right token got through.

Targets: the process survives and ingest loses no batch; the peak stays near the budget
(DuckDB looks at an interrupt between vectors only: see docs/service.md); guesses checked
at most 5 before the first wait and a few a minute after; 20 of 20 fresh clients in.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ATTACK = "SELECT length(string_agg(repeat('x', 10000000), '')) AS n FROM range(85)"
ORDINARY = "SELECT count(*) AS n FROM gpu_samples"


def post(url: str, query: str) -> tuple[int, str, float]:
    t = time.monotonic()
    req = urllib.request.Request(url + "/api/v1/sql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    except OSError as e:
        return 0, f"connection failed: {e}", time.monotonic() - t
    doc = json.loads(body) if body else {}
    return status, str(doc.get("error") or doc.get("rows")), time.monotonic() - t


def memory(rounds: int, parallel: int) -> None:
    import psutil

    from cmdare.analytics import safesql
    from cmdare.analytics.server.service import HttpConfig, Service
    from cmdare.collector.consumer import StorageRetry
    from cmdare.collector.db import connect
    from cmdare.collector.ingest.batch import Batch
    from cmdare.collector.writer import Writer
    from cmdare.wire.events import EventFactory, encode_many
    from tests.analytics.test_golden_output import build

    path = Path(tempfile.mkdtemp()) / "fleet.duckdb"
    build(path)
    con = connect(path)
    svc = Service(con, path, HttpConfig("127.0.0.1", 0))
    url = svc.start()
    svc.ready = True
    proc = psutil.Process()
    start = proc.memory_info().rss
    peak, stop = [start], threading.Event()
    stored, lost = [0], [0]

    def watch() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], proc.memory_info().rss)

    def ingest() -> None:  # the collector's writer, in its own thread, on the collector's connection
        w = Writer(con, max_skew=None)
        f = EventFactory("bench-node", "worker", "bench-job")
        n = 0
        while not stop.wait(0.05):
            b = Batch()
            b.add(f"b{n}", encode_many(f.make("gpu", {"index": i % 8, "util_gpu_ratio": 0.5}) for i in range(5000)))
            n += 1
            try:
                StorageRetry(stop)(lambda b=b: w.write_batch(b))
                stored[0] += 1
            except Exception as e:  # noqa: BLE001  (counted: a lost batch is the failure measured)
                lost[0] += 1
                print(f"  batch lost: {str(e)[:120]}", flush=True)

    threads = [threading.Thread(target=watch, daemon=True), threading.Thread(target=ingest, daemon=True)]
    for t in threads:
        t.start()
    print(f"part 1: {rounds} rounds x {parallel} parallel memory attacks, SQL budget "
          f"{safesql.BUDGET.total >> 20} MiB, start RSS {start >> 20} MiB", flush=True)
    try:
        for rnd in range(1, rounds + 1):
            out: list[tuple[int, str, float]] = []
            ts = [threading.Thread(target=lambda o=out: o.append(post(url, ATTACK))) for _ in range(parallel)]
            for t in ts:
                t.start()
            time.sleep(0.2)
            ordinary = post(url, ORDINARY)
            for t in ts:
                t.join()
            said = Counter(f"{s} {m.split(':')[0][:40]}" for s, m, _ in out)
            print(f"  round {rnd}: {dict(said)}; ordinary query {ordinary[0]} in {ordinary[2]:.2f} s; "
                  f"peak +{(peak[0] - start) >> 20} MiB", flush=True)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        svc.stop()
        con.close()
    print(f"part 1: peak RSS {peak[0] >> 20} MiB (+{(peak[0] - start) >> 20} MiB over the start); batches "
          f"stored {stored[0]}, lost {lost[0]}", flush=True)


def guesses(seconds: float) -> None:
    import http.client

    from cmdare.analytics.server.service import HttpConfig, Service
    from cmdare.collector.db import connect

    token = "bench-admin-token-0123456789"
    path = Path(tempfile.mkdtemp()) / "t.duckdb"
    con = connect(path)
    svc = Service(con, path, HttpConfig("127.0.0.1", 0, token=token))
    port = int(svc.start().rsplit(":", 1)[1])
    svc.ready = True

    def get(source: str, credential: str) -> int:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
        try:
            c.request("GET", "/api/v1/nodes", headers={"Authorization": f"Bearer {credential}"})
            return c.getresponse().status
        finally:
            c.close()

    checked = refused = 0
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            for i in range(4):
                s = get("127.0.0.2", f"wrong-guess-{i}")
                checked += s == 401
                refused += s == 429
            get("127.0.0.2", token)
        took = time.monotonic() - t0
        fresh = sum(get(f"127.0.1.{i + 1}", token) == 200 for i in range(20))
    finally:
        svc.stop()
        con.close()
    print(f"part 2: interleaved attack for {took:.1f} s from 127.0.0.2: {checked} wrong guesses checked "
          f"({checked / took:.2f}/s), {refused} answered 429 unchecked; fresh addresses with the right token: "
          f"{fresh}/20 in", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=6)
    ap.add_argument("--guess-seconds", type=float, default=10.0)
    a = ap.parse_args()
    if not (1 <= a.rounds <= 100 and 1 <= a.parallel <= 64 and 0 < a.guess_seconds <= 600):
        ap.error("--rounds 1..100, --parallel 1..64, --guess-seconds (0, 600]")
    memory(a.rounds, a.parallel)
    guesses(a.guess_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
