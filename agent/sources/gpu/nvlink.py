"""NVLink: the links active at start (a VM's single GPU has none and costs no call), and
each tick each link's state (``active: 0`` when one goes down), its four error counters
and, with GPM, its throughput; ``nvlink_errors_total`` sums the counters of all links."""

from __future__ import annotations

from typing import Any

from .fields import AT
from .nvml import FUNCTION_NOT_FOUND, INVALID_ARGUMENT, NOT_SUPPORTED, code

MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS
STATE, COUNTER = "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter"
# NVLink error counters (nvmlNvLinkErrorCounter_t) and their names in the ``nvlink`` objects
NVLINK_ERRORS = (("replay_errors_total", 0), ("recovery_errors_total", 1), ("crc_flit_errors_total", 2),
                 ("crc_data_errors_total", 3))
_AT, _AT_TOTAL = AT["nvlink"], AT["nvlink_errors_total"]


def discover(n: Any, h: Any) -> list[int]:
    """The NVLinks active at start."""
    links: list[int] = []
    for link in range(MAX_LINKS):
        try:
            active = n.nvmlDeviceGetNvLinkState(h, link)
        except n.NVMLError as e:
            if code(e) in (NOT_SUPPORTED, INVALID_ARGUMENT) and links:
                break  # past the last link
            if code(e) in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
                return []  # no NVLink on this GPU
            continue
        except AttributeError:
            return []
        if active:
            links.append(link)
    return links


def read(src: Any, g: Any, d: dict[str, Any], t: list[str], rates: dict[int, list[float]]) -> None:
    """Every link's state, counters and throughput into ``d`` / ``t``. A call that fails
    costs that link's value (GpuLost: the GPU); one the GPU cannot answer is not asked again."""
    if STATE in g.absent:
        return
    n, h, errors_ = src.nvml, g.handle, src.errors
    state = n.nvmlDeviceGetNvLinkState
    counter = None if COUNTER in g.absent else n.nvmlDeviceGetNvLinkErrorCounter
    links, parts, total = [], [], 0
    for link in g.links:
        try:
            s = state(h, link)
        except errors_ as e:
            if src.failed(g, STATE, e):
                return
            continue
        if not s:
            links.append({"link": link, "active": 0})
            parts.append(f'{{"link":{link},"active":0}}')
            continue
        rate = rates.get(link)
        if counter is not None:
            try:
                a, b, c, e_ = int(counter(h, link, 0)), int(counter(h, link, 1)), int(counter(h, link, 2)), int(
                    counter(h, link, 3))
            except errors_ as e:
                if src.failed(g, COUNTER, e):
                    counter = None
            else:  # the usual case, in one literal each (the agent's cost is per link and tick)
                total += a + b + c + e_
                text = (f'{{"link":{link},"active":1,"replay_errors_total":{a},"recovery_errors_total":{b},'
                        f'"crc_flit_errors_total":{c},"crc_data_errors_total":{e_}')
                if rate is None:
                    links.append({"link": link, "active": 1, "replay_errors_total": a, "recovery_errors_total": b,
                                  "crc_flit_errors_total": c, "crc_data_errors_total": e_})
                    parts.append(text + "}")
                else:
                    links.append({"link": link, "active": 1, "replay_errors_total": a, "recovery_errors_total": b,
                                  "crc_flit_errors_total": c, "crc_data_errors_total": e_,
                                  "rx_bytes_per_second": rate[0], "tx_bytes_per_second": rate[1]})
                    parts.append(f'{text},"rx_bytes_per_second":{float.__repr__(rate[0])},'
                                 f'"tx_bytes_per_second":{float.__repr__(rate[1])}}}')
                continue
        o: dict[str, Any] = {"link": link, "active": 1}
        text = f'{{"link":{link},"active":1'
        if rate is not None:
            o["rx_bytes_per_second"], o["tx_bytes_per_second"] = rate
            text += f',"rx_bytes_per_second":{float.__repr__(rate[0])},"tx_bytes_per_second":{float.__repr__(rate[1])}'
        links.append(o)
        parts.append(text + "}")
    if links:
        d["nvlink"], d["nvlink_errors_total"] = links, total
        t[_AT], t[_AT_TOTAL] = "[" + ",".join(parts) + "]", int.__repr__(total)
