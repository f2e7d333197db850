"""Hugging Face ``Trainer`` callback: step time, input wait, the job declaration and (on
request) FLOPs per step, from ``Trainer.train``.

    from cmdare.agent.adapters.transformers import CmdareCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[CmdareCallback("bert-ft")])
    trainer.train()

Written against the public ``transformers.TrainerCallback`` API.  One step is one optimizer
step (``gradient_accumulation_steps`` batches): it runs from one ``on_step_end`` to the
next; the gap between a step's end and the next ``on_step_begin``, where the Trainer
fetches the next step's batches, is its input wait (logging done there counts too).
Evaluation and epoch ends pause the clock.  On ``on_train_begin`` the job is declared with
the model's parameter and tensor counts, ``args.process_index`` / ``args.world_size`` as
rank and world size, the versions and the accelerator.  Examples per step:
``batch_size`` if given, else per-device batch size x gradient accumulation steps.
``measure_flops=True`` counts the first step's FLOPs with ``torch.utils.flop_counter``
(that step is then not timed).

Under DDP (``torchrun``, several processes) the Trainer wraps the model only inside
``train()``, and its callbacks are handed the unwrapped model; given the trainer
(``CmdareCallback.attach(trainer, job)``, or ``trainer=``) the callback finds the wrapped
one on ``on_train_begin``, times its gradient communication (adapters/torch.py
``watch_ddp``; ``comm_hook=False``: not) and declares the gradient bytes it all-reduces.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from .. import track
from ._hooks import HookClock
from .torch import accelerator_of, grad_bytes, module_counts, split_shape, watch_ddp

log = logging.getLogger("cmdare.track")


class CmdareCallback(transformers.TrainerCallback):
    def __init__(
        self, job: str, batch_size: int | None = None, measure_flops: bool = False, trainer: Any = None,
        comm_hook: bool = True, **init: Any
    ) -> None:
        """``job`` and any ``track.init`` keyword (run, ps, role, model, flops_per_step,
        accelerator, socket_path); ``batch_size``: examples per optimizer step;
        ``trainer``: the Trainer, to time a DDP model's gradient communication
        (``comm_hook=False``: not)."""
        self.job, self.batch_size, self.measure_flops, self.init = job, batch_size, measure_flops, init
        self.trainer, self.comm_hook = trainer, comm_hook
        self.clock = HookClock()
        self._examples = 0

    @classmethod
    def attach(cls, trainer: Any, job: str, **kw: Any) -> CmdareCallback:
        """A callback that sees ``trainer`` (its DDP model too), added to it."""
        cb = cls(job, trainer=trainer, **kw)
        trainer.add_callback(cb)
        return cb

    @property
    def run(self) -> track.Run | None:
        return self.clock.run

    @property
    def flops_per_step(self) -> float | None:
        return self.clock.flops_per_step

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self._examples = (
            self.batch_size or args.per_device_train_batch_size * args.gradient_accumulation_steps
        )
        declared: dict[str, Any] = {
            "rank": args.process_index,
            "world_size": args.world_size,
            "batch_size": self.batch_size or args.per_device_train_batch_size,
            "framework": "transformers",
            "framework_version": f"{transformers.__version__} (torch {torch.__version__})",
        }
        if isinstance(model, torch.nn.Module):
            declared["params"], declared["tensors"] = module_counts(model)
            declared["accelerator"] = accelerator_of(model)
            name = getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
            declared["model"] = name
        declared.update(self.init)
        shape = split_shape(declared)
        counter = FlopCounterMode(display=False) if self.measure_flops else None
        ddp = self._ddp()
        run = track.init(self.job, **declared)
        comm = None
        if ddp is not None:
            shape.setdefault("grad_bytes", grad_bytes(ddp.module))
        if shape:
            run.declare(**shape)
        if ddp is not None and self.comm_hook:
            try:
                comm = watch_ddp(ddp)
            except ValueError as e:
                log.warning("cmdare: communication wait not timed: %s", e)
        self.clock.start(run, counter, comm)

    def _ddp(self) -> Any:
        """The Trainer's DDP-wrapped model, when it was given the trainer and runs DDP."""
        from torch.nn.parallel import DistributedDataParallel

        wrapped = getattr(self.trainer, "model_wrapped", None)
        return wrapped if isinstance(wrapped, DistributedDataParallel) else None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.clock.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.clock.end(self._examples)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.clock.pause()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.clock.pause()

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.clock.close()
