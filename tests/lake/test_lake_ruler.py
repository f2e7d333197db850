"""One ruler among a lake's servers (analytics/server/lakeruler.py, collector/lease.py): exactly
one server evaluates the rules; its alert state lives in the catalog, so every server
shows the same alerts and a standby that takes over sends no episode twice and loses
none; the lease is a lock the catalog's machinery frees when its holder dies; the fast
path reads revocations ahead of the lake and what a broken or hostile producer sends
costs only its own records."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pytest

from cmdare.analytics.cli.client import Remote
from cmdare.analytics.server.service import HttpConfig
from cmdare.collector.cli import config, serve
from cmdare.collector.lake import Lake
from cmdare.collector.lakeingest import LakeSpoolIngest
from cmdare.collector.lease import Lease
from tests.lake.test_lake_serve import _get, _hb, _metric, _spool

RULES = """
groups:
  - name: g
    interval: 1s
    rules:
      - alert: Revoked
        expr: |
          SELECT node, max(lead_seconds) AS value FROM revocations
          WHERE revokes AND ts >= eval_time() - INTERVAL 10 MINUTE GROUP BY node
        labels: {severity: warning}
        annotations: {summary: "{{ $labels.node }} is being revoked"}
"""


def _revocation(node: str, ts: float, i: int = 0) -> dict:
    return {"v": 1, "type": "revocation", "id": f"{node}-rev-{i}", "ts": ts, "node": node, "role": "worker",
            "job": "j", "labels": {}, "data": {"cloud": "gce", "kind": "preemption", "action": "TERMINATE",
                                               "lead_seconds": 30.0, "revokes": True}}


class Hook(BaseHTTPRequestHandler):
    posts: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict]]]:
    class H(Hook):
        posts: list[dict] = []

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/hook", H.posts
    srv.shutdown()


def settings(rules: Path, hook_url: str, **extra: object) -> config.CollectorConfig:
    flags = {"rules": (str(rules),), "receiver_webhook": (hook_url,), "resend": "1h", "detect_every": "off",
             **extra}
    return config.build("serve", "", flags, set(flags))


def serve_thread(cfg: serve.ServeConfig, lines: list[str],
                 stop: threading.Event) -> tuple[threading.Thread, list[BaseException]]:
    """``serve.run(cfg)`` started in a thread: the thread, and what it raised (once ended)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            serve.run(cfg, lines.append, stop)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def catalog_db(postgres) -> str:
    """A PostgreSQL catalog of its own on the session's server (which holds other lakes')."""
    import uuid

    from sqlalchemy import create_engine, text

    db = f"lake_{uuid.uuid4().hex[:8]}"
    eng = create_engine(postgres.url, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f"CREATE DATABASE {db}"))
    eng.dispose()
    return postgres.url.rsplit("/", 1)[0] + "/" + db


@contextlib.contextmanager
def ruled_server(lake: Path, st: config.CollectorConfig, lines: list[str] | None = None,
                 **kw: object) -> Iterator[tuple[str, threading.Event, list[str]]]:
    """A server with the ruler's settings, in a thread: its URL, its stop event, its lines."""
    lines = [] if lines is None else lines
    stop = threading.Event()
    cfg = serve.ServeConfig(str(lake), None, HttpConfig("127.0.0.1", 0, None), 0.2, settings=st, **kw)
    t, errors = serve_thread(cfg, lines, stop)
    deadline = time.monotonic() + 60
    while not any(" on http" in x for x in lines):
        assert t.is_alive() and time.monotonic() < deadline, (lines, errors)
        time.sleep(0.05)
    url = re.search(r" on (http://\S+)", next(x for x in lines if " on http" in x)).group(1)
    try:
        yield url, stop, lines
    finally:
        stop.set()
        t.join(30)


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def firing(posts: list[dict], node: str) -> list[dict]:
    return [a for p in posts for a in p["alerts"] if a["status"] == "firing" and a["labels"].get("node") == node]


def alerts_of(url: str) -> list[tuple]:
    d = Remote(url).request("GET", "/api/v1/alerts")["alerts"]
    cols = d["columns"]
    return sorted(tuple(r[cols.index(c)] for c in ("rule", "state", "since", "labels")) for r in d["rows"])


def make_lake(tmp_path: Path, events: list[dict]) -> tuple[Path, LakeSpoolIngest]:
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    spool = tmp_path / "spool"
    _spool(spool, events)
    ing = LakeSpoolIngest(lk, spool, max_skew=None, commit_every=0.05)
    ing.load_available()
    return tmp_path / "lake", ing


@pytest.mark.slow  # (waits for a lease to pass on purpose: the full run's)
def test_one_server_rules_every_server_shows_its_alerts_and_a_standby_takes_over(tmp_path: Path, hook) -> None:
    hook_url, posts = hook
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    now = time.time()
    lake, ing = make_lake(tmp_path, _hb("n1", 3, now - 30) + [_revocation("n1", now - 5)])
    st = settings(rules, hook_url)
    with ruled_server(lake, st) as (a, stop_a, lines_a):
        wait_for(lambda: firing(posts, "n1"), 30, "n1's revocation at the webhook")
        with ruled_server(lake, st) as (b, _, lines_b):
            time.sleep(2 * 2.0 + 1)  # two of b's asks for the lease, and a's rounds after the delivery
            assert _metric(a, "cmdare_server_ruler") == 1 and _metric(b, "cmdare_server_ruler") == 0
            assert any("ruling the lake" in x for x in lines_a) and not any("ruling the lake" in x for x in lines_b)
            # every server shows the ruler's alerts (the state is the catalog's, copied)
            wait_for(lambda: alerts_of(b) and alerts_of(b) == alerts_of(a), 10, "b showing a's alerts")
            assert [r[1] for r in alerts_of(b)] == ["firing"]
            stop_a.set()  # the ruler goes: b takes over within its next asks
            t = time.monotonic()
            wait_for(lambda: any("ruling the lake" in x for x in lines_b), 15, "b ruling")
            assert time.monotonic() - t < 6
            assert any("(1 alerts restored)" in x for x in lines_b), lines_b
            # a new revocation reaches the webhook through b; n1's episode is not sent again
            _spool(tmp_path / "spool", [_revocation("n2", time.time() - 1)])
            ing.load_available()
            wait_for(lambda: firing(posts, "n2"), 30, "n2's revocation at the webhook through b")
            time.sleep(1.5)
            assert _metric(b, "cmdare_server_ruler") == 1
    assert len(firing(posts, "n1")) == 1, posts
    assert len(firing(posts, "n2")) == 1, posts
    ing.stager.close()


def test_a_standby_that_cannot_rule_keeps_serving_and_a_server_without_rules_never_asks(tmp_path: Path,
                                                                                         hook) -> None:
    hook_url, posts = hook
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    lake, ing = make_lake(tmp_path, _hb("n1", 3, time.time() - 30))
    ing.stager.close()
    held = Lease(Lake(str(lake), create=False))
    assert held.try_acquire()  # someone else holds the lease
    try:
        with ruled_server(lake, settings(rules, hook_url)) as (a, _, lines):
            time.sleep(3)
            assert _metric(a, "cmdare_server_ruler") == 0
            assert _get(a, "/api/v1/nodes")[0] == 200
            assert not any("ruling" in x for x in lines)
        with ruled_server(lake, None) as (b, _, lines):
            assert "asking to rule" not in " ".join(lines)
    finally:
        held.release()


def test_the_flock_lease_is_freed_when_its_holder_is_killed(tmp_path: Path) -> None:
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure(("lake_commits",))
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom cmdare.collector.lake import Lake\n"
         "from cmdare.collector.lease import Lease\n"
         f"l = Lease(Lake({str(tmp_path / 'lake')!r}, create=False))\nassert l.try_acquire()\n"
         "print('held', flush=True)\ntime.sleep(600)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        mine = Lease(Lake(str(tmp_path / "lake"), create=False))
        assert not mine.try_acquire()
        assert mine.path.read_text().split(":")[1].strip() == str(child.pid)  # who holds it, for a person
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert mine.try_acquire() and mine.held()
        mine.release()
    finally:
        child.kill()


def test_the_fast_path_adds_each_event_once_and_the_lake_copy_replaces_it(tmp_path: Path) -> None:
    """Rows read ahead and then committed show once; a row read twice is kept once; the
    table of rows read ahead is bounded."""
    from cmdare.analytics.server import lakeserve
    from cmdare.analytics.server.lakeserve import LakeReplica

    now = time.time()
    lake, ing = make_lake(tmp_path, _hb("n1", 3, now - 30))
    rep = LakeReplica(Lake(str(lake), create=False))
    try:
        rep.refresh()
        cols = [r[0] for r in rep.con.execute("DESCRIBE fast_revocations").fetchall()]
        ahead = _rows(cols, [("n1-rev-0", "n1"), ("n1-rev-0", "n1"), ("n2-rev-0", "n2")])
        assert rep.add_fast("revocations", ahead) == 2
        assert rep.add_fast("revocations", ahead) == 0  # read again (a rebalance): nothing new
        assert _ids(rep) == ["n1-rev-0", "n2-rev-0"]
        _spool(tmp_path / "spool", [_revocation("n1", now - 5)])  # n1's now in the lake too
        ing.load_available()
        rep.refresh()
        assert _ids(rep) == ["n1-rev-0", "n2-rev-0"]
        assert rep.con.execute("SELECT count(*) FROM fast_revocations").fetchone()[0] == 1
        # a hostile flood read ahead: bounded, the newest kept
        old = lakeserve.FAST_MAX_ROWS
        lakeserve.FAST_MAX_ROWS = 50
        try:
            rep.add_fast("revocations", _rows(cols, [(f"x-{i}", "x") for i in range(200)], base=now - 400))
            assert rep.con.execute("SELECT count(*) FROM fast_revocations").fetchone()[0] == 50
            assert "x-199" in _ids(rep) and "n1-rev-0" in _ids(rep)  # (the lake's rows untouched)
        finally:
            lakeserve.FAST_MAX_ROWS = old
    finally:
        rep.close()
        ing.stager.close()


def _rows(cols: list[str], keys: list[tuple[str, str]], base: float | None = None) -> pa.Table:
    import datetime as dt

    t0 = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    data: dict[str, list] = {c: [] for c in cols}
    for i, (id_, node) in enumerate(keys):
        for c in cols:
            data[c].append({"id": id_, "node": node, "ts": t0 + dt.timedelta(seconds=i) if base is None else
                            dt.datetime.fromtimestamp(base + i, dt.timezone.utc).replace(tzinfo=None),
                            "revokes": True, "lead_seconds": 30.0, "cloud": "gce", "kind": "preemption",
                            "job": "j"}.get(c))
    return pa.table(data)


def _ids(rep) -> list[str]:
    return sorted(r[0] for r in rep.con.execute("SELECT id FROM revocations").fetchall())


@pytest.mark.parametrize(("argv", "words"), [
    (["--notices", "kafka://127.0.0.1:9/t"], "--notices: the ruler reads notices for its rules"),
    (["--rules", "default", "--notices", "kafka://u:p@127.0.0.1:9/t"], "--notices"),
    (["--rules", "default", "--notices-group", "x" * 300], "--notices-group: 1 to 200"),
    (["--commit-every", "1y"], "--commit-every"),
    (["--alertmanager", "http://127.0.0.1:9"], "give the rules to evaluate with --rules"),
])
def test_serve_refuses_bad_ruler_settings_in_one_line(tmp_path: Path, argv: list[str], words: str) -> None:
    from click.testing import CliRunner

    from cmdare.collector.cli import cli

    lake, ing = make_lake(tmp_path, _hb("n1", 1, time.time()))
    ing.stager.close()
    r = CliRunner().invoke(cli, ["serve", "--lake", str(lake), "--http", "127.0.0.1:0", *argv])
    assert r.exit_code == 2, r.output
    err = r.output.strip().splitlines()[-1]
    assert words in err and "u:p" not in r.output


def test_a_rule_file_that_does_not_hold_against_the_lake_stops_the_server(tmp_path: Path, hook) -> None:
    lake, ing = make_lake(tmp_path, _hb("n1", 1, time.time()))
    ing.stager.close()
    bad = tmp_path / "bad.yml"
    bad.write_text(RULES.replace("FROM revocations", "FROM no_such_table"))
    stop = threading.Event()
    cfg = serve.ServeConfig(str(lake), None, HttpConfig("127.0.0.1", 0, None), 0.2, settings=settings(bad, hook[0]))
    from cmdare.wire.units import ConfigError

    with pytest.raises(ConfigError, match="no_such_table"):
        serve.run(cfg, lambda line: None, stop)


@pytest.mark.slow  # (waits for a lease to pass on purpose: the full run's)
def test_a_ruler_whose_catalog_session_ends_stops_and_exits(postgres, tmp_path: Path, hook) -> None:
    """A flapping network between the ruler and a PostgreSQL catalog: its lease's session is
    ended (as PostgreSQL ends it when the client vanishes). The ruler saves nothing more
    (the fence) and exits, so that a standby rules; nothing is sent after."""
    from sqlalchemy import create_engine, text

    catalog = catalog_db(postgres)
    hook_url, posts = hook
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    lk = Lake(str(tmp_path / "lake"), catalog)
    lk.ensure()
    _spool(tmp_path / "spool", _hb("n1", 3, time.time() - 30) + [_revocation("n1", time.time() - 5)])
    ing = LakeSpoolIngest(lk, tmp_path / "spool", max_skew=None, commit_every=0.05)
    ing.load_available()
    ing.stager.close()
    lines: list[str] = []
    cfg = serve.ServeConfig(str(tmp_path / "lake"), catalog, HttpConfig("127.0.0.1", 0, None), 0.2,
                            settings=settings(rules, hook_url))
    t, errors = serve_thread(cfg, lines, threading.Event())
    wait_for(lambda: firing(posts, "n1"), 30, "the ruler's first delivery")
    assert any("PostgreSQL advisory lock" in x for x in lines)
    eng = create_engine(catalog, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:  # every session holding the lease ends
        ended = c.execute(text("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                               "AND granted")).fetchall()
    eng.dispose()
    assert ended
    t.join(20)
    assert not t.is_alive()
    assert errors and "lost the ruler's lease" in str(errors[0]) and len(str(errors[0]).splitlines()) == 1
    sent = len(posts)
    time.sleep(2)
    assert len(posts) == sent


def test_the_fence_refuses_a_save_once_the_lease_is_gone(postgres, tmp_path: Path) -> None:
    """The save's own transaction checks the lease: a ruler that lost it writes nothing,
    even before it notices (the deliberate race: the check between two saves)."""
    import datetime as dt

    from sqlalchemy import text

    from cmdare.analytics.alertstore import AlertStore, LeaseLost, pg_fence

    catalog = catalog_db(postgres)
    lk = Lake(str(tmp_path / "lake"), catalog)
    lk.ensure(("lake_commits",))
    lease = Lease(lk)
    assert lease.kind == "postgresql" and lease.try_acquire()
    other = Lease(Lake(str(tmp_path / "lake"), catalog, create=False))
    assert not other.try_acquire()
    store = AlertStore(lk.catalog.engine, pg_fence(lease))
    store.ensure()
    now = dt.datetime(2026, 11, 29, 3, 0)
    row = ("g/R", "fp1", '{"node": "n1"}', "{}", "firing", float("nan"), now, now, now, None, None, 0, None, now, 1)
    store.save(["g/R"], [row], [("g/R", "g", "r.yml", "ok", None, now, 0.01, 1)])
    alerts, rules = store.load()
    assert alerts[0][:5] == ("g/R", "fp1", '{"node": "n1"}', "{}", "firing") and alerts[0][5] is None  # (NaN: null)
    with lease.engine.connect() as c:  # the lease's session ends behind its back (waited for: up to
        # 5 s; without the wait the terminated backend could still hold the lock at the save, so the
        # save rightly went through and the test failed by chance, 1 fast-tier run in ~10)
        c.execute(text("SELECT pg_terminate_backend(:p, 5000)"), {"p": lease.backend_pid})
        c.commit()
    with pytest.raises(LeaseLost):
        store.save(["g/R"], [], [])
    assert store.load()[0] == alerts  # nothing changed
    assert not lease.held()
    assert other.try_acquire()
    other.release()


@pytest.mark.kafka
def test_the_fast_path_takes_each_good_notice_and_a_hostile_producer_costs_only_its_records(
        kafka_broker, tmp_path: Path) -> None:
    """On the real broker: garbage that names a revocation, a revocation with a non-finite
    time, a flood of heartbeats (skipped unread) and two good notices in the same polls;
    the good ones are added once and the rules poked; nothing else is."""
    import uuid

    from kafka import KafkaProducer

    from cmdare.analytics.server.lakeruler import FastPath
    from cmdare.analytics.server.lakeserve import LakeReplica
    from cmdare.wire.events import encode_many
    from cmdare.wire.kafka import parse_kafka_url

    lake, ing = make_lake(tmp_path, _hb("n1", 3, time.time() - 30))
    ing.stager.close()
    rep = LakeReplica(Lake(str(lake), create=False))
    rep.refresh()
    topic = f"fast-{uuid.uuid4().hex[:6]}"
    poked: list[set[str]] = []
    fast = FastPath(rep, parse_kafka_url("t", kafka_broker.url(topic)), f"g-{topic}", poked.append)
    prod = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    try:
        prod.send(topic, b"warm-up")  # (the topic exists before the group starts at its end)
        prod.flush()
        fast.start()
        wait_for(lambda: fast.consumer.assignment(), 30, "the fast path's partitions")
        time.sleep(1)
        now = time.time()
        bad_ts = json.dumps({"v": 1, "type": "revocation", "id": "bad-ts", "ts": "NaN", "node": "evil",
                             "role": "worker", "job": "j", "labels": {}, "data": {"revokes": True}})
        for value in (b"revocation\x00\xff{{{", bad_ts.encode(), encode_many(_hb("n9", 200, now - 300)),
                      encode_many([_revocation("n1", now - 1)] + _hb("n1", 50, now - 60)),
                      encode_many([_revocation("n2", now - 1), {"type": "lifecycle"}])):
            prod.send(topic, value)
        prod.flush()
        wait_for(lambda: fast.added >= 2, 20, "the two good notices")
        time.sleep(1)
    finally:
        fast.stop()
        prod.close()
    assert _ids(rep) == ["n1-rev-0", "n2-rev-0"]
    assert {"revocations"} in poked
    assert fast.read == 5 and fast.decoded == 4  # the heartbeats-only message was skipped unread (the warm-up: before)
    assert rep.con.execute("SELECT count(*) FROM heartbeats WHERE node = 'n9'").fetchone()[0] == 0
    rep.close()


def test_analyze_lake_shows_the_rulers_alerts(tmp_path: Path, hook) -> None:
    """analyze --lake reads the alert state where the ruler keeps it (the catalog), as every
    server shows it."""
    from click.testing import CliRunner

    from cmdare.analytics.cli import cli as analyze

    hook_url, posts = hook
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    lake, ing = make_lake(tmp_path, _hb("n1", 3, time.time() - 30) + [_revocation("n1", time.time() - 5)])
    ing.stager.close()
    before = CliRunner().invoke(analyze, ["--lake", str(lake), "alerts", "--json"])
    assert before.exit_code == 0 and "n1" not in before.stdout
    with ruled_server(lake, settings(rules, hook_url)) as (url, _, _):
        wait_for(lambda: firing(posts, "n1"), 30, "the ruler's alert")
        time.sleep(1.5)
        served = alerts_of(url)
    r = CliRunner().invoke(analyze, ["--lake", str(lake), "alerts", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert [(a["rule"], a["state"]) for a in got["alerts"]] == [(s[0], s[1]) for s in served] == [("g/Revoked", "firing")]
    assert got["rules"][0]["rule"] == "g/Revoked" and got["rules"][0]["health"] == "ok"
