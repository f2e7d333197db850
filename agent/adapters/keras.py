"""Keras 3 callback: step time, input wait and the job declaration, from ``model.fit``.

    from cmdare.agent.adapters.keras import CmdareCallback

    cb = CmdareCallback("resnet50-a", batch_size=64)
    model.fit(cb.data(ds), epochs=3, callbacks=[cb])

Written against Keras' public ``keras.callbacks.Callback`` API (any backend).  What it
measures: a step runs from one training batch's end to the next one's; the input wait is
the time the training thread spent fetching the batch from the dataset wrapped with
``cb.data(...)`` (plus any gap between one batch's end and the next one's start).  Epoch ends and validation pause the clock, so they count in
no step.  On ``on_train_begin`` it declares the job with the model's parameter count and
number of weight tensors, the framework and its version.  With ``steps_per_execution``
above 1, Keras calls back once per execution, so one recorded step covers that many
batches (pass ``batch_size`` as examples per execution).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import keras

from .. import track
from ._hooks import HookClock


class CmdareCallback(keras.callbacks.Callback):
    def __init__(self, job: str, batch_size: int | None = None, **init: Any) -> None:
        """``job`` and any ``track.init`` keyword (run, rank, world_size, ps, role, model,
        flops_per_step, accelerator, socket_path); ``batch_size``: examples per step."""
        super().__init__()
        self.job, self.batch_size, self.init = job, batch_size, init
        self.clock = HookClock()
        self._thread = threading.get_ident()

    @property
    def run(self) -> track.Run | None:
        return self.clock.run

    def data(self, x: Any) -> Any:
        """Wrap what you pass to ``fit`` so the time the training loop is blocked fetching
        each batch counts as input wait: a ``keras.utils.PyDataset`` (its ``__getitem__``
        timed when Keras calls it on the training thread, i.e. ``workers=1``) or any
        iterable of batches (each ``next()`` timed).  Keras 3 fetches a batch inside the
        train function, between the batch callbacks, so without this only step time is
        measured."""
        if isinstance(x, keras.utils.PyDataset):
            return _TimedPyDataset(x, self)
        if isinstance(x, Iterable) and not hasattr(x, "shape"):
            return self._timed_iter(x)
        raise TypeError(
            f"CmdareCallback.data: expected a PyDataset or an iterable of batches, got {type(x).__name__}"
        )

    def _timed_iter(self, x: Iterable[Any]) -> Iterator[Any]:
        it = iter(x)
        while True:
            t = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                return
            self._fetched(time.perf_counter() - t)
            yield b

    def _fetched(self, seconds: float) -> None:
        if self.run is not None and threading.get_ident() == self._thread:
            self.run.add_wait(seconds)

    def on_train_begin(self, logs: Any = None) -> None:
        self._thread = threading.get_ident()
        m = self.model
        declared: dict[str, Any] = {
            "framework": "keras",
            "framework_version": f"{keras.__version__} ({keras.backend.backend()})",
            "batch_size": self.batch_size,
            **self.init,
        }
        declared.setdefault("model", getattr(m, "name", "") or "")
        try:
            declared.setdefault("params", int(m.count_params()))
            declared.setdefault("tensors", len(m.weights))
        except ValueError:  # a model not built yet has no weights to count
            pass
        self.clock.start(track.init(self.job, **declared))

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.clock.begin()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.clock.end(self.batch_size or 0)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.clock.pause()

    def on_test_begin(self, logs: Any = None) -> None:
        self.clock.pause()

    def on_train_end(self, logs: Any = None) -> None:
        self.clock.close()


class _TimedPyDataset(keras.utils.PyDataset):
    """A PyDataset that times its inner dataset's ``__getitem__`` as input wait."""

    def __init__(self, inner: Any, cb: CmdareCallback) -> None:
        super().__init__(
            workers=inner.workers,
            use_multiprocessing=inner.use_multiprocessing,
            max_queue_size=inner.max_queue_size,
        )
        self.inner, self.cb = inner, cb

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        t = time.perf_counter()
        try:
            return self.inner[i]
        finally:
            self.cb._fetched(time.perf_counter() - t)

    def on_epoch_end(self) -> None:
        self.inner.on_epoch_end()
