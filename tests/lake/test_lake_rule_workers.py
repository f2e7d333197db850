"""A lake server's alert rules run in worker processes (analytics/server/sqlpool.py ``rule``): a
rule's SQL reads the lake as the worker last planned it (the tables whose metadata moved
planned again, ``LakeDatabase.replan``) plus the rows the ruler read ahead of the lake;
its instances equal an evaluation on the lake itself; a rule that turns hostile costs its
worker and its own round, never the server's memory or the other rules."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

import psutil
import pytest

from cmdare.analytics import safesql
from cmdare.analytics.alerting import RuleError
from cmdare.analytics.alerting.evaluate import evaluate
from cmdare.analytics.alerting.rulefmt import Rule
from cmdare.analytics.alertstore import AlertStore
from cmdare.analytics.lakedb import LakeDatabase
from cmdare.analytics.server.sqlpool import SqlPool
from cmdare.collector.lake import Lake
from tests.lake.test_lake_ruler import (
    RULES,
    _revocation,
    _rows,
    firing,
    hook,  # noqa: F401  (the webhook fixture)
    make_lake,
    ruled_server,
    settings,
    wait_for,
)
from tests.lake.test_lake_serve import _hb, _metric, _spool

REVOKED = Rule("Revoked", "g", "rules.yml", expr=(
    "SELECT node, count(*) AS value FROM revocations "
    "WHERE revokes AND ts >= eval_time() - INTERVAL 10 MINUTE GROUP BY node"))


def _config() -> dict:
    return {**{k: v for k, v in safesql.CONFIG.items() if k != "lock_configuration"}, "memory_limit": "512MB"}


def _found(instances: list) -> dict[str, float]:
    return {i.labels["node"]: i.value for i in instances}


def _in_process(lake: Path, rule: Rule, at: dt.datetime) -> dict[str, float]:
    db = LakeDatabase(str(lake))
    con = db._open(None)
    try:
        return _found(evaluate(con, rule, at))
    finally:
        con.close()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def test_a_rule_in_a_worker_sees_the_lake_and_the_rows_read_ahead_once(tmp_path: Path) -> None:
    now = time.time()
    lake, ing = make_lake(tmp_path, _hb("n1", 3, now - 30) + [_revocation("n1", now - 20)])
    pool = SqlPool(str(lake), None, size=1, fast=True)
    try:
        at = _now()
        assert _found(pool.rule(REVOKED, at, 10.0)) == _in_process(lake, REVOKED, at) == {"n1": 1}
        # read ahead: n1's again (already in the lake) and n2's (not yet): each once
        cols = [r[0] for r in LakeDatabase(str(lake))._open(None).execute("DESCRIBE revocations").fetchall()]
        ahead = _rows(cols, [("n1-rev-0", "n1"), ("n2-rev-0", "n2")])
        assert _found(pool.rule(REVOKED, _now(), 10.0, fast={"revocations": ahead})) == {"n1": 1, "n2": 1}
        # the next commits are seen at the next evaluation (planned again, only what moved)
        _spool(tmp_path / "spool", [_revocation("n3", time.time() - 5), _revocation("n1", time.time() - 4, 1)])
        ing.load_available()
        at = _now()
        assert _found(pool.rule(REVOKED, at, 10.0)) == _in_process(lake, REVOKED, at) == {"n1": 2, "n3": 1}
    finally:
        pool.close()
        ing.stager.close()


def test_the_lake_planned_again_in_part_equals_the_lake_planned_whole(tmp_path: Path) -> None:
    """Every table of a connection planned again after commits (only the moved tables)
    holds exactly the rows of one planned from scratch; a deliberate skip of a moved table
    fails this."""
    now = time.time()
    lake, ing = make_lake(tmp_path, _hb("n1", 3, now - 300))
    db = LakeDatabase(str(lake))
    for fast in (False, True):
        con = db._open(_config(), fast)
        at = db.lake.locations()
        _spool(tmp_path / "spool", _hb(f"m{fast}", 4, now - 100) + [_revocation(f"n{fast}", now - 10)])
        ing.load_available()
        moved = {t for t, loc in db.lake.locations().items() if at.get(t) != loc}
        assert {"heartbeats", "revocations"} <= moved
        db.replan(con, moved, fast)
        fresh = db._open(_config(), fast)
        tables = [t for (t,) in fresh.execute("SELECT table_name FROM information_schema.tables WHERE "
                                              "table_schema = 'main' AND table_name <> 'schema_migrations'").fetchall()]
        assert "heartbeats" in tables and ("lake_revocations" in tables) == fast
        for t in tables:
            q = f"SELECT count(*), sum(hash(x)) FROM {t} x"
            assert con.execute(q).fetchall() == fresh.execute(q).fetchall(), t
        con.close()
        fresh.close()
    ing.stager.close()


def test_a_rules_failure_in_its_worker_is_one_line_and_the_worker_is_replaced(tmp_path: Path) -> None:
    lake, ing = make_lake(tmp_path, _hb("n1", 3, time.time() - 30))
    ing.stager.close()
    pool = SqlPool(str(lake), None, size=1, fast=True)
    try:
        hog = Rule("Hog", "g", "rules.yml", expr="SELECT 'x' AS node, length(string_agg(repeat('x', 100000000), '')) "
                                                  "AS value FROM range(20)")
        with pytest.raises(RuleError) as e:
            pool.rule(hog, _now(), 20.0)
        assert "memory" in str(e.value) and str(e.value).startswith("expr ") and "\n" not in str(e.value)
        bad = Rule("Bad", "g", "rules.yml", expr="SELECT node, 1/0 AS value FROM no_such_table")
        with pytest.raises(RuleError, match="^expr failed: .*no_such_table"):
            pool.rule(bad, _now(), 5.0)
        assert _found(pool.rule(REVOKED, _now(), 10.0)) == {}  # the pool still answers
    finally:
        pool.close()


HOSTILE = RULES + """  - name: h
    interval: 1s
    rules:
      - alert: Hog
        # harmless until a node named hog is revoked: then it asks for 2 GB
        expr: |
          SELECT node, length(string_agg(repeat(node, 33333333), '')) AS value
          FROM revocations, range(20) WHERE node = 'hog' GROUP BY node
        labels: {severity: warning}
"""


@pytest.mark.slow  # (a server, its workers and a memory attack: the full run's)
def test_a_rule_that_turns_hostile_costs_its_worker_not_the_server_nor_other_rules(tmp_path: Path, hook) -> None:  # noqa: F811
    hook_url, posts = hook
    rules = tmp_path / "rules.yml"
    rules.write_text(HOSTILE)
    now = time.time()
    lake, ing = make_lake(tmp_path, _hb("n1", 3, now - 30))
    me = psutil.Process()
    with ruled_server(lake, settings(rules, hook_url)) as (url, _, lines):
        wait_for(lambda: _metric(url, "cmdare_server_ruler") == 1, 30, "the server ruling")
        base = me.memory_info().rss
        peak, done = [base], threading.Event()

        def watch() -> None:
            while not done.wait(0.05):
                peak.append(me.memory_info().rss)

        threading.Thread(target=watch, daemon=True).start()
        _spool(tmp_path / "spool", [_revocation("hog", time.time() - 3), _revocation("n1", time.time() - 2)])
        ing.load_available()
        wait_for(lambda: firing(posts, "n1"), 30, "n1's revocation at the webhook beside the hostile rule")
        store = AlertStore(Lake(str(lake), create=False).catalog.engine)

        def hog_error() -> str:
            return next((r[4] or "" for r in store.load()[1] if r[0] == "h/Hog" and r[3] == "error"), "")

        wait_for(lambda: "memory" in hog_error(), 60, "the hostile rule's error saved")
        assert hog_error().startswith("expr ") and "\n" not in hog_error()
        assert _metric(url, "cmdare_collector_alert_rules_unhealthy") == 1
        done.set()
        assert max(peak) - base < 300 << 20, (max(peak) - base) >> 20  # the attack's memory was the worker's
        assert firing(posts, "hog")  # (the other group's rule judged hog's notice as any other)
        assert not [a for p in posts for a in p["alerts"] if a["labels"]["alertname"] == "Hog"]
    ing.stager.close()
