"""The pages' sign-in sessions (analytics/server/sessions.py) and the Guard that checks them
(analytics/server/http.py): only a live session's exact id signs a browser in; sessions expire,
end at sign-out and with the token; the store is bounded; every answer is no-store."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cmdare.analytics.db import Database
from cmdare.analytics.server.http import Guard, Limits, create_app
from cmdare.analytics.server.sessions import COOKIE, MAX_SESSIONS, SESSION_TTL, Sessions, session_id
from cmdare.analytics.server.tokens import digest
from cmdare.collector.db import connect
from cmdare.dashboards.pages import mount

TOKEN = "s3cret-token"


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def hdr(cookie: str) -> dict[bytes, bytes]:
    return {b"cookie": cookie.encode("latin-1")}


def test_the_exact_session_id_signs_in() -> None:
    s = Sessions()
    sid = s.open(TOKEN)
    assert len(sid) == 43 and TOKEN not in sid  # 32 random bytes (256 bits), URL-safe base64
    assert s.check(session_id(hdr(f"{COOKIE}={sid}")), TOKEN)
    assert s.check(session_id(hdr(f"theme=dark; {COOKIE}={sid}; x=1")), TOKEN)
    assert s.open(TOKEN) != sid  # each sign-in its own session


@pytest.mark.parametrize("cookie", [
    "",  # no cookie
    f"{COOKIE}=",  # empty value: a prefix of everything
    "{COOKIE}={sid1}",  # a prefix
    "{COOKIE}={sid_1}",  # all but the last character
    "{COOKIE}={sid}0",  # the id and more
    "{COOKIE}={SID}",
    f"{COOKIE}={TOKEN}",  # the token itself is not a session
    f"{COOKIE}={digest(TOKEN)}",  # nor what the store keeps of it
    "{COOKIE}={key}",  # nor the store's key of the session
    f"{COOKIE.upper()}={{sid}}",  # another cookie's name
    f"x{COOKIE}={{sid}}",
    f"{COOKIE}",  # a name alone
])
def test_anything_but_a_live_sessions_exact_id_is_refused(cookie: str) -> None:
    s = Sessions()
    sid = s.open(TOKEN)
    text = cookie.format(COOKIE=COOKIE, sid=sid, sid1=sid[:1], sid_1=sid[:-1], SID=sid.swapcase(),
                         key=hashlib.sha256(sid.encode()).hexdigest())
    assert not s.check(session_id(hdr(text)), TOKEN)
    assert s.check(sid, TOKEN)  # the session itself still stands


def test_a_session_expires_after_its_ttl_and_is_forgotten() -> None:
    clock = Clock()
    s = Sessions(ttl=3600, clock=clock)
    sid = s.open(TOKEN)
    clock.t += 3599
    assert s.check(sid, TOKEN)
    clock.t += 1  # at the expiry exactly: over
    assert not s.check(sid, TOKEN) and len(s) == 0
    assert SESSION_TTL == 12 * 3600.0  # the documented default


def test_a_session_ends_with_its_token_and_at_sign_out() -> None:
    s = Sessions()
    a, b = s.open(TOKEN), s.open(TOKEN)
    assert not s.check(a, "rotated-token")  # a collector restarted with a new token
    assert s.close(a) and not s.check(a, TOKEN) and s.check(b, TOKEN)
    assert not s.close(a) and not s.close(None) and not s.close("")
    assert not s.check(None, TOKEN)


def test_the_store_is_bounded_the_oldest_going_first_and_expired_ones_pruned() -> None:
    clock = Clock()
    s = Sessions(ttl=100, max_sessions=3, clock=clock)
    first = [s.open(TOKEN) for _ in range(3)]
    fourth = s.open(TOKEN)
    assert len(s) == 3 and not s.check(first[0], TOKEN) and all(s.check(x, TOKEN) for x in (*first[1:], fourth))
    clock.t += 100
    s.open(TOKEN)
    assert len(s) == 1  # the expired ones went at the next sign-in
    assert MAX_SESSIONS == 10_000
    with pytest.raises(ValueError):
        Sessions(ttl=0)
    with pytest.raises(ValueError):
        Sessions(max_sessions=0)
    one = Sessions(ttl=1, max_sessions=1)  # the smallest store there is
    a, b = one.open(TOKEN), one.open(TOKEN)
    assert not one.check(a, TOKEN) and one.check(b, TOKEN)


def test_sign_ins_with_one_token_end_only_that_tokens_sessions() -> None:
    """The second hostile round: 10,000 sign-ins with the team token ended the admin's
    session. Now a token's own oldest session goes; another token's never does."""
    from cmdare.analytics.server.tokens import Tokens, digest

    toml = (f'[[token]]\nname = "ops"\nscope = "admin"\nsha256 = "{digest("admin-secret")}"\n'
            f'[[token]]\nname = "vision"\nscope = "read"\nsha256 = "{digest("team-secret")}"\n'
            'labels = { team = "vision" }\n'
            f'[[token]]\nname = "nlp"\nscope = "read"\nsha256 = "{digest("nlp-secret")}"\n')
    from cmdare.analytics.server.tokens import parse

    tokens = Tokens(parse(toml, "tokens.toml"))
    ops, vision, nlp = tokens.all()
    s = Sessions(max_per_token=100, max_sessions=200)
    admin = s.open(ops)
    team = [s.open(vision) for _ in range(10_000)]
    assert s.token(admin, tokens) == ops  # still signed in
    assert sum(s.check(x, tokens) for x in team) == 100 and s.check(team[-1], tokens)  # the newest 100
    others = [s.open(nlp) for _ in range(99)]  # 200 sessions in all: the store is full
    s.open(nlp)  # the token holding the most (vision, 100) gives up its oldest
    assert s.check(admin, tokens) and len(s) == 200 and all(s.check(x, tokens) for x in others)
    assert sum(s.check(x, tokens) for x in team) == 99
    assert s.close(admin) and not s.close(admin) and "ops" not in s._of  # noqa: SLF001


def test_a_huge_cookie_header_is_read_only_to_its_bound() -> None:
    from cmdare.analytics.server.sessions import MAX_COOKIE_HEADER

    s = Sessions()
    sid = s.open(TOKEN)
    tail = f"; {COOKIE}={sid}"
    exact = "x=" + "a" * (MAX_COOKIE_HEADER - 2 - len(tail)) + tail
    assert len(exact) == MAX_COOKIE_HEADER == 8192 and session_id(hdr(exact)) == sid
    assert session_id(hdr("x=a" + exact[2:])) == sid[:-1]  # one byte over: the end is not read
    assert session_id(hdr("x=" + "a" * 10_000 + f"; {COOKIE}={sid}")) is None
    assert session_id(hdr(f"{COOKIE}={sid}; " + "x=" + "a" * 10_000)) == sid


# -- through the app ----------------------------------------------------------------------------

@pytest.fixture
def app(tmp_path: Path):
    clock = Clock()
    sessions = Sessions(ttl=600, clock=clock)
    connect(str(tmp_path / "x.duckdb")).close()  # a collector's database, empty
    inner = create_app(Database(tmp_path / "x.duckdb"), TOKEN, Limits(), sessions=sessions, ui=mount)
    client = TestClient(Guard(inner, TOKEN, Limits(), lambda: None, sessions), follow_redirects=False)
    return client, clock, sessions


def _sign_in(client: TestClient, token: str = TOKEN):
    return client.post("/ui/login", content=f"token={token}&next=/ui/jobs",
                       headers={"Content-Type": "application/x-www-form-urlencoded"})


def test_sign_in_gives_a_cookie_that_reads_until_it_expires(app) -> None:
    client, clock, sessions = app
    r = _sign_in(client)
    assert r.status_code == 303 and r.headers["location"] == "/ui/jobs"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=600" in cookie and TOKEN not in cookie
    assert client.get("/api/v1/nodes").status_code == 200
    page = client.get("/ui/jobs")
    assert page.status_code == 200 and 'action="/ui/logout"' in page.text
    assert client.post("/api/v1/findings/run", json={}).status_code == 401  # the cookie never writes
    clock.t += 600
    assert client.get("/api/v1/nodes").status_code == 401
    assert client.get("/ui/jobs").headers["location"].startswith("/ui/login?next=")
    assert len(sessions) == 0


def test_sign_out_ends_the_session_even_for_a_copied_cookie(app) -> None:
    client, _, sessions = app
    _sign_in(client)
    stolen = client.cookies.get(COOKIE)
    r = client.post("/ui/logout")
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert f'{COOKIE}=""' in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
    assert client.get("/api/v1/nodes", cookies={COOKIE: stolen}).status_code == 401
    assert len(sessions) == 0


def test_sign_out_without_a_session_or_with_anothers_id_ends_nothing_else(app) -> None:
    client, _, sessions = app
    _sign_in(client)
    mine = client.cookies.get(COOKIE)
    client.cookies.clear()
    assert client.post("/ui/logout").status_code == 303  # nothing to end: still a clean answer
    assert client.post("/ui/logout", cookies={COOKIE: mine[:-1]}).status_code == 303
    assert client.get("/api/v1/nodes", cookies={COOKIE: mine}).status_code == 200 and len(sessions) == 1


def test_a_wrong_token_opens_no_session(app) -> None:
    client, _, sessions = app
    r = _sign_in(client, "wrong")
    assert r.status_code == 401 and "set-cookie" not in r.headers and len(sessions) == 0


def test_every_answer_is_no_store_but_the_static_files(app) -> None:
    client, _, _ = app
    h = {"Authorization": f"Bearer {TOKEN}"}
    for path in ("/api/v1/nodes", "/api/v1/no-such", "/ui/jobs", "/healthz", "/ui/login"):
        assert client.get(path, headers=h).headers.get("cache-control") == "no-store", path
    assert client.get("/api/v1/nodes").headers.get("cache-control") == "no-store"  # the 401 too
    assert client.get("/ui/static/app.js").headers["cache-control"] == "public, max-age=300"
