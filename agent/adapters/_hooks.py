"""What the framework callbacks share: step time and input wait from a training loop's
batch-begin / batch-end hooks (no framework imported here).

A step runs from one batch's end hook to the next one's; the gap between a batch's end and
the next batch's begin (where the loops of Keras, Lightning and the Hugging Face Trainer
fetch the next batch) is that step's input wait.  ``pause`` (an epoch end, evaluation)
makes the next step's clock start at its begin hook, so the pause counts in no step.
A ``comm`` timer (adapters/torch.py ``watch_ddp``: a DDP model's all-reduce against the end
of backward) adds each step's exposed communication before the step is recorded.
"""

from __future__ import annotations

import time
from typing import Any

from .. import track


class HookClock:
    def __init__(self) -> None:
        self.run: track.Run | None = None
        self._gap_from: float | None = None
        self._flops: Any = None  # a FlopCounterMode entered for the first step (torch callbacks)
        self._counting = False
        self.flops_per_step: float | None = None
        self.comm: Any = None  # a CommTimer (adapters/torch.py), when the model is DDP

    def start(self, run: track.Run, flop_counter: Any = None, comm: Any = None) -> None:
        """Begin tracking ``run``; ``flop_counter``: a ``FlopCounterMode`` to wrap the first
        step in (its FLOPs are then declared with the job); ``comm``: a DDP model's
        communication timer."""
        self.run, self._gap_from = run, None
        self._flops = flop_counter
        self._counting = False
        self.comm = comm

    def begin(self) -> None:
        if self.run is None:
            return
        if self._flops is not None and self.flops_per_step is None:
            if not self._counting:
                self._flops.__enter__()
                self._counting = True
            return
        if self._gap_from is None:
            self.run.begin_step()
        else:
            self.run.add_wait(time.perf_counter() - self._gap_from)

    def end(self, examples: float) -> None:
        if self.run is None:
            return
        if self._counting:
            self._flops.__exit__(None, None, None)
            self._counting = False
            self.flops_per_step = float(self._flops.get_total_flops())
            self._flops = None
            self.run.declare(flops_per_step=self.flops_per_step)
            self.pause()  # the counted step was slowed: not recorded
            if self.comm is not None:
                self.comm.take()  # (nor its communication)
            return
        if self.comm is not None:
            exposed = self.comm.take()
            if exposed is not None:
                self.run.add_comm_wait(exposed)
        self.run.step(examples=examples)
        self._gap_from = time.perf_counter()

    def pause(self) -> None:
        self._gap_from = None
        if self.run is not None:
            self.run.pause()

    def close(self, exc: BaseException | None = None) -> None:
        """Training ended (``exc``: the exception it ended with): the run reports its end."""
        if self._counting:  # training ended inside the counted step
            self._flops.__exit__(None, None, None)
            self._counting = False
        self._flops = None
        if self.run is not None:
            self.run.close(exc)
            self.run = None
