"""The PyTorch adapter's cost on a DDP model (issue 68): per training step, DDP's built-in
C++ all-reduce (no Python hook), PyTorch's own Python ``allreduce_hook``, and cmdare's timed
all-reduce (``track_module`` on a DDP model: ``watch_ddp``), in one process over a gloo group
of one rank (the hooks run as with many; the all-reduce itself is then trivial, so what is
left is the hooks' own cost).

    python bench/ddp_hook.py [--buckets 8] [--steps 400] [--runs 5]

``--buckets``: gradient buckets per step (a layer per bucket: a ResNet-50 at DDP's default
25 MB buckets has about 4-5). Prints the median microseconds per step of each and the
difference per bucket. Any Python communication hook costs DDP its built-in C++ path; the
timing's own share is the difference from PyTorch's Python hook.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from common import ROOT  # noqa: F401  (puts the checkout on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    from cmdare.agent.adapters.torch import track_module

    torch.set_num_threads(1)
    d = tempfile.mkdtemp(prefix="cmdare-bench-ddp-")
    dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)

    def model() -> DistributedDataParallel:
        torch.manual_seed(0)  # a 64 x 64 layer is 16 kB of gradients: one bucket each at a 10 kB cap
        layers = [torch.nn.Linear(64, 64) for _ in range(a.buckets)]
        return DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=0.01)

    def timed(kind: str) -> float:
        m = model()
        if kind == "python":
            m.register_comm_hook(None, default_hooks.allreduce_hook)
        run = track_module("bench-ddp", m, socket_path=f"{d}/none.sock", comm_hook=kind == "cmdare")
        xs = [torch.randn(16, 64) for _ in range(a.steps)]
        t = time.perf_counter()
        for x in run.batches(iter(xs)):
            m(x).sum().backward()
        secs = (time.perf_counter() - t) / a.steps
        run.close()
        return secs * 1e6

    got: dict[str, list[float]] = {"builtin": [], "python": [], "cmdare": []}
    for _ in range(a.runs):
        for k in got:
            got[k].append(timed(k))
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"{a.buckets} buckets a step, {a.steps} steps, median of {a.runs} runs (us per step):")
    print(f"  DDP's built-in all-reduce (C++, no hook)   {med['builtin']:8.0f}")
    print(f"  PyTorch's Python allreduce_hook            {med['python']:8.0f}  "
          f"(+{(med['python'] - med['builtin']) / a.buckets:.0f} us a bucket)")
    print(f"  cmdare's timed all-reduce (track_module)   {med['cmdare']:8.0f}  "
          f"(+{(med['cmdare'] - med['builtin']) / a.buckets:.0f} us a bucket over the built-in, "
          f"+{(med['cmdare'] - med['python']) / a.buckets:.0f} over PyTorch's Python hook)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
