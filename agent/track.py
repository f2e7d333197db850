"""cmdare tracking library for training code: step times, input wait, checkpoints, job.

Standard library only (no agent dependencies, no framework). A few lines in a loop::

    from cmdare.agent import track

    run = track.init(job="resnet50-a", model="resnet50", batch_size=256, rank=0, world_size=8)
    for batch in run.batches(loader, examples=256):  # input wait measured, one step per batch
        train_step(batch)
    with run.checkpoint("save") as ck:
        torch.save(state, path)
        ck.bytes = os.path.getsize(path)

What it measures. ``run.batches(it)`` times each ``next()`` on the batch iterator (the
input wait: time the loop was blocked on data) and counts each batch as a step whose time
runs from one batch's arrival to the next one's (so step time = input wait + compute).
``run.step(examples=n)`` marks a step by hand instead; ``run.wait()`` times a custom
blocking fetch.

How a run ends. ``run.close()`` (or leaving ``with track.init(...) as run:``) reports the
run's end: ``finished``; ``failed`` with the exception's type and message when the block
raised, or the exit code of a ``SystemExit`` other than 0; ``interrupted`` on
``KeyboardInterrupt`` (SIGINT). ``run.end(state, ...)`` says it by hand (a signal handler of
your own: ``run.end("interrupted", signal="SIGTERM")``). A process that exits without
either reports at interpreter exit: ``failed`` after an uncaught exception, else
``finished`` (a bare ``sys.exit(3)`` outside the ``with`` block cannot be told from 0 there:
use the block or ``run.end``). A process killed outright (SIGKILL, the OOM killer, a
segfault, SIGTERM without a handler) says nothing: the agent sees its process gone and
reports the run ``crashed``.

How it ships. Records go, in batches, as datagrams to the local cmdare-agent over a Unix
datagram socket (``$CMDARE_TRAIN_SOCKET`` or ``/run/cmdare/train.sock``), sent
non-blocking: a missing, stopped or slow agent never blocks or breaks training. What
cannot be delivered is dropped and counted (``run.dropped``), and the count reaches the
agent with the next datagram that gets through.
"""

from __future__ import annotations

import atexit
import json
import os
import signal as _signal
import socket
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

DEFAULT_SOCKET = "/run/cmdare/train.sock"
PROTOCOL = 1  # version of the datagram protocol between this library and the agent
FLUSH_RECORDS = 256  # step records per datagram
FLUSH_SECONDS = 1.0  # ... or at least this often while steps are being recorded
ROLES = ("worker", "ps", "chief", "data", "client")
END_STATES = ("finished", "failed", "interrupted")  # what a process can say of itself ("crashed": the agent)
MAX_ERROR = 500  # characters of an exception's text sent with a failed run

T = TypeVar("T")
_clock = time.perf_counter


class Run:
    """One training process's handle (see ``init``)."""

    def __init__(self, job: str, run: str, rank: int, socket_path: str, **declared: Any) -> None:
        self.job, self.run, self.rank = job, run, rank
        self.socket_path = socket_path
        self.declared = declared
        self.steps = 0  # steps recorded by this process
        self.dropped = 0  # step records (and job/checkpoint messages) that could not be delivered
        self._unsent_dropped = 0
        self._records: list[list[float]] = []
        self._produced: list[list[float]] = []  # an input worker's batches (role "data")
        self.batches_produced = 0
        self._last_flush = _clock()
        self._last_step_end: float | None = None
        self._wait = 0.0  # input wait accumulated for the step in progress
        self._comm: float | None = None  # communication wait of the step in progress (None: never reported)
        self.ended: str | None = None  # the end state reported (None: still running)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._head = {"v": PROTOCOL, "job": job, "run": run, "rank": rank, "pid": os.getpid()}
        self._send({"k": "job", **declared})
        _LIVE.add(self)

    def declare(self, **fields: Any) -> None:
        """Add to this process's job declaration (e.g. ``flops_per_step`` once measured)
        and send it again; the agent forwards it at once and the latest one counts."""
        self.declared.update({k: v for k, v in fields.items() if v not in (None, "")})
        self._send({"k": "job", **self.declared})

    # -- transport ---------------------------------------------------------------------
    def _send(self, msg: dict[str, Any], records: int = 1) -> bool:
        msg.update(self._head)
        msg["dropped"] = self.dropped
        try:
            self._sock.sendto(json.dumps(msg, separators=(",", ":")).encode(), self.socket_path)
            return True
        except OSError:  # no agent (ENOENT, ECONNREFUSED), agent busy (EAGAIN), too large
            self.dropped += records
            return False

    def flush(self) -> None:
        """Send the step records gathered so far (also done every 256 steps and every second)."""
        recs, self._records = self._records, []
        made, self._produced = self._produced, []
        self._last_flush = _clock()
        if recs:
            self._send({"k": "steps", "s": recs}, len(recs))
        if made:
            self._send({"k": "data", "s": made}, len(made))

    # -- steps -------------------------------------------------------------------------
    def step(self, examples: int | float = 0, step: int | None = None) -> None:
        """Mark the end of one training step that processed ``examples`` examples (or
        tokens).  Its time runs from the previous step's end; the very first call only
        marks the start (there is nothing to measure from)."""
        now = _clock()
        prev = self._last_step_end
        self._last_step_end = now
        self.steps += 1
        if prev is None:  # the first step has no start to measure from
            self._wait = 0.0
            self._comm = None if self._comm is None else 0.0
            return
        rec = [time.time(), now - prev, self._wait, examples, self.steps if step is None else step]
        if self._comm is not None:  # once a run reports communication, every step says how much
            rec.append(min(self._comm, now - prev))
            self._comm = 0.0
        self._records.append(rec)
        self._wait = 0.0
        if len(self._records) >= FLUSH_RECORDS or now - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def add_wait(self, seconds: float) -> None:
        """Count ``seconds`` measured elsewhere (a framework callback's gap between batches)
        as input wait of the step in progress."""
        self._wait += max(0.0, seconds)

    def add_comm_wait(self, seconds: float) -> None:
        """Count ``seconds`` the training thread waited on gradient communication that
        computation did not hide (DDP's all-reduce after backward, FSDP's collectives), from
        any framework, as communication wait of the step in progress: the agent reports it
        beside input wait (``comm_mean_seconds``, ``comm_share_ratio``) and ``comm_bound``
        judges it. Not finite or negative: ignored."""
        if isinstance(seconds, (int, float)) and seconds == seconds and 0 <= seconds < float("inf"):
            self._comm = (self._comm or 0.0) + float(seconds)

    def begin_step(self) -> None:
        """Mark where a step starts when no previous step end can serve (the first step, or
        the first after ``pause``); a no-op otherwise."""
        if self._last_step_end is None:
            self._last_step_end, self._wait = _clock(), 0.0

    def pause(self) -> None:
        """Training stops for a while (evaluation, an epoch boundary): the next step's time
        is measured from ``begin_step``, not from the last step's end."""
        self._last_step_end, self._wait = None, 0.0

    def wait(self, fetch: Callable[[], T]) -> T:
        """Call ``fetch()`` and count the time it blocks as input wait of the current step."""
        t = _clock()
        try:
            return fetch()
        finally:
            self._wait += _clock() - t

    def batches(self, iterable: Iterable[T], examples: int | Callable[[T], int | float] = 0) -> Iterator[T]:
        """Yield from ``iterable``, timing each fetch as input wait; every batch after the
        first closes a step (``examples``: a number per step, or a function of the batch).
        """
        it = iter(iterable)
        count = examples if callable(examples) else None
        pending: T | None = None
        have = False
        while True:
            t = _clock()
            try:
                batch = next(it)
            except StopIteration:
                if have:
                    self._wait += _clock() - t
                    self.step(count(pending) if count else examples)  # type: ignore[arg-type]
                self.flush()
                return
            now = _clock()
            if have:
                self._wait += now - t
                self.step(count(pending) if count else examples)  # type: ignore[arg-type]
            elif self._last_step_end is None:
                self._last_step_end, self._wait = now, 0.0  # warm-up fetch: before the first step
            else:
                self._wait += now - t
            pending, have = batch, True
            yield batch

    # -- input (data) workers ---------------------------------------------------------------
    def batch_produced(self, seconds: float, examples: int | float = 0, idle: float = 0.0) -> None:
        """An input worker (``role="data"``) produced one batch in ``seconds`` of processing
        (``examples`` in it), then spent ``idle`` seconds handing it over (blocked
        on a consumer or a full queue).  ``analyze recommend data-workers --job`` reads
        these as the worker's processing time per batch."""
        self.batches_produced += 1
        self._produced.append([time.time(), max(0.0, seconds), max(0.0, idle), examples, self.batches_produced])
        if len(self._produced) >= FLUSH_RECORDS or _clock() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def produced(self, iterable: Iterable[T], examples: int | Callable[[T], int | float] = 0) -> Iterator[T]:
        """For an input worker (``role="data"``): yield the batches of ``iterable`` (the
        input pipeline), timing each ``next()`` as that batch's processing time and the
        time until the next batch is asked for (handing it to a consumer: a queue put, an
        RPC reply) as idle.  ``for batch in run.produced(pipeline): queue.put(batch)``."""
        it = iter(iterable)
        count = examples if callable(examples) else None
        try:
            while True:
                t = _clock()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                done = _clock()
                n = count(batch) if count else examples
                try:
                    yield batch
                finally:
                    self.batch_produced(done - t, n, idle=_clock() - done)  # type: ignore[arg-type]
        finally:
            self.flush()

    # -- checkpoints -------------------------------------------------------------------
    def checkpoint(self, action: str = "save", path: str = "", step: int | None = None) -> _Checkpoint:
        """``with run.checkpoint("save"|"restore") as ck: ...; ck.bytes = size`` times it."""
        if action not in ("save", "restore"):
            raise ValueError(f"checkpoint action must be 'save' or 'restore', got {action!r}")
        return _Checkpoint(self, action, path, self.steps if step is None else step)

    # -- the end of the run ----------------------------------------------------------------
    def end(self, state: str = "finished", *, exit_code: int | None = None, error: str | None = None,
            signal: str | int | None = None) -> None:
        """Report how this process's run ended (once: later calls do nothing): ``finished``,
        ``failed`` (``error``: the exception, ``exit_code``) or ``interrupted`` (``signal``:
        its name or number). Steps recorded so far are sent first. The socket stays open
        until ``close()``."""
        if state not in END_STATES:
            raise ValueError(f"run.end: state must be one of {', '.join(END_STATES)}, got {state!r}")
        if self.ended is not None or self._sock.fileno() < 0:
            return
        self.ended = state
        msg: dict[str, Any] = {"k": "end", "state": state, "steps": self.steps}
        if exit_code is not None:
            msg["exit_code"] = int(exit_code)
        if error:
            msg["error"] = str(error)[:MAX_ERROR]
        if signal is not None:
            msg["signal"] = _signal_name(signal)
        self.flush()
        self._send(msg)

    def close(self, exc: BaseException | None = None) -> None:
        """Send what is left and report the end (``exc``: the exception the run ended with,
        if any; see ``end``), then close the socket."""
        if self._sock.fileno() < 0:
            return
        state, details = _end_of(exc)
        self.end(state, **details)
        self._sock.close()
        _LIVE.discard(self)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        self.close(e)


def _signal_name(sig: str | int) -> str:
    if isinstance(sig, int):
        try:
            return _signal.Signals(sig).name
        except ValueError:
            return str(sig)
    return str(sig)[:32]


def _end_of(exc: BaseException | None) -> tuple[str, dict[str, Any]]:
    """The end state (and its details) of a run that ended with ``exc`` (None: normally)."""
    if exc is None:
        return "finished", {}
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", {"signal": "SIGINT"}
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or code == 0:
            return "finished", {}
        return "failed", {"exit_code": code if isinstance(code, int) else 1,
                          "error": None if isinstance(code, int) else f"SystemExit: {code}"}
    return "failed", {"error": f"{type(exc).__name__}: {exc}"}


_LIVE: weakref.WeakSet[Run] = weakref.WeakSet()


@atexit.register
def _at_exit() -> None:
    """Runs still open when the interpreter exits: failed after an uncaught exception
    (``sys.last_value``, set before exit handlers run), else finished."""
    exc = getattr(sys, "last_value", None)
    for run in list(_LIVE):
        try:
            run.close(exc if isinstance(exc, BaseException) else None)
        except Exception:  # noqa: S110 - never the training process's exit
            pass


class _Checkpoint:
    def __init__(self, run: Run, action: str, path: str, step: int) -> None:
        self.run, self.action, self.path, self.step = run, action, path, step
        self.bytes: int | None = None

    def __enter__(self) -> _Checkpoint:
        self._t = _clock()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        msg: dict[str, Any] = {
            "k": "ckpt",
            "action": self.action,
            "seconds": _clock() - self._t,
            "step": self.step,
            "ok": et is None,
        }
        if self.bytes is not None:
            msg["bytes"] = int(self.bytes)
        if self.path:
            msg["path"] = str(self.path)[:1024]
        if e is not None:
            msg["error"] = f"{type(e).__name__}: {e}"[:500]
        self.run.flush()  # steps before the checkpoint arrive before it
        self.run._send(msg)


def init(
    job: str,
    *,
    run: str = "",
    rank: int | None = None,
    world_size: int | None = None,
    ps: int | None = None,
    role: str = "worker",
    model: str = "",
    params: int | None = None,
    tensors: int | None = None,
    flops_per_step: float | None = None,
    batch_size: int | None = None,
    framework: str = "",
    framework_version: str = "",
    accelerator: str = "",
    socket_path: str | None = None,
) -> Run:
    """Declare this training process to the local agent and return its ``Run``.

    ``rank`` and ``world_size`` default to ``$RANK`` / ``$WORLD_SIZE`` (torchrun), else 0
    and 1. ``ps``: parameter servers, for parameter-server jobs. ``params`` and ``tensors``: parameter count and number of parameter tensors;
    ``flops_per_step`` when known; ``batch_size`` per worker. Data-parallel jobs: GPUs per
    node from ``$LOCAL_WORLD_SIZE`` (torchrun's), else ``run.declare(gpus_per_node=...)``,
    and ``run.declare(grad_bytes=...)``, the gradient bytes all-reduced per step (the
    PyTorch adapter declares both for a DDP model).
    """
    if not isinstance(job, str) or not job:
        raise ValueError("track.init: job must be a non-empty string")
    if role not in ROLES:
        raise ValueError(f"track.init: role must be one of {', '.join(ROLES)}, got {role!r}")
    rank = int(os.environ.get("RANK", 0)) if rank is None else int(rank)
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else int(world_size)
    path = socket_path or os.environ.get("CMDARE_TRAIN_SOCKET") or DEFAULT_SOCKET
    declared: dict[str, Any] = {"world_size": world_size, "role": role}
    if os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
        declared["gpus_per_node"] = int(os.environ["LOCAL_WORLD_SIZE"])
    for key, val in (
        ("ps", ps),
        ("model", model),
        ("params", params),
        ("tensors", tensors),
        ("flops_per_step", flops_per_step),
        ("batch_size", batch_size),
        ("framework", framework),
        ("framework_version", framework_version),
        ("accelerator", accelerator),
    ):
        if val not in (None, ""):
            declared[key] = val
    return Run(job, run, rank, path, **declared)
