"""Host source: the pure conversions on literal values, and collect() against a fake
psutil adapter (a seam, no monkey-patching)."""

from __future__ import annotations

import re
from collections import namedtuple
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmdare.agent.sources.host import HostSource, cpu_busy_ratio, disk_rows, net_rows
from tests.conftest import examples

CT = namedtuple("scputimes", "user nice system idle iowait irq softirq steal guest guest_nice")
NIC = namedtuple("snetio", "bytes_sent bytes_recv packets_sent packets_recv errin errout dropin dropout")
DISK = namedtuple("sdiskio", "read_count write_count read_bytes write_bytes read_time write_time busy_time")


def test_cpu_busy_ratio_from_time_deltas() -> None:
    a = CT(100, 0, 50, 800, 50, 0, 0, 0, 10, 0)
    b = CT(160, 0, 70, 900, 70, 0, 0, 0, 30, 0)  # +80 busy, +120 idle(incl iowait)
    assert cpu_busy_ratio(a, b) == 0.4  # guest is already inside user: not counted twice


def _by_name(prev, cur):
    """The definition, field by field (the source computes it by position, per core)."""
    p, c = prev._asdict(), cur._asdict()
    total = sum(c[k] - p.get(k, 0.0) for k in c if k not in ("guest", "guest_nice"))
    if total <= 0:
        return None
    idle = sum(c.get(k, 0.0) - p.get(k, 0.0) for k in ("idle", "iowait"))
    return round(min(1.0, max(0.0, 1.0 - idle / total)), 4)


times = st.floats(min_value=0, max_value=1e7, allow_nan=False)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(times, min_size=10, max_size=10), st.lists(times, min_size=10, max_size=10))
def test_cpu_busy_ratio_equals_the_definition(before, delta) -> None:
    a = CT(*before)
    b = CT(*(x + d for x, d in zip(before, delta, strict=True)))
    assert cpu_busy_ratio(a, b) == _by_name(a, b)
    assert cpu_busy_ratio(b, a) == _by_name(b, a)  # counters going back: None or clamped


def test_cpu_busy_ratio_without_iowait_and_across_types() -> None:
    mac = namedtuple("scputimes", "user nice system idle")  # psutil on macOS: no iowait
    assert cpu_busy_ratio(mac(1, 0, 1, 8), mac(4, 0, 2, 14)) == 0.4
    assert cpu_busy_ratio(mac(1, 0, 1, 8), CT(4, 0, 2, 14, 0, 0, 0, 0, 0, 0)) == 0.4  # by name


def test_cpu_busy_ratio_no_time_passed() -> None:
    a = CT(1, 0, 1, 1, 0, 0, 0, 0, 0, 0)
    assert cpu_busy_ratio(a, a) is None


def test_net_and_disk_rows_exclusions_and_units() -> None:
    nets = {"lo": NIC(1, 1, 1, 1, 0, 0, 0, 0), "eth0": NIC(10, 20, 3, 4, 1, 2, 5, 6)}
    assert net_rows(nets, re.compile("^lo$")) == [
        {
            "nic": "eth0",
            "rx_bytes_total": 20,
            "tx_bytes_total": 10,
            "rx_packets_total": 4,
            "tx_packets_total": 3,
            "rx_errors_total": 1,
            "tx_errors_total": 2,
            "rx_drops_total": 5,
            "tx_drops_total": 6,
        }
    ]
    disks = {"loop0": DISK(1, 1, 1, 1, 1, 1, 1), "nvme0n1": DISK(7, 8, 4096, 8192, 0, 0, 1500)}
    assert disk_rows(disks, re.compile(r"^loop\d*$")) == [
        {
            "disk": "nvme0n1",
            "read_bytes_total": 4096,
            "write_bytes_total": 8192,
            "read_ops_total": 7,
            "write_ops_total": 8,
            "busy_seconds_total": 1.5,
        }
    ]


class FakePsutil:
    def __init__(self, fail: str | None = None) -> None:
        self.t = 0
        self.fail = fail

    def cpu_times(self, percpu: bool = False):
        self.t += 1
        one = CT(10 * self.t, 0, 0, 30 * self.t, 0, 0, 0, 0, 0, 0)
        return [one, one] if percpu else one

    def virtual_memory(self):
        return SimpleNamespace(total=1000, available=250)

    def swap_memory(self):
        return SimpleNamespace(total=10, used=3)

    def net_io_counters(self, pernic: bool = False):
        if self.fail == "net":
            raise OSError("/proc/net/dev unreadable")
        return {"eth0": NIC(1, 2, 3, 4, 0, 0, 0, 0)}

    def disk_io_counters(self, perdisk: bool = False):
        return {}

    def pids(self):
        return [1, 2, 3]


def test_collect_emits_one_host_event() -> None:
    src = HostSource(HostSource.parse_config("sources.host", {}), psutil=FakePsutil())
    src.start()
    out = []
    src.collect(lambda t, d, ts=None: out.append((t, d)))
    assert [t for t, _ in out] == ["host"]
    d = out[0][1]
    assert d["cpu_util_ratio"] == 0.25 and d["cpu_per_core_ratio"] == [0.25, 0.25]
    assert d["mem_used_bytes"] == 750 and d["swap_used_bytes"] == 3 and d["procs"] == 3
    assert d["net"][0]["nic"] == "eth0" and d["disk"] == []


def test_a_failing_reading_keeps_the_others_and_reports_the_error() -> None:
    src = HostSource(HostSource.parse_config("sources.host", {}), psutil=FakePsutil(fail="net"))
    src.start()
    out = []
    with pytest.raises(RuntimeError, match="net: /proc/net/dev unreadable"):
        src.collect(lambda t, d, ts=None: out.append(d))
    assert "net" not in out[0] and out[0]["mem_total_bytes"] == 1000


def test_real_psutil_reading() -> None:
    """This machine, for real: the fields a user sees in analyze host."""
    src = HostSource(HostSource.parse_config("sources.host", {}))
    src.start()
    out = []
    src.collect(lambda t, d, ts=None: out.append(d))
    d = out[0]
    assert d["mem_total_bytes"] > 0 and 0 <= d.get("cpu_util_ratio", 0) <= 1 and d["procs"] > 0


counter = st.integers(0, 2**63 - 1)
names = st.text(min_size=1, max_size=12)


@settings(max_examples=examples(200), deadline=None)
@given(
    nics=st.dictionaries(names, st.tuples(*[counter] * 8), max_size=4),
    disks=st.dictionaries(
        names, st.tuples(*[counter] * 6, st.one_of(st.none(), st.integers(0, 2**40))), max_size=4
    ),
)
def test_net_and_disk_templates_are_the_encoders_json(nics, disks) -> None:
    """The host line's NIC and disk lists are written from templates: byte for byte what the
    event encoder writes for the same rows, and the row line is the one without them."""
    from cmdare.agent.sources.host import disk_json, net_json
    from cmdare.wire.events import Encoded, encode_row_data
    from cmdare.wire.registry import JSON_ENCODER as _encoder

    none = re.compile("^$")
    net = net_rows({k: NIC(*v) for k, v in nics.items()}, none)
    disk = []
    for k, v in disks.items():
        c = DISK(*v) if v[6] is not None else namedtuple("sdiskio", DISK._fields[:6])(*v[:6])
        disk += disk_rows({k: c}, none)
    assert net_json(net) == _encoder.encode(net)
    assert disk_json(disk) == _encoder.encode(disk)
    data = {"procs": 3, "net": net, "disk": disk}
    assert encode_row_data("host", Encoded(data, parts={"net": net_json(net), "disk": disk_json(disk)})) == (
        encode_row_data("host", data)
    )


def test_counters_that_are_not_integers_take_the_generic_encoder() -> None:
    """A psutil that hands back floats or None (none does today) must not produce bad JSON."""
    from cmdare.agent.sources.host import disk_json, net_json

    row = {k: 1 for k in ("rx_bytes_total", "tx_bytes_total", "rx_packets_total", "tx_packets_total")}
    row |= {k: 0 for k in ("rx_errors_total", "tx_errors_total", "rx_drops_total", "tx_drops_total")}
    for bad in (1.5, None):
        with pytest.raises((TypeError, ValueError)):
            net_json([{"nic": "eth0", **row, "rx_bytes_total": bad}])
    disk = {
        "disk": "sda",
        "read_bytes_total": 1,
        "write_bytes_total": 2,
        "read_ops_total": 3,
        "write_ops_total": 4,
    }
    with pytest.raises(ValueError):
        disk_json([{**disk, "busy_seconds_total": float("nan")}])

    class FloatPsutil(FakePsutil):
        def net_io_counters(self, pernic: bool = False):
            return {"eth0": NIC(1.5, 2, 3, 4, 0, 0, 0, 0)}

    src = HostSource(HostSource.parse_config("sources.host", {}), psutil=FloatPsutil())
    src.start()
    out = []
    src.collect(lambda t, d, ts=None: out.append(d))
    assert "net" not in out[0].parts and out[0]["net"][0]["tx_bytes_total"] == 1.5
