"""The cloud source against local servers that behave as the GCE, AWS and Azure metadata
services do (tests/fakes/metadata.py): identity, each notice published once and before its
deadline, tokens that expire, and servers that hang, fail or answer garbage."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cmdare.agent.config import ConfigError
from cmdare.agent.sources import metadata as cloud
from cmdare.agent.sources.cloud import CloudSource
from cmdare.agent.sources.state import AgentState
from tests.fakes.metadata import FakeMetadata

BOOT = 1_790_000_000.0


@pytest.fixture
def servers() -> Iterator[list[FakeMetadata]]:
    made: list[FakeMetadata] = []
    yield made
    for s in made:
        s.stop()


def serve(servers: list[FakeMetadata], cloud_: str, **kw: Any) -> FakeMetadata:
    s = FakeMetadata(cloud_, **kw).start()
    servers.append(s)
    return s


class Run:
    """A started cloud source and what it emitted."""

    def __init__(self, url: str, state: AgentState | None = None, **opts: Any) -> None:
        raw = {
            "metadata_url": url,
            "poll_interval": "100ms",
            "backoff_max": "200ms",
            "timeout": "1s",
            "gpu_dir": "/nonexistent",
            **opts,
        }
        self.src = CloudSource(CloudSource.parse_config("sources.cloud", raw), state=state, boot_time=BOOT)
        self.events: list[tuple[str, dict[str, Any], float]] = []
        self.src.start()

    def drain(self) -> None:
        self.src.collect_urgent(lambda t, d, ts=None, **_: self.events.append((t, d, ts)))

    def wait(self, pred: Callable[[], bool], timeout: float = 5.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.drain()
            if pred():
                return
            time.sleep(0.02)
        raise AssertionError(f"timed out; events: {self.events}; problems: {self.src.problems}")

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [d for t, d, _ in self.events if t == type_]

    def close(self) -> None:
        self.src.close()


def test_gce_identity_and_a_preemption_published_once_before_the_deadline(servers) -> None:
    srv = serve(servers, "gce")
    run = Run(srv.url, provider="gce")
    try:
        run.wait(lambda: run.of("instance"))
        ident = run.of("instance")[0]
        assert ident == {
            "cloud": "gce",
            "region": "us-central1",
            "zone": "us-central1-a",
            "instance_id": "4412034093029384934",
            "instance_type": "a2-highgpu-1g",
            "name": "vm-1",
            "spot": True,
            "boot_time": BOOT,
        }
        time.sleep(0.3)  # the watchers are now parked in their long polls
        polls = len(srv.requests)
        deadline = srv.preempt()
        run.wait(lambda: run.of("revocation"))
        (t, d, ts) = next(e for e in run.events if e[0] == "revocation")
        assert ts - srv.announced_at < 1.0 and ts < deadline  # long poll: answered on the change
        assert d["kind"] == "preemption" and d["revokes"] is True and d["cloud"] == "gce"
        assert 29 < d["lead_seconds"] <= 30 and d["boot_time"] == BOOT
        srv.maintenance()
        run.wait(lambda: len(run.of("revocation")) == 2)
        m = run.of("revocation")[1]
        assert m["kind"] == "maintenance" and m["action"] == "TERMINATE_ON_HOST_MAINTENANCE"
        assert m["revokes"] is False and 59 < m["lead_seconds"] <= 60
        time.sleep(0.5)
        run.drain()
        assert len(run.of("revocation")) == 2  # each published once
        assert len(srv.requests) - polls < 12  # long polls, not a busy loop
    finally:
        run.close()


def test_aws_token_renewed_notice_once_and_not_again_after_a_restart(servers, tmp_path: Path) -> None:
    srv = serve(servers, "aws", token_ttl_cap=1)  # every token dies after a second
    state = AgentState(tmp_path)
    state.new_boot(BOOT)
    run = Run(srv.url, state=state, provider="aws", aws_token_ttl="1s")
    try:
        run.wait(lambda: run.of("instance"))
        ident = run.of("instance")[0]
        assert ident["cloud"] == "aws" and ident["region"] == "us-east-1" and ident["zone"] == "us-east-1b"
        assert ident["instance_type"] == "p3.2xlarge" and ident["spot"] is True
        assert ident["instance_id"] == "i-0abc123def4567890"
        assert ident["launched_at"] == 1772366310.0  # pendingTime 2026-03-01T11:58:30Z: the cloud's launch
        time.sleep(1.5)  # past the first token's life: renewed, no notice lost
        deadline = srv.preempt()
        run.wait(lambda: run.of("revocation"))
        d = run.of("revocation")[0]
        assert d["kind"] == "spot-interruption" and d["action"] == "terminate" and d["revokes"] is True
        assert d["deadline"] == deadline and 115 < d["lead_seconds"] <= 120
        srv.post_rebalance()
        run.wait(lambda: len(run.of("revocation")) == 2)
        assert run.of("revocation")[1]["kind"] == "rebalance" and run.of("revocation")[1]["revokes"] is False
        time.sleep(0.5)  # several more polls see the same two notices
        run.drain()
        assert len(run.of("revocation")) == 2
        assert not run.src.problems
        puts = sum(1 for m, p in srv.requests if m == "PUT")
        assert puts >= 2  # the token was renewed
    finally:
        run.close()
    again = Run(srv.url, state=AgentState(tmp_path), provider="aws")  # the agent restarted
    try:
        again.wait(lambda: again.of("instance"))
        time.sleep(0.5)
        again.drain()
        assert again.of("revocation") == []  # already published before the restart
    finally:
        again.close()


def test_azure_preempt_for_this_vm_only_and_approval_when_configured(servers) -> None:
    srv = serve(servers, "azure")
    run = Run(srv.url, provider="azure", azure_approve=["Preempt"])
    try:
        run.wait(lambda: run.of("instance"))
        ident = run.of("instance")[0]
        assert (
            ident["cloud"] == "azure" and ident["region"] == "westeurope" and ident["zone"] == "westeurope-1"
        )
        assert ident["instance_type"] == "Standard_NC6s_v3" and ident["spot"] is True
        srv.add_event("Reboot", time.time() + 300, resources=["another-vm"])  # not ours
        deadline = srv.preempt(lead=30)
        run.wait(lambda: srv.approved)
        (d,) = run.of("revocation")
        assert d["kind"] == "preemption" and d["action"] == "Preempt" and d["revokes"] is True
        assert d["deadline"] == deadline and d["notice_id"].startswith("azure:")
        assert srv.approved == [d["notice_id"].split(":")[1]]  # approved after it was handed over
    finally:
        run.close()


def test_azure_events_are_not_approved_unless_configured(servers) -> None:
    srv = serve(servers, "azure")
    run = Run(srv.url, provider="azure")
    try:
        run.wait(lambda: run.of("instance"))
        srv.add_event("Terminate", time.time() + 60)
        run.wait(lambda: run.of("revocation"))
        time.sleep(0.4)
        assert srv.approved == [] and not any(m == "POST" for m, _ in srv.requests)
        d = run.of("revocation")[0]
        assert d["kind"] == "termination" and d["revokes"] is False
    finally:
        run.close()


@pytest.mark.parametrize("cloud_", ["gce", "aws", "azure"])
@pytest.mark.parametrize("mode", ["hang", "500", "garbage"])
def test_bad_metadata_servers_are_reported_and_survived(servers, cloud_: str, mode: str) -> None:
    srv = serve(servers, cloud_)
    srv.mode = mode
    run = Run(srv.url, provider=cloud_, timeout="300ms")
    try:
        run.wait(lambda: bool(run.src.problems), timeout=5)
        with pytest.raises(RuntimeError) as e:
            run.src.collect(lambda *a, **k: None)  # the source's status: error, with the reason
        reason = str(e.value)
        assert {"hang": "timed out", "500": "HTTP 500", "garbage": "malformed"}[mode] in reason, reason
        assert len(reason.splitlines()) == 1
        srv.mode = "ok"  # the service recovers: so does the source
        run.wait(lambda: run.of("instance"), timeout=8)
        srv.preempt()
        run.wait(lambda: run.of("revocation"), timeout=8)
        run.wait(lambda: not run.src.problems, timeout=8)
    finally:
        run.close()


@pytest.mark.parametrize("cloud_", ["gce", "aws", "azure"])
def test_auto_detection(servers, cloud_: str) -> None:
    srv = serve(servers, cloud_)
    t0 = time.monotonic()
    found = cloud.detect(cloud.Http(srv.url, 1.0), 1.0)
    assert found is not None and found.name == cloud_ and time.monotonic() - t0 < 1.0


def test_no_cloud_is_detected_quickly_and_still_publishes_the_local_identity(servers, tmp_path) -> None:
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    hanging = serve(servers, "aws")
    hanging.mode = "hang"
    for url in (closed, hanging.url):
        t0 = time.monotonic()
        assert cloud.detect(cloud.Http(url, 0.5), 0.5) is None
        assert time.monotonic() - t0 < 1.6
    gpus = tmp_path / "gpus"
    for bus in ("0000:00:04.0", "0000:00:05.0"):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text("Model: \t\t Tesla V100-SXM2-16GB\nIRQ: 35\n")
    run = Run(closed, detect_timeout="300ms", gpu_dir=str(gpus))
    try:
        run.wait(lambda: run.of("instance"))
        assert run.of("instance")[0] == {
            "cloud": "none",
            "accelerator": "Tesla V100-SXM2-16GB",
            "accelerator_count": 2,
            "boot_time": BOOT,
        }
        run.src.collect(lambda *a, **k: None)  # no cloud is not a problem
    finally:
        run.close()


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"provider": "gcp"}, "sources.cloud.provider: must be one of auto, none, gce, aws, azure"),
        (
            {"metadata_url": "169.254.169.254"},
            "sources.cloud.metadata_url: expected an http://host[:port] URL",
        ),
        ({"azure_approve": ["Evict"]}, "sources.cloud.azure_approve: unknown event type 'Evict'"),
        ({"poll_interval": "0s"}, "sources.cloud.poll_interval: must be between 10ms and 10m"),
    ],
)
def test_config_errors_name_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        CloudSource.parse_config("sources.cloud", raw)


def test_azure_approval_of_a_notice_published_before_a_restart(servers, tmp_path: Path) -> None:
    srv = serve(servers, "azure")
    state = AgentState(tmp_path)
    state.new_boot(BOOT)
    first = Run(srv.url, state=state, provider="azure")
    try:
        first.wait(lambda: first.of("instance"))
        srv.preempt(lead=60)
        first.wait(lambda: first.of("revocation"))
    finally:
        first.close()
    assert srv.approved == []
    again = Run(srv.url, state=AgentState(tmp_path), provider="azure", azure_approve=["Preempt"])
    try:
        again.wait(lambda: srv.approved)  # published (and spooled) by the first process
        again.drain()
        assert again.of("revocation") == []  # not published twice
    finally:
        again.close()


@pytest.mark.parametrize("cloud_", ["gce", "aws"])
def test_notices_do_not_wait_for_a_failing_identity(servers, cloud_: str) -> None:
    srv = serve(servers, cloud_)
    srv.fail_paths = {"/computeMetadata/v1/instance/", "/latest/dynamic/instance-identity/document"}
    run = Run(srv.url, provider=cloud_)
    try:
        run.wait(lambda: "identity" in run.src.problems)
        time.sleep(0.3)
        srv.preempt()
        run.wait(lambda: run.of("revocation"))
        assert run.of("instance") == []  # still failing, reported, retried
        srv.fail_paths = set()
        run.wait(lambda: run.of("instance"), timeout=8)
    finally:
        run.close()


@pytest.mark.parametrize("pending", ["yesterday", 12, None])
def test_an_unreadable_or_missing_aws_launch_time_is_left_out_and_the_identity_kept(servers, pending) -> None:
    srv = serve(servers, "aws")
    srv.pending_time = pending
    run = Run(srv.url, state=None, provider="aws")
    try:
        run.wait(lambda: run.of("instance"))
        ident = run.of("instance")[0]
        assert "launched_at" not in ident and ident["instance_type"] == "p3.2xlarge"
    finally:
        run.close()
