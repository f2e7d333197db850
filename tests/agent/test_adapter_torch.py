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


@pytest.fixture
def one_rank(tmp_path: Path):
    """A process group of one rank over gloo (DDP runs its hooks as with many)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def test_a_ddp_models_exposed_communication_is_each_steps_comm_wait(source, one_rank) -> None:
    """track_module on a DDP model declares the module it wraps and times its gradient
    communication: a hook whose all-reduce ends 40 ms after backward's computation (a slow
    link) shows as about 40 ms of communication wait in every step; the user's hook still
    does the reduction (its result is what the optimizer applies)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    src, sock = source
    used = []

    def slow_link(state, bucket):  # (DDP checks a hook's annotations: none here)
        used.append(bucket.index())
        fut = default_hooks.allreduce_hook(state, bucket)
        return fut.then(lambda f: (time.sleep(0.04), f.value())[1])

    torch.manual_seed(0)
    inner = mlp(16, 32)
    model = DistributedDataParallel(inner)
    from cmdare.agent.adapters.torch import watch_ddp

    comm = watch_ddp(model, hook=slow_link)
    with pytest.raises(ValueError, match="^watch_ddp: DDP refused the timing hook .*hook=") as e:
        watch_ddp(model)  # DDP takes one hook
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="expected a DistributedDataParallel model, got Sequential"):
        watch_ddp(inner)
    run = track_module("torch-ddp", model, batch_size=8, socket_path=str(sock), comm_hook=False)
    assert run.comm is None
    run.comm = comm  # (the hook registered above, with the user's own)
    before = [p.detach().clone() for p in inner.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in run.batches(torch.randn(8, 16) for _ in range(12)):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    run.close()
    assert used and comm.buckets == 12 and any((a != b).any() for a, b in zip(before, inner.parameters(), strict=True))
    got = collect(src)
    decl = [d for t, j, d in got if t == "train_job" and j == "torch-ddp"][-1]  # (the latest counts)
    assert decl["model"] == "Sequential" and decl["params"] == sum(p.numel() for p in inner.parameters())
    assert decl["grad_bytes"] == 4 * decl["params"]  # float32 gradients, all of them all-reduced
    rows = [d for t, j, d in got if t == "train_steps" and j == "torch-ddp"]
    assert sum(d["steps"] for d in rows) == 12  # (a step per batch)
    comm_s = sum(d["comm_mean_seconds"] * d["steps"] for d in rows) / 12
    step_s = sum(d["step_mean_seconds"] * d["steps"] for d in rows) / 12
    assert 0.035 <= comm_s <= step_s, (comm_s, step_s)


def test_track_module_times_a_ddp_model_by_itself(source, one_rank, monkeypatch) -> None:
    """... and declares the gradient bytes it all-reduces (a frozen layer's and a shared
    tensor's counted as DDP reduces them) and torchrun's GPUs per node."""
    from torch.nn.parallel import DistributedDataParallel

    src, sock = source
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    net = mlp(8, 8)
    frozen = next(net.parameters())
    frozen.requires_grad_(False)
    model = DistributedDataParallel(net.to(torch.float64))
    run = track_module("torch-ddp-auto", model, socket_path=str(sock))
    assert run.comm is not None
    for x in run.batches(torch.randn(4, 8, dtype=torch.float64) for _ in range(5)):
        model(x).sum().backward()
    run.close()
    assert run.comm.buckets == 5
    got = collect(src)
    rows = [d for t, j, d in got if t == "train_steps" and j == "torch-ddp-auto"]
    assert sum(d["steps"] for d in rows) == 5 and all(d["comm_mean_seconds"] is not None for d in rows)
    decl = [d for t, j, d in got if t == "train_job" and j == "torch-ddp-auto"][-1]
    trained = sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert decl["gpus_per_node"] == 4 and decl["grad_bytes"] == 8 * trained < 8 * decl["params"]


def test_track_module_times_an_fsdp_models_gradient_reduction(source, one_rank) -> None:
    """An FSDP root (one rank: FSDP reduces without sharding, an all-reduce): its units'
    reductions run through the timing hook, the gradients are FSDP's own (the same
    parameters after a step as an FSDP model without the hook), and every step carries
    its communication wait."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from cmdare.agent.adapters.torch import watch_fsdp

    src, sock = source

    def make():
        torch.manual_seed(0)
        return FSDP(mlp(8, 16), device_id=torch.device("cpu"))

    timed, plain = make(), make()
    run = track_module("torch-fsdp", timed, socket_path=str(sock))
    assert run.comm is not None
    with pytest.raises(ValueError, match="^watch_fsdp: expected a FullyShardedDataParallel model, got Sequential"):
        watch_fsdp(mlp(2, 2))
    xs = [torch.randn(4, 8) for _ in range(6)]
    for m in (timed, plain):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for x in (run.batches(xs) if m is timed else xs):
            m(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    run.close()
    assert run.comm.buckets == 6
    assert all(torch.equal(a, b) for a, b in zip(timed.parameters(), plain.parameters(), strict=True))
    got = collect(src)
    rows = [d for t, j, d in got if t == "train_steps" and j == "torch-fsdp"]
    assert sum(d["steps"] for d in rows) == 6 and all(d["comm_mean_seconds"] is not None for d in rows)
    decl = [d for t, j, d in got if t == "train_job" and j == "torch-fsdp"][-1]
    assert decl["model"] == "Sequential"
