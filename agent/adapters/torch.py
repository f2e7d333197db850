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

A ``DistributedDataParallel`` module: ``track_module`` declares the wrapped module (its
class, its parameters) and times the gradient communication DDP does not hide behind
backward (``watch_ddp``, a communication hook around the all-reduce): per step, from the
launch of the last gradient bucket (backward's computation is over then) to the completion
of the last all-reduce, which backward waits for. Each step reports it as communication
wait (``run.add_comm_wait``), beside input wait; ``comm_bound`` judges it. A model with a
communication hook of its own: ``watch_ddp(run, model, hook=yours, state=its_state)``
registers yours, timed (DDP takes one hook per model).
"""

from __future__ import annotations

import threading
import time
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


def _is_fsdp(module: Any) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(module, FullyShardedDataParallel)


SHAPE = ("gpus_per_node", "grad_bytes")  # declared with run.declare (track.init takes neither)


def split_shape(declared: dict[str, Any]) -> dict[str, Any]:
    """The job's shape taken out of ``declared`` (given to an adapter as ``track.init``
    keywords): what ``run.declare`` sends after ``track.init``."""
    return {k: declared.pop(k) for k in SHAPE if k in declared}


def grad_bytes(module: torch.nn.Module) -> int:
    """The gradient bytes a data-parallel step all-reduces: each parameter that requires a
    gradient (shared ones once), times its element size."""
    seen: set[int] = set()
    out = 0
    for p in module.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        out += p.numel() * p.element_size()
    return out


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


class CommTimer:
    """When a DDP model's gradient buckets were handed to communication and when their
    all-reduce finished (``watch_ddp``'s hook calls ``launched`` and ``done``, on whichever
    threads run them); ``take()`` gives the exposed communication since the last take."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_launch: float | None = None
        self._last_done: float | None = None
        self.buckets = 0  # buckets communicated so far (all steps)
        self.exposed = 0.0  # seconds of exposed communication taken so far (all steps)

    def launched(self) -> None:
        with self._lock:
            self._last_launch = time.perf_counter()
            self.buckets += 1

    def done(self) -> None:
        t = time.perf_counter()
        with self._lock:
            if self._last_done is None or t > self._last_done:
                self._last_done = t

    def take(self) -> float | None:
        """Seconds from the last bucket's launch to the last all-reduce's end, since the last
        take (None: no communication since)."""
        with self._lock:
            a, b = self._last_launch, self._last_done
            self._last_launch = self._last_done = None
        if a is None:
            return None
        exposed = max(0.0, (b or a) - a)
        self.exposed += exposed
        return exposed


class _Timed:
    """The state ``watch_ddp`` registers: the timer, and the hook it times with its state."""

    def __init__(self, timer: CommTimer, hook: Callable[[Any, Any], Any] | None, state: Any) -> None:
        self.timer, self.hook, self.state = timer, hook, state


def _timed_hook(timed, bucket):  # type: ignore[no-untyped-def]  # (DDP checks the annotations: none, or its own)
    timed.timer.launched()
    fut = timed.hook(timed.state, bucket)
    done = timed.timer.done

    def finished(f):  # type: ignore[no-untyped-def]
        done()
        return f.value()

    return fut.then(finished)


def _timed_allreduce(timed, bucket):  # type: ignore[no-untyped-def]
    """DDP's own all-reduce (as ``default_hooks.allreduce_hook``: the bucket's mean over the
    group), timed: one callback does both (each Python callback costs tens of us a bucket)."""
    import torch.distributed as dist

    timer = timed.timer
    timer.launched()
    group = timed.state if timed.state is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

    def finished(f):  # type: ignore[no-untyped-def]
        timer.done()
        return f.value()[0]

    return fut.then(finished)


def watch_ddp(model: Any, hook: Callable[[Any, Any], Any] | None = None, state: Any = None) -> CommTimer:
    """Register on the ``DistributedDataParallel`` ``model`` a communication hook that times
    ``hook`` (default: DDP's own all-reduce, ``default_hooks.allreduce_hook``, over
    ``state``: the process group, None for the default one); a ``TorchRun`` reports what
    it times each step. Raises ValueError (one line) when the model is not DDP or already
    has a hook (DDP takes one: pass yours here)."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        raise ValueError(f"watch_ddp: expected a DistributedDataParallel model, got {type(model).__name__}")
    timer = CommTimer()
    try:
        model.register_comm_hook(_Timed(timer, hook, state), _timed_hook if hook is not None else _timed_allreduce)
    except RuntimeError as e:
        raise ValueError(f"watch_ddp: DDP refused the timing hook ({str(e).splitlines()[0][:160]}): a model with "
                         "a communication hook of its own passes it as watch_ddp(model, hook=..., state=...)") from None
    return timer


def _timed_fsdp(timed, grad, output=None):  # type: ignore[no-untyped-def]
    """FSDP's own gradient reduction (as its ``default_hooks``: an all-reduce without
    sharding, else a reduce-scatter into the shard ``output``, with the same pre- and
    post-division), timed as the DDP hook is: launched, and done when the collective's
    future completes. It waits for the collective before returning, as FSDP's own hooks
    do (over NCCL the wait orders the current stream; the host goes on)."""
    import torch.distributed as dist

    st, timer = timed.state, timed.timer
    timer.launched()
    if st.gradient_predivide_factor > 1:
        grad.div_(st.gradient_predivide_factor)
    if output is None:
        work = dist.all_reduce(grad, group=st.process_group, async_op=True)
    else:
        work = dist.reduce_scatter_tensor(output, grad, group=st.process_group, async_op=True)
    try:
        fut = work.get_future()
    except RuntimeError:  # (gloo's reduce-scatter has no future: its wait blocks the host until done)
        fut = None
    if fut is not None:
        fut.then(lambda f: timer.done())
    work.wait()
    if fut is None:
        timer.done()
    if st.gradient_postdivide_factor > 1:
        (grad if output is None else output).div_(st.gradient_postdivide_factor)


def watch_fsdp(model: Any) -> CommTimer:
    """Register on the ``FullyShardedDataParallel`` root ``model`` a communication hook that
    runs and times FSDP's own gradient reduction (each FSDP unit's reduce-scatter, or its
    all-reduce without sharding): per step, from the launch of the last unit's collective
    to its end, the communication backward did not hide. Raises ValueError (one line) when
    the model is not an FSDP root or FSDP refuses the hook (one that has its own)."""
    from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState
    from torch.distributed.fsdp import FullyShardedDataParallel

    if not isinstance(model, FullyShardedDataParallel):
        raise ValueError(f"watch_fsdp: expected a FullyShardedDataParallel model, got {type(model).__name__}")
    timer = CommTimer()
    group: Any = model.process_group  # set once FSDP has wrapped the model
    try:
        model.register_comm_hook(_Timed(timer, None, DefaultState(group)), _timed_fsdp)
    except (AssertionError, RuntimeError, ValueError) as e:
        raise ValueError(f"watch_fsdp: FSDP refused the timing hook ({str(e).splitlines()[0][:160]}): "
                         "time its communication with run.add_comm_wait") from None
    return timer


class TorchRun:
    """A ``track.Run`` plus the module it describes (see ``track_module``)."""

    def __init__(self, run: track.Run, module: torch.nn.Module, measure_flops: bool,
                 comm: CommTimer | None = None) -> None:
        self.run = run
        self.module = module
        self.measure_flops = measure_flops
        self.flops_per_step: float | None = None
        self.comm = comm  # a DDP model's communication timing (watch_ddp), reported each step

    def __getattr__(self, name: str) -> Any:  # wait, checkpoint, flush, dropped, ...
        return getattr(self.run, name)

    def step(self, examples: int | float = 0, step: int | None = None) -> None:
        """``track.Run.step``, with the step's exposed communication first (a DDP model)."""
        self._report_comm()
        self.run.step(examples, step)

    def _report_comm(self) -> None:
        if self.comm is not None:
            exposed = self.comm.take()
            if exposed is not None:
                self.run.add_comm_wait(exposed)

    def _reporting(self, it: Iterator[T]) -> Iterator[T]:
        """``it``, reporting each step's communication before the next batch is fetched
        (``track.Run.batches`` closes the step right after that fetch)."""
        for b in it:
            yield b
            self._report_comm()

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
            if self.comm is not None:
                self.comm.take()  # (nor its communication)
        yield from self.run.batches(self._reporting(it) if self.comm is not None else it, count)

    def close(self, exc: BaseException | None = None) -> None:
        self.run.close(exc)

    def __enter__(self) -> TorchRun:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        self.close(e)


def track_module(job: str, module: torch.nn.Module, *, measure_flops: bool = False, **init: Any) -> TorchRun:
    """Declare this training process (see ``track.init``) with what ``module`` tells:
    parameters, parameter tensors, model name (the class name), framework and version,
    accelerator.  Keywords given explicitly win over what is read.  A
    ``DistributedDataParallel`` module: the module it wraps is declared, and its gradient
    communication is timed (``watch_ddp``; ``comm_hook=False``: not) and the gradient bytes
    it all-reduces each step declared (``grad_bytes``). A ``FullyShardedDataParallel``
    root: its units' gradient reductions are timed (``watch_fsdp``)."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"track_module: expected a torch.nn.Module, got {type(module).__name__}")
    comm_hook = init.pop("comm_hook", True)
    inner: Any = module.module if isinstance(module, DistributedDataParallel) or _is_fsdp(module) else module
    params, tensors = module_counts(inner)
    declared: dict[str, Any] = {
        "model": type(inner).__name__,
        "params": params,
        "tensors": tensors,
        "framework": "pytorch",
        "framework_version": torch.__version__,
        "accelerator": accelerator_of(inner),
        **init,
    }
    shape = split_shape(declared)  # given, or a DDP model's
    if isinstance(module, DistributedDataParallel):
        shape.setdefault("grad_bytes", grad_bytes(inner))
    comm = watch_ddp(module) if comm_hook and isinstance(module, DistributedDataParallel) else None
    if comm_hook and _is_fsdp(module):
        comm = watch_fsdp(module)
    run = track.init(job, **declared)
    if shape:
        run.declare(**shape)  # (the declaration again, with them: the latest counts)
    return TorchRun(run, module, measure_flops, comm)
