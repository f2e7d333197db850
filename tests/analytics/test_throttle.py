"""Failed sign-ins are slowed per address and overall (analytics/server/throttle.py), through the
API's bearer check and the pages' login form, counted on /metrics, logged without the
token; clients that signed in keep working while others guess."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cmdare.analytics.db import Database
from cmdare.analytics.server.http import Guard, Limits, create_app
from cmdare.analytics.server.sessions import Sessions
from cmdare.analytics.server.throttle import Throttle
from cmdare.collector.db import connect
from cmdare.dashboards.pages import mount

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
    th.succeeded("10.0.0.1", "the-token")  # (a success, say, just before the last failure)
    assert th.wait("10.0.0.1", "the-token") == 0  # that credential is trusted from there
    assert th.wait("10.0.0.1", "another-guess") == 300  # the success cleared nothing for the others
    assert th.failures["bearer"] == 17
    clock.t += 299
    th.failed("10.0.0.1", "bearer")  # still in the same row: the longest wait again
    assert th.wait("10.0.0.1") == 300
    clock.t += 300 + 300  # a whole cap with no failure after the wait: the row is forgotten
    th.failed("10.0.0.1", "bearer")
    assert th.wait("10.0.0.1") == 0


def test_an_ipv6_host_is_throttled_by_its_64() -> None:
    assert Throttle.key("2001:db8:1:2:aaaa::1") == Throttle.key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert Throttle.key("2001:db8:1:3::1") != Throttle.key("2001:db8:1:2::1")
    assert Throttle.key("::ffff:10.1.2.3") == "10.1.2.3" and Throttle.key(None) == "?"
    assert Throttle.key("testclient") == "testclient" and len(Throttle.key("x" * 500)) == 64


def test_guessing_from_many_addresses_costs_each_a_cap_and_never_starves_a_valid_client() -> None:
    clock = Clock()
    th = Throttle(rate=10, burst=100, clock=clock)
    for i in range(99):
        th.failed(f"10.1.{i // 250}.{i % 250}", "bearer")  # one guess from each of 99 addresses
    assert th.wait("10.1.0.0") == 0  # one free guess each while the bucket holds
    th.failed("10.1.9.9", "bearer")  # the 100th empties it
    assert th.wait("10.1.9.9") == 300  # from now on a failure costs its address the longest wait
    assert th.wait("10.2.0.1", "whatever") == 0  # a fresh address is still looked at (a valid client gets in)
    th.failed("10.2.0.1", "bearer")
    assert th.wait("10.2.0.1", "guess") == 300  # ... but a wrong guess from it is its last for a cap
    clock.t += 10.0  # the bucket refills: ordinary rules again
    th.failed("10.3.0.1", "bearer")
    assert th.wait("10.3.0.1") == 0


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
    app = create_app(Database(tmp_path / "x.duckdb"), TOKEN, Limits(), sessions=sessions, throttle=th, ui=mount)
    guard = Guard(app, TOKEN, Limits(), lambda: None, sessions, th)
    return guard, th, clock


def client(guard, address: str) -> TestClient:
    return TestClient(guard, client=(address, 40000), follow_redirects=False)


def test_wrong_bearer_tokens_get_429_unchecked_and_another_address_is_answered(served, caplog) -> None:
    guard, th, clock = served
    caplog.set_level(logging.WARNING, logger="cmdare.analytics.server.throttle")
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

    from cmdare.analytics.server.service import HttpConfig, Service

    con = connect(str(tmp_path / "m.duckdb"))
    svc = Service(con, tmp_path / "m.duckdb", HttpConfig("127.0.0.1", 0, TOKEN), ui=mount)
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


@pytest.mark.slow  # 20 s of interleaved requests (fast tier: docs/testing.md)
def test_a_valid_token_between_guesses_buys_no_more_guesses(served) -> None:
    """The bypass of the second hostile round: four wrong guesses, then one valid request,
    on one connection, over and over. The valid requests keep working; the guesses are
    looked at five times, then once per doubling wait, however many valid requests come."""
    guard, th, clock = served
    c = client(guard, "10.0.0.9")
    checked = ok = 0
    for _ in range(200):  # 10 s in 1/20 s steps
        for i in range(4):
            r = c.get("/api/v1/nodes", headers={"Authorization": f"Bearer guess-{i}"})
            checked += r.status_code == 401
            assert r.status_code in (401, 429)
        r = c.get("/api/v1/nodes", headers={"Authorization": f"Bearer {TOKEN}"})
        ok += r.status_code == 200
        clock.t += 0.05
    assert ok >= 195  # the first valid request came after four guesses: it was checked, then trusted
    assert checked <= 5 + 4  # five free, then one after each wait of 1, 2, 4 s (10 s in all)


def test_fresh_addresses_with_the_valid_token_get_in_while_others_guess(served) -> None:
    guard, th, clock = served
    for i in range(150):  # a guess from each of 150 addresses: the overall bucket (100) empties
        client(guard, f"10.5.0.{i}").get("/api/v1/nodes", headers={"Authorization": "Bearer nope"})
    for i in range(20):  # new, legitimate clients
        r = client(guard, f"10.6.0.{i}").get("/api/v1/nodes", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
    r = client(guard, "10.5.0.149").get("/api/v1/nodes", headers={"Authorization": "Bearer nope-again"})
    assert r.status_code == 429 and r.headers["retry-after"] == "300"
