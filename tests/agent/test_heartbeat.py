"""The heartbeat source: a contiguous sequence from 1 per agent instance, with the
agent's own counters, valid on the wire."""

from __future__ import annotations

import pytest

from cmdare.agent.sources.heartbeat import HeartbeatSource
from cmdare.wire.events import EventFactory, validate
from cmdare.wire.units import ConfigError


def collect(src: HeartbeatSource, ticks: int) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = []
    for _ in range(ticks):
        src.collect(lambda t, d, **_: out.append((t, d)))
    return out


def test_sequence_is_contiguous_from_one_and_carries_the_agents_counters() -> None:
    stats = {"instance": "abc", "samples_total": 7, "dropped_total": 0, "interval_seconds": 10.0}
    src = HeartbeatSource(HeartbeatSource.parse_config("sources.heartbeat", {}), stats=lambda: dict(stats))
    evs = collect(src, 3)
    assert [t for t, _ in evs] == ["heartbeat"] * 3
    assert [d["seq"] for _, d in evs] == [1, 2, 3]
    assert evs[-1][1] == {"seq": 3, **stats}
    f = EventFactory("n", "worker")
    for t, d in evs:
        validate(f.make(t, d))


def test_a_new_instance_starts_again_at_one() -> None:
    a, b = (HeartbeatSource(HeartbeatSource.parse_config("sources.heartbeat", {})) for _ in range(2))
    collect(a, 5)
    assert [d["seq"] for _, d in collect(b, 2)] == [1, 2]


def test_it_has_no_options_but_enabled() -> None:
    assert HeartbeatSource.parse_config("sources.heartbeat", {"enabled": "false"}) == {"enabled": False}
    with pytest.raises(ConfigError, match=r"unknown key 'sources.heartbeat.interval' \(known: enabled\)"):
        HeartbeatSource.parse_config("sources.heartbeat", {"interval": "1s"})
