"""The server tier over a lake (``cmdare-collector serve --lake``): the same recording
served from a database file by a collector and from a lake by a server answers every API
resource, every golden ``analyze --server`` command and every page with the same bytes;
what collectors commit later is read incrementally and seen within the refresh; stored
findings written through one server are read by another; what a hostile client or a
broken lake does costs only its own request or refresh."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.analytics.cli.client import Remote
from cmdare.analytics.resources import RESOURCES
from cmdare.analytics.server.service import HttpConfig
from cmdare.collector.cli import cli as collector_cli
from cmdare.collector.cli import serve
from cmdare.collector.lake import Lake
from cmdare.collector.lakeingest import LakeSpoolIngest
from cmdare.wire.events import encode_many
from cmdare.wire.spool import seg_name
from tests.analytics.test_resources import EXAMPLES, WRITES
from tests.conftest import serving
from tests.fixtures.analyze_golden.cases import CASES
from tests.lake.test_lake_equivalence import both, norm  # noqa: F401  (the module fixture: a file and a lake)

# a lake, an ingest collector and two servers per module (33 s to set up): scripts/test-fast leaves it to
# the full run
pytestmark = pytest.mark.slow


@contextlib.contextmanager
def lake_server(lake: Path, refresh: float = 0.2, token: str | None = None, **kw) -> Iterator[str]:
    """``cmdare-collector serve --lake`` in a thread of this process: its URL."""
    lines: list[str] = []
    stop = threading.Event()
    cfg = serve.ServeConfig(str(lake), None, HttpConfig("127.0.0.1", 0, token), refresh, **kw)
    t = threading.Thread(target=serve.run, args=(cfg, lines.append, stop), daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while not any(" on http" in x for x in lines):
        assert t.is_alive() and time.monotonic() < deadline, lines
        time.sleep(0.05)
    url = re.search(r" on (http://\S+)", next(x for x in lines if " on http" in x)).group(1)
    try:
        yield url
    finally:
        stop.set()
        t.join(30)


class Raw(Remote):
    """A client that keeps every answer's bytes."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.answers: list[tuple[str, int, bytes]] = []

    def request(self, method, route, params=None, body=None):
        import urllib.parse

        q = {k: v for k, v in (params or {}).items() if v is not None and v != [] and v != ()}
        url = self.url + route + ("?" + urllib.parse.urlencode(q, doseq=True) if q else "")
        req = urllib.request.Request(url, method=method, headers={"Accept": "application/json"},
                                     data=None if body is None else json.dumps(body, default=str).encode())
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                data, code = r.read(), r.status
        except urllib.error.HTTPError as e:
            data, code = e.read(), e.code
        self.answers.append((route, code, data))
        d = json.loads(data)
        if code != 200:
            from cmdare.analytics.db import AnalyticsError

            raise AnalyticsError(d.get("error", f"HTTP {code}"))
        return d


def _get(url: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url + path, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _walk(url: str, job: str) -> list[tuple[str, int, bytes]]:
    """Every resource that reads (the examples of tests/analytics/test_resources.py), the
    OpenAPI document and the pages, as bytes."""
    front = Raw(url)
    for r in RESOURCES:
        if r.name in WRITES:
            continue
        kw = {k: (v.replace("{job}", job) if isinstance(v, str) else v) for k, v in EXAMPLES[r.name].items()}
        with contextlib.suppress(Exception):
            front.call(r.name, **kw)
    out = list(front.answers)
    for path in ("/openapi.json", "/ui", f"/ui/jobs/{job}", "/ui/findings", "/ui/alerts", "/healthz"):
        out.append((path, *_get(url, path)))
    return out


def test_the_api_and_the_pages_answer_from_the_lake_with_the_file_modes_bytes(both, tmp_path: Path) -> None:  # noqa: F811
    db, lake = both
    job = "sim-input-6"
    with serving(db, tmp_path / "served.duckdb") as file_url, lake_server(lake) as lake_url:
        a, b = _walk(file_url, job), _walk(lake_url, job)
        assert len(a) == len(b) >= 30
        differ = [(ra, ca, da[:300], cb, db_[:300]) for (ra, ca, da), (_, cb, db_) in zip(a, b, strict=True)
                  if (ca, da) != (cb, db_)]
        assert not differ, differ[:3]
        assert sum(c == 200 for _, c, _ in b) >= 28


@pytest.mark.slow  # (every golden command twice: the full run's)
def test_every_golden_command_answers_the_same_through_a_lake_server(both, tmp_path: Path) -> None:  # noqa: F811
    """Both ways: the write commands of the golden cases (fits, stored findings) go through
    each server in the same order, and what each later command reads follows."""
    db, lake = both
    work = fresh_lake(lake, tmp_path)  # (the fixture's lake stays as the other tests read it)
    runner = CliRunner()
    differ = []
    with serving(db, tmp_path / "served.duckdb") as file_url, lake_server(work) as lake_url:
        for argv in CASES:
            a = runner.invoke(cli, ["--server", file_url, *argv], env={"CMDARE_LAKE": ""})
            b = runner.invoke(cli, ["--server", lake_url, *argv], env={"CMDARE_LAKE": ""})
            na = (a.exit_code, norm(a.stdout, tmp_path / "served.duckdb", db), norm(a.stderr, tmp_path / "served.duckdb"))
            nb = (b.exit_code, norm(b.stdout, work), norm(b.stderr, work))
            if na != nb:
                differ.append((argv, na[0], nb[0], na[1][:400] + na[2][:200], nb[1][:400] + nb[2][:200]))
    assert not differ, "\n\n".join(map(str, differ[:3])) + f"\n({len(differ)} of {len(CASES)} differ)"


def fresh_lake(lake: Path, tmp_path: Path) -> Path:
    """Another lake of the fixture's recording (its spool loaded again): one a test may write."""
    import shutil

    spool = tmp_path / "spool"
    shutil.copytree(lake.parent / "spool", spool, ignore=shutil.ignore_patterns("cursor.*"))
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    ing = LakeSpoolIngest(lk, spool, max_skew=None)
    ing.load_available()
    ing.stager.close()
    return tmp_path / "lake"


def _spool(d: Path, events: list[dict]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    n = len(list(d.glob("*.ndjson"))) + 1
    (d / seg_name(n)).write_bytes(encode_many(events))


def _hb(node: str, n: int, t0: float) -> list[dict]:
    return [{"v": 1, "type": "heartbeat", "id": f"{node}-hb-{i}", "ts": t0 + 10 * i, "node": node, "role": "worker",
             "job": "j", "labels": {}, "data": {"seq": i + 1}} for i in range(n)]


def _all_files(lake: Path) -> set[str]:
    lk = Lake(str(lake), create=False)
    return {f for t in lk.names() for f in lk.files(t)}


def _metric(url: str, name: str) -> float:
    text = _get(url, "/metrics")[1].decode()
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def _nodes(url: str) -> dict[str, dict]:
    d = Remote(url).request("GET", "/api/v1/nodes")
    cols = d["columns"]
    return {r[cols.index("node")]: dict(zip(cols, r, strict=True)) for r in d["rows"]}


def test_new_commits_are_read_incrementally_and_seen_within_the_refresh(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    lake.ensure()
    spool = tmp_path / "spool"
    t0 = time.time() - 60
    _spool(spool, _hb("n1", 5, t0))
    ing = LakeSpoolIngest(lake, spool, max_skew=None, commit_every=0.05)
    ing.load_available()
    with lake_server(tmp_path / "lake", refresh=0.2) as url:
        assert set(_nodes(url)) == {"n1"}
        read = _metric(url, "cmdare_server_lake_files_read_total")
        before = _all_files(tmp_path / "lake")
        _spool(spool, _hb("n2", 5, t0 + 1))
        ing.load_available()
        t = time.monotonic()
        while "n2" not in _nodes(url):
            assert time.monotonic() - t < 5, "a commit not seen within the refresh"
            time.sleep(0.05)
        seen = time.monotonic() - t
        # only the files the commit added were read (heartbeats, nodes' rounds, lake_commits)
        # (a refresh may fall between the commit's tables: the marker is read by the next one)
        new = _all_files(tmp_path / "lake") - before
        assert len(new) >= 3
        while (got := _metric(url, "cmdare_server_lake_files_read_total") - read) < len(new):
            assert time.monotonic() - t < 5, (got, len(new))
            time.sleep(0.05)
        time.sleep(0.5)  # a few more refreshes: nothing read again
        assert _metric(url, "cmdare_server_lake_files_read_total") - read == len(new)
        assert seen < 2.0
        hb = Remote(url).request("POST", "/api/v1/sql", body={"query": "SELECT count(*) FROM heartbeats"})
        assert hb["rows"] == [[10]]
    ing.stager.close()


def test_a_compacted_table_is_read_again_whole_with_the_same_rows(tmp_path: Path) -> None:
    from cmdare.analytics.server.lakeserve import LakeReplica
    from cmdare.collector.lakemaint import maintain

    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    spool = tmp_path / "spool"
    t0 = time.time() - 600
    ing = LakeSpoolIngest(lk, spool if spool.exists() else spool, max_skew=None, commit_every=0.05)
    for i in range(4):
        _spool(spool, _hb(f"n{i}", 6, t0 + i))
        ing.load_available()
    ing.stager.close()
    rep = LakeReplica(Lake(str(tmp_path / "lake"), create=False))
    try:
        rep.refresh()
        assert len(rep.files["heartbeats"]) == 4
        before = rep.con.execute("SELECT count(*), count(DISTINCT id) FROM heartbeats").fetchone()
        maintain(Lake(str(tmp_path / "lake"), create=False), compact_files=2)
        assert rep.refresh() >= 1
        assert len(rep.files["heartbeats"]) == 1  # the compacted day: one file, read whole again
        assert rep.con.execute("SELECT count(*), count(DISTINCT id) FROM heartbeats").fetchone() == before == (24, 24)
    finally:
        rep.close()


def test_findings_stored_through_one_server_are_read_by_another(both, tmp_path: Path) -> None:  # noqa: F811
    _, lake = both
    work = fresh_lake(lake, tmp_path)
    with lake_server(work) as one, lake_server(work) as two:
        assert Remote(two).request("GET", "/api/v1/findings")["rows"] == []
        stored = Remote(one).request("POST", "/api/v1/findings/run", body={"store": True})
        assert len(stored["findings"]) >= 5
        t = time.monotonic()
        while not Remote(two).request("GET", "/api/v1/findings")["rows"]:
            assert time.monotonic() - t < 10
            time.sleep(0.1)
        assert Remote(two).request("GET", "/api/v1/findings") == Remote(one).request("GET", "/api/v1/findings")


def test_a_broken_commit_costs_that_refresh_and_nothing_already_served(tmp_path: Path) -> None:
    """A data file that cannot be read (a truncated upload, a disk error): the refresh fails
    in one line, the replica keeps every row it had, and the refresh after the file is
    readable again reads it."""
    from cmdare.analytics.db import AnalyticsError
    from cmdare.analytics.server.lakeserve import LakeReplica

    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    spool = tmp_path / "spool"
    ing = LakeSpoolIngest(lk, spool, max_skew=None, commit_every=0.05)
    _spool(spool, _hb("n1", 5, time.time() - 60))
    ing.load_available()
    rep = LakeReplica(Lake(str(tmp_path / "lake"), create=False))
    try:
        rep.refresh()
        _spool(spool, _hb("n2", 5, time.time() - 50))
        ing.load_available()
        new = [f for f in Lake(str(tmp_path / "lake"), create=False).files("heartbeats") if f not in rep.files["heartbeats"]]
        (good,) = new
        kept = Path(good).read_bytes()
        Path(good).write_bytes(b"PAR1 not parquet at all" * 3)
        with pytest.raises(AnalyticsError) as e:
            rep.refresh()
        assert "\n" not in str(e.value) and "cannot read" in str(e.value)
        assert rep.con.execute("SELECT count(*) FROM heartbeats").fetchone() == (5,)
        assert rep.con.execute("SELECT count(*) FROM nodes").fetchone() == (1,)  # all of the commit, or none
        Path(good).write_bytes(kept)
        rep.refresh()
        assert rep.con.execute("SELECT count(*) FROM heartbeats").fetchone() == (10,)
    finally:
        rep.close()
        ing.stager.close()


def test_a_lake_server_refuses_what_a_collector_refuses(both, tmp_path: Path) -> None:  # noqa: F811
    """User SQL (in a worker over the lake's files, as analyze --lake sql) reads the tables'
    files and no other: not the catalog beside them, nothing else on the host; it writes
    nothing."""
    _, lake = both
    parquet = next(iter(Lake(str(lake), create=False).files("heartbeats")))
    with lake_server(lake) as url:
        assert _post(url, "/api/v1/sql", {"query": f"SELECT count(*) FROM read_parquet('{parquet}')"})[0] == 200
        for q in (f"SELECT * FROM read_csv('{lake}/catalog.db')", "SELECT * FROM read_csv('/etc/passwd')",
                  "DELETE FROM heartbeats", "COPY heartbeats TO '/tmp/x.csv'", "ATTACH '/tmp/x.duckdb' AS x"):
            code, body = _post(url, "/api/v1/sql", {"query": q})
            assert code == 400, (q, body)
            assert "\n" not in json.loads(body)["error"]
        assert Remote(url).request("POST", "/api/v1/sql", body={"query": "SELECT count(*) FROM heartbeats"})["rows"][0][0] > 0


def test_a_scoped_token_sees_only_its_labels_on_a_lake_server(both, tmp_path: Path) -> None:  # noqa: F811
    from cmdare.analytics.server.tokens import Tokens, digest

    _, lake = both
    f = tmp_path / "tokens.toml"
    f.write_text(f'[[token]]\nname = "sim"\nscope = "read"\nsha256 = "{digest("s" * 32)}"\n'
                 f'labels = {{ simulated = "true" }}\n'
                 f'[[token]]\nname = "ops"\nscope = "admin"\nsha256 = "{digest("o" * 32)}"\n')
    with lake_server(lake, token=Tokens.load(str(f))) as url:
        def nodes(secret: str) -> int:
            req = urllib.request.Request(url + "/api/v1/nodes", headers={"Authorization": f"Bearer {secret}"})
            with urllib.request.urlopen(req, timeout=30) as r:
                return len(json.loads(r.read())["rows"])

        assert nodes("o" * 32) == 120
        assert nodes("s" * 32) == 36
        assert _get(url, "/api/v1/nodes")[0] == 401


def _post(url: str, path: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url + path, method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.parametrize(("argv", "words"), [
    (["serve"], "Missing option '--lake'"),
    (["serve", "--lake", " "], "--lake: empty"),
    (["serve", "--lake", "/nonexistent/lake"], "no such lake"),
    (["serve", "--lake", "LAKE", "--http", "off"], "a server serves the API"),
    (["serve", "--lake", "LAKE", "--http", "0.0.0.0:0"], "off loopback the API needs a bearer token"),
    (["serve", "--lake", "LAKE", "--refresh", "0s"], "--refresh"),
    (["serve", "--lake", "LAKE", "--refresh", "nan"], "--refresh"),
    (["serve", "--lake", "LAKE", "--catalog", "mysql://u:secret@h/db"], "--catalog"),
])
def test_serve_refuses_bad_settings_in_one_line(both, argv: list[str], words: str) -> None:  # noqa: F811
    _, lake = both
    r = CliRunner().invoke(collector_cli, [a.replace("LAKE", str(lake)) for a in argv],
                           env={"CMDARE_HTTP_TOKEN": "", "CMDARE_LAKE": ""})
    assert r.exit_code != 0
    assert words in r.output, r.output
    assert "secret" not in r.output
    assert len(r.output.strip().splitlines()) <= 4  # usage lines, then the one error


def test_agents_are_judged_as_of_the_lakes_horizon_never_lost_for_want_of_a_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Collectors that stopped committing 10 minutes ago: the agents whose heartbeats reach
    up to their last commit are not lost (nor in a file no collector fills: judged as of its
    end); an agent silent long before the horizon is lost on both."""
    import datetime as real_dt

    import cmdare.collector.lake as lake_mod

    class Past(real_dt.datetime):
        @classmethod
        def now(cls, tz=None):  # the collectors' clock when they committed: 10 minutes ago
            return real_dt.datetime.now(tz) - real_dt.timedelta(seconds=600)

    shim = type("dt", (), {"datetime": Past, "timezone": real_dt.timezone, "timedelta": real_dt.timedelta,
                           "date": real_dt.date})
    monkeypatch.setattr(lake_mod, "dt", shim)
    end = time.time() - 605
    events = []
    for node, last in (("live", end), ("gone", end - 3600)):
        events.append({"v": 1, "type": "lifecycle", "id": f"{node}-start", "ts": last - 300, "node": node,
                       "role": "worker", "job": "j", "labels": {},
                       "data": {"event": "agent_start", "boot_time": last - 400, "interval_seconds": 10.0}})
        events += [{"v": 1, "type": "heartbeat", "id": f"{node}-hb-{i}", "ts": last - 300 + 10 * i, "node": node,
                    "role": "worker", "job": "j", "labels": {}, "data": {"seq": i + 1}} for i in range(31)]
    spool = tmp_path / "spool"
    _spool(spool, events)
    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    ing = LakeSpoolIngest(lk, spool, max_skew=None)
    ing.load_available()
    ing.stager.close()
    monkeypatch.undo()
    r = CliRunner().invoke(cli, ["--lake", str(tmp_path / "lake"), "nodes", "--json"])
    assert r.exit_code == 0, r.output
    state = {x["node"]: x["state"] for x in map(json.loads, r.stdout.splitlines())} if r.stdout.lstrip()[:1] == "{" \
        else {x["node"]: x["state"] for x in json.loads(r.stdout)}
    assert state["gone"] == "lost"
    assert state["live"] != "lost", state
    with lake_server(tmp_path / "lake") as url:
        assert _nodes(url)["live"]["state"] == state["live"]
        assert _nodes(url)["gone"]["state"] == "lost"
    # the same events in a file no collector fills: judged as of its own end (its newest
    # event), as the lake is: the live agent is not lost there either, and a note says so
    from cmdare.collector.consumer import SpoolIngest
    from cmdare.collector.db import connect

    (spool / "cursor.collected").unlink()
    con = connect(tmp_path / "f.duckdb")
    SpoolIngest(con, spool, max_skew=None).load_available()
    con.close()
    r = CliRunner().invoke(cli, ["--db", str(tmp_path / "f.duckdb"), "nodes", "--json"], env={"CMDARE_LAKE": ""})
    out = json.loads(r.stdout) if r.stdout.lstrip()[:1] == "[" else list(map(json.loads, r.stdout.splitlines()))
    assert {x["node"]: x["state"] for x in out} == {"live": "alive", "gone": "lost"}  # alive as of its end
    assert "note: this database ends at" in r.stderr


def test_the_horizon_is_the_oldest_recent_sources_newest_commit() -> None:
    import datetime as dt

    import duckdb

    from cmdare.analytics.lakedb import HORIZON_QUIET, lake_horizon

    con = duckdb.connect()
    t = dt.datetime(2026, 5, 1, 12)
    con.execute("CREATE TABLE lake_commits (committed_at TIMESTAMP, source VARCHAR)")
    assert lake_horizon(con) is None
    rows = [(t, "k/0"), (t - dt.timedelta(seconds=30), "k/0"), (t - dt.timedelta(seconds=20), "k/1"),
            (t - dt.timedelta(seconds=HORIZON_QUIET + 1), "k/2")]  # k/2: no agent writes there any more
    con.executemany("INSERT INTO lake_commits VALUES (?, ?)", rows)
    assert lake_horizon(con) == t - dt.timedelta(seconds=20)


def test_a_memory_attack_in_user_sql_costs_only_its_worker(both) -> None:  # noqa: F811
    """The query that grew a collector past 6 GB: refused in one line from its worker; the
    server's own memory stays flat and its other requests keep answering; the next query
    gets a fresh worker."""
    import psutil

    _, lake = both
    me = psutil.Process()
    with lake_server(lake) as url:
        assert _post(url, "/api/v1/sql", {"query": "SELECT 1"})[0] == 200  # (the workers started)
        base = me.memory_info().rss
        peak, lat, stop = [base], [], threading.Event()

        def watch() -> None:
            while not stop.is_set():
                peak.append(me.memory_info().rss)
                t = time.monotonic()
                assert _get(url, "/api/v1/nodes")[0] == 200
                lat.append(time.monotonic() - t)
                time.sleep(0.02)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        code, body = _post(url, "/api/v1/sql", {"query": "SELECT string_agg(repeat('x', 100000000), '') FROM range(20)"})
        stop.set()
        w.join(10)
        err = json.loads(body)["error"]
        assert code == 400 and "\n" not in err and ("memory" in err or "byte limit" in err or "size limit" in err), err
        assert max(peak) - base < 300 << 20, (max(peak) - base) >> 20
        assert lat and sorted(lat)[int(0.99 * (len(lat) - 1))] < 1.0, lat
        code, body = _post(url, "/api/v1/sql", {"query": "SELECT count(*) AS n FROM heartbeats"})
        assert code == 200 and json.loads(body)["rows"][0][0] > 0


def test_a_worker_killed_past_its_cap_is_replaced_and_said_in_one_line(both) -> None:  # noqa: F811
    from cmdare.analytics.safesql import SqlRefused
    from cmdare.analytics.server.sqlpool import SqlPool

    _, lake = both
    pool = SqlPool(str(lake), None, size=1)
    try:
        assert pool.run("SELECT count(*) FROM heartbeats", 10, 30, 1 << 20).rows[0][0] > 0
        w = pool._idle[0]
        with pytest.raises(SqlRefused) as e:  # a list too big for the cap, built in Python's own memory
            pool.run("SELECT list(repeat('y', 1000)) FROM range(3000000)", 10, 60, 1 << 40)
        assert "\n" not in str(e.value)
        with pytest.raises(SqlRefused) as e:  # interrupted inside the worker at its time limit
            pool.run("SELECT count(*) FROM range(1000000000000) a", 10, 0.5, 1 << 20)
        assert "time limit" in str(e.value)
        assert pool.run("SELECT 41 + 1", 10, 30, 1 << 20).rows == [(42,)]
        import os
        import signal

        (w,) = pool._idle
        os.kill(w.proc.pid, signal.SIGSTOP)  # a wedged worker: stopped at the wall deadline, replaced
        t = time.monotonic()
        with pytest.raises(SqlRefused) as e:
            pool.run("SELECT 1", 10, 0.5, 1 << 20)
        assert "time limit" in str(e.value) and time.monotonic() - t < 0.5 + 5 + 2
        assert pool.killed == 1 and w.proc.wait(5) == -signal.SIGKILL
        assert pool.run("SELECT 2", 10, 30, 1 << 20).rows == [(2,)]
        (w,) = pool._idle
        os.kill(w.proc.pid, signal.SIGKILL)  # died while idle: the next query gets a fresh worker
        w.proc.wait(5)
        assert pool.run("SELECT 3", 10, 30, 1 << 20).rows == [(3,)]
        assert pool._idle[0] is not w
    finally:
        pool.close()


def test_a_scoped_tokens_sql_in_a_worker_sees_its_labels_only(both, tmp_path: Path) -> None:  # noqa: F811
    from cmdare.analytics.server.tokens import Tokens, digest

    _, lake = both
    f = tmp_path / "tokens.toml"
    f.write_text(f'[[token]]\nname = "sim"\nscope = "read"\nsha256 = "{digest("s" * 32)}"\n'
                 f'labels = {{ simulated = "true" }}\n')
    with lake_server(lake, token=Tokens.load(str(f))) as url:
        def sql(q: str) -> tuple[int, dict]:
            req = urllib.request.Request(url + "/api/v1/sql", method="POST", data=json.dumps({"query": q}).encode(),
                                         headers={"Content-Type": "application/json", "Authorization": "Bearer " + "s" * 32})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        code, body = sql("SELECT count(*) FROM nodes")
        assert (code, body["rows"]) == (200, [[36]])  # of 120
        parquet = next(iter(Lake(str(lake), create=False).files("heartbeats")))
        code, body = sql(f"SELECT count(*) FROM read_parquet('{parquet}')")
        assert code == 400 and "sees its labels" in body["error"], body


def _replica_rows(rep) -> dict[str, tuple]:
    """Every table of a replica's main schema: its row count and a hash of its rows."""
    tables = [t for (t,) in rep.con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' AND table_type = 'BASE TABLE' "
        "AND table_catalog = current_database() AND table_name <> 'schema_migrations'").fetchall()]
    return {t: rep.con.execute(f"SELECT count(*), sum(hash(x)) FROM {t} x").fetchone() for t in tables}


def test_a_replica_kept_in_its_cache_dir_reads_only_what_changed_at_a_restart(tmp_path: Path, caplog) -> None:
    """A server restarted over its --cache-dir reads nothing the lake did not change since
    (the 1,000-node day took 86-96 s to read whole), and holds exactly the rows a replica
    read from scratch holds; a cache of another lake, or broken, is read again (said)."""
    from cmdare.analytics.server.lakeserve import STATE, LakeReplica
    from cmdare.collector.lakemaint import maintain

    lk = Lake(str(tmp_path / "lake"))
    lk.ensure()
    spool, cache = tmp_path / "spool", tmp_path / "cache"
    t0 = time.time() - 600
    ing = LakeSpoolIngest(lk, spool, max_skew=None, commit_every=0.05)
    _spool(spool, _hb("n1", 6, t0) + [_rev("n1", t0 + 30)])
    ing.load_available()
    rep = LakeReplica(Lake(str(tmp_path / "lake"), create=False), cache)
    rep.refresh()
    assert not rep.kept and rep.loaded_files > 0
    import pyarrow as pa

    ahead = rep.con.sql("SELECT * REPLACE ('n9-rev' AS id, 'n9' AS node) FROM lake_revocations").to_arrow_table()
    assert rep.add_fast("revocations", ahead) == 1  # read ahead by this run's ruler: not the next run's
    assert isinstance(ahead, pa.Table)
    rep.close()
    # restarted, nothing new: nothing read
    rep = LakeReplica(Lake(str(tmp_path / "lake"), create=False), cache)
    assert rep.kept and rep.refresh() == 0 and rep.loaded_files == 0
    assert rep.con.execute("SELECT count(*) FROM fast_revocations").fetchone()[0] == 0
    first = _replica_rows(rep)
    rep.close()
    # a commit and a compaction while it was down: the commit's files read, the compacted table whole
    _spool(spool, _hb("n2", 6, t0 + 100))
    ing.load_available()
    maintain(Lake(str(tmp_path / "lake"), create=False), compact_files=2)
    ing.stager.close()
    rep = LakeReplica(Lake(str(tmp_path / "lake"), create=False), cache)
    assert rep.kept and rep.refresh() >= 1
    assert 0 < rep.loaded_files < sum(len(f) for f in rep.files.values())
    kept = _replica_rows(rep)
    rep.close()
    fresh = LakeReplica(Lake(str(tmp_path / "lake"), create=False))
    fresh.refresh()
    assert kept == _replica_rows(fresh) != first
    assert kept["heartbeats"][0] == 12 and kept["lake_revocations"][0] == 1
    fresh.close()
    # a cache of another lake is not taken for this one; a broken one is read again, said once
    other = Lake(str(tmp_path / "other"))
    other.ensure()
    rep = LakeReplica(Lake(str(tmp_path / "other"), create=False), cache)
    assert not rep.kept
    rep.close()
    (cache / "replica.duckdb").write_bytes(b"not a database" * 100)
    rep = LakeReplica(Lake(str(tmp_path / "lake"), create=False), cache)
    assert not rep.kept and "not reused" in caplog.text
    rep.refresh()
    assert _replica_rows(rep) == kept
    assert rep.con.execute(f"SELECT count(*) FROM {STATE}.files").fetchone()[0] == sum(len(f) for f in rep.files.values())
    rep.close()


def _rev(node: str, ts: float) -> dict:
    return {"v": 1, "type": "revocation", "id": f"{node}-rev", "ts": ts, "node": node, "role": "worker", "job": "j",
            "labels": {}, "data": {"cloud": "gce", "kind": "preemption", "action": "TERMINATE", "lead_seconds": 30.0,
                                   "revokes": True}}
