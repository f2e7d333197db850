"""The collector's memory while a client sends memory attacks through the SQL API.

    python bench/sql_memory.py [--db FILE]

A real collector API (``Service``) over a database (the golden demo fleet's, made once, or
``--db``) in this process; its resident memory is sampled every 10 ms while each query of
issue 52's memory attack is sent to ``POST /api/v1/sql`` one after another. Prints, per
query: the answer (status and its one line), the time, and how far the process grew above
what it held before. Target: every attack answered in one line, the process never more
than the per-query budget (1 GiB) above its start.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ATTACKS = [
    "SELECT string_agg(repeat('x', 100000000), '') FROM range(20)",
    "SELECT repeat('x', 300000000) FROM range(3)",
    "SELECT list(repeat('m', 1000)) FROM range(5000000)",
    "SELECT count(*) FROM range(10)",  # an ordinary one after them
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", help="a cmdare database (default: the golden demo fleet, made once)")
    a = ap.parse_args()
    import psutil
    from common import served

    proc = psutil.Process()
    with served(a.db) as (_, url):
        for q in ATTACKS:
            start = proc.memory_info().rss
            peak, done = [start], threading.Event()

            def watch(peak: list[int] = peak, done: threading.Event = done) -> None:
                while not done.wait(0.01):
                    peak[0] = max(peak[0], proc.memory_info().rss)

            th = threading.Thread(target=watch, daemon=True)
            th.start()
            t = time.monotonic()
            req = urllib.request.Request(url + "/api/v1/sql", data=json.dumps({"query": q}).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    status, body = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, body = e.code, e.read()
            took = time.monotonic() - t
            done.set()
            th.join()
            doc = json.loads(body) if body else {}
            said = doc.get("error") or f"{len(doc.get('rows', []))} row(s)"
            print(f"{q[:60]:62} {status}  {took:6.2f} s  +{(peak[0] - start) >> 20:5d} MiB peak  {said[:90]}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
