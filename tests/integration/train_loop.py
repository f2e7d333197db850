"""A real (small) training loop for the end-to-end tests: numpy linear regression by SGD,
fed by a multi-process data loader (multiprocessing.Pool.imap, 2 workers, prefetching).

    python tests/integration/train_loop.py --mode input|compute --steps N --job J [--pause S]

mode=input: each example costs the loader heavy CPU work (the loop waits on input);
mode=compute: the loader is cheap and each step does heavy matrix work.
Prints one JSON line at the end: steps, dropped, max step seconds, wall seconds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread per process: the loader has its own

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cmdare.agent import track  # noqa: E402

BATCH, DIM = 32, 64


def make_batch(args: tuple[int, str]) -> tuple[np.ndarray, np.ndarray]:
    i, mode = args
    rng = np.random.default_rng(i)
    x = rng.standard_normal((BATCH, DIM))
    if mode == "input":  # per-example decoding / augmentation that costs real CPU
        for _ in range(BATCH):
            a = rng.standard_normal((60, 60))
            a = a @ a.T
    y = x @ np.arange(DIM) + rng.standard_normal(BATCH) * 0.1
    return x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("input", "compute"), required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--job", required=True)
    ap.add_argument("--pause", type=float, default=0.0, help="sleep this long per step (long runs)")
    a = ap.parse_args()
    run = track.init(
        a.job, run="r1", model="linreg", params=DIM, tensors=1, batch_size=BATCH, framework="numpy"
    )
    w = np.zeros(DIM)
    heavy = np.random.default_rng(0).standard_normal((260, 260))
    t0 = time.perf_counter()
    max_step, last = 0.0, time.perf_counter()
    with mp.get_context("fork").Pool(2) as pool:
        loader = pool.imap(make_batch, ((i, a.mode) for i in range(a.steps)), chunksize=1)
        for x, y in run.batches(loader, examples=BATCH):
            grad = x.T @ (x @ w - y) / BATCH
            w -= 1e-3 * grad
            if a.mode == "compute":
                for _ in range(6):
                    heavy = np.tanh(heavy @ heavy * 1e-3)
            if a.pause:
                time.sleep(a.pause)
            now = time.perf_counter()
            max_step, last = max(max_step, now - last), now
    with run.checkpoint("save", path="/dev/null") as ck:
        ck.bytes = w.nbytes
    run.close()
    print(
        json.dumps(
            {
                "steps": run.steps,
                "dropped": run.dropped,
                "max_step_seconds": max_step,
                "wall_seconds": time.perf_counter() - t0,
            }
        )
    )


if __name__ == "__main__":
    main()
