"""The pages: one unit per page (its name, path, title and what it shows), HTML shells that
the shared script (static/app.js) fills from the HTTP API's JSON. Every script, style and
licence is vendored under static/ (uPlot, pinned in static/vendor/VENDOR.json): the pages
work offline and load nothing from another origin.

Authentication is the API's: with a bearer token set, a browser signs in once at
``/ui/login`` and gets a session cookie (HttpOnly, SameSite=Strict, a random session id,
never the token: analytics/server/sessions.py) that is accepted for GET and HEAD only, so the
cookie can read and never write; it expires, and ``sign out`` ends it.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from fastapi import Path, Request  # module level: FastAPI resolves the routes' annotations here
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from cmdare.analytics.server.sessions import COOKIE, Sessions, session_id

LOGIN_DELAY = 0.5  # seconds a wrong token waits for its answer
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".json": "application/json", ".txt": "text/plain; charset=utf-8", "": "text/plain; charset=utf-8"}


@dataclass(frozen=True)
class Page:
    """One page: its name (``data-page`` for the script), URL path, title, what it shows."""

    name: str
    path: str
    title: str
    shows: str


PAGES: dict[str, Page] = {p.name: p for p in (
    Page("fleet", "/ui", "Fleet", "nodes by liveness, GPUs by state, jobs, findings, alerts, goodput; a per-GPU "
         "utilisation heatmap; revocations on a timeline; the node table, filtered by label"),
    Page("jobs", "/ui/jobs", "Jobs", "every job with its speed and input-bound verdict"),
    Page("job", "/ui/jobs/{job}", "Job", "steps/s, step time and input wait over time; GPUs active of allocated; "
         "what to do (the findings' recommendations with evidence and fits); checkpoints; ranks, slowest first; "
         "goodput and badput; the job's findings"),
    Page("findings", "/ui/findings", "Findings", "stored findings, worst first, with their evidence"),
    Page("alerts", "/ui/alerts", "Alerts", "alerts firing, pending and resolved with rule, labels and start; "
         "the rules' health (every alert's generatorURL opens this page at its rule)"),
    Page("recommendations", "/ui/recommendations", "Recommendations", "for each job with findings: the "
         "recommendations they suggest, run, with evidence, fits and assumptions, or why one cannot answer"),
    Page("models", "/ui/models", "Models", "each stored fit: family, held-out error (inside and outside the fitted "
         "ranges), predicted vs measured, input ranges, coefficients"),
    Page("report", "", "Report", "analyze report --html: the fleet, jobs, each job, findings and alerts in one "
         "self-contained file"),
)}


def shell(page: Page, title: str, attrs: dict[str, str] | None = None, inline: dict[str, Any] | None = None,
          signout: bool = False) -> str:
    """The HTML of a page. ``inline``: the self-contained report (scripts, styles and the
    API answers inlined; no request leaves the file). ``signout``: a sign-out button (a
    collector with a token)."""
    data_attrs = "".join(f' data-{k}="{html.escape(v, quote=True)}"' for k, v in (attrs or {}).items())
    nav = "".join(f'<a href="{"#" + p.name if inline is not None else p.path}" data-nav="{p.name}">{p.title}</a>'
                  for p in PAGES.values() if p.path and "{" not in p.path)
    if inline is None:
        head = ('<link rel="stylesheet" href="/ui/static/vendor/uPlot.min.css">'
                '<link rel="stylesheet" href="/ui/static/style.css">'
                '<script src="/ui/static/vendor/uPlot.iife.min.js" defer></script>'
                '<script src="/ui/static/app.js" defer></script>')
        tail = ""
    else:
        data = json.dumps(inline["data"], separators=(",", ":")).replace("<", "\\u003c")  # no </script>, no <!--
        scripts = [f"window.CMDARE_DATA={data};", _script(static_text("vendor/uPlot.iife.min.js")),
                   _script(static_text("app.js"))]  # inline scripts run where they stand: last
        head = (f'<meta http-equiv="Content-Security-Policy" content="{report_csp(scripts)}">'
                f"<style>{static_text('vendor/uPlot.min.css')}</style><style>{static_text('style.css')}</style>")
        tail = "".join(f"<script>{x}</script>" for x in scripts)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">
<title>{html.escape(title)} · cmdare</title>{head}</head>
<body><header><span class="brand">cmdare</span><nav>{nav}</nav>
<div class="controls"><label>range <select id="range">
<option value="15m">15 min</option><option value="1h">1 h</option><option value="6h">6 h</option>
<option value="24h">24 h</option><option value="7d">7 d</option><option value="all">all</option></select></label>
<label>refresh <select id="refresh"><option value="0">off</option><option value="10">10 s</option>
<option value="30">30 s</option><option value="60">1 min</option></select></label>
<span id="updated"></span>{SIGNOUT if signout else ""}</div></header>
<div id="error" role="alert" hidden></div>
<main id="page" data-page="{page.name}"{data_attrs}><h1>{html.escape(title)}</h1><p class="loading">loading…</p></main>
{tail}</body></html>
"""


def report_csp(scripts: list[str]) -> str:
    """The offline report's Content-Security-Policy: only its own inline scripts (by their
    SHA-256) run, and the file loads and sends nothing (a hostile name in the data cannot
    add a script, a form target or a request)."""
    hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(x.encode()).digest()).decode() + "'"
                      for x in scripts)
    return (f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src data:; "
            "form-action 'none'; base-uri 'none'")


SIGNOUT = ('<form method="post" action="/ui/logout" class="signout"><button type="submit">sign out</button>'
           '</form>')


def _script(text: str) -> str:
    return text.replace("</script", "<\\/script")


def static_text(name: str) -> str:
    return static_bytes(name).decode("utf-8")


def static_bytes(name: str) -> bytes:
    """A vendored file (``name`` relative to static/), refused outside it."""
    parts = name.split("/")
    if not name or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        raise FileNotFoundError(name)
    res = resources.files("cmdare.dashboards").joinpath("static", *parts)
    if not res.is_file():
        raise FileNotFoundError(name)
    return res.read_bytes()


def login_page(next_: str, failed: bool, wait: float = 0.0) -> str:
    msg = '<p class="bad">That token is not the collector\'s.</p>' if failed else ""
    if wait > 0:
        msg = f'<p class="bad">Too many failed sign-ins from this address: try again in {math.ceil(wait)} s.</p>'
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>sign in · cmdare</title>
<link rel="stylesheet" href="/ui/static/style.css"></head><body class="login"><main>
<h1>cmdare</h1><p>This collector asks for its API token (the one given with --http-token-file).</p>{msg}
<form method="post" action="/ui/login"><input type="hidden" name="next" value="{html.escape(next_, quote=True)}">
<label>token <input type="password" name="token" autocomplete="current-password" autofocus></label>
<button type="submit">sign in</button></form></main></body></html>
"""


def safe_next(value: str) -> str:
    """Only a path of these pages: never another origin (an open redirect)."""
    if value.startswith("/ui") and not value.startswith("//") and "\\" not in value and len(value) <= 2048:
        return value
    return "/ui"


def parse_login(body: bytes) -> tuple[str, str]:
    form = parse_qs(body[:8192].decode("utf-8", "replace"), max_num_fields=8)
    return (form.get("token", [""])[0], safe_next(form.get("next", ["/ui"])[0]))


def mount(app: Any, token: Any, sessions: Sessions | None = None, throttle: Any = None) -> None:
    """The pages' routes on the collector's FastAPI app; ``sessions``: the signed-in browsers
    (the Guard in front checks them); ``throttle``: failed sign-ins (analytics/server/throttle.py)."""
    from cmdare.analytics.server.throttle import Throttle
    from cmdare.analytics.server.tokens import Tokens

    token = Tokens.of(token)  # the API's tokens (analytics/server/tokens.py), or None
    sessions = sessions if sessions is not None else Sessions()
    throttle = throttle if throttle is not None else Throttle()
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
               "Cache-Control": "no-store"}

    def page(name: str, attrs: dict[str, str] | None = None, title: str | None = None) -> HTMLResponse:
        p = PAGES[name]
        return HTMLResponse(shell(p, title or p.title, attrs, signout=bool(token)), headers=headers)

    def plain(name: str) -> Any:
        def endpoint() -> Any:
            return page(name)

        return endpoint

    for p in PAGES.values():  # every page of a fixed path: the registry is the route table
        if p.path and "{" not in p.path:
            app.add_api_route(p.path, plain(p.name), methods=["GET"], include_in_schema=False)

    from cmdare.analytics.server.routing import named

    @app.get(named("/ui/jobs/{job}"), include_in_schema=False)
    def job(job: str = Path(max_length=512)) -> Any:
        return page("job", {"job": job}, f"Job {job}")

    @app.get("/ui/static/{name:path}", include_in_schema=False)
    def static(name: str) -> Any:
        try:
            body = static_bytes(name)
        except (FileNotFoundError, OSError, ValueError):
            return Response(b"not found\n", 404, media_type="text/plain")
        ext = "." + name.rsplit(".", 1)[-1] if "." in name.rsplit("/", 1)[-1] else ""
        return Response(body, media_type=STATIC_TYPES.get(ext, "application/octet-stream"),
                        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "public, max-age=300"})

    @app.get("/ui/login", include_in_schema=False)
    def login_form(next: str = "/ui") -> Any:  # noqa: A002
        if not token:
            return RedirectResponse(safe_next(next), 303)
        return HTMLResponse(login_page(safe_next(next), False), headers=headers)

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Any:
        got, nxt = parse_login(await request.body())
        if not token:
            return RedirectResponse(nxt, 303)
        address = request.client.host if request.client else None
        wait = throttle.wait(address, got)
        if wait > 0:  # not even looked at
            return HTMLResponse(login_page(nxt, False, wait), 429,
                                headers={**headers, "Retry-After": str(math.ceil(wait))})
        who = token.match(got)
        if who is None:
            import asyncio

            throttle.failed(address, "login")
            await asyncio.sleep(LOGIN_DELAY)  # a guess costs time (each connection; the throttle bounds them)
            return HTMLResponse(login_page(nxt, True), 401, headers=headers)
        throttle.succeeded(address, got)
        r = RedirectResponse(nxt, 303)
        r.set_cookie(COOKIE, sessions.open(who), max_age=int(sessions.ttl), httponly=True, samesite="strict",
                     path="/", secure=request.url.scheme == "https")
        return r

    @app.post("/ui/logout", include_in_schema=False)
    def logout(request: Request) -> Any:
        # open to all (the Guard lets it through): it ends only the session its own cookie
        # names, and a cross-site form cannot send that cookie (SameSite=Strict)
        sessions.close(session_id({k.encode("latin-1"): v.encode("latin-1") for k, v in request.headers.items()}))
        r = RedirectResponse("/ui/login", 303, headers={"Cache-Control": "no-store"})
        r.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return r
