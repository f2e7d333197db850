"""A real Hugging Face Trainer under DDP for the tests: two CPU processes over gloo ($RANK,
$WORLD_SIZE, $LOCAL_RANK, $MASTER_ADDR, $MASTER_PORT as torchrun sets them), tracked by
cmdare's callback attached to the trainer (``CmdareCallback.attach``), so it finds the model
the Trainer wraps in DDP and times its gradient communication.

    python hf_ddp.py --job J --out DIR [--steps N]

A wide model (two 2048 x 2048 layers) on a batch of 4: a step is mostly its all-reduce.
Prints one JSON line: rank, steps, gradient buckets communicated, exposed communication (s),
records dropped."""

from __future__ import annotations

import argparse
import json
import os

import torch
import transformers
from torch import nn

from cmdare.agent.adapters.transformers import CmdareCallback


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 2048, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.x[i]}


class Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        output_dir=a.out, per_device_train_batch_size=4, max_steps=a.steps, report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, disable_tqdm=True, ddp_backend="gloo", dataloader_num_workers=0)
    trainer = transformers.Trainer(model=Wide(), args=args, train_dataset=Data(4 * a.steps * 2))
    cb = CmdareCallback.attach(trainer, a.job)
    seen = {}
    trainer.add_callback(type("Keep", (transformers.TrainerCallback,), {  # the run before the callback closes it
        "on_step_end": lambda self, *x, **k: seen.update(run=cb.run, comm=cb.clock.comm)}))
    trainer.train()  # (the callback closes its run at the end)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    run, comm = seen["run"], seen["comm"]
    print(json.dumps({"rank": int(os.environ["RANK"]), "steps": run.steps,
                      "buckets": comm.buckets if comm else 0, "exposed": comm.exposed if comm else 0.0,
                      "dropped": run.dropped}), flush=True)
    # past this point only the interpreter's teardown runs: a gloo thread there can abort the
    # process ("terminate called without an active exception": a clean clone's CI run, rank 1)
    os._exit(0)


if __name__ == "__main__":
    main()
