"""The PyTorch loop wrapper around a real training loop fed by a real multi-process
DataLoader (2 workers), its records received by the agent's train source: input-bound and
compute-bound loops told apart, the job declared with the module's own counts, and FLOPs
per step measured by torch's flop counter.

(Named to run before test_keras.py: the DataLoader forks its workers, which is safest
before JAX, loaded by the Keras test, has started its threads.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from cmdare.agent.adapters.torch import batch_examples, module_counts, track_module  # noqa: E402
from cmdare.agent.sources.train import TrainSource  # noqa: E402

B = 32


class Examples(Dataset):
    """Each example costs ``work`` rounds of real CPU work in the loader process."""

    def __init__(self, n: int, width: int, work: int) -> None:
        self.n, self.width, self.work = n, width, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.width, generator=g)
        for _ in range(self.work):  # decoding / augmentation
            a = torch.randn(48, 48, generator=g)
            a = a @ a.T
        return x, x.sum(0, keepdim=True)


def mlp(width: int, hidden: int, deep: int = 0) -> torch.nn.Module:
    """``deep``: hidden-to-hidden layers between the input and output layers."""
    mid = [m for _ in range(deep) for m in (torch.nn.Linear(hidden, hidden), torch.nn.ReLU())]
    return torch.nn.Sequential(
        torch.nn.Linear(width, hidden), torch.nn.ReLU(), *mid, torch.nn.Linear(hidden, 1)
    )


def train(
    job: str, sock: Path, width: int, hidden: int, work: int, batches: int = 40, deep: int = 0, **kw
) -> tuple:
    torch.manual_seed(0)
    model = mlp(width, hidden, deep)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Examples(B * batches, width, work), batch_size=B, num_workers=2)
    run = track_module(job, model, batch_size=B, socket_path=str(sock), **kw)
    for x, y in run.batches(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    run.close()
    return model, run


def collect(src: TrainSource) -> list:
    time.sleep(0.3)
    got: list = []
    src.collect(lambda t, d, ts=None, job=None, **_: got.append((t, job, d)))
    return got


def totals(got: list, job: str) -> tuple[int, float, float]:
    rows = [d for t, j, d in got if t == "train_steps" and j == job]
    n = sum(d["steps"] for d in rows)
    step = sum(d["step_mean_seconds"] * d["steps"] for d in rows)
    wait = sum(d["wait_mean_seconds"] * d["steps"] for d in rows)
    return n, wait / step, sum(d["examples"] for d in rows)


@pytest.mark.slow  # real PyTorch training loops on CPU
def test_dataloader_loops_input_bound_and_compute_bound(source) -> None:
    src, sock = source
    torch.set_num_threads(1)
    slow, _ = train("torch-input", sock, width=32, hidden=32, work=100)  # robustly input-bound on a loaded machine
    # each batch costs the loop ~2 ms to receive from a worker even when it is ready, so
    # the compute-bound model needs steps well above 20 ms: ~7 GFLOP per step here
    fast, _ = train("torch-compute", sock, width=1024, hidden=4096, work=0, deep=2)
    got = collect(src)
    jobs = {j: d for t, j, d in got if t == "train_job"}
    assert jobs["torch-input"]["params"] == 32 * 32 + 32 + 32 + 1 and jobs["torch-input"]["tensors"] == 4
    d = jobs["torch-compute"]
    assert (
        d["params"]
        == sum(p.numel() for p in fast.parameters())
        == 1024 * 4096 + 4096 + 2 * 4096 * 4097 + 4097
    )
    assert d["framework"] == "pytorch" and d["framework_version"] == torch.__version__
    assert d["model"] == "Sequential" and d["accelerator"] == "cpu" and d["batch_size"] == B
    n, share, examples = totals(got, "torch-input")
    assert n == 40 and examples == B * 40  # every batch closed a step, examples from the batch
    assert share > 0.5, share  # 2 loader processes cannot keep up with a tiny model
    n, share, _ = totals(got, "torch-compute")
    assert n == 40 and share < 0.1, share


def test_flops_per_step_measured_once_from_the_first_step(source) -> None:
    src, sock = source
    width, hidden = 64, 128
    _, run = train("torch-flops", sock, width=width, hidden=hidden, work=0, batches=12, measure_flops=True)
    # forward: 2*B*(width*hidden + hidden); backward: weight grads of both layers and the
    # input grad of the second (the batch itself needs none); the optimizer adds no matmuls
    expect = 2 * B * width * hidden * 2 + 2 * B * hidden * 3
    assert run.flops_per_step == expect
    got = collect(src)
    decl = [d for t, j, d in got if t == "train_job" and j == "torch-flops"]
    assert len(decl) == 2 and "flops_per_step" not in decl[0] and decl[1]["flops_per_step"] == expect
    n, _, _ = totals(got, "torch-flops")
    assert n == 11  # 12 batches: every step but the counted one is timed


def test_module_counts_and_batch_examples() -> None:
    lin = torch.nn.Linear(4, 4)
    tied = torch.nn.Sequential(lin, torch.nn.ReLU(), lin)  # one layer used twice
    assert module_counts(tied) == (20, 2)
    assert batch_examples(torch.zeros(7, 3)) == 7
    assert batch_examples({"ids": torch.zeros(5, 9), "mask": torch.zeros(5, 9)}) == 5
    assert batch_examples(("text", [torch.zeros(3)])) == 3
    assert batch_examples("nothing") == 0
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        track_module("j", object())  # type: ignore[arg-type]
