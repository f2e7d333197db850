"""One HTTP receiver's rules (analytics/alerting/notify/http.py), decided case by case: what
is due to it from the engine's alerts (firing episodes, re-sends, owed resolutions), what it
posts to Alertmanager and to a webhook, and its retry backoff."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cmdare.analytics.alerting.notify.http import HttpReceiver
from cmdare.analytics.alerting.state import Alert

T0 = dt.datetime(2026, 3, 1, 12, 0, 0)
T1 = T0 + dt.timedelta(minutes=5)


@dataclass
class Engine:
    """What a receiver reads of the engine: its alerts, and deliveries reported back."""

    alerts: list[Alert]
    reported: list = field(default_factory=list)

    def snapshot(self) -> list[Alert]:
        return list(self.alerts)

    def delivered(self, items, now) -> None:
        self.reported.append(items)


def _alert(state: str, fired: dt.datetime | None = T0, fp: str = "f1", rule: str = "r", **kw) -> Alert:
    return Alert(rule, fp, {"alertname": "A", "node": "n1", "fp": fp}, {"summary": "s"}, state, 1.0,
                 T0 - dt.timedelta(minutes=1),  # pending for a minute before it fired
                 fired_at=fired, resolved_at=T1 if state == "resolved" else None, **kw)


class Sink(BaseHTTPRequestHandler):
    got: list = []
    at: list = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).got.append((self.path, body))
        type(self).at.append(time.monotonic())
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def sink():
    h = type("S", (Sink,), {"got": [], "at": [], "status": 200})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), h)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield h, f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


@pytest.fixture
def receiver():
    made: list[HttpReceiver] = []

    def make(kind: str = "webhook", url: str = "http://127.0.0.1:9/h", **kw) -> HttpReceiver:
        made.append(HttpReceiver(kind, url, **kw))
        return made[-1]

    yield make
    for r in made:
        r.stop(grace=0)


def _due(r: HttpReceiver, *alerts: Alert, rules=("r",)) -> list[tuple[str, bool]]:
    return [(it.key[1], it.resolved) for it in r.due(Engine(list(alerts)), set(rules))]


def test_a_firing_episode_is_due_once_then_again_only_after_resend(receiver) -> None:
    r = receiver(resend=60)
    a = _alert("firing")
    assert _due(r, a) == [("f1", False)]
    assert _due(r, a) == []  # handed over just now
    r.handed[("r", "f1")] = (T0, False, dt.datetime.utcnow() - dt.timedelta(seconds=59))
    assert _due(r, a) == []
    r.handed[("r", "f1")] = (T0, False, dt.datetime.utcnow() - dt.timedelta(seconds=61))
    assert _due(r, a) == [("f1", False)]
    # a new episode of the same instance, or one whose resolution was handed over: due at once
    assert _due(r, _alert("firing", fired=T1)) == [("f1", False)]
    r.handed[("r", "f1")] = (T1, True, dt.datetime.utcnow())
    assert _due(r, _alert("firing", fired=T1)) == [("f1", False)]
    # other rules' alerts are not this round's
    assert _due(r, _alert("firing", fp="f2", rule="other")) == []


def test_a_resolution_is_owed_only_for_an_episode_handed_over_and_only_once(receiver) -> None:
    r = receiver()
    # never notified and never handed to this receiver: nobody was told it fired
    assert _due(r, _alert("resolved")) == []
    # notified (saved before a restart): owed
    assert _due(r, _alert("resolved", notified=True)) == [("f1", True)]
    assert _due(r, _alert("resolved", notified=True)) == []  # its resolution was handed over
    # handed the firing of this very episode in this run: owed
    r2 = receiver()
    assert _due(r2, _alert("firing")) == [("f1", False)]
    assert _due(r2, _alert("resolved")) == [("f1", True)]
    # handed the firing of an earlier episode only: this one's resolution is nobody's
    r3 = receiver()
    assert _due(r3, _alert("firing", fired=T0 - dt.timedelta(hours=1))) == [("f1", False)]
    assert _due(r3, _alert("resolved")) == []
    # delivered already (this run or, restored, the last): never again
    r4 = receiver()
    r4.resolved_sent.add((("r", "f1"), T0))
    assert _due(r4, _alert("resolved", notified=True)) == []
    # pending and inhibited alerts are nobody's business
    assert _due(receiver(), _alert("pending", fired=None), _alert("inhibited", fp="f2")) == []


def test_alertmanager_gets_its_api_and_a_webhook_the_documented_envelope(sink, receiver) -> None:
    h, url = sink
    am = receiver("alertmanager", url + "/", resend=60, generator="http://gen/cmdare")
    wh = receiver("webhook", url + "/hook?x=1", resend=60, generator="http://gen/cmdare")
    e = Engine([_alert("firing", fp="f1"), _alert("firing", fp="f2")])
    t = dt.datetime.utcnow()
    for r in (am, wh):
        r.send(r.due(e, {"r"}))
    deadline = time.monotonic() + 10
    # both bodies received, and both deliveries reported back (after each answer is read)
    while (len(h.got) < 2 or len(e.reported) < 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    got = dict(h.got)
    assert set(got) == {"/api/v2/alerts", "/hook?x=1"}
    items = got["/api/v2/alerts"]
    assert isinstance(items, list) and [i["labels"]["fp"] for i in items] == ["f1", "f2"]
    first = items[0]
    assert set(first) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
    assert first["startsAt"] == "2026-03-01T12:00:00.000Z" and first["generatorURL"] == "http://gen/cmdare/ui/alerts?rule=r"
    ends = dt.datetime.fromisoformat(first["endsAt"].rstrip("Z"))
    assert abs((ends - t).total_seconds() - 4 * 60) < 5  # a firing alert ends 4 resends on unless re-sent
    hook = got["/hook?x=1"]
    assert hook["status"] == "firing" and hook["externalURL"] == "http://gen/cmdare"
    assert (hook["version"], hook["groupKey"], hook["truncatedAlerts"], hook["receiver"]) == ("4", "{}:{}", 0, "cmdare")
    assert hook["commonLabels"] == {"alertname": "A", "node": "n1"}  # what every alert of the batch shares
    assert [(a["status"], a["fingerprint"]) for a in hook["alerts"]] == [("firing", "f1"), ("firing", "f2")]
    assert [r_.engine for r_ in (am, wh)] == [e, e] and len(e.reported) == 2


def test_a_resolved_alert_ends_when_it_resolved_and_a_webhook_batch_of_resolutions_says_so(sink, receiver) -> None:
    h, url = sink
    wh = receiver("webhook", url + "/hook")
    wh.send(wh.due(Engine([_alert("resolved", notified=True)]), {"r"}))
    deadline = time.monotonic() + 10
    while not h.got and time.monotonic() < deadline:
        time.sleep(0.01)
    (_, body), = h.got
    assert body["status"] == "resolved" and body["alerts"][0]["endsAt"] == "2026-03-01T12:05:00.000Z"


@pytest.mark.slow  # waits on purpose, or runs pytest itself, for seconds (fast tier: docs/testing.md)
def test_retries_back_off_from_half_a_second_doubling_and_start_over_after_a_success(sink, receiver, caplog) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="cmdare.alerts")
    h, url = sink
    h.status = 503
    r = receiver("webhook", url + "/hook")

    def attempts(n: int) -> None:
        deadline = time.monotonic() + 10
        while len(h.at) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(h.at) >= n

    r.send(r.due(Engine([_alert("firing")]), {"r"}))
    attempts(3)
    h.status = 200
    attempts(4)
    gaps = [b - a for a, b in zip(h.at, h.at[1:], strict=False)]
    assert 0.4 < gaps[0] < 0.95 and 0.9 < gaps[1] < 1.4, gaps  # 0.5 s, then 1 s
    deadline = time.monotonic() + 5
    while not r.idle() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert (r.failed_total, r.sent_total, r.last_error) == (3, 1, None)
    # the same error said once, and the recovery once
    said = [(x.levelname, x.getMessage()) for x in caplog.records if x.name == "cmdare.alerts"]
    assert said == [("WARNING", f"alert receiver {r.name}: OSError: HTTP 503 (retrying with backoff)"),
                    ("INFO", f"alert receiver {r.name}: delivering again")]
    # a success starts the backoff over: the next failure is retried after 0.5 s again
    h.status = 503
    r.send(r.due(Engine([_alert("firing", fired=T1)]), {"r"}))
    attempts(6)
    assert 0.4 < h.at[5] - h.at[4] < 1.2, h.at  # not 1.5 s or more
    h.status = 200


def test_stop_delivers_what_is_queued_before_the_sender_ends(sink, receiver) -> None:
    h, url = sink
    r = receiver("webhook", url + "/hook")
    with r._cv:  # queued while the sender is between batches
        r._batch[("r", "f1")] = r.due(Engine([_alert("firing")]), {"r"})[0]
    r.stop(grace=3)
    assert [b["alerts"][0]["fingerprint"] for _, b in h.got] == ["f1"] and not r.thread.is_alive()


def test_the_delivery_bounds_are_the_documented_ones(receiver) -> None:
    """docs/alerts.md, "Delivery": one exchange 5 s, backoff capped at 30 s, a firing alert
    again every 1m; the same for every receiver kind, Kafka's included."""
    from cmdare.analytics.alerting.notify.kafka import KafkaReceiver
    from cmdare.wire.kafka import parse_kafka_url

    k = KafkaReceiver(parse_kafka_url("--alert-kafka", "kafka://127.0.0.1:9/alerts"))
    try:
        for r in (receiver(), k):
            assert (r.timeout, r.backoff_max, r.resend) == (5.0, 30.0, 60.0)
            # a sender thread never keeps the process alive, and a new receiver owes nothing
            assert r.thread.daemon and r.thread.is_alive() and r.idle()
    finally:
        k.stop(grace=0)


@pytest.mark.slow  # waits on purpose, or runs pytest itself, for seconds (fast tier: docs/testing.md)
def test_stop_ends_an_idle_sender_at_once_and_waits_3_s_for_a_hung_one(receiver) -> None:
    import socket

    r = receiver()
    t = time.monotonic()
    r.stop(grace=5)
    assert not r.thread.is_alive() and time.monotonic() - t < 1
    # a receiver that accepts and never answers: stop gives the sender 3 s, then returns
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    try:
        hung = receiver("webhook", f"http://127.0.0.1:{srv.getsockname()[1]}/h", timeout=30)
        hung.send(hung.due(Engine([_alert("firing")]), {"r"}))
        deadline = time.monotonic() + 5
        while hung.idle() and time.monotonic() < deadline:
            time.sleep(0.01)
        t = time.monotonic()
        hung.stop()
        assert 2.5 < time.monotonic() - t < 3.5 and hung.thread.is_alive()
    finally:
        srv.close()


def test_a_firing_alert_is_due_again_at_exactly_resend_and_other_rules_never_hide_it(receiver, monkeypatch) -> None:
    import cmdare.analytics.alerting.notify.http as mod

    now = dt.datetime(2026, 3, 1, 13, 0, 0)
    monkeypatch.setattr(mod, "utcnow", lambda: now)
    r = receiver(resend=60)
    a = _alert("firing")
    r.handed[("r", "f1")] = (T0, False, now - dt.timedelta(seconds=59.999))
    assert _due(r, a) == []
    r.handed[("r", "f1")] = (T0, False, now - dt.timedelta(seconds=60))
    assert _due(r, a) == [("f1", False)]
    # another rule's alert listed first does not end the round
    assert _due(receiver(), _alert("firing", fp="f0", rule="other"), a) == [("f1", False)]


@pytest.mark.parametrize(("status", "delivered"), [(299, True), (300, False)])
def test_any_2xx_answer_is_a_delivery_and_anything_from_300_is_retried(sink, receiver, status, delivered) -> None:
    h, url = sink
    h.status = status
    r = receiver("webhook", url + "/hook")
    r.send(r.due(Engine([_alert("firing")]), {"r"}))
    deadline = time.monotonic() + 10
    while not (r.sent_total or r.failed_total) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert (r.sent_total, r.failed_total > 0) == ((1, False) if delivered else (0, True))
    if not delivered:
        assert r.last_error == "OSError: HTTP 300"
    h.status = 200
