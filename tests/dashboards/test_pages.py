"""The pages in a real browser, against a collector API serving the simulated fleet (with
the findings ``analyze bottlenecks`` stored): each page loads with no console error and no
failed request, and shows what a person reads there."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmdare.analytics.cli import cli
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import MODELS, DemoFleet

EVIL = '<img src=x onerror="window.__pwned=1">'


@pytest.fixture(scope="module")
def fleet_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = DemoFleet(seed=1, t0=time.time() - 40 * 60)
    f.build()
    for m in MODELS[:5]:  # single-GPU runs of declared models: enough for a speed fit (the models page)
        f.job(m, "v100", intervals=8)
    t = time.time() - 20 * 60  # a job whose model name is markup: shown as text, never run
    f._ev(t, "evil-n0", "train_job", {"run": "r1", "rank": 0, "world_size": 1, "model": EVIL, "batch_size": 8}, "sim-evil")
    for i in range(1, 4):
        f._ev(t + 10 * i, "evil-n0", "train_steps", {
            "run": "r1", "rank": 0, "interval_seconds": 10.0, "steps": 10, "first_step": 10 * i - 9, "last_step": 10 * i,
            "examples": 80.0, "step_mean_seconds": 1.0, "wait_mean_seconds": 0.1, "wait_share_ratio": 0.1,
            "steps_per_second": 1.0, "examples_per_second": 8.0}, "sim-evil")
    for e in f.events:
        if e["node"] == "evil-n0":
            e["labels"] = {"team": "red"}  # not simulated=true: the label filter leaves it out
    db = tmp_path_factory.mktemp("pages") / "fleet.duckdb"
    con = connect(db)
    Writer(con).write([("sim", encode_many(f.events))])
    con.close()
    r = CliRunner().invoke(cli, ["bottlenecks", "--db", str(db)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["fit", "speed", "--db", str(db)])
    assert r.exit_code == 0, r.output
    return db


def serve(db: Path, token: str | None = None) -> Iterator[str]:
    from tests.conftest import serving

    with serving(db, token=token) as url:
        yield url


@pytest.fixture(scope="module")
def api(fleet_db: Path) -> Iterator[str]:
    yield from serve(fleet_db)


def gpus_in(api: str) -> int:
    body = json.dumps({"query": 'SELECT count(*) FROM (SELECT DISTINCT node, "index" FROM gpu_samples)'}).encode()
    req = urllib.request.Request(api + "/api/v1/sql", body, {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())["rows"][0][0]


def test_the_fleet_page_shows_the_strip_a_row_per_gpu_and_the_nodes(page, api: str, fleet_db: Path) -> None:
    p = page.open(api + "/ui?range=all")
    page.shot("fleet", docs=True)  # the first screen, as a person opens it
    n = gpus_in(api)
    assert p.get_attribute(".heat", "data-rows") == str(n)
    strip = {p.inner_text(f'[data-stat="{k}"] .v'): k for k in ("GPUs busy", "GPUs idle", "GPUs throttled", "GPUs failing")}
    counts = {k: int(v.replace(",", "")) for v, k in strip.items()}
    summary = json.loads(urllib.request.urlopen(api + "/api/v1/fleet").read())
    g = summary["gpus"]
    assert g["busy"] + g["idle"] + g["failing"] == n and g["idle"] >= 1 and g["failing"] >= 1
    assert 1 <= g["throttled"] <= g["busy"] + g["idle"]  # throttled GPUs are counted busy or idle too
    assert summary["gpus"]["busy"] == int(p.inner_text('[data-stat="GPUs busy"] .v'))
    assert int(p.inner_text('[data-stat="findings"] .v')) == sum(summary["findings"].values()) >= 5
    assert counts  # the strip is there
    # hovering a cell names the GPU, its job and its utilisation
    box = p.locator(".heat canvas").bounding_box()
    p.mouse.move(box["x"] + 240, box["y"] + 10)
    tip = p.inner_text(".tip")
    assert "GPU 0" in tip and "utilisation" in tip and "job sim-" in tip
    # the revocation of the spot VM is on the timeline, the node table filters
    assert int(p.get_attribute(".timeline", "data-marks")) >= 1
    p.fill("input.filter", "sim-ps-5-n7")
    rows = p.locator("section:has(h2:text-matches('^Nodes')) tbody tr")
    assert rows.count() == 1 and "sim-ps-5-n7" in rows.first.inner_text()
    page.shot("fleet-used")
    assert page.problems == []


def test_the_ps_bound_jobs_page_names_the_finding_and_its_numbers(page, api: str) -> None:
    p = page.open(api + "/ui/jobs/sim-ps-5?range=all")
    page.shot("job", docs=True)
    card = p.locator('.finding[data-kind="ps_bound"]')
    text = card.inner_text()
    assert "ps_bound · critical" in text and "8 workers x 1 PS" in text and "% of linear scaling" in text
    card.locator("summary").click()
    assert '"workers": 8' in card.locator(".ev").inner_text()
    # ranks, slowest first; 4 charts drawn by uPlot (steps/s, step time, input wait, GPU use);
    # goodput parts that add up to the wall
    ranks = p.locator("section:has(h2:text('Ranks, slowest first')) tbody tr")
    assert ranks.count() == 8
    means = [float(ranks.nth(i).locator("td").nth(4).inner_text()) for i in range(8)]
    assert means == sorted(means, reverse=True)
    assert p.locator("section:has(h2:text-matches('^Over time')) .uplot").count() == 4
    util = p.locator("div:has(> h3:text-matches('^GPU utilisation')) .chart").get_attribute("data-points")
    assert int(util) > 10  # a stepping job's GPUs over time too
    widths = p.eval_on_selector_all(".bar span", "els => els.map(e => parseFloat(e.style.width))")
    assert abs(sum(widths) - 100) < 0.5
    # how the job's run stands: each rank finished (the simulated fleet's runs end)
    assert p.inner_text('[data-stat="state"] .v') == "finished"
    runs = p.locator("section:has(h2:text-matches('^Runs')) tbody tr")
    assert runs.count() == 8 and all("finished" in runs.nth(i).inner_text() for i in range(8))
    assert page.problems == []


def test_a_job_page_says_what_to_do_its_gpus_and_its_checkpoints(page, api: str) -> None:
    p = page.open(api + "/ui/jobs/sim-ps-5?range=all")
    p.wait_for_selector("section[data-ready]")  # the advice: detectors and recommenders run now
    card = p.locator('[data-recommender="cluster"]')
    text = card.inner_text()
    assert "analyze recommend cluster --from-job sim-ps-5" in text and "PS-bound now" in text
    assert "workers 8, ps 4" in text  # the PS count that removes the bottleneck
    p.wait_for_selector("section[data-scaling]")
    sc = p.locator("section[data-scaling]")
    assert sc.locator(".chart").get_attribute("data-measured") == "3"  # sim-ps-3, -4, -5: 2, 4 and 8 workers
    assert "no cluster fit: analyze fit cluster" in sc.inner_text() and sc.locator(".uplot").count() == 1
    p = page.open(api + "/ui/jobs/sim-idle-8?range=all")
    p.wait_for_selector("section[data-ready]")
    assert p.inner_text('[data-stat="GPUs active / allocated"] .v') == "2 / 4"  # 2 of its 4 GPUs idle
    assert p.locator("section:has(h2:text-is(\"GPUs of the job's nodes\")) tr.hl").count() == 2
    p = page.open(api + "/ui/jobs/sim-ckpt-11?range=all")
    p.wait_for_selector("section[data-ready]")
    ck = p.locator("section:has(h2:text-matches('^Checkpoints')) tbody tr")
    assert ck.count() >= 10 and "save" in ck.first.inner_text()
    assert page.problems == []


def test_the_recommendations_page_answers_each_flagged_job_or_says_why_not(page, api: str) -> None:
    p = page.open(api + "/ui/recommendations?range=all")
    jobs = p.eval_on_selector_all("section.advice", "els => els.map(e => e.dataset.job)")
    assert {"sim-ps-5", "sim-input-6", "sim-idle-8"} <= set(jobs)
    ps = p.locator('section.advice[data-job="sim-ps-5"]').inner_text()
    assert "workers 8, ps 4" in ps
    inp = p.locator('section.advice[data-job="sim-input-6"]').inner_text()
    assert "data-workers" in inp and ("cannot answer" in inp or "workers" in inp)
    # issue 51: a finding no recommender answers shows its detector's own action, never
    # "no recommendation" (the idle job: release its idle GPUs)
    p.wait_for_selector('section.advice[data-job="sim-idle-8"] [data-action="gpu_idle"]')
    idle = p.locator('section.advice[data-job="sim-idle-8"]').inner_text()
    assert "release the idle GPUs" in idle and "suggest no recommendation" not in idle
    assert page.problems == []


def test_the_models_page_shows_each_fit_with_its_held_out_plot_and_ranges(page, api: str) -> None:
    p = page.open(api + "/ui/models")
    fit = p.locator('section.fit[data-kind="speed"]')
    assert "held-out MAPE" in fit.inner_text() and "families tried:" in fit.inner_text()
    fits = json.loads(urllib.request.urlopen(api + "/api/v1/fits").read())["fits"]
    speed = next(f for f in fits if f["kind"] == "speed")
    assert int(fit.locator("canvas.scatter").get_attribute("data-points")) == speed["rows"] == len(speed["held_out"])
    assert all(m > 0 and pr > 0 for _, m, pr in speed["held_out"])
    assert "flops_per_step" in fit.inner_text() and fit.get_attribute("id") == "fit-" + speed["fit_id"]
    page.shot("models")
    assert page.problems == []


def test_the_fleet_page_filters_by_node_label(page, api: str) -> None:
    p = page.open(api + "/ui?range=all")
    everyone = int(p.get_attribute(".heat", "data-rows"))
    p.fill("form.labelfilter input", "simulated=true")
    p.click("form.labelfilter button")
    p.wait_for_function("location.search.includes('label=simulated')")
    p.wait_for_selector("main[data-ready='1']")
    assert "evil-n0" not in p.inner_text("section:has(h2:text-matches('^Nodes'))")
    assert 0 < int(p.get_attribute(".heat", "data-rows")) <= everyone
    assert page.problems == []


def test_a_fleet_too_large_for_gpu_rows_shows_jobs_and_a_click_drills_into_one(page, api: str) -> None:
    # the row per job the page falls back to past 10,000 GPUs, asked for here by the URL
    p = page.open(api + "/ui?range=all&group=job")
    heat = json.loads(urllib.request.urlopen(api + "/api/v1/fleet/heatmap?group=job").read())
    assert p.get_attribute(".heat", "data-group") == "job"
    assert int(p.get_attribute(".heat", "data-rows")) == len(heat["rows"]) >= 3
    assert "jobs (" in p.inner_text("section:has(.heat) .legend")
    page.shot("fleet-jobs")
    i = next(k for k, r in enumerate(heat["rows"]) if r["job"] is not None and r["gpus"] >= 2)
    job = heat["rows"][i]["job"]
    box = p.locator(".heat canvas").bounding_box()
    cell = 12 if len(heat["rows"]) <= 400 else 2  # the page's row height at this many rows
    p.mouse.move(box["x"] + 300, box["y"] + 4 + cell * i + cell / 2)
    assert job in p.inner_text(".tip") and "mean utilisation" in p.inner_text(".tip")
    p.mouse.click(box["x"] + 300, box["y"] + 4 + cell * i + cell / 2)
    p.wait_for_function("new URLSearchParams(location.search).get('job') !== null")
    p.wait_for_selector("main[data-ready='1']")
    assert "group=" not in p.evaluate("location.search") and "range=all" in p.evaluate("location.search")
    assert p.get_attribute(".heat", "data-group") == "gpu"
    assert int(p.get_attribute(".heat", "data-rows")) == heat["rows"][i]["gpus"]
    assert f"of job {job}" in p.inner_text("section:has(.heat) h2")
    page.shot("fleet-drill")
    nodes = p.locator("section:has(h2:text-matches('^Nodes')) tbody tr")
    assert nodes.count() >= 1 and all(job in nodes.nth(k).inner_text() for k in range(nodes.count()))
    p.click("a.back")  # back to the whole fleet
    p.wait_for_function("new URLSearchParams(location.search).get('job') === null")
    p.wait_for_selector("main[data-ready='1']")
    assert p.get_attribute(".heat", "data-group") == "gpu"  # a small fleet: GPU by GPU again
    assert page.problems == []


def test_findings_and_jobs_pages_link_to_each_job(page, api: str) -> None:
    p = page.open(api + "/ui/findings?range=all")
    kinds = set(p.eval_on_selector_all(".finding", "els => els.map(e => e.dataset.kind)"))
    assert {"ps_bound", "input_bound", "straggler", "gpu_idle"} <= kinds
    p.click('.finding[data-kind="input_bound"] a:text("job page")')
    p.wait_for_selector("main[data-ready]")
    assert "/ui/jobs/sim-input-" in p.url and p.locator('.finding[data-kind="input_bound"]').count() == 1
    p = page.open(api + "/ui/jobs?range=all")
    assert p.locator("tbody tr").count() >= 12
    assert page.problems == []


def test_markup_in_the_data_is_shown_as_text_never_run(page, api: str) -> None:
    p = page.open(api + "/ui/jobs?range=all")
    assert p.locator(f"td:text-is('{EVIL}')").count() == 1  # the model name, as its characters
    assert p.evaluate("window.__pwned") is None and p.locator("main img").count() == 0
    p = page.open(api + "/ui/jobs/sim-evil?range=all")
    assert EVIL in p.inner_text('[data-stat="accelerator"]') and p.evaluate("window.__pwned") is None
    assert page.problems == []


def test_state_is_in_the_url_so_a_link_can_be_shared(page, api: str) -> None:
    p = page.open(api + "/ui?range=24h&refresh=30")
    assert p.input_value("#range") == "24h" and p.input_value("#refresh") == "30"
    p.select_option("#range", "6h")
    p.wait_for_function("location.search.includes('range=6h')")
    assert "refresh=30" in p.url
    assert p.get_attribute('nav a[data-nav="jobs"]', "href") == "/ui/jobs?range=6h"
    p.select_option("#refresh", "0")
    p.wait_for_function("!location.search.includes('refresh')")
    assert page.problems == []


def test_an_api_error_is_one_line_on_the_page_not_a_blank(page, api: str) -> None:
    page.page.goto(api + "/ui/jobs/no-such-job")
    page.page.wait_for_selector("main[data-ready]")
    assert page.page.get_attribute("main", "data-ready") == "error"
    assert "no such job" in page.page.inner_text("#error")


# -- the attacker's side ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def guarded(fleet_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import shutil

    db = tmp_path_factory.mktemp("guarded") / "g.duckdb"
    shutil.copy(fleet_db, db)
    yield from serve(db, token="s3cret-token")


def test_with_a_token_a_browser_signs_in_once_and_its_cookie_only_reads(page, guarded: str) -> None:
    p = page.page
    p.goto(guarded + "/ui/jobs/sim-ps-5?range=all")
    assert "/ui/login?next=" in p.url  # not the page, not its data
    p.fill("input[name=token]", "wrong")
    p.click("button[type=submit]")
    assert "not the collector's" in p.inner_text("main")
    p.fill("input[name=token]", "s3cret-token")
    p.click("button[type=submit]")
    p.wait_for_selector("main[data-ready]")
    assert p.url.endswith("/ui/jobs/sim-ps-5?range=all") and p.get_attribute("main", "data-ready") == "1"
    [cookie] = p.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and "s3cret" not in cookie["value"]
    # the cookie reads; it cannot write (POST needs the bearer token)
    status = p.evaluate("""async () => (await fetch('/api/v1/findings/run', {method: 'POST',
        headers: {'Content-Type': 'application/json'}, body: '{}'})).status""")
    assert status == 401
    assert p.evaluate("async () => (await fetch('/api/v1/nodes')).status") == 200
    # sign out: the session ends, the cookie goes, the pages ask for the token again
    p.click("form.signout button")
    p.wait_for_url("**/ui/login")
    assert p.context.cookies() == []
    p.goto(guarded + "/ui/jobs")
    assert "/ui/login?next=" in p.url


def test_login_refuses_an_open_redirect_and_pages_send_a_strict_policy(guarded: str) -> None:
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(guarded)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request("POST", "/ui/login", body="token=s3cret-token&next=//evil.example/x",
              headers={"Content-Type": "application/x-www-form-urlencoded"})
    r = c.getresponse()
    r.read()
    assert r.status == 303 and r.getheader("Location") == "/ui"
    c.request("GET", "/ui", headers={"Authorization": "Bearer s3cret-token"})
    r = c.getresponse()
    body = r.read().decode()
    assert r.status == 200 and "script-src 'self'" in r.getheader("Content-Security-Policy")
    assert "frame-ancestors 'none'" in r.getheader("Content-Security-Policy") and "s3cret" not in body
    # without a token: the API answers 401, a page sends to the login; the static files are open
    for path, status in (("/api/v1/nodes", 401), ("/ui/findings", 303), ("/ui/static/app.js", 200),
                         ("/ui/static/../pages.py", 404), ("/ui/static/%2e%2e/pages.py", 404),
                         ("/ui/static/vendor/../../pages.py", 404), ("/ui/static/.hidden", 404)):
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        assert r.status == status, path
    c.close()


def test_the_vendored_charting_library_is_the_pinned_one() -> None:
    import hashlib

    from cmdare.dashboards.pages import static_bytes

    lock = json.loads(static_bytes("vendor/VENDOR.json"))["uplot"]
    assert lock["version"] == "1.6.32" and lock["licence"] == "MIT"
    for name, digest in lock["files"].items():
        assert hashlib.sha256(static_bytes("vendor/" + name)).hexdigest() == digest, name
    for own in ("app.js", "style.css"):  # nothing loaded from another origin
        assert b"http://" not in static_bytes(own) and b"https://" not in static_bytes(own)


# -- the report ---------------------------------------------------------------------------------

@pytest.mark.slow  # the whole offline report rendered in a browser
def test_the_html_report_is_the_pages_in_one_file_that_makes_no_request(page, fleet_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "fleet.html"
    r = CliRunner().invoke(cli, ["report", "--html", str(out), "--db", str(fleet_db)])
    assert r.exit_code == 0, r.output
    assert "report: job 1/" in r.stderr and "wrote " in r.stdout
    text = out.read_text()
    assert "</script" not in text.split("window.CMDARE_DATA=", 1)[1].split("</script>", 1)[0]
    # only the file's own three scripts may run (by hash), and it may load or send nothing
    csp = text.split('http-equiv="Content-Security-Policy" content="', 1)[1].split('"', 1)[0]
    assert csp.startswith("default-src 'none'; script-src 'sha256-") and csp.count("'sha256-") == 3
    assert "'unsafe-inline'" not in csp.split("script-src", 1)[1].split(";", 1)[0]
    requests: list[str] = []
    page.page.on("request", lambda q: requests.append(q.url))
    p = page.open(out.as_uri())
    assert requests == [out.as_uri()]  # scripts, styles and data are all in the file
    sections = p.eval_on_selector_all(".page[data-page]", "els => els.map(e => e.id)")
    assert sections[:2] == ["fleet", "jobs"] and "job-sim-ps-5" in sections and sections[-4:] == ["findings", "recommendations", "alerts", "models"]
    # each job's page is folded under a line saying how it stands, with contents up top: the
    # report of this fleet's 17 jobs was 37,393 px tall (issue 66)
    jobs = p.locator("details.page[data-page=job]")
    assert jobs.count() >= 10 and p.locator("details.page[open]").count() == 0
    assert p.evaluate("document.documentElement.scrollHeight") < 8_000
    assert "finished · 1 finding" in p.inner_text("#job-sim-ps-5 > summary")
    assert p.locator("nav.contents a[href='#job-sim-ps-5']").count() == 1
    assert p.evaluate("window.__pwned") is None and EVIL in p.inner_text("#jobs")
    # links between the pages stay inside the file, and open the page they lead to
    p.click("#jobs a:text-is('sim-ps-5')")
    assert p.url.endswith("#job-sim-ps-5") and p.locator("#job-sim-ps-5").get_attribute("open") is not None
    ps = p.locator("#job-sim-ps-5")
    assert "8 workers x 1 PS" in ps.locator('.finding[data-kind="ps_bound"]').inner_text()
    assert ps.locator("section:has(> h2:text-matches('^Over time')) .uplot").count() == 4
    page.shot("report")
    assert page.problems == []


@pytest.mark.slow  # the offline report rendered in a browser
def test_a_report_for_one_job_and_its_errors(fleet_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "one.html"
    r = CliRunner().invoke(cli, ["report", "--html", str(out), "--job", "sim-ps-5", "--since", "7d", "--db", str(fleet_db)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text().split("window.CMDARE_DATA=", 1)[1].split(";</script>", 1)[0])
    assert data["$report"]["jobs"] == ["sim-ps-5"] and data["$report"]["since"]
    assert data["/api/v1/jobs/sim-ps-5/series"]["ranks"][0]["node"].startswith("sim-ps-5-n")
    r = CliRunner().invoke(cli, ["report", "--html", str(out), "--job", "sim-ps-5", "--since", "7d", "--json",
                                 "--db", str(fleet_db)])
    assert r.exit_code == 0 and json.loads(r.stdout) == {"html": str(out), "bytes": out.stat().st_size,
                                                         "jobs": ["sim-ps-5"]}
    before = out.read_bytes()
    r = CliRunner().invoke(cli, ["report", "--html", str(out), "--job", "nope", "--db", str(fleet_db)])
    assert r.exit_code == 1 and "no such job 'nope'" in r.output and len(r.output.strip().splitlines()[-1]) < 200
    assert out.read_bytes() == before  # nothing half-written over the last report
    r = CliRunner().invoke(cli, ["report", "--html", str(tmp_path), "--db", str(fleet_db)])
    assert r.exit_code == 1 and "is a directory" in r.output
    r = CliRunner().invoke(cli, ["report", "--html", str(out), "--db", str(tmp_path / "none.duckdb")])
    assert r.exit_code == 1 and "no such database" in r.output


@pytest.mark.slow  # two whole reports built (17 s): the full run
def test_a_report_read_on_two_threads_over_one_held_connection_is_the_sequential_one(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    import datetime as dt

    from cmdare.analytics.db import Database
    from cmdare.dashboards import report

    # a fleet of two days ago: no node near its liveness edge while the two reports are read
    f = DemoFleet(seed=1, t0=time.time() - 2 * 86400)
    f.build()
    con = connect(tmp_path / "old.duckdb")
    Writer(con).write([("sim", encode_many(f.events))])
    con.close()
    assert CliRunner().invoke(cli, ["bottlenecks", "--db", str(tmp_path / "old.duckdb")]).exit_code == 0
    db = Database(tmp_path / "old.duckdb")
    since = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(days=3)
    got = []
    for workers, hold in ((1, False), (2, True)):
        monkeypatch.setattr(report, "WORKERS", workers)
        with db.held() if hold else contextlib.nullcontext():
            d = report.gather(report.local_get(db), None, since)
        d["$report"].pop("made")
        got.append(d)
    differ = [k for k in got[0] if json.dumps(got[0][k]) != json.dumps(got[1].get(k))]
    assert not differ, [(k, json.dumps(got[0][k])[:600], json.dumps(got[1].get(k))[:600]) for k in differ]
    assert list(got[0]) == list(got[1]) and len(got[0]["$report"]["jobs"]) >= 5  # in the same order
    # a write within a hold (a read-only connection would refuse it) lets the hold go first
    with db.held():
        with db.read() as con:
            n = con.execute("SELECT count(*) FROM nodes").fetchone()[0]
        with db.write() as con:
            con.execute("INSERT INTO nodes (node) VALUES ('written-while-held')")
        with db.read() as con:
            assert con.execute("SELECT count(*) FROM nodes").fetchone()[0] == n + 1


def test_the_readme_shows_the_pages_as_the_suite_took_them() -> None:
    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    for name in ("fleet", "job"):
        img = ROOT / "docs" / "img" / f"{name}.png"
        assert f"](docs/img/{name}.png)" in readme.split("## Architecture")[0], name  # on the first screen
        assert img.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and 20_000 < img.stat().st_size < 600_000


def test_ui_url_is_checked_and_a_credential_in_it_is_never_quoted() -> None:
    from cmdare.analytics.server.service import parse_http

    cfg = parse_http("127.0.0.1:0", ui_url="https://cmdare.example.com/fleet/")
    assert cfg is not None and cfg.ui_url == "https://cmdare.example.com/fleet"
    with pytest.raises(ValueError) as e:
        parse_http("127.0.0.1:0", ui_url="https://admin:hunter2@cmdare.example.com")
    assert "hunter2" not in str(e.value) and "admin" not in str(e.value) and "credentials" in str(e.value)
    for bad in ("javascript:alert(1)", "ftp://x/", "https:///nohost", "https://h/?q=1", "x" * 5000):
        with pytest.raises(ValueError, match="--ui-url") as e:
            parse_http("127.0.0.1:0", ui_url=bad)
        assert len(str(e.value)) < 120  # one line, a short excerpt
    assert parse_http("off", ui_url="https://ok.example") is None  # checked even with the API off
    with pytest.raises(ValueError):
        parse_http("off", ui_url="https://u:p@ok.example")


def test_a_kubernetes_pods_job_page_shows_its_idle_gpus_and_the_finding(page, tmp_path: Path) -> None:
    """Issue 55: a pod that never called ``track`` (its GPUs named by the kubelet) has a job
    page: its GPUs, none active, the gpu_idle finding in what to do, no failed request."""
    from tests.analytics.test_kubernetes_jobs import node

    for api in serve(node(tmp_path)):
        p = page.open(api + "/ui/jobs/" + urllib.request.quote("nlp/bert-0", safe="") + "?range=all")
        p.wait_for_selector("section[data-ready]")
        assert p.inner_text('[data-stat="GPUs active / allocated"] .v') == "0 / 2"
        assert p.inner_text('[data-stat="state"] .v') == "pod (no steps)"
        # no declaration: the GPUs' own name, and no model shown as the accelerator's detail
        acc = p.inner_text('[data-stat="accelerator"]')
        assert "A100" in acc and "model not declared" in acc
        # a GPU's full name is one line of the strip, not four (the value in a smaller type)
        lines = p.eval_on_selector('[data-stat="accelerator"] .v', """e => { const r = document.createRange();
            r.selectNodeContents(e); return [...r.getClientRects()].map(x => Math.round(x.top)); }""")
        assert len(set(lines)) == 1, (lines, p.inner_text('[data-stat="accelerator"] .v'))
        assert p.locator("section:has(h2:text-is(\"GPUs of the job's nodes\")) tr.hl").count() == 2
        util = p.locator("div:has(> h3:text-matches('^GPU utilisation')) .chart")
        assert int(util.get_attribute("data-points")) > 50  # its GPUs over time, though it sent no step
        assert p.locator("div:has(> h3:text-matches('^steps/s')) .chart").get_attribute("data-points") == "0"
        todo = p.inner_text("section:has(h2:text-matches('^What to do'))")
        assert "gpu_idle k8s-n0" in todo and "release the idle GPUs" in todo  # the detector, run now
        gp = p.inner_text("section:has(h2:text-matches('^Goodput'))")
        assert "idle_accelerators\t1\t100" in gp
        page.shot("job-kubernetes-pod")
    assert page.problems == []
