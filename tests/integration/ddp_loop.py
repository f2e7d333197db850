"""A real data-parallel training process for the tests: PyTorch DDP over the gloo backend
on CPU, one process per rank ($RANK, $WORLD_SIZE, $MASTER_ADDR, $MASTER_PORT as torchrun
sets them), tracked through cmdare's PyTorch adapter (``track_module`` on the DDP model).

    python ddp_loop.py --model comm|compute --steps N --job J [--wrap ddp|fsdp] [--backend gloo|nccl]

``comm``: a wide model (two 2048 x 2048 layers, 8.4 M parameters, 34 MB of gradients a
step) on a batch of 4, so a step is mostly its all-reduce; ``compute``: a narrow deep model
(12 layers of 64 x 64, 50 k parameters) on a batch of 8,192, so a step is mostly its
backward and the all-reduce of 200 kB hides. Prints one JSON line: rank, steps, seconds,
gradient buckets communicated, exposed communication (s), records dropped. ``--wrap fsdp``:
FullyShardedDataParallel (each rank holds half the parameters; a reduce-scatter per step)
instead of DDP, and rank 0 also says whether the trained parameters equal those of the same
model trained alone on the same batches (every rank draws the same ones: their mean
gradient is the gradient). ``--backend nccl``: the same on GPUs, one per rank ($LOCAL_RANK),
over NCCL (the hooks' futures then complete when the GPU's collective does)."""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cmdare.agent.adapters.torch import track_module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("comm", "compute"), required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--job", required=True)
    ap.add_argument("--wrap", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dev = torch.device("cpu")
    if a.backend == "nccl":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
        torch.cuda.set_device(dev)
    dist.init_process_group(a.backend, timeout=dt.timedelta(seconds=60))
    if a.model == "comm":
        model, batch, width = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048)), 4, 2048
    else:
        layers: list[nn.Module] = []
        for _ in range(12):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        model, batch, width = nn.Sequential(*layers), 8192, 64
    model = model.to(dev)
    alone = copy.deepcopy(model)
    if a.wrap == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        ddp = FullyShardedDataParallel(model, device_id=dev)
    else:
        ddp = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    run = track_module(a.job, ddp, batch_size=batch)
    data = [torch.randn(batch, width).to(dev) for _ in range(8)]
    t0 = time.perf_counter()
    for x in run.batches(data[i % len(data)] for i in range(a.steps)):
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    run.close()
    same = None
    if a.wrap == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(ddp):
            trained = [p.detach().clone() for p in ddp.parameters()]
        if int(os.environ["RANK"]) == 0:  # the updates compared (the parameters barely move)
            init = [p.detach().clone() for p in alone.parameters()]
            opt1 = torch.optim.SGD(alone.parameters(), lr=1e-4)
            for i in range(a.steps):
                alone(data[i % len(data)]).pow(2).mean().backward()
                opt1.step()
                opt1.zero_grad()
            same = all(torch.allclose((x.reshape(-1) - p0.reshape(-1)), (y - p0).reshape(-1), rtol=1e-3,
                                      atol=1e-3 * float((y - p0).abs().max()))
                       for x, y, p0 in zip(trained, alone.parameters(), init, strict=True))
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": int(os.environ["RANK"]), "steps": run.run.steps, "seconds": time.perf_counter() - t0,
                      "buckets": run.comm.buckets if run.comm else 0,
                      "exposed": run.comm.exposed if run.comm else 0.0, "dropped": run.run.dropped, "same": same}))


if __name__ == "__main__":
    main()
