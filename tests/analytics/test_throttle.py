"""Failed sign-ins are slowed per address and overall (analytics/throttle.py), through the
API's bearer check and the pages' login form, counted on /metrics, logged without the
token; clients that signed in keep working while others guess."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cmdare.analytics.db import Database
from cmdare.analytics.http import Guard, Limits, create_app
from cmdare.analytics.throttle import Throttle
from cmdare.collector.db import connect
from cmdare.dashboards.sessions import Sessions

TOKEN = "s3cret-token"


class Clock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


def test_an_address_waits_after_five_failures_and_the_wait_doubles_to_its_cap() -> None:
    clock = Clock()
    th = Throttle(clock=clock)
    for _ in range(5):
        assert th.wait("10.0.0.1") == 0
        th.failed("10.0.0.1", "bearer")
    waits = []
    for _ in range(12):
        waits.append(th.wait("10.0.0.1"))
        clock.t += waits[-1]
        assert th.wait("10.0.0.1") == 0
        th.failed("10.0.0.1", "bearer")
    assert waits == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    assert th.wait("10.0.0.2") == 0  # another address is not slowed
    th.succeeded("10.0.0.1")
    assert th.wait("10.0.0.1") == 0 and th.failures["bearer"] == 17


def test_an_ipv6_host_is_throttled_by_its_64() -> None:
    assert Throttle.key("2001:db8:1:2:aaaa::1") == Throttle.key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert Throttle.key("2001:db8:1:3::1") != Throttle.key("2001:db8:1:2::1")
    assert Throttle.key("::ffff:10.1.2.3") == "10.1.2.3" and Throttle.key(None) == "?"
    assert Throttle.key("testclient") == "testclient" and len(Throttle.key("x" * 500)) == 64


def test_guessing_from_many_addresses_stops_all_but_the_trusted() -> None:
    clock = Clock()
    th = Throttle(rate=10, burst=100, clock=clock)
    th.succeeded("10.9.9.9")  # signed in before the attack
    for i in range(100):
        th.failed(f"10.1.{i // 250}.{i % 250}", "bearer")  # one guess from each of 100 addresses
    assert th.wait("10.2.0.1") == pytest.approx(0.1)  # a new address waits for the bucket
    assert th.wait("10.9.9.9") == 0  # the trusted one does not
    clock.t += 0.1
    assert th.wait("10.2.0.1") == 0  # one attempt a tenth of a second, overall
    clock.t += 3600.1
    assert th.wait("10.9.9.9") == 0  # the bucket is full again; the trust has ended, nothing waits


def test_a_stale_cookie_is_counted_not_throttled_and_the_tables_are_bounded() -> None:
    th = Throttle(max_clients=3)
    for _ in range(50):
        th.failed("10.0.0.1", "cookie")
    assert th.wait("10.0.0.1") == 0 and th.failures["cookie"] == 50
    for i in range(10):
        th.failed(f"10.0.0.{i}", "bearer")
    assert len(th._clients) == 3


@pytest.fixture
def served(tmp_path: Path):
    clock = Clock()
    th = Throttle(clock=clock)
    sessions = Sessions()
    connect(str(tmp_path / "x.duckdb")).close()
    app = create_app(Database(tmp_path / "x.duckdb"), TOKEN, Limits(), sessions=sessions, throttle=th)
    guard = Guard(app, TOKEN, Limits(), lambda: None, sessions, th)
    return guard, th, clock


def client(guard, address: str) -> TestClient:
    return TestClient(guard, client=(address, 40000), follow_redirects=False)


def test_wrong_bearer_tokens_get_429_unchecked_and_another_address_is_answered(served, caplog) -> None:
    guard, th, clock = served
    caplog.set_level(logging.WARNING, logger="cmdare.analytics.throttle")
    bad = client(guard, "10.0.0.5")
    for i in range(5):
        assert bad.get("/api/v1/nodes", headers={"Authorization": f"Bearer guess-{i}"}).status_code == 401
    r = bad.get("/api/v1/nodes", headers={"Authorization": f"Bearer {TOKEN}"})  # even the right one: unchecked
    assert r.status_code == 429 and r.headers["retry-after"] == "1" and r.headers["cache-control"] == "no-store"
    assert r.json() == {"error": "too many failed sign-ins from this address: try again in 1 s"}
    good = client(guard, "10.0.0.6")
    assert good.get("/api/v1/nodes", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert good.get("/api/v1/nodes").status_code == 401  # no credentials: no failure counted
    clock.t += 1
    assert bad.get("/api/v1/nodes", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert th.failures["bearer"] == 5 and th.throttled == 1
    text = caplog.text
    assert "5 failed sign-ins in a row from 10.0.0.5" in text and "guess-" not in text and TOKEN not in text


def test_the_login_form_is_throttled_with_the_same_counts(served, monkeypatch) -> None:
    from cmdare.dashboards import pages

    monkeypatch.setattr(pages, "LOGIN_DELAY", 0.0)  # the per-guess sleep is not what this tests
    guard, th, clock = served
    c = client(guard, "10.0.0.7")
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for i in range(5):
        assert c.post("/ui/login", content=f"token=guess{i}&next=/ui", headers=form).status_code == 401
    r = c.post("/ui/login", content=f"token={TOKEN}&next=/ui", headers=form)
    assert r.status_code == 429 and "try again in 1 s" in r.text and "set-cookie" not in r.headers
    assert r.headers["retry-after"] == "1"
    clock.t += 1
    r = c.post("/ui/login", content=f"token={TOKEN}&next=/ui", headers=form)
    assert r.status_code == 303 and "set-cookie" in r.headers
    assert th.failures["login"] == 5


def test_stale_cookies_are_counted_apart_and_never_lock_a_browser_out(served) -> None:
    guard, th, _ = served
    c = client(guard, "10.0.0.8")
    for _ in range(20):
        r = c.get("/ui/jobs", cookies={"cmdare_session": "from-before-a-restart"})
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
    assert th.failures["cookie"] == 20 and th.throttled == 0


def test_failures_are_on_the_collectors_metrics(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    from cmdare.analytics.service import HttpConfig, Service

    con = connect(str(tmp_path / "m.duckdb"))
    svc = Service(con, tmp_path / "m.duckdb", HttpConfig("127.0.0.1", 0, TOKEN))
    svc.start()
    try:
        for _ in range(6):
            req = urllib.request.Request(svc.url + "/api/v1/nodes", headers={"Authorization": "Bearer nope"})
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(req, timeout=10)
        req = urllib.request.Request(svc.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        with pytest.raises(urllib.error.HTTPError) as e:  # the same address: it waits too
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 429
        svc.throttle.clock = lambda: 10**9  # its wait is over
        text = urllib.request.urlopen(req, timeout=10).read().decode()
    finally:
        svc.stop()
        con.close()
    assert 'cmdare_collector_auth_failures_total{how="bearer"} 5.0' in text
    assert "cmdare_collector_auth_throttled_total 2.0" in text
