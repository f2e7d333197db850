"""A rule's result is bounded (rows, label characters, each label's length: refused in one
line, never cut or merged), by `alerts check`, at load and live; a receiver delivers its
critical alerts first, in a delivery of their own, and a bulk group in parts."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

import pytest

from cmdare.analytics import alerting
from cmdare.analytics.alerting.evaluate import MAX_INSTANCES, MAX_RESULT_BYTES, evaluate, validate
from cmdare.analytics.alerting.notify.http import MAX_ITEMS, Item, Receiver
from cmdare.analytics.alerting.rulefmt import MAX_TEXT
from cmdare.collector.db import connect
from tests.analytics.alerting.test_delivery import T0, _alerting, _round


def rules(expr: str) -> str:
    return f"""
groups:
  - name: g
    interval: 5s
    rules:
      - alert: Big
        expr: >
          {expr}
"""


def _rule(tmp_path: Path, expr: str):
    f = tmp_path / "r.yml"
    f.write_text(rules(expr))
    return alerting.load_files([f])


@pytest.mark.parametrize(("expr", "error"), [
    (f"SELECT 'n' || i AS k, 1 AS value FROM range({MAX_INSTANCES + 1}) t(i)",
     "expr returned more than 10,000 rows (alert instances): narrow it"),
    ("SELECT 'n' || i AS k, repeat('x', 4000) AS big, 1 AS value FROM range(600) t(i)",
     "expr's labels hold more than 2 MiB in "),
    (f"SELECT repeat('x', {MAX_TEXT + 1}) AS k, 1 AS value",
     "expr: label k is longer than 4,096 characters (row 1 or before): refused, not cut"),
])
def test_a_result_past_its_bounds_is_refused_in_one_line_everywhere(tmp_path: Path, expr: str, error: str) -> None:
    groups = _rule(tmp_path, expr)  # the file itself is fine: the bound is on what it returns
    con = connect(str(tmp_path / "a.duckdb"))
    try:
        with pytest.raises(alerting.RuleError) as e:
            validate(con, groups)  # alerts check and load
        assert error in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith(str(tmp_path))
        with pytest.raises(alerting.RuleError, match="^" + error[:20].replace("(", r"\(").replace("'", ".")):
            evaluate(con, groups[0].rules[0], dt.datetime(2026, 3, 1))  # live
    finally:
        con.close()


def test_results_at_the_bounds_are_instances(tmp_path: Path) -> None:
    con = connect(str(tmp_path / "a.duckdb"))
    try:
        (rule,) = _rule(tmp_path, f"SELECT 'n' || i AS k, 1 AS value FROM range({MAX_INSTANCES}) t(i)")[0].rules
        assert len(evaluate(con, rule, dt.datetime(2026, 3, 1))) == MAX_INSTANCES
        (rule,) = _rule(tmp_path, f"SELECT repeat('x', {MAX_TEXT}) AS k, 1 AS value")[0].rules
        [one] = evaluate(con, rule, dt.datetime(2026, 3, 1))
        assert one.labels == {"k": "x" * MAX_TEXT}
        # labels of 2 MiB less a little, in 512 rows: under the bound
        per = (MAX_RESULT_BYTES - 4096) // 512 - len("k") - len("big")
        (rule,) = _rule(tmp_path, f"SELECT 'n' || lpad(i::VARCHAR, 3, '0') AS k, repeat('x', {per - 4}) AS big, "
                                  "1 AS value FROM range(512) t(i)")[0].rules
        assert len(evaluate(con, rule, dt.datetime(2026, 3, 1))) == 512
    finally:
        con.close()


def test_a_rule_past_its_bounds_live_is_unhealthy_and_the_others_alert(tmp_path: Path) -> None:
    text = rules("SELECT 'n' || i AS k, repeat('y', 4000) AS big, 1 AS value FROM range(2000) t(i)") + """
      - alert: Small
        expr: SELECT 'a' AS k, 1 AS value
"""
    now = [T0]
    al, _ = _alerting(tmp_path / "a.duckdb", text, None, lambda: now[0])
    try:
        _round(al, None)
        firing = {a.labels["alertname"] for a in al.engine.snapshot() if a.state == "firing"}
        health = {k.split("/")[1]: h for k, h in al.engine.health.items()}
    finally:
        al.stop()
        al.con.close()
    assert firing == {"Small"} and health["Big"].health == "error"
    assert "more than 2 MiB" in health["Big"].last_error


class Recorder(Receiver):
    kind = "test"

    def __init__(self) -> None:
        self.deliveries: list[list[dict]] = []
        self.gate = threading.Event()
        super().__init__("rec", resend=60)

    def _deliver(self, items: list[dict]) -> None:
        self.gate.wait(10)
        self.deliveries.append(items)


def item(i: int, severity: str) -> Item:
    return Item(("r", f"f{i}"), i, False, {"labels": {"alertname": f"A{i}", "severity": severity}})


def test_critical_alerts_go_first_in_a_delivery_of_their_own_and_bulk_in_parts() -> None:
    r = Recorder()
    try:
        r.send([item(0, "warning")])  # taken at once; the receiver hangs on it
        time.sleep(0.2)
        r.send([item(i, "warning") for i in range(1, 1201)])  # a bulk group queued behind
        r.send([item(5000, "critical")])  # then a revocation
        r.gate.set()
        deadline = time.monotonic() + 10
        while not r.idle() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        r.stop()
    sizes = [len(d) for d in r.deliveries]
    assert sizes == [1, 1, MAX_ITEMS, MAX_ITEMS, 200]
    assert r.deliveries[1] == [{"labels": {"alertname": "A5000", "severity": "critical"}}]
    assert [a["labels"]["alertname"] for a in r.deliveries[2][:2]] == ["A1", "A2"]  # the rest oldest first


def test_a_failed_part_goes_again_before_the_rest_and_a_critical_one_still_first() -> None:
    class Flaky(Recorder):
        fails = 1

        def _deliver(self, items: list[dict]) -> None:
            if self.fails and len(items) == MAX_ITEMS:
                self.fails -= 1
                self.send([item(9000, "critical")])  # arrives while the bulk part fails
                raise OSError("receiver down")
            super()._deliver(items)

    r = Flaky()
    r.gate.set()
    try:
        r.send([item(i, "warning") for i in range(1, 601)])
        deadline = time.monotonic() + 15
        while (not r.idle() or len(r.deliveries) < 3) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        r.stop()
    names = [[a["labels"]["alertname"] for a in d] for d in r.deliveries]
    assert names[0] == ["A9000"] and len(names[1]) == MAX_ITEMS and names[1][0] == "A1" and len(names[2]) == 100
    assert r.failed_total == 1
