"""PyTorch Lightning callback: step time, input wait, the job declaration and (on request)
FLOPs per step, from ``Trainer.fit``.

    from cmdare.agent.adapters.lightning import CmdareCallback

    trainer = lightning.Trainer(callbacks=[CmdareCallback("resnet50-a")])
    trainer.fit(module, loader)

Written against Lightning's public ``Callback`` API (``lightning.pytorch``, or the older
``pytorch_lightning`` package).  A step runs from one training batch's end to the next
one's; the gap between a batch's end and the next batch's start, where Lightning fetches
(and moves to the device) the next batch, is its input wait.  Epoch ends and validation
pause the clock.  On ``on_train_start`` the job is declared with the LightningModule's
parameter and tensor counts, the trainer's global rank and world size, the framework
versions and the accelerator.  Examples per step: ``batch_size`` if given, else each
batch's leading dimension.  ``measure_flops=True`` counts the first training step's FLOPs
with ``torch.utils.flop_counter`` (that step is then not timed).  Under a DDP strategy the
gradient all-reduce backward did not hide is timed each step (adapters/torch.py
``watch_ddp`` on ``trainer.strategy.model``; ``comm_hook=False``: not) and reported as
communication wait.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

try:
    import lightning.pytorch as pl

    _FRAMEWORK = "lightning"
except ImportError:  # the older package name
    import pytorch_lightning as pl  # type: ignore[no-redef]

    _FRAMEWORK = "pytorch_lightning"

from .. import track
from ._hooks import HookClock
from .torch import accelerator_of, batch_examples, grad_bytes, module_counts, split_shape, watch_ddp

log = logging.getLogger("cmdare.track")


class CmdareCallback(pl.Callback):
    def __init__(
        self, job: str, batch_size: int | None = None, measure_flops: bool = False, comm_hook: bool = True,
        **init: Any
    ) -> None:
        """``job`` and any ``track.init`` keyword (run, ps, role, model, flops_per_step,
        accelerator, socket_path); ``batch_size``: examples per step; ``comm_hook``: time a
        DDP strategy's gradient communication."""
        super().__init__()
        self.job, self.batch_size, self.measure_flops, self.init = job, batch_size, measure_flops, init
        self.comm_hook = comm_hook
        self.clock = HookClock()

    @property
    def run(self) -> track.Run | None:
        return self.clock.run

    @property
    def flops_per_step(self) -> float | None:
        return self.clock.flops_per_step

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        params, tensors = module_counts(pl_module)
        declared: dict[str, Any] = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "model": type(pl_module).__name__,
            "params": params,
            "tensors": tensors,
            "batch_size": self.batch_size,
            "framework": _FRAMEWORK,
            "framework_version": f"{pl.__version__} (torch {torch.__version__})",
            "accelerator": accelerator_of(pl_module),
            **self.init,
        }
        shape = split_shape(declared)
        counter = FlopCounterMode(display=False) if self.measure_flops else None
        run = track.init(self.job, **declared)
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(getattr(trainer.strategy, "model", None), DistributedDataParallel):
            # a DDP strategy's shape: the gradients it all-reduces, the devices per node
            shape.setdefault("grad_bytes", grad_bytes(pl_module))
            shape.setdefault("gpus_per_node", trainer.num_devices)
        if shape:
            run.declare(**shape)
        self.clock.start(run, counter, self._watch(trainer))

    def _watch(self, trainer: Any) -> Any:
        """A DDP strategy's model, its communication timed (None: not DDP, or a hook of the
        strategy's own: said once)."""
        from torch.nn.parallel import DistributedDataParallel

        model = getattr(trainer.strategy, "model", None)
        if not self.comm_hook or not isinstance(model, DistributedDataParallel):
            return None
        try:
            return watch_ddp(model)
        except ValueError as e:
            log.warning("cmdare: communication wait not timed: %s", e)
            return None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.clock.begin()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.clock.end(self.batch_size or batch_examples(batch))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.clock.pause()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.clock.pause()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.clock.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.clock.close(exception)
