"""Training-process source: what ``cmdare.agent.track`` sends over the local socket.

The agent binds a Unix datagram socket (``socket``, mode ``socket_mode``, 0660 by default,
group ``socket_group``: training processes of that group's users can send, no one else) and a receiver thread reads it continuously, so the kernel's datagram
queue never fills between ticks. Per tick it emits, per (job, run, rank):

- ``train_steps``: the interval's aggregate of step records: count, mean, p50, p95, max of
  step time and of input wait, input-wait share, steps/s and examples/s;
- ``train_data``: an input (data) worker's batches of the interval (``Run.produced``):
  count, processing time per batch (mean, p50, p95), time handing batches over, batches/s;
- ``train_slow_step``: single steps slower than ``slow_factor`` times the rank's recent
  median (at most ``max_slow_per_tick`` per rank per tick);
- ``train_job`` and ``train_checkpoint``: each declaration and checkpoint at once (the
  receiver wakes the agent, which emits and flushes them between ticks);
- ``train_end``: a run's end as the process reports it (finished, failed, interrupted: at
  once), or ``crashed`` when its process is gone without one (seen at a tick, reported at
  the next, so an end still queued on the socket wins). The process is known by the
  kernel's word (SO_PASSCRED), not by what the datagram claims, and by its start time, so a
  reused PID is not taken for it; a sender in another PID namespace (the kernel gives 0)
  is not watched.

Events carry the training job's id in the envelope ``job`` field. Every datagram is hostile
until checked: at most 1 MiB and 64 levels of nesting, names bounded, every number finite
and in range (a record outside is dropped whole). A malformed datagram, and one for a new
(job, run, rank) past the cardinality limits (``max_ranks_per_job``, ``max_ranks``), is
dropped and counted per job, and logged once per tick: never fatal, never another job's
data. The receiver thread is supervised: restarted if it ever ends, counted, logged.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import stat
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from cmdare.wire.plugin import Option
from cmdare.wire.registry import DATA_FIELDS
from cmdare.wire.units import ConfigError
from cmdare.wire.validation import kind_ok

from .base import SOURCES, Emit, Source, SourceUnavailable

log = logging.getLogger("cmdare.agent.train")

PROTOCOL = 1
WINDOW = 256  # recent step times per rank for the slow-step median
MIN_WINDOW = 20  # no slow-step verdicts before this many steps
IDLE_FORGET = 3600.0  # seconds without a message before a rank's state is dropped
MAX_DATAGRAM = 1 << 20
MAX_DEPTH = 64
MAX_NAME = 256  # characters of a job or run id
MAX_RECORDS = 100_000  # records in one datagram
# bounds of a record's fields: [ts, seconds, seconds, examples, step]
_LIMITS = ((0.0, 1e11), (0.0, 1e7), (0.0, 1e7), (0.0, 1e12), (0.0, 2.0**53), (0.0, 1e7))
END_STATES = ("finished", "failed", "interrupted")  # what a process may say of its run
MAX_ERROR = 500  # characters of a failed run's exception kept
_CRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
_CRED_SPACE = socket.CMSG_SPACE(_CRED.size)


def _depth_ok(data: bytes) -> bool:
    """Brackets nested at most MAX_DEPTH deep (a cheap upper bound: brackets inside strings
    count too), checked before the JSON decoder recurses."""
    depth = 0
    for b in data:
        if b in (91, 123):  # [ {
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif b in (93, 125):
            depth -= 1
    return True


def _record_ok(rec: Any) -> bool:
    """[time, step s, input wait s, examples, step number] and, from a run that reports it,
    the step's communication wait (s): numbers in range, nothing else."""
    return (type(rec) is list and len(rec) in (5, 6)
            and all(type(x) in (int, float) and lo <= x <= hi for x, (lo, hi) in zip(rec, _LIMITS, strict=False))
            and (len(rec) == 5 or rec[5] <= rec[1]))


def _pct(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list: the smallest value with at least a
    share ``q`` of the values at or below it."""
    return sorted_vals[max(0, math.ceil(q * len(sorted_vals)) - 1)]


def _comm(recs: list[list[float]]) -> dict[str, float]:
    """The interval's communication wait, from the records that carry one (none: no field)."""
    with_comm = [x for x in recs if len(x) > 5]
    if not with_comm:
        return {}
    comm, step = sum(x[5] for x in with_comm), sum(x[1] for x in with_comm)
    return {"comm_mean_seconds": comm / len(with_comm), "comm_share_ratio": min(1.0, comm / step) if step > 0 else 0.0}


class _Rank:
    def __init__(self) -> None:
        self.records: list[list[float]] = []
        self.produced: list[list[float]] = []  # an input worker's batches (role data)
        self.window: deque[float] = deque(maxlen=WINDOW)
        self.dropped = 0  # the library's own count of undelivered records
        self.since = self.last = time.time()
        self.pid: int | None = None  # the sending process, as the kernel names it (None: not watched)
        self.started: float | None = None  # its start time (a reused PID is another process)
        self.ended = False  # the run's end was reported (by the process or as crashed)
        self.gone_at: float | None = None  # when its process was first seen gone
        self.last_step = 0


@SOURCES.register
class TrainSource(Source):
    """Step times, input wait, checkpoints and job declarations that training processes
    send with cmdare.agent.track, aggregated per interval, job, run and rank."""

    name = "train"
    OPTIONS = {
        "socket": Option("str", "/run/cmdare/train.sock", "Unix datagram socket the tracking library sends to"),
        "slow_factor": Option(
            "float", 3.0, "a step is slow above this many times the rank's recent median", lo=1.0, lo_open=True
        ),
        "max_slow_per_tick": Option("int", 20, "slow steps kept per rank per tick (the rest are counted)"),
        "socket_mode": Option("str", "0660", "permission bits of the socket (octal); 0666 lets any local user send"),
        "socket_group": Option("str", "", "group of the socket: users in it may send (empty: the agent's own group)"),
        "max_ranks_per_job": Option("int", 4096, "live (run, rank) pairs one job may have; more are refused and counted",
                                    lo=1, hi=1_000_000),
        "max_ranks": Option("int", 16384, "live (job, run, rank) triples in all; more are refused and counted",
                            lo=1, hi=10_000_000),
    }

    @classmethod
    def parse_config(cls, where: str, raw: Any) -> dict[str, Any]:
        cfg = super().parse_config(where, raw)
        m = cfg["socket_mode"]
        if not (isinstance(m, str) and len(m) in (3, 4) and all(c in "01234567" for c in m) and int(m, 8) <= 0o777):
            raise ConfigError(f"{where}.socket_mode: expected octal permission bits like 0660, got {m!r}")
        if int(m, 8) & 0o200 == 0:
            raise ConfigError(f"{where}.socket_mode: the owner (the agent) must keep write permission, got {m!r}")
        return cfg

    def __init__(self, config: dict[str, Any], wake: Callable[[], None] | None = None, **_: Any) -> None:
        super().__init__(config)
        self.wake = wake or (lambda: None)
        self.path = Path(self.config["socket"])
        self.sock: socket.socket | None = None
        self._warned_pid_ns = False  # a sender in a PID namespace the agent cannot see: said once
        self.lock = threading.Lock()
        self.ranks: dict[tuple[str, str, int], _Rank] = {}
        self.urgent: list[tuple[str, str, dict[str, Any], float]] = []  # (type, job, data, ts)
        self.bad = 0
        self.bad_example = ""
        self.bad_by_job: dict[str, int] = {}  # dropped datagrams per job (bounded: see _count_bad)
        self.refused = 0  # datagrams of new ranks past the cardinality limits
        self.restarts = 0  # receiver threads restarted by the supervisor
        self.received = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def check(self) -> str:
        """Whether the socket could be bound, without creating it or its directory."""
        p = self.path
        if p.exists() and not stat.S_ISSOCK(p.lstat().st_mode):
            raise SourceUnavailable(f"{p} exists and is not a socket; not replacing it")
        d = p.parent
        while not d.exists() and d != d.parent:
            d = d.parent
        if not os.access(d, os.W_OK | os.X_OK):
            raise SourceUnavailable(f"cannot listen on {p}: {d} is not writable by this user")
        if self.config["socket_group"]:
            import grp

            try:
                grp.getgrnam(self.config["socket_group"])
            except KeyError:
                raise SourceUnavailable(f"socket_group {self.config['socket_group']!r} does not exist") from None
        made = "" if p.parent.exists() else f" ({p.parent} to be created)"
        return (f"would listen on {p}{made}, mode {self.config['socket_mode']}, "
                f"group {self.config['socket_group'] or '(the agent' + chr(39) + 's)'}")

    def start(self) -> None:
        p = self.path
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.exists() or p.is_symlink():
                if not stat.S_ISSOCK(p.lstat().st_mode):
                    raise SourceUnavailable(f"{p} exists and is not a socket; not replacing it")
                p.unlink()  # a stale socket of an earlier agent
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the sender's PID, by the kernel
            s.bind(str(p))
            os.chmod(p, int(self.config["socket_mode"], 8))
            if self.config["socket_group"]:
                import grp

                try:
                    gid = grp.getgrnam(self.config["socket_group"]).gr_gid
                except KeyError:
                    s.close()
                    p.unlink(missing_ok=True)
                    raise SourceUnavailable(
                        f"socket_group {self.config['socket_group']!r} does not exist (create it, or leave socket_group empty)"
                    ) from None
                os.chown(p, -1, gid)
        except OSError as e:
            raise SourceUnavailable(f"cannot listen on {p}: {e.strerror or e}") from None
        s.settimeout(0.2)
        self.sock = s
        self._stop.clear()
        self._start_thread()

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._receive, name="cmdare-train-recv", daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        """The receiver thread restarted if it ended (it should not: every datagram is
        caught), counted and logged: training telemetry never stops silently."""
        if self.sock is not None and self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            self.restarts += 1
            log.error("train: the socket receiver ended; restarted (%d so far)", self.restarts)
            self._start_thread()

    def _receive(self) -> None:
        while not self._stop.is_set():
            sock = self.sock
            if sock is None:
                return
            try:
                data, anc, _, _ = sock.recvmsg(MAX_DATAGRAM + 1, _CRED_SPACE)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)
                continue
            try:
                self._take(data, self._sender_pid(anc))
            except Exception as e:  # never the thread: one datagram, counted
                self._count_bad("", f"{type(e).__name__}: {e}")

    def _sender_pid(self, anc: list[tuple[int, int, bytes]]) -> int | None:
        """The sender's PID (the kernel's word); a sender in a PID namespace this agent
        cannot see (the kernel gives 0: the agent runs in a container of its own) is said
        once: its GPU processes cannot be matched to its job, nor its crash seen."""
        pid = _sender(anc)
        if pid == 0:
            if not self._warned_pid_ns:
                self._warned_pid_ns = True
                log.warning("train: a training process in a PID namespace this agent cannot see: its GPU processes "
                            "are not matched to its job and its crash is not seen; run the agent in the host's PID "
                            "namespace (Kubernetes: hostPID: true)")
            return None
        return pid

    def _count_bad(self, job: str, why: str) -> None:
        with self.lock:
            self.bad += 1
            self.bad_example = why[:200]
            if job in self.bad_by_job or len(self.bad_by_job) < 1000:
                self.bad_by_job[job] = self.bad_by_job.get(job, 0) + 1

    def _take(self, data: bytes, pid: int | None = None) -> None:
        """One datagram; ``pid``: its sender as the kernel names it (None: not known)."""
        job = ""
        try:
            if len(data) > MAX_DATAGRAM:
                raise ValueError(f"datagram larger than {MAX_DATAGRAM} bytes")
            if not _depth_ok(data):
                raise ValueError(f"nested more than {MAX_DEPTH} levels")
            m = json.loads(data)
            if type(m) is not dict or m.get("v") != PROTOCOL:
                raise ValueError(f"not a protocol v{PROTOCOL} message")
            job, run, rank, kind = m["job"], m.get("run", ""), m["rank"], m["k"]
            if type(job) is not str or not job or type(run) is not str or type(rank) is not int:
                job = job if type(job) is str else ""
                raise ValueError("job, run or rank of the wrong type")
            if len(job) > MAX_NAME or len(run) > MAX_NAME or not 0 <= rank < 1 << 31:
                job = job[:MAX_NAME]
                raise ValueError("job or run longer than 256 characters, or rank out of range")
            dropped = m.get("dropped", 0)
            if type(dropped) is not int or not 0 <= dropped < 1 << 63:
                raise ValueError("dropped is not a whole number from 0")
            key = (job, run, rank)
            head = {"run": run, "rank": rank}
            if kind in ("steps", "data"):
                recs = m["s"]
                if type(recs) is not list or len(recs) > MAX_RECORDS:
                    raise ValueError(f"s is not a list of at most {MAX_RECORDS} records")
                for rec in recs:
                    if not _record_ok(rec):
                        raise ValueError(
                            "step record is not [ts, step_s, wait_s, examples, step] in range" if kind == "steps"
                            else "data record is not [ts, process_s, idle_s, elements, batch] in range"
                        )
            with self.lock:
                r = self.ranks.get(key)
                if r is None:
                    if not self._room_for(job):
                        self.refused += 1
                        raise ValueError("a new rank past max_ranks_per_job / max_ranks: refused")
                    r = self.ranks[key] = _Rank()
                r.dropped, r.last = max(r.dropped, dropped), time.time()
                if pid and pid != r.pid:
                    r.pid, r.started, r.gone_at = pid, _started(pid), None
                if kind == "steps":
                    r.records.extend(recs)
                    if recs:
                        r.last_step = int(recs[-1][4])
                elif kind == "data":
                    r.produced.extend(recs)
                elif kind == "job":
                    d = _typed("train_job", m, _JOB_KEYS)  # its pid: the kernel's, where known
                    self.urgent.append(("train_job", job, {**head, **d, **_pid(r)}, time.time()))
                elif kind == "ckpt":
                    d = _typed("train_checkpoint", m, _CKPT_KEYS)
                    self.urgent.append(("train_checkpoint", job, {**head, **d}, time.time()))
                elif kind == "end":
                    d = _end_fields(m)
                    if r.ended:  # said twice (or after it was seen crashed): the first word stands
                        raise ValueError("the run's end was already reported")
                    r.ended = True
                    self.urgent.append(("train_end", job, {**head, **d, **_pid(r)}, time.time()))
                else:
                    raise ValueError(f"unknown message kind {kind!r}")
                self.received += 1
            if kind not in ("steps", "data"):
                self.wake()  # declarations and checkpoints go out at once, not next tick
        except (ValueError, KeyError, TypeError, RecursionError, OverflowError) as e:
            self._count_bad(job, f"{type(e).__name__}: {e}")

    def _room_for(self, job: str) -> bool:
        """Whether a new (job, run, rank) fits the cardinality limits (under the lock)."""
        if len(self.ranks) >= self.config["max_ranks"]:
            return False
        return sum(1 for k in self.ranks if k[0] == job) < self.config["max_ranks_per_job"]

    def collect_urgent(self, emit: Emit) -> None:
        with self.lock:
            urgent, self.urgent = self.urgent, []
        for type_, job, data, ts in urgent:
            emit(type_, data, ts, job=job)

    def collect(self, emit: Emit) -> None:
        if self.sock is None:
            self.start()
        self._supervise()
        self.collect_urgent(emit)
        now = time.time()
        with self.lock:
            work = []
            for key in [k for k, r in self.ranks.items() if now - r.last > IDLE_FORGET]:
                del self.ranks[key]  # a process gone for an hour: forget its window
            produced = []
            for key, r in self.ranks.items():
                if r.records:
                    work.append((key, r, r.records, r.since))
                    r.records = []
                if r.produced:
                    produced.append((key, r, r.produced, r.since))
                    r.produced = []
                r.since = now
            bad, self.bad = self.bad, 0
            by_job, self.bad_by_job = self.bad_by_job, {}
        for agg, items in ((self._aggregate, work), (self._aggregate_data, produced)):
            for (job, run, rank), r, recs, since in items:
                try:  # one rank's interval costs that interval only
                    agg(emit, job, run, rank, r, recs, max(now - since, 1e-3))
                except (ValueError, TypeError, OverflowError, ZeroDivisionError) as e:
                    bad += 1
                    by_job[job] = by_job.get(job, 0) + 1
                    self.bad_example = f"{type(e).__name__}: {e}"[:200]
        self._watch(emit, now)
        if bad:
            jobs = ", ".join(f"{j or '?'}: {n}" for j, n in sorted(by_job.items(), key=lambda x: -x[1])[:5])
            log.warning("train: %d malformed or refused datagrams this tick (%s; e.g. %s)", bad, jobs,
                        self.bad_example)

    def _watch(self, emit: Emit, now: float) -> None:
        """Runs whose process is gone without reporting an end: ``crashed``, one tick after
        the process was first seen gone (an end still queued on the socket wins)."""
        with self.lock:
            watched = [(k, r) for k, r in self.ranks.items() if r.pid and not r.ended]
        for (job, run, rank), r in watched:
            if _alive(r.pid, r.started):  # type: ignore[arg-type]
                r.gone_at = None
                continue
            if r.gone_at is None:
                r.gone_at = now
                continue
            with self.lock:
                if r.ended:
                    continue
                r.ended = True
            emit("train_end", {"run": run, "rank": rank, "state": "crashed", "steps": r.last_step, **_pid(r)},
                 r.gone_at, job=job)

    def _aggregate(
        self, emit: Emit, job: str, run: str, rank: int, r: _Rank, recs: list[list[float]], interval: float
    ) -> None:
        steps = sorted(x[1] for x in recs)
        waits = sorted(x[2] for x in recs)
        total_step, total_wait = sum(steps), sum(waits)
        examples = sum(x[3] for x in recs)
        n = len(recs)
        # rate over the time the steps covered (first start .. last end), not the tick
        span = max(recs[-1][0] - recs[0][0] + recs[0][1], total_step, 1e-9)
        emit(
            "train_steps",
            {
                "run": run,
                "rank": rank,
                "interval_seconds": round(interval, 6),
                "steps": n,
                "first_step": int(recs[0][4]),
                "last_step": int(recs[-1][4]),
                "examples": examples,
                "step_mean_seconds": total_step / n,
                "step_p50_seconds": _pct(steps, 0.5),
                "step_p95_seconds": _pct(steps, 0.95),
                "step_max_seconds": steps[-1],
                "wait_mean_seconds": total_wait / n,
                "wait_p50_seconds": _pct(waits, 0.5),
                "wait_p95_seconds": _pct(waits, 0.95),
                "wait_max_seconds": waits[-1],
                "wait_share_ratio": total_wait / total_step if total_step > 0 else 0.0,
                "steps_per_second": n / span,
                "examples_per_second": examples / span,
                "dropped_total": r.dropped,
                **_comm(recs),
            },
            recs[-1][0],
            job=job,
        )
        factor, cap, kept = self.config["slow_factor"], self.config["max_slow_per_tick"], 0
        med = None
        for rec in recs:
            if len(r.window) >= MIN_WINDOW:
                if med is None:
                    med = sorted(r.window)[len(r.window) // 2]
                if rec[1] > factor * med and kept < cap:
                    kept += 1
                    emit(
                        "train_slow_step",
                        {
                            "run": run,
                            "rank": rank,
                            "step": int(rec[4]),
                            "step_seconds": rec[1],
                            "wait_seconds": rec[2],
                            "median_seconds": med,
                            "examples": rec[3],
                        },
                        rec[0],
                        job=job,
                    )
            r.window.append(rec[1])

    def _aggregate_data(
        self, emit: Emit, job: str, run: str, rank: int, r: _Rank, recs: list[list[float]], interval: float
    ) -> None:
        """An input worker's batches of the interval: processing time per batch (what the
        tf.data service auto-scaler calls a worker's processing time per element) and the
        time spent handing batches over (blocked on consumers)."""
        proc = sorted(x[1] for x in recs)
        idle = sum(x[2] for x in recs)
        total, n = sum(proc), len(recs)
        span = max(recs[-1][0] - recs[0][0] + recs[0][1] + recs[0][2], total + idle, 1e-9)
        emit(
            "train_data",
            {
                "run": run,
                "rank": rank,
                "interval_seconds": round(interval, 6),
                "batches": n,
                "elements": sum(x[3] for x in recs),
                "process_mean_seconds": total / n,
                "process_p50_seconds": _pct(proc, 0.5),
                "process_p95_seconds": _pct(proc, 0.95),
                "idle_mean_seconds": idle / n,
                "idle_share_ratio": idle / (total + idle) if total + idle > 0 else 0.0,
                "batches_per_second": n / span,
                "dropped_total": r.dropped,
                **_comm(recs),
            },
            recs[-1][0],
            job=job,
        )

    def close(self) -> None:
        self._stop.set()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
        try:
            if self.path.exists() and stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()
        except OSError:
            pass


def _sender(anc: list[tuple[int, int, bytes]]) -> int | None:
    """The sending process's PID from the kernel's credentials (None: none; 0: a sender in
    a PID namespace this agent cannot see, which it cannot watch)."""
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS and len(data) >= _CRED.size:
            return _CRED.unpack_from(data)[0]
    return None


def _started(pid: int) -> float | None:
    """When process ``pid`` started (None: it is gone, or cannot be read)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(pid: int, started: float | None) -> bool:
    """Whether the process is still the one that sent (running, not a zombie)."""
    try:
        p = psutil.Process(pid)
        if started is not None and abs(p.create_time() - started) > 0.01:
            return False  # the PID was reused by another process
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ZombieProcess too
        return False
    except psutil.Error:  # AccessDenied: it exists
        return True


def _pid(r: _Rank) -> dict[str, Any]:
    return {"pid": r.pid} if r.pid else {}


def _end_fields(m: dict[str, Any]) -> dict[str, Any]:
    """A run end's fields, checked: a state the process may report, an exit code and a
    step count in range, texts bounded."""
    state = m.get("state")
    if state not in END_STATES:
        raise ValueError(f"end state must be one of {', '.join(END_STATES)}")
    d = _typed("train_end", m, _END_KEYS)
    code, steps = d.get("exit_code"), d.get("steps")
    if code is not None and not -(1 << 31) <= code < 1 << 31:
        raise ValueError("exit_code out of range")
    if steps is not None and not 0 <= steps < 1 << 53:
        raise ValueError("steps out of range")
    for k, n in (("error", MAX_ERROR), ("signal", 32)):
        if k in d:
            d[k] = d[k][:n]
    return d


def _typed(type_: str, m: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The message's fields of this event type, each of its declared kind; a field of the
    wrong kind (the training code passed a string for ``params``, say) is left out and
    logged, so the rest of the event still arrives."""
    spec, out = DATA_FIELDS[type_], {}
    for k in keys:
        v = m.get(k)
        if v is None:
            continue
        if kind_ok(spec[k][0], v):
            out[k] = v
        else:
            log.warning("train: %s.%s must be %s, got %r: left out", type_, k, spec[k][0], v)
    return out


_JOB_KEYS = tuple(
    k for k in DATA_FIELDS["train_job"] if k not in ("run", "rank")
)  # the rest of a declaration
_CKPT_KEYS = ("action", "seconds", "bytes", "step", "path", "ok", "error")
_END_KEYS = ("state", "exit_code", "signal", "error", "steps")
