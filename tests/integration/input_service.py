"""A real training job fed by separate input-worker processes (a tf.data-service-like
set-up) for the end-to-end tests: ``--workers K`` processes each make batches (a fixed
preprocessing latency, as reading and decoding from remote storage takes, plus numpy work)
and put them on a queue; the training process takes them off and computes.

    python tests/integration/input_service.py --job J --workers 1 --steps 200 \
        --make-ms 40 --compute-ms 10

Input workers report with track.init(job, role="data", rank=k) and run.produced(...); the
trainer with run.batches(...). Prints one JSON line: steps, batches made, dropped.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import sys
import time
from pathlib import Path

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cmdare.agent import track  # noqa: E402

BATCH, DIM = 32, 64


def pipeline(seed: int, make_s: float, stop: mp.Event):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        time.sleep(make_s)  # fetch and decode
        x = rng.standard_normal((BATCH, DIM))
        yield x, x @ np.arange(DIM)


def worker(job: str, k: int, make_s: float, q: mp.Queue, stop: mp.Event) -> None:
    run = track.init(job, run="r1", role="data", rank=k)
    for batch in run.produced(pipeline(k, make_s, stop), examples=BATCH):
        while not stop.is_set():
            try:
                q.put(batch, timeout=0.1)
                break
            except queue.Full:
                continue
    run.close()
    print(json.dumps({"rank": k, "made": run.batches_produced, "dropped": run.dropped}), flush=True)
    q.cancel_join_thread()  # batches left on the queue: nobody will read them, exit anyway


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--make-ms", type=float, default=40.0)
    ap.add_argument("--compute-ms", type=float, default=10.0)
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue(maxsize=4)
    stop = ctx.Event()
    procs = [ctx.Process(target=worker, args=(a.job, 100 + k, a.make_ms / 1000, q, stop), daemon=True)
             for k in range(a.workers)]
    for p in procs:
        p.start()
    run = track.init(a.job, run="r1", rank=0, model="linreg", params=DIM, tensors=1, batch_size=BATCH)
    w = np.zeros(DIM)

    def batches():  # type: ignore[no-untyped-def]
        for _ in range(a.steps):
            yield q.get()

    for x, y in run.batches(batches(), examples=BATCH):
        t = time.perf_counter()
        w -= 1e-4 * x.T @ (x @ w - y) / BATCH
        while time.perf_counter() - t < a.compute_ms / 1000:  # the accelerator's step, as CPU work
            w = w * 0.999999 + 1e-9
    run.close()
    stop.set()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.terminate()
    print(json.dumps({"steps": run.steps, "dropped": run.dropped}))


if __name__ == "__main__":
    main()
