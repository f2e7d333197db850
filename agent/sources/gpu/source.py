"""The ``gpu`` source: one ``gpu`` event per GPU per tick, Xid errors, ECC increases and row
remappings or page retirements turning pending / failed as ``gpu_event``s (counts of
occurrences, never a last-value gauge). See the package docstring for the failure rules."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from cmdare.wire.plugin import Option
from cmdare.wire.rowform import Encoded
from cmdare.wire.units import ConfigError

from ..base import SOURCES, Emit, Source, SourceUnavailable
from . import gpm, kubelet, mig, nvlink, processes, slurm
from .device import Gpu
from .fields import FIXED, HEALTH, Call, put
from .nvml import (
    GPU_IS_LOST,
    MISMATCH,
    NOT_FOUND,
    TIMEOUT,
    GpuLost,
    code,
    handle_key,
    load_backend,
    never_again,
    text,
)

log = logging.getLogger("cmdare.agent.gpu")

_ECC_KINDS = (("ecc_corrected", "ecc_corrected_total"), ("ecc_uncorrected", "ecc_uncorrected_total"))
_REMAP_STATES = ("row_remap_pending", "row_remap_failed", "retired_pages_pending")  # gpu_event kinds when they turn true
Step = tuple[Any, tuple[Any, ...], Callable[..., None], Call]  # (function or None: absent, args, convert, call)


@SOURCES.register
class GpuSource(Source):
    """Per-GPU samples from NVML each tick; Xid and ECC increases as ``gpu_event``s."""

    name = "gpu"
    OPTIONS = {
        "backend": Option("str", "pynvml", "NVML binding: 'pynvml' or 'python:module' (tests)"),
        "retry_interval": Option("duration", 60.0, "how often to retry when NVML or GPUs are missing"),
        "processes": Option("bool", True, "send per-process GPU memory"),
        "slurm": Option("bool", True, "name each GPU process's Slurm job, step and user (from /proc: no slurmctld call)"),
        "slurm_gpu_map": Option("str", "", "a prolog's GPU-to-Slurm-job files (dcgm-exporter's --hpc-job-mapping-dir, "
                                "e.g. /run/dcgm-job-map); '': each GPU's job from its processes alone"),
        "kubernetes": Option("bool", True, "name each GPU's Kubernetes pod, namespace, container and job (the kubelet's "
                             "pod-resources socket; none there: not a Kubernetes node, said once)"),
        "kubelet_socket": Option("str", kubelet.SOCKET, "the kubelet's pod-resources socket"),
        "kubernetes_interval": Option("duration", 10.0, "how often the kubelet is asked which pod holds each GPU"),
        "job_labels": Option("list", list(kubelet.JOB_LABELS),
                             "pod labels naming a pod's job, the first present wins (none: namespace/pod)"),
        "apiserver": Option("str", "", "where pod labels are read: '' in-cluster (the service account), a URL, "
                            "or 'none' (jobs named namespace/pod)"),
        "xid_events": Option("bool", True, "watch NVML Xid critical-error events"),
        "profiling": Option("bool", True, "GPM profiling metrics (SM / tensor / DRAM activity; Hopper and later)"),
        "nvlink": Option("bool", True, "NVLink state, error counters and throughput"),
        "mig": Option("bool", True, "each MIG instance as a GPU of its own"),
    }

    @classmethod
    def parse_config(cls, where: str, raw: Any) -> dict[str, Any]:
        cfg = super().parse_config(where, raw)
        b = cfg["backend"]
        if b != "pynvml" and not (b.startswith("python:") and len(b) > len("python:")):
            raise ConfigError(f"{where}.backend: must be 'pynvml' or 'python:<module>', got {b!r}")
        kubelet.check_config(where, cfg)
        m = cfg["slurm_gpu_map"]
        if m and (not m.startswith("/") or len(m) > 256 or "\0" in m):
            raise ConfigError(f"{where}.slurm_gpu_map: expected '' or an absolute path, got {m[:80]!r}")
        return cfg

    def __init__(self, config: dict[str, Any], nvml: Any = None, clock: Callable[[], float] = time.monotonic,
                 **_: Any) -> None:
        super().__init__(config)
        self._nvml_given = nvml
        self.nvml: Any = None
        self.errors: tuple[type[BaseException], ...] = ()  # what an NVML call raises when it fails
        self.clock = clock
        self.gpus: list[Gpu] = []
        self.event_set: Any = None
        self._inited = False
        self._next_retry = -math.inf  # while NVML or its GPUs are missing: no retry before this
        self._why = ""
        self.slurm = slurm.Resolver() if self.config.get("slurm", True) and self.config.get("processes", True) else None
        gmap = self.config.get("slurm_gpu_map", "")
        self.slurm_map = slurm.GpuMap(gmap) if gmap and self.config.get("slurm", True) else None
        self.pods: kubelet.PodResolver | None = None
        if self.config.get("kubernetes", True):
            api = self.config.get("apiserver", "")
            self.pods = kubelet.PodResolver(
                self.config.get("kubelet_socket", kubelet.SOCKET), self.config.get("kubernetes_interval", 10.0),
                job_labels=self.config.get("job_labels", kubelet.JOB_LABELS),
                labels=None if api == "none" else kubelet.Labels(api))

    # -- start and stop ---------------------------------------------------------------------
    def start(self) -> None:
        now = self.clock()
        if now < self._next_retry:
            raise SourceUnavailable(self._why)
        self._next_retry = now + self.config["retry_interval"]
        try:
            self.nvml = self._nvml_given if self._nvml_given is not None else load_backend(self.config["backend"])
        except ImportError as e:
            hint = "; install nvidia-ml-py" if self.config["backend"] == "pynvml" else ""
            self._why = f"cannot import NVML backend {self.config['backend']!r}: {e}{hint}"
            raise SourceUnavailable(self._why) from None
        n = self.nvml
        self.errors = (n.NVMLError, *MISMATCH, AttributeError, TypeError)
        try:
            n.nvmlInit()
        except n.NVMLError as e:
            self._why = f"NVML not available: {e} (no NVIDIA driver on this machine?)"
            raise SourceUnavailable(self._why) from None
        self._inited = True
        try:
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as e:
            self.close()
            self._why = f"NVML cannot count GPUs: {e}"
            raise SourceUnavailable(self._why) from None
        if count == 0:
            self.close()
            self._why = "NVML found no NVIDIA GPU on this machine"
            raise SourceUnavailable(self._why)
        self.gpus = []
        for i in range(count):
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                uuid, name = text(n.nvmlDeviceGetUUID(h)), text(n.nvmlDeviceGetName(h))
            except n.NVMLError as e:
                log.warning("GPU %d: cannot open: %s", i, e)
                self.gpus.append(Gpu(i, None, f"index-{i}", "unknown", lost=True))
                continue
            self.gpus.append(Gpu(i, h, uuid, name))
        self._discover()
        if self.config["xid_events"]:
            self._watch_xid()
        if self.pods is not None:
            self.pods.start()  # a thread: a tick only reads what it found
        self._next_retry = -math.inf  # started: a later start (after close) is not a retry

    def _discover(self) -> None:
        """MIG instances (each a GPU of its own), GPM support and NVLinks of every GPU; one
        log line for the GPUs without profiling metrics."""
        cfg, n = self.config, self.nvml
        no_gpm = []
        for g in list(self.gpus):
            if g.handle is None:
                continue
            migs = mig.instances(self, g) if cfg["mig"] else []
            self.gpus += migs
            if cfg["nvlink"]:
                g.links = nvlink.discover(n, g.handle)
            if cfg["profiling"]:
                sup = self.ask("nvmlGpmQueryDeviceSupport", g.handle)
                if sup is not None and getattr(sup, "isSupportedDevice", False):
                    gpm.setup(n, g, g.links)
                    for m in migs:
                        gpm.setup(n, m, [])
                else:
                    no_gpm.append(f"{g.index} ({g.name})")
        if no_gpm:
            has = getattr(n, "nvmlGpmQueryDeviceSupport", None) is not None
            log.info("GPU %s: no profiling metrics (SM / tensor / DRAM activity): %s", ", ".join(no_gpm),
                     "NVML's GPM API needs a Hopper or later GPU" if has else "this nvidia-ml-py has no GPM API")

    def _watch_xid(self) -> None:
        n = self.nvml
        try:
            self.event_set = n.nvmlEventSetCreate()
            for g in self.gpus:
                if g.handle is not None:
                    try:
                        n.nvmlDeviceRegisterEvents(g.handle, n.nvmlEventTypeXidCriticalError, self.event_set)
                    except n.NVMLError as e:  # not supported on some GPUs (e.g. vGPU)
                        log.info("GPU %d: Xid events not available: %s", g.index, e)
        except (n.NVMLError, AttributeError) as e:
            log.info("Xid events not available: %s", e)
            self.event_set = None

    def close(self) -> None:
        if self.pods is not None:
            self.pods.stop()
        if self.nvml is not None and self._inited:
            for g in self.gpus:
                gpm.free(self.nvml, g)
            try:
                if self.event_set is not None:
                    self.nvml.nvmlEventSetFree(self.event_set)
            except Exception:
                pass
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
        self._inited, self.event_set = False, None

    # -- calls and their failures -----------------------------------------------------------
    def ask(self, fn: str, *args: Any) -> Any:
        """A call at start (discovery): its answer, or None where it cannot answer."""
        f = getattr(self.nvml, fn, None)
        if f is None:
            return None
        try:
            return f(*args)
        except self.errors as e:
            log.debug("%s: %s", fn, e)
            return None

    def call(self, g: Gpu, fn: str, *args: Any, handle: Any = None) -> Any:
        """A call of a tick on ``g``'s handle (or ``handle``): its answer, or None."""
        if fn in g.absent:
            return None
        f = getattr(self.nvml, fn, None)
        if f is None:
            g.absent.add(fn)
            return None
        try:
            return f(g.handle if handle is None else handle, *args)
        except self.errors as e:
            self.failed(g, fn, e)
            return None

    def failed(self, g: Gpu, fn: str, e: BaseException) -> bool:
        """What a failed call means: GpuLost raised for a GPU off the bus; True when ``fn``
        is absent on this GPU for good; else this tick's value is absent (said once)."""
        c = code(e)
        if c == GPU_IS_LOST:
            raise GpuLost(str(e)) from None
        if never_again(e):
            g.absent.add(fn)
            g.plan = None  # made again without it
            return True
        if c != NOT_FOUND and (fn, c) not in g.said:
            g.said.add((fn, c))
            log.warning("GPU %d: %s: %s (the field is left out while it fails)", g.index, fn, e)
        return False

    def _plan(self, g: Gpu) -> list[Step]:
        """This GPU's calls, resolved: the fixed fields, processes, health. A function the
        binding lacks or the GPU does not answer is replaced by its fallback, if any, else
        not called."""
        n, plan = self.nvml, []
        calls = [*FIXED, processes.LIST, *HEALTH] if self.config["processes"] else [*FIXED, *HEALTH]
        for c in calls:
            f, fn = None, ""
            for name in (c.fn, c.fallback):
                if name and name not in g.absent:
                    f = getattr(n, name, None)
                    if f is not None:
                        fn = name
                        break
                    g.absent.add(name)
            try:
                args = tuple(getattr(n, a) if isinstance(a, str) else a for a in c.args)
            except AttributeError:  # a binding without the constant: the call cannot be made
                f, args = None, ()
            plan.append((f, args, c.convert, Call(fn, c.names, c.convert, c.args,
                                                  c.fallback if fn == c.fn else "")))
        return plan

    # -- one tick ---------------------------------------------------------------------------
    def sample(self, g: Gpu) -> Encoded:
        """One GPU's sample and its row: the calls of its plan in a row (a failure costs its
        fields: ``failed``), then GPM, NVLink, MIG identity and process utilisation."""
        h, errors_ = g.handle, self.errors
        d: dict[str, Any] = {"index": g.index, "uuid": g.uuid, "name": g.name}
        t = g.blank.copy()
        plan = g.plan
        if plan is None:
            plan = g.plan = self._plan(g)
        for f, args, convert, c in plan:
            if f is None:
                continue
            try:
                convert(f(h, *args), d, t)
            except errors_ as e:
                if self.failed(g, c.fn, e) and c.fallback:  # an older call answers the same
                    v = self.call(g, c.fallback, *args)
                    if v is not None:
                        convert(v, d, t)
        if g.mig:
            d.update(g.mig)
            for at, x in mig.identity_text(g.mig):
                t[at] = x
        rates = gpm.read(self, g, d, t) if g.gpm is not None else {}
        if g.links:
            nvlink.read(self, g, d, t, rates)
        if processes.UTILISATION not in g.absent:
            processes.utilisation(self, g, d, t)
        if self.slurm is not None and d.get("processes"):  # after the shares: the entries' key order is the text's
            processes.attribute(self.slurm, d, t)
        if self.pods is not None:
            g.pod = self.pods.get(g.uuid)
            if g.pod is not None:
                g.pod.put(d, t)
        g.slurm_job = None
        if g.pod is None and (self.slurm is not None or self.slurm_map is not None):
            held = self._slurm_job(g, d)
            if held is not None:
                g.slurm_job = held[0]
                put(d, t, "slurm_job", held[0])
                if held[1]:
                    put(d, t, "slurm_user", held[1])
        return Encoded(d, row="\t".join(t).rstrip("\t"))

    def _slurm_job(self, g: Gpu, d: dict[str, Any]) -> tuple[str, str | None] | None:
        """The Slurm job holding ``g`` (and its user): a prolog's GPU map where configured, else
        the one Slurm job every process on it is in (none where two share it or one is in none)."""
        if self.slurm_map is not None:
            held = self.slurm_map.get(g.index, g.uuid)
            if held is not None:
                return held
        procs = d.get("processes")
        if not procs:
            return None
        jobs = {p.get("slurm_job") for p in procs}
        if len(jobs) != 1 or None in jobs:
            return None
        return next(iter(jobs)), procs[0].get("slurm_user")

    def collect(self, emit: Emit) -> None:
        if not self._inited:
            self.start()  # raises SourceUnavailable until NVML and a GPU are there
        problems = []
        for g in self.gpus:
            if g.lost:
                continue
            try:
                data = self.sample(g)
            except GpuLost as e:
                g.lost = True
                emit("gpu_event", {"index": g.index, "uuid": g.uuid, "kind": "lost", "count": 1})
                problems.append(f"GPU {g.index} ({g.uuid}) lost: {e}")
                log.error("GPU %d (%s) is lost: %s", g.index, g.uuid, e)
                for m in self.gpus:  # its MIG instances go with it
                    if m.parent is g and not m.lost:
                        m.lost = True
                        emit("gpu_event", {"index": m.index, "uuid": m.uuid, "kind": "lost", "count": 1})
                continue
            if g.pod is not None:  # held by a Kubernetes pod: the sample is that pod's job's
                emit("gpu", data, job=g.pod.job)
            elif g.slurm_job is not None:  # ... or by a Slurm job
                emit("gpu", data, job="slurm-" + g.slurm_job)
            else:
                emit("gpu", data)
            self._health_events(g, data, emit)
        self._drain_xid(emit)
        if problems:
            raise RuntimeError("; ".join(problems))
        if self.gpus and all(g.lost for g in self.gpus):
            raise RuntimeError("all GPUs lost")

    @staticmethod
    def _health_events(g: Gpu, data: dict[str, Any], emit: Emit) -> None:
        """A row remapping / page retirement that became pending or failed, and ECC increases."""
        for key in _REMAP_STATES:
            now_ = data.get(key)
            if now_ and not g.remap_prev.get(key):
                emit("gpu_event", {"index": g.index, "uuid": g.uuid, "kind": key, "count": 1})
            if now_ is not None:
                g.remap_prev[key] = bool(now_)
        for kind, key in _ECC_KINDS:
            total = data.get(key)
            if total is None:
                continue
            prev = g.ecc_prev.get(kind)
            if prev is not None and total > prev:
                emit("gpu_event", {"index": g.index, "uuid": g.uuid, "kind": kind, "count": total - prev})
            g.ecc_prev[kind] = total

    def _drain_xid(self, emit: Emit) -> None:
        if self.event_set is None:
            return
        by_handle = None  # made when an event comes (most ticks have none)
        for _ in range(64):  # bounded per tick
            try:
                ev = self.nvml.nvmlEventSetWait_v2(self.event_set, 0)
            except self.nvml.NVMLError as e:
                if code(e) != TIMEOUT:
                    log.debug("Xid wait: %s", e)
                return
            if by_handle is None:
                by_handle = {handle_key(g.handle): g for g in self.gpus}
            g = by_handle.get(handle_key(ev.device))
            emit("gpu_event", {"index": g.index if g else -1, "uuid": g.uuid if g else "", "kind": "xid", "count": 1,
                               "xid": int(ev.eventData)})
