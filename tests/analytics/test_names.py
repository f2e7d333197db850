"""Names that break URLs (a ``/``, spaces, quotes, ``%``, unicode) reach their job's API
routes, page and report page; every time parameter is range-checked (a one-line 422,
never a 500)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from cmdare.analytics.cli import cli
from cmdare.analytics.db import Database
from cmdare.analytics.server.http import create_app
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.dashboards.pages import mount
from cmdare.wire.events import encode_many
from tests.analytics.test_accounting import job

NAMES = ["a/b", "team x/run 1", "50% off", "it's \"quoted\"", "ünïcode-模型", "a%2Fb", "...", "x?y#z", "+plus+"]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("names") / "n.duckdb"
    events = []
    for i, name in enumerate(NAMES):
        events += job(name, f"node-{i}", "a2-highgpu-1g", False, "NVIDIA A100-SXM4-40GB", "t", 1, records=6)
    con = connect(p)
    Writer(con).write([("t", encode_many(events))])
    con.close()
    return p


@pytest.fixture(scope="module")
def client(db: Path) -> TestClient:
    return TestClient(create_app(Database(db), ui=mount))


def test_the_api_without_the_pages_answers_and_serves_no_ui(db: Path, client: TestClient) -> None:
    """The server layer imports no page: a front end hands ``ui`` in (the collector's root
    and the lake server do); an app made without it answers the API and has no /ui."""
    with TestClient(create_app(Database(db))) as bare:
        assert bare.get("/api/v1/jobs").json() == client.get("/api/v1/jobs").json()
        assert bare.get("/ui").status_code == 404 and client.get("/ui").status_code == 200


def seg(name: str) -> str:
    return urllib.parse.quote(name, safe="")


@pytest.mark.parametrize("name", NAMES)
def test_every_job_route_and_page_answers_for_an_odd_name(client: TestClient, name: str) -> None:
    r = client.get(f"/api/v1/jobs/{seg(name)}")
    assert r.status_code == 200, r.text
    assert r.json()["job"] == name
    for tail in ("steps", "goodput", "series", "advice", "scaling"):
        r = client.get(f"/api/v1/jobs/{seg(name)}/{tail}")
        assert r.status_code == 200, (tail, r.text)
    steps = client.get(f"/api/v1/jobs/{seg(name)}/steps").json()
    assert steps["rows"] and sum(r[steps["columns"].index("steps")] for r in steps["rows"]) == 600
    page = client.get(f"/ui/jobs/{seg(name)}")
    assert page.status_code == 200
    assert f'data-job="{_attr(name)}"' in page.text


def _attr(s: str) -> str:
    import html

    return html.escape(s, quote=True)


def test_a_slash_in_a_name_never_reaches_another_route(client: TestClient) -> None:
    # "a/b" is its own job; "a" is none: the encoded slash stays inside the name
    assert client.get("/api/v1/jobs/a%2Fb/steps").json()["rows"]
    r = client.get("/api/v1/jobs/a/b/steps")  # an unencoded slash is two segments: no route
    assert r.status_code == 404 and "\n" not in r.text
    assert client.get("/api/v1/jobs/a%252Fb").json()["job"] == "a%2Fb"  # a literal %2F, encoded once more


def test_the_remote_client_reaches_odd_names(db: Path) -> None:
    from cmdare.analytics.cli.client import Remote

    with TestClient(create_app(Database(db), ui=mount)) as tc:
        remote = Remote.__new__(Remote)  # the client's routes, over the in-process app
        calls = []

        def request(method, route, params=None, **_):
            calls.append(route)
            r = tc.request(method, route, params=params)
            assert r.status_code == 200, r.text
            return r.json()

        remote.request = request  # type: ignore[method-assign]
        for name in ("a/b", "team x/run 1", "50% off"):
            remote.call("steps", job=name)
    assert calls[0] == "/api/v1/jobs/a%2Fb/steps"


@pytest.mark.slow  # the whole report over nine jobs (6 s): the full run
def test_the_report_holds_every_odd_name_under_the_route_the_page_asks_for(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    r = CliRunner().invoke(cli, ["report", "--html", str(out), "--db", str(db)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    data = json.loads(text.split("window.CMDARE_DATA=", 1)[1].split(";</script>", 1)[0])
    for name in NAMES:
        base = "/api/v1/jobs/" + urllib.parse.quote(name, safe="!*'()")  # as encodeURIComponent
        assert data[base]["job"] == name
        for tail in ("/goodput", "/series", "/advice"):
            assert "error" not in data[base + tail], (name, tail)


@pytest.mark.parametrize("value", ["9999-12-31T23:59:59", "0001-01-01T00:00:00", "1969-12-31T23:59:59",
                                   "2200-01-01T00:00:01", "2199-12-31T23:00:00-05:00"])
def test_a_time_out_of_range_is_a_one_line_422(client: TestClient, value: str) -> None:
    from cmdare.analytics.resources import RESOURCES

    timed = [(r, p.name) for r in RESOURCES for p in r.params if p.name in ("since", "until") and r.method == "GET"]
    assert len(timed) >= 10
    for r, param in [*timed, (None, "since"), (None, "until")]:
        route = r.route.replace("{job}", seg("a/b")) if r else "/api/v1/fleet/heatmap"
        got = client.get(route, params={param: value})
        assert got.status_code == 422, (route, got.text)
        err = got.json()["error"]
        assert err == f"query.{param}: a time from 1970-01-01 to 2200-01-01 (UTC)", (route, err)
    r = client.post("/api/v1/findings/run", json={"since": value})
    assert r.status_code == 422 and "1970-01-01 to 2200-01-01" in r.json()["error"]


def test_times_at_the_range_edges_answer(client: TestClient) -> None:
    for value in ("1970-01-01T00:00:00", "2200-01-01T00:00:00", "2199-12-31T18:00:00-05:00"):
        r = client.get(f"/api/v1/jobs/{seg('a/b')}/goodput", params={"since": value})
        assert r.status_code == 200, (value, r.text)


@pytest.mark.parametrize(("text", "error"), [
    ("9999-12-31T23:59:59", "--since: '9999-12-31T23:59:59' is not a time from 1970-01-01 to 2200-01-01 (UTC)"),
    ("1969-12-31T23:59:59+00:00", "is not a time from 1970-01-01 to 2200-01-01 (UTC)"),
])
def test_a_time_argument_out_of_range_is_one_line(text: str, error: str) -> None:
    from cmdare.analytics.db import AnalyticsError, time_arg

    with pytest.raises(AnalyticsError) as e:
        time_arg("--since", text)
    assert error in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["100000d", "999999999d", "30000000d"])
def test_a_duration_reaching_before_1970_means_everything(text: str) -> None:
    import datetime as dt

    from cmdare.analytics.db import since_cutoff, time_arg

    assert since_cutoff(text) == time_arg("--since", text) == dt.datetime(1970, 1, 1)


def test_the_cli_refuses_a_time_out_of_range_in_one_line(db: Path) -> None:
    for flag, value in (("--until", "9999-12-31T23:59:59"), ("--until", "1900-01-01")):
        r = CliRunner().invoke(cli, ["goodput", "--job", "a/b", flag, value, "--db", str(db)])
        assert r.exit_code == 2 and "a time from 1970-01-01 to 2200-01-01" in r.output, r.output
        assert "Traceback" not in r.output and r.output.strip().count("\n") < 4
    r = CliRunner().invoke(cli, ["goodput", "--job", "a/b", "--until", "2200-01-01T00:00:00", "--db", str(db)])
    assert r.exit_code == 0, r.output
