"""A token with a label filter (``labels = { team = "vision" }``) sees its team's nodes and
their jobs only, in API calls, pages and user SQL, and cannot read around the filter; an
unfiltered token sees everything (analytics/scoping.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli as analyze
from cmdare.analytics.server.service import HttpConfig, Service
from cmdare.analytics.server.tokens import TokenError, Tokens, digest, parse
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.dashboards.pages import mount
from cmdare.wire.events import encode_many
from tests.conftest import serving

T0 = 1.79e9


def ev(i: int, node: str, team: str, type_: str, data: dict, job: str = "") -> dict:
    return {"v": 1, "id": f"{type_}-{node}-{i}", "ts": T0 + i, "node": node, "role": "worker", "job": job,
            "labels": {"team": team}, "type": type_, "data": data}


def fleet(path: Path) -> None:
    events = []
    for node, team, job in (("v1", "vision", "vis-a"), ("v2", "vision", "both"), ("n1", "nlp", "nlp-a"),
                            ("n2", "nlp", "both")):
        events.append(ev(0, node, team, "train_job", {"run": "r", "rank": 0}, job))
        for i in range(1, 6):
            events.append(ev(i, node, team, "heartbeat", {"seq": i}, job))
            events.append(ev(i, node, team, "gpu", {"index": 0, "util_gpu_ratio": 0.5}, job))
    con = connect(path)
    Writer(con, max_skew=None).write([("x", encode_many(events))])
    con.execute("""INSERT INTO findings (kind, job, node, severity, confidence, summary, first_detected, detected_at)
                   VALUES ('gpu_idle', 'nlp-a', NULL, 'warning', 0.9, 'nlp job idle', now(), now()),
                          ('gpu_idle', 'vis-a', NULL, 'warning', 0.9, 'vision job idle', now(), now())""")
    con.close()


def table(name: str, scope: str, secret: str, labels: str = "") -> str:
    return (f'[[token]]\nname = "{name}"\nscope = "{scope}"\nsha256 = "{digest(secret)}"\n'
            + (f"labels = {labels}\n" if labels else ""))


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("labels")
    db = d / "f.duckdb"
    fleet(db)
    f = d / "tokens.toml"
    f.write_text(table("ops", "admin", "admin-secret") + table("vision", "read", "vision-secret", '{ team = "vision" }')
                 + table("nobody", "read", "nobody-secret", '{ team = "nobody" }'))
    con = connect(db)
    svc = Service(con, db, HttpConfig("127.0.0.1", 0, Tokens.load(f)), ui=mount)
    u = svc.start()
    svc.ready = True
    try:
        yield u
    finally:
        svc.stop()
        con.close()


def get(url: str, path: str, secret: str, body: dict | None = None) -> tuple[int, object]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST",
                                 headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def sql(url: str, secret: str, query: str) -> tuple[int, object]:
    code, body = get(url, "/api/v1/sql", secret, {"query": query})
    return code, body


def rows(body: object) -> list:
    assert isinstance(body, dict), body
    return [tuple(r) for r in body["rows"]]


def test_a_filtered_token_sees_its_teams_nodes_and_their_jobs(url: str) -> None:
    code, body = sql(url, "admin-secret", "SELECT node FROM nodes ORDER BY node")
    assert code == 200 and rows(body) == [("n1",), ("n2",), ("v1",), ("v2",)]
    code, body = sql(url, "vision-secret", "SELECT node FROM nodes ORDER BY node")
    assert code == 200 and rows(body) == [("v1",), ("v2",)]
    code, body = sql(url, "vision-secret", "SELECT node, count(*) FROM gpu_samples GROUP BY node ORDER BY node")
    assert rows(body) == [("v1", 5), ("v2", 5)]
    # the shared job is visible, its other team's node is not; a job-wide finding of a visible job is
    code, body = sql(url, "vision-secret", "SELECT DISTINCT job, node FROM heartbeats WHERE job = 'both'")
    assert rows(body) == [("both", "v2")]
    code, body = sql(url, "vision-secret", "SELECT summary FROM findings ORDER BY 1")
    assert rows(body) == [("vision job idle",)]
    code, body = sql(url, "nobody-secret", "SELECT count(*) FROM heartbeats")
    assert rows(body) == [(0,)]
    code, body = sql(url, "vision-secret", "SELECT count(*) FROM model_fits")  # built from every team's jobs
    assert rows(body) == [(0,)]


def column(body: object, name: str) -> list:
    assert isinstance(body, dict) and "columns" in body, body
    i = body["columns"].index(name)
    return sorted(r[i] for r in body["rows"])


def test_api_routes_and_pages_see_the_same(url: str) -> None:
    code, nodes = get(url, "/api/v1/nodes", "vision-secret")
    assert code == 200 and column(nodes, "node") == ["v1", "v2"]
    code, nodes = get(url, "/api/v1/nodes", "admin-secret")
    assert column(nodes, "node") == ["n1", "n2", "v1", "v2"]
    code, jobs = get(url, "/api/v1/jobs", "vision-secret")
    assert code == 200 and set(column(jobs, "job")) == {"vis-a", "both"}, jobs
    code, jobs = get(url, "/api/v1/jobs", "admin-secret")
    assert set(column(jobs, "job")) == {"vis-a", "both", "nlp-a"}
    code, other = get(url, "/api/v1/jobs/nlp-a", "vision-secret")
    assert "n1" not in json.dumps(other)
    code, _ = get(url, "/metrics", "vision-secret")
    assert code == 403  # the whole fleet's figures
    # the pages read the API with the session their token signed in: the same filter
    import http.cookiejar
    import urllib.request

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(urllib.request.Request(url + "/ui/login", data=b"token=vision-secret&next=/ui/jobs", method="POST"),
                timeout=30).read()
    assert any(c.name == "cmdare_session" for c in jar)
    with opener.open(url + "/api/v1/nodes", timeout=30) as r:
        assert column(json.loads(r.read()), "node") == ["v1", "v2"]
    with opener.open(url + "/ui/jobs", timeout=30) as r:
        assert r.status == 200


@pytest.mark.parametrize(("query", "words"), [
    ('SELECT count(*) FROM "f".main.heartbeats', "the table 'f.main.heartbeats'"),
    ("SELECT count(*) FROM f.heartbeats", "the table 'f.heartbeats'"),
    ("SELECT * FROM query_table('heartbeats')", "the table function 'query_table'"),
    ("SELECT * FROM query('SELECT * FROM f.main.heartbeats')", "the table function 'query'"),
    ("SELECT * FROM duckdb_views()", "the table function 'duckdb_views'"),
    ("SELECT (SELECT count(*) FROM f.main.nodes) AS n", "the table 'f.main.nodes'"),
    ("WITH x AS (SELECT * FROM f.main.nodes) SELECT * FROM x", "the table 'f.main.nodes'"),
    ('SELECT * FROM "f".main.instance_lives()', "the table function 'instance_lives'"),  # the served catalog's macro
    ("SELECT * FROM main.range(3)", "the table function 'range'"),  # a function named with its schema
    ("SELECT * FROM " + "q" * 70 + "()", "the table function '" + "q" * 60 + "'"),
    ('SELECT * FROM "' + "c" * 90 + '".main.t', "the table '" + ("c" * 90 + ".main.t")[:80] + "' (name tables"),
    # the second hostile round: catalogue views that count every team's rows
    ("SELECT relname, reltuples FROM pg_class", "the catalogue view 'pg_class'"),
    ("SELECT reltuples FROM pg_catalog.pg_class", "the catalogue view 'pg_class'"),
    ("SELECT table_name, estimated_size FROM duckdb_tables", "the catalogue view 'duckdb_tables'"),
    ("SELECT * FROM Duckdb_Logs", "the catalogue view 'duckdb_logs'"),
])
def test_reading_around_the_filter_is_refused_in_one_line(url: str, query: str, words: str) -> None:
    code, body = sql(url, "vision-secret", query)
    assert code == 400 and words in body["error"] and "token vision sees" in body["error"], body  # type: ignore[index]
    code, body = sql(url, "admin-secret", query.replace("duckdb_views()", "range(1)"))
    assert code in (200, 400)  # an unfiltered token is not refused for naming the catalog


def test_a_filtered_token_runs_the_allowed_table_functions_and_cannot_write(url: str) -> None:
    code, body = sql(url, "vision-secret", "SELECT count(*) FROM range(3), (SELECT node FROM main.nodes)")
    assert code == 200 and rows(body) == [(6,)]
    code, body = sql(url, "vision-secret", "SELECT DISTINCT node FROM runs() ORDER BY node")
    assert code == 200 and rows(body) == [("v1",), ("v2",)]  # cmdare's macro, over the team's views
    code, body = sql(url, "admin-secret", "SELECT count(*) FROM runs() WHERE node = 'n1'")
    assert rows(body) == [(1,)]  # the other team's run, to an unfiltered token
    code, body = get(url, "/api/v1/findings/run", "vision-secret", {"store": False})
    assert code == 403


def test_label_filters_in_the_token_file_are_checked() -> None:
    sha = digest("x")
    ok = parse(f'[[token]]\nname="a"\nscope="read"\nsha256="{sha}"\nlabels={{team="vision", env="prod"}}\n', "t")
    assert ok[0].labels == (("env", "prod"), ("team", "vision"))
    for labels, words in (('{team="vision"}\nscope2=1', "expected name, scope"),
                          ("{}", "a table of 1 to 8"),
                          ('{team=1}', "a value of 1 to 128"),
                          ("{team=\"x'; DROP TABLE nodes; --\"}", "a value of 1 to 128"),
                          ('{"a b"="x"}', "name 'a b'"),
                          ("'team=vision'", "a table of 1 to 8")):
        with pytest.raises(TokenError, match=words):
            parse(f'[[token]]\nname="a"\nscope="read"\nsha256="{sha}"\nlabels={labels}\n', "t")
    with pytest.raises(TokenError, match="a label filter is for read tokens"):
        parse(f'[[token]]\nname="a"\nscope="admin"\nsha256="{sha}"\nlabels={{team="x"}}\n', "t")


def test_the_cli_through_a_collector_sees_what_its_token_sees(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CMDARE_HTTP_TOKEN", "vision-secret")
    r = CliRunner().invoke(analyze, ["sql", "SELECT node FROM nodes ORDER BY node", "--json"], obj={"server": url})
    assert r.exit_code == 0, r.output
    assert [x["node"] for x in json.loads(r.stdout)] == ["v1", "v2"]


def test_a_scopes_views_are_shared_for_a_while_then_made_again(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads of one label set share its views for FRESH seconds (a node that joins the team
    is seen after them); a replaced catalog is dropped by its last reader."""
    from cmdare.analytics import scoping
    from cmdare.analytics.db import Database

    db = tmp_path / "f.duckdb"
    fleet(db)
    con = connect(db)
    try:
        served = Database.served(con, db)
        scope = scoping.Scope("vision", (("team", "vision"),))
        clock = [1000.0]
        monkeypatch.setattr(scoping.time, "monotonic", lambda: clock[0])

        def visible() -> int:
            with scoping.active(scope), served.read() as c:
                return c.execute("SELECT count(*) FROM nodes").fetchall()[0][0]

        def scopes() -> int:
            return con.execute("SELECT count(*) FROM duckdb_databases() "
                               "WHERE database_name LIKE 'cmdare_scope_%'").fetchall()[0][0]

        assert visible() == 2 and scopes() == 1
        con.execute("UPDATE nodes SET labels = '{\"team\": \"vision\"}' WHERE node = 'n1'")
        clock[0] += scoping.FRESH - 0.25  # binary fractions: the clock's sums are exact
        assert visible() == 2 and scopes() == 1  # the same views
        with scoping.active(scope), served.read() as held:  # a read in flight on the old views
            clock[0] += 0.5
            assert visible() == 3 and scopes() == 2  # made again; the old one still read
            assert held.execute("SELECT count(*) FROM nodes").fetchall()[0][0] == 2
        assert scopes() == 1  # its last reader dropped it
        con.execute("UPDATE nodes SET labels = '{\"team\": \"vision\"}' WHERE node = 'n2'")
        clock[0] += scoping.FRESH  # exactly stale: made again, and the old one, unread, dropped at once
        assert visible() == 4 and scopes() == 1
        assert scoping.FRESH == 5.0  # docs/service.md: "shared by its reads for 5 s"

        def broken(name: str) -> str:
            raise RuntimeError("a macro that does not bind")

        monkeypatch.setattr(scoping, "view_sql", broken)
        clock[0] += scoping.FRESH
        with pytest.raises(RuntimeError), scoping.active(scope), served.read():
            pass
        assert scopes() == 1  # the half-made catalog was dropped (the one before it stays until replaced)
    finally:
        con.close()


def test_reads_a_scope_cannot_filter_are_refused(tmp_path: Path) -> None:
    """Fail closed: under a scope, a database file opened here (no served catalog to
    attach beside), a write, and a lake are one-line refusals, not unfiltered reads."""
    from cmdare.analytics import scoping
    from cmdare.analytics.db import AnalyticsError, Database

    db = tmp_path / "f.duckdb"
    fleet(db)
    with scoping.active(scoping.Scope("vision", (("team", "vision"),))):
        for use in (lambda: Database(db).read(), lambda: Database(db).write()):
            with pytest.raises(AnalyticsError, match=r"^token vision sees only team=vision: it cannot "), use() as _:
                pass
        from cmdare.analytics.lakedb import LakeDatabase
        from cmdare.collector.lake import Lake

        Lake(str(tmp_path / "lake")).ensure()
        with pytest.raises(AnalyticsError, match="it cannot read a lake"), LakeDatabase(str(tmp_path / "lake")).read():
            pass
    with Database(db).read() as con:  # outside the scope: everything
        assert con.execute("SELECT count(*) FROM nodes").fetchall() == [(4,)]


def test_concurrent_filtered_and_unfiltered_reads_each_see_their_own(url: str) -> None:
    """Many requests at once, three tokens: each answer is its token's, and the scopes'
    catalogs do not pile up (one per label set, replaced when stale)."""
    import threading

    want = {"admin-secret": 4, "vision-secret": 2, "nobody-secret": 0}
    wrong: list[object] = []

    def worker(secret: str) -> None:
        for _ in range(8):
            code, body = sql(url, secret, "SELECT count(*) FROM nodes")
            if code != 200 or rows(body) != [(want[secret],)]:
                wrong.append((secret, code, body))

    threads = [threading.Thread(target=worker, args=(s,)) for s in list(want) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    code, body = sql(url, "admin-secret", "SELECT count(*) FROM duckdb_databases() WHERE database_name LIKE 'cmdare_scope_%'")
    assert code == 200 and rows(body)[0][0] <= 2  # at most the views of each label set in use (vision, nobody)


def test_every_get_route_answers_a_filtered_token_without_a_server_error(url: str) -> None:
    """No route reads around the scope by failing: each GET of the OpenAPI document, path
    parameters filled with the team's own names, answers 2xx or a one-line 4xx."""
    code, spec = get(url, "/openapi.json", "admin-secret")
    assert code == 200
    seen = 0
    for path, ops in sorted(spec["paths"].items()):  # type: ignore[index, union-attr]
        if "get" not in ops:
            continue
        p = path.replace("{job}", "vis-a").replace("{node}", "v1").replace("{kind}", "gpu-idle")
        code, body = get(url, p.split("{")[0], "vision-secret")
        assert code < 500, (p, code, body)
        if code >= 400:
            assert isinstance(body, dict) and "\n" not in body.get("error", ""), (p, body)
        seen += 1
    assert seen >= 20


def test_rule_checks_under_a_filter_read_the_views_too(url: str) -> None:
    """A rule's SQL sent to be checked is bound and run under the token's scope: naming the
    served catalog is refused, an unqualified table is the team's view."""
    def check(expr: str) -> tuple[int, object]:
        rule = f"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: {expr}\n"
        return get(url, "/api/v1/alerts/check", "vision-secret", {"files": [{"name": "x.yml", "text": rule}]})

    code, body = check('SELECT node, 1 AS value FROM "f".main.nodes')
    assert code == 400 and "token vision sees" in body["error"], body  # type: ignore[index]
    code, body = check("SELECT node, 1 AS value FROM nodes")
    assert code == 200, body


def test_a_trainer_cannot_claim_another_teams_job_by_its_name(tmp_path: Path) -> None:
    """Issue 69: a trainer on a vision node that calls ``track.init('nlp-secret-job')`` made
    the vision token see nlp's job-wide finding, goodput hours and alerts. Job-wide rows are
    a team's only where every node that ran the job is the team's; a job seen on both
    teams' nodes is shown to each for its own nodes."""
    db = tmp_path / "f.duckdb"
    events = []
    for node, team, job in (("v1", "vision", "vis-a"), ("n1", "nlp", "nlp-secret-job"),
                            ("v9", "vision", "nlp-secret-job")):  # the claim, from a vision node
        events.append(ev(0, node, team, "train_job", {"run": "r", "rank": 0}, job))
        for i in range(1, 4):
            events.append(ev(i, node, team, "heartbeat", {"seq": i}, job))
    con = connect(db)
    Writer(con, max_skew=None).write([("x", encode_many(events))])
    con.execute("""INSERT INTO findings (kind, job, node, severity, confidence, summary, first_detected, detected_at)
                   VALUES ('gpu_idle', 'nlp-secret-job', NULL, 'warning', 0.9, 'nlp secret idle', now(), now()),
                          ('gpu_idle', 'vis-a', NULL, 'warning', 0.9, 'vision job idle', now(), now())""")
    con.execute("""INSERT INTO goodput_hours (job, hour, fp, whole, productive, input_wait, startup, checkpoint_save,
                                             checkpoint_restore, revocation)
                   VALUES ('nlp-secret-job', '2026-12-01 10:00', 'x', true, 3600, 0, 0, 0, 0, 0),
                          ('vis-a', '2026-12-01 10:00', 'y', true, 1800, 0, 0, 0, 0, 0)""")
    con.execute("""INSERT INTO alerts (rule, fingerprint, labels, state, active_at, updated_at) VALUES
                   ('JobSlow', 'f1', '{"job": "nlp-secret-job"}', 'firing', now(), now()),
                   ('JobSlow', 'f2', '{"job": "vis-a"}', 'firing', now(), now()),
                   ('NodeLost', 'f3', '{"node": "v9", "job": "nlp-secret-job"}', 'firing', now(), now())""")
    con.close()
    f = tmp_path / "tokens.toml"
    f.write_text(table("ops", "admin", "admin-secret") + table("vision", "read", "vision-secret", '{ team = "vision" }')
                 + table("nlp", "read", "nlp-secret", '{ team = "nlp" }'))
    with serving(db, token=Tokens.load(f)) as url:
        for q, vision in (
            ("SELECT summary FROM findings ORDER BY 1", [("vision job idle",)]),
            ("SELECT job, productive FROM goodput_hours ORDER BY 1", [("vis-a", 1800.0)]),
            ("SELECT fingerprint FROM alerts ORDER BY 1", [("f2",), ("f3",)]),  # its own node's alert stays
            ("SELECT DISTINCT node FROM heartbeats WHERE job = 'nlp-secret-job'", [("v9",)]),
        ):
            code, body = sql(url, "vision-secret", q)
            assert code == 200 and rows(body) == vision, (q, body)
        code, body = sql(url, "admin-secret", "SELECT count(*) FROM findings")
        assert rows(body) == [(2,)]  # nothing stored changed; an admin sees the job-wide rows
        code, body = sql(url, "nlp-secret", "SELECT DISTINCT node FROM heartbeats WHERE job = 'nlp-secret-job'")
        assert rows(body) == [("n1",)]  # nlp sees its own nodes of the job, never vision's
        code, body = get(url, "/api/v1/jobs/nlp-secret-job", "vision-secret")
        assert code in (200, 400, 404) and "nlp secret idle" not in json.dumps(body), body
        code, body = get(url, "/api/v1/alerts", "vision-secret")
        assert code == 200 and '"f1"' not in json.dumps(body)

