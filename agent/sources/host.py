"""Host source (psutil): CPU, load, memory and swap, NICs, disks, process count.

Fields and units: see ``DATA_FIELDS["host"]`` in wire/registry.py and docs/sources.md.
Counters (``*_total``) are cumulative since boot; analytics derive rates.  CPU shares
are computed from the change in CPU times since the previous tick, so the first tick
after start reports no CPU share.  A psutil call that fails leaves its fields out and the
tick is reported as an error; the other fields are still sent.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from operator import itemgetter, sub
from typing import Any

from cmdare.wire.events import Encoded, jstr
from cmdare.wire.plugin import Option

from .base import SOURCES, Emit, Source

_IDLE_FIELDS = ("idle", "iowait")


def _picker(idx: list[int]) -> Callable[[Any], tuple[Any, ...]]:
    if len(idx) == 1:
        i = idx[0]
        return lambda t: (t[i],)
    return itemgetter(*idx)


_PICKERS: dict[type, tuple[Callable[[Any], tuple[Any, ...]], Callable[[Any], tuple[Any, ...]]]] = {}


def _pickers(t: type) -> tuple[Callable[[Any], tuple[Any, ...]], Callable[[Any], tuple[Any, ...]]]:
    """(counted fields, idle fields) of a ``cpu_times`` named-tuple type, by position."""
    p = _PICKERS.get(t)
    if p is None:
        fields = t._fields  # type: ignore[attr-defined]
        # guest time is already counted in user/nice on Linux
        counted = [i for i, k in enumerate(fields) if k not in ("guest", "guest_nice")]
        idle = [i for i, k in enumerate(fields) if k in _IDLE_FIELDS]
        p = _PICKERS[t] = (_picker(counted), _picker(idle) if idle else (lambda _: ()))
    return p


def cpu_busy_ratio(prev: Any, cur: Any) -> float | None:
    """Busy share between two psutil ``cpu_times`` readings (named tuples of one type).

    Called once per core per tick (208 times on a large GPU VM), hence by position."""
    if type(prev) is not type(cur):  # not seen from psutil; by name, absent fields as 0
        p, c = prev._asdict(), cur._asdict()
        keys = [k for k in c if k not in ("guest", "guest_nice")]
        total = sum(c[k] - p.get(k, 0.0) for k in keys)
        idle = sum(c.get(k, 0.0) - p.get(k, 0.0) for k in _IDLE_FIELDS)
    else:
        counted, idle_of = _pickers(type(cur))
        total = sum(map(sub, counted(cur), counted(prev)))
        idle = sum(map(sub, idle_of(cur), idle_of(prev)))
    if total <= 0:
        return None
    return round(min(1.0, max(0.0, 1.0 - idle / total)), 4)


def net_rows(counters: dict[str, Any], exclude: re.Pattern[str]) -> list[dict[str, Any]]:
    return [
        {
            "nic": nic,
            "rx_bytes_total": c.bytes_recv,
            "tx_bytes_total": c.bytes_sent,
            "rx_packets_total": c.packets_recv,
            "tx_packets_total": c.packets_sent,
            "rx_errors_total": c.errin,
            "tx_errors_total": c.errout,
            "rx_drops_total": c.dropin,
            "tx_drops_total": c.dropout,
        }
        for nic, c in sorted(counters.items())
        if not exclude.search(nic)
    ]


def net_json(rows: list[dict[str, Any]]) -> str:
    """``net_rows`` as compact JSON, the event encoder's text byte for byte, from a template
    (the generic encoder is a third of the host line's cost).  TypeError / ValueError when
    a counter is not an integer (psutil's always are): the caller encodes generically."""
    return (
        "["
        + ",".join(
            f'{{"nic":{jstr(r["nic"])},"rx_bytes_total":{r["rx_bytes_total"]:d},'
            f'"tx_bytes_total":{r["tx_bytes_total"]:d},"rx_packets_total":{r["rx_packets_total"]:d},'
            f'"tx_packets_total":{r["tx_packets_total"]:d},"rx_errors_total":{r["rx_errors_total"]:d},'
            f'"tx_errors_total":{r["tx_errors_total"]:d},"rx_drops_total":{r["rx_drops_total"]:d},'
            f'"tx_drops_total":{r["tx_drops_total"]:d}}}'
            for r in rows
        )
        + "]"
    )


def disk_json(rows: list[dict[str, Any]]) -> str:
    """``disk_rows`` as compact JSON, as ``net_json``."""
    out = []
    for r in rows:
        t = (
            f'{{"disk":{jstr(r["disk"])},"read_bytes_total":{r["read_bytes_total"]:d},'
            f'"write_bytes_total":{r["write_bytes_total"]:d},"read_ops_total":{r["read_ops_total"]:d},'
            f'"write_ops_total":{r["write_ops_total"]:d}'
        )
        busy = r.get("busy_seconds_total")
        if busy is not None:
            if type(busy) is not float or busy - busy != 0.0:
                raise ValueError("busy_seconds_total: not a finite float")
            t += f',"busy_seconds_total":{busy!r}'
        out.append(t + "}")
    return "[" + ",".join(out) + "]"


def disk_rows(counters: dict[str, Any], exclude: re.Pattern[str]) -> list[dict[str, Any]]:
    rows = []
    for disk, c in sorted(counters.items()):
        if exclude.search(disk):
            continue
        row = {
            "disk": disk,
            "read_bytes_total": c.read_bytes,
            "write_bytes_total": c.write_bytes,
            "read_ops_total": c.read_count,
            "write_ops_total": c.write_count,
        }
        busy = getattr(c, "busy_time", None)
        if busy is not None:
            row["busy_seconds_total"] = busy / 1000.0
        rows.append(row)
    return rows


@SOURCES.register
class HostSource(Source):
    """CPU, load, memory, swap, NIC and disk counters of the machine, through psutil."""

    name = "host"
    OPTIONS = {
        "nic_exclude": Option("str", r"^lo$", "regex of NIC names to leave out"),
        "disk_exclude": Option("str", r"^(loop|ram|sr|zram)\d*$", "regex of disk names to leave out"),
        "per_core": Option("bool", True, "send per-core CPU shares"),
    }

    def __init__(self, config: dict[str, Any], psutil: Any = None, **_: Any) -> None:
        super().__init__(config)
        if psutil is None:
            import psutil as _psutil

            psutil = _psutil
        self.ps = psutil
        self.nic_exclude = re.compile(self.config["nic_exclude"])
        self.disk_exclude = re.compile(self.config["disk_exclude"])
        self._prev_total: Any = None
        self._prev_cores: list[Any] | None = None

    def start(self) -> None:
        self._prev_total = self.ps.cpu_times()
        self._prev_cores = self.ps.cpu_times(percpu=True) if self.config["per_core"] else None

    def collect(self, emit: Emit) -> None:
        ps, errors = self.ps, []
        data: dict[str, Any] = {}

        def guard(what: str, fn: Any) -> None:
            try:
                fn()
            except Exception as e:  # one failing reading must not lose the others
                errors.append(f"{what}: {e}")

        def cpu() -> None:
            cur = ps.cpu_times()
            if self._prev_total is not None:
                r = cpu_busy_ratio(self._prev_total, cur)
                if r is not None:
                    data["cpu_util_ratio"] = r
            self._prev_total = cur
            if self.config["per_core"]:
                cores = ps.cpu_times(percpu=True)
                if self._prev_cores is not None and len(self._prev_cores) == len(cores):
                    ratios = [cpu_busy_ratio(a, b) for a, b in zip(self._prev_cores, cores, strict=True)]
                    data["cpu_per_core_ratio"] = [x if x is not None else 0.0 for x in ratios]
                self._prev_cores = cores

        def load() -> None:
            data["load1"], data["load5"], data["load15"] = (round(x, 3) for x in os.getloadavg())

        def mem() -> None:
            vm = ps.virtual_memory()
            data["mem_total_bytes"], data["mem_available_bytes"] = vm.total, vm.available
            data["mem_used_bytes"] = vm.total - vm.available
            sw = ps.swap_memory()
            data["swap_total_bytes"], data["swap_used_bytes"] = sw.total, sw.used

        def net() -> None:
            data["net"] = net_rows(ps.net_io_counters(pernic=True) or {}, self.nic_exclude)

        def disk() -> None:
            data["disk"] = disk_rows(ps.disk_io_counters(perdisk=True) or {}, self.disk_exclude)

        def procs() -> None:
            data["procs"] = len(ps.pids())

        for what, fn in (
            ("cpu", cpu),
            ("load", load),
            ("memory", mem),
            ("net", net),
            ("disk", disk),
            ("procs", procs),
        ):
            guard(what, fn)
        parts: dict[str, str] = {}
        for key, enc in (("net", net_json), ("disk", disk_json)):
            if key in data:
                try:
                    parts[key] = enc(data[key])
                except (TypeError, ValueError):  # not psutil's integers: the generic encoder
                    pass
        emit("host", Encoded(data, parts=parts))
        if errors:
            raise RuntimeError("; ".join(errors))
