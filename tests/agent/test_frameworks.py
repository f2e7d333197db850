"""The PyTorch Lightning and Hugging Face Trainer callbacks in real fits on CPU, fed by real
multi-process DataLoaders (2 workers), their records received by the agent's train source:
input-bound and compute-bound fits told apart, the job declared with the model's own
counts, rank and world size, FLOPs per step counted when asked."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from tests.agent.test_adapter_torch import B, Examples, collect, mlp, totals  # noqa: E402

INPUT = dict(width=32, hidden=32, work=40, deep=0)  # loader-heavy, tiny model
COMPUTE = dict(width=1024, hidden=4096, work=0, deep=2)  # ~7 GFLOP per step


def lightning_fit(job: str, sock: Path, tmp: Path, batches: int = 30, **kw) -> tuple:
    L = pytest.importorskip("lightning.pytorch")
    from cmdare.agent.adapters.lightning import CmdareCallback

    shape = {k: kw.pop(k) for k in ("width", "hidden", "work", "deep")}

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(shape["width"], shape["hidden"], shape["deep"])

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    module = Regressor()
    loader = DataLoader(Examples(B * batches, shape["width"], shape["work"]), batch_size=B, num_workers=2)
    strategy = kw.pop("strategy", "auto")
    cb = CmdareCallback(job, socket_path=str(sock), **kw)
    trainer = L.Trainer(
        max_epochs=1,
        strategy=strategy,
        accelerator="cpu",
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp),
    )
    trainer.fit(module, loader)
    return module, cb


def hf_train(job: str, sock: Path, tmp: Path, batches: int = 30, accum: int = 1, **kw) -> tuple:
    transformers = pytest.importorskip("transformers")
    from cmdare.agent.adapters.transformers import CmdareCallback

    shape = {k: kw.pop(k) for k in ("width", "hidden", "work", "deep")}

    class Dicts(Examples):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return {"x": x, "labels": y}

    class Regressor(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(shape["width"], shape["hidden"], shape["deep"])

        def forward(self, x, labels=None):
            out = self.net(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    torch.manual_seed(0)
    model = Regressor()
    args = transformers.TrainingArguments(
        output_dir=str(tmp / "hf"),
        per_device_train_batch_size=B,
        gradient_accumulation_steps=accum,
        num_train_epochs=1,
        dataloader_num_workers=2,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    cb = CmdareCallback(job, socket_path=str(sock), **kw)
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=Dicts(B * batches, shape["width"], shape["work"]),
        callbacks=[cb],
    )
    trainer.train()
    return model, cb


@pytest.mark.slow  # real fits of each framework on CPU
@pytest.mark.parametrize("fit", [lightning_fit, hf_train], ids=["lightning", "transformers"])
def test_callback_tells_input_bound_from_compute_bound(fit, source, tmp_path: Path) -> None:
    src, sock = source
    torch.set_num_threads(1)
    slow, _ = fit("cb-input", sock, tmp_path, **INPUT)
    fast, _ = fit("cb-compute", sock, tmp_path, **COMPUTE)
    got = collect(src)
    jobs = {j: d for t, j, d in got if t == "train_job"}
    d = jobs["cb-compute"]
    assert d["params"] == sum(p.numel() for p in fast.parameters()) and d["tensors"] == 8
    assert d["rank"] == 0 and d["world_size"] == 1 and d["accelerator"] == "cpu"
    assert d["model"] == "Regressor" and d["framework"] in ("lightning", "transformers")
    assert jobs["cb-input"]["params"] == 32 * 32 + 32 + 33
    n, share, examples = totals(got, "cb-input")
    assert n == 30 and examples == 30 * B  # every batch is a step (the first timed from its start)
    assert share > 0.5, share
    n, share, _ = totals(got, "cb-compute")
    assert n == 30 and share < 0.1, share


@pytest.mark.parametrize("fit", [lightning_fit, hf_train], ids=["lightning", "transformers"])
def test_callback_counts_flops_of_the_first_step(fit, source, tmp_path: Path) -> None:
    src, sock = source
    width, hidden = 64, 128
    _, cb = fit(
        "cb-flops", sock, tmp_path, batches=8, width=width, hidden=hidden, work=0, deep=0, measure_flops=True
    )
    expect = 2 * B * width * hidden * 2 + 2 * B * hidden * 3  # as for the loop wrapper
    assert cb.flops_per_step == expect
    got = collect(src)
    decl = [d for t, j, d in got if t == "train_job" and j == "cb-flops"]
    assert decl[-1]["flops_per_step"] == expect
    assert totals(got, "cb-flops")[0] == 7  # 8 batches: all but the counted one are timed


def test_hf_step_is_an_optimizer_step_over_accumulated_batches(source, tmp_path: Path) -> None:
    src, sock = source
    hf_train("cb-accum", sock, tmp_path, batches=24, accum=4, width=16, hidden=16, work=0, deep=0)
    n, _, examples = totals(collect(src), "cb-accum")
    assert n == 6 and examples == 6 * 4 * B  # 6 optimizer steps of 4 batches each


def test_lightning_under_ddp_reports_each_steps_communication_wait(source, tmp_path: Path) -> None:
    """Lightning's DDP strategy (one CPU process, a gloo group of one): the callback times the
    strategy's DDP model's all-reduce, and every step carries its communication wait."""
    import os

    import torch.distributed as dist

    L = pytest.importorskip("lightning.pytorch")
    src, sock = source
    env = dict(os.environ)  # (Lightning sets RANK, MASTER_PORT ... for its group: not for the next tests)
    try:
        _, cb = lightning_fit("lightning-ddp", sock, tmp_path, batches=12, strategy=L.strategies.DDPStrategy(),
                              **COMPUTE | {"hidden": 256})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(env)
    assert cb.clock.comm is not None and cb.clock.comm.buckets == 12
    got = collect(src)
    rows = [d for t, j, d in got if t == "train_steps" and j == "lightning-ddp"]
    assert sum(d["steps"] for d in rows) == 12 and all(d["comm_mean_seconds"] is not None for d in rows)
    assert all(0 <= d["comm_mean_seconds"] <= d["step_mean_seconds"] for d in rows)
    # and the shape it runs in: the gradients the strategy all-reduces, its devices per node
    decl = [d for t, j, d in got if t == "train_job" and j == "lightning-ddp"][-1]
    assert decl["grad_bytes"] == 4 * decl["params"] and decl["gpus_per_node"] == 1, decl
