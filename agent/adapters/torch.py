"""PyTorch loop wrapper: the job declared from the module, step time and input wait from the
batch loop, FLOPs per step measured once on request.

    from cmdare.agent.adapters.torch import track_module

    run = track_module("resnet50-a", model, batch_size=64, measure_flops=True)
    for x, y in run.batches(loader):          # a DataLoader, or any iterable of batches
        loss = loss_fn(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
    run.close()

``track_module`` reads the parameter count and the number of parameter tensors from the
module (``module.parameters()``, shared tensors counted once), the framework version, and
the accelerator from where the parameters live (``torch.cuda.get_device_name``, or
``cpu``); any ``track.init`` keyword overrides what it reads.  ``run.batches`` works as
``track.Run.batches`` (each fetch timed as input wait; every batch closes a step), and the
examples per step default to the batch's leading dimension.

``measure_flops=True``: the first training step (from the first batch handed out to the
request for the second) runs under ``torch.utils.flop_counter.FlopCounterMode``, which
counts the forward, backward and optimizer operations that step dispatches; the job is then
declared again with ``flops_per_step``.  That step is slowed by the counting, so it is not
recorded as a step.  Counting happens on the training thread only (DataLoader workers are
not counted, as they are not part of the model's work).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from torch.utils.flop_counter import FlopCounterMode

from .. import track

T = TypeVar("T")


def module_counts(module: torch.nn.Module) -> tuple[int, int]:
    """(parameters, parameter tensors) of ``module``; a tensor shared by two layers counts once."""
    seen: set[int] = set()
    params = tensors = 0
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        params += p.numel()
        tensors += 1
    return params, tensors


def accelerator_of(module: torch.nn.Module) -> str:
    """Where the module's parameters live: the CUDA device's name, ``mps``, or ``cpu``."""
    p = next(iter(module.parameters()), None)
    if p is None:
        return ""
    dev = p.device
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return dev.type


def batch_examples(batch: Any) -> int:
    """Examples in a batch: the leading dimension of its first tensor (tuples, lists and
    dicts are searched in order); 0 when there is none."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for b in batch:
            n = batch_examples(b)
            if n:
                return n
    return 0


class TorchRun:
    """A ``track.Run`` plus the module it describes (see ``track_module``)."""

    def __init__(self, run: track.Run, module: torch.nn.Module, measure_flops: bool) -> None:
        self.run = run
        self.module = module
        self.measure_flops = measure_flops
        self.flops_per_step: float | None = None

    def __getattr__(self, name: str) -> Any:  # step, wait, checkpoint, flush, dropped, ...
        return getattr(self.run, name)

    def batches(
        self, iterable: Iterable[T], examples: int | Callable[[T], int | float] | None = None
    ) -> Iterator[T]:
        """Yield the batches of ``iterable``, timing each fetch as input wait (see
        ``track.Run.batches``); ``examples`` defaults to each batch's leading dimension."""
        count = batch_examples if examples is None else examples
        it = iter(iterable)
        if self.measure_flops and self.flops_per_step is None:
            try:
                first = next(it)
            except StopIteration:
                return
            counter = FlopCounterMode(display=False)
            with counter:
                yield first  # the caller's first training step runs here
            self.flops_per_step = float(counter.get_total_flops())
            self.run.declare(flops_per_step=self.flops_per_step)
            self.run.pause()  # the counted step was slowed: the next one starts the clock
        yield from self.run.batches(it, count)

    def close(self, exc: BaseException | None = None) -> None:
        self.run.close(exc)

    def __enter__(self) -> TorchRun:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        self.close(e)


def track_module(job: str, module: torch.nn.Module, *, measure_flops: bool = False, **init: Any) -> TorchRun:
    """Declare this training process (see ``track.init``) with what ``module`` tells:
    parameters, parameter tensors, model name (the class name), framework and version,
    accelerator.  Keywords given explicitly win over what is read."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"track_module: expected a torch.nn.Module, got {type(module).__name__}")
    params, tensors = module_counts(module)
    declared: dict[str, Any] = {
        "model": type(module).__name__,
        "params": params,
        "tensors": tensors,
        "framework": "pytorch",
        "framework_version": torch.__version__,
        "accelerator": accelerator_of(module),
        **init,
    }
    return TorchRun(track.init(job, **declared), module, measure_flops)
