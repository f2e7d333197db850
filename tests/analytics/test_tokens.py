"""Named, scoped API tokens stored as their SHA-256 (analytics/server/tokens.py): a read token
reads and cannot write, an admin token writes; a token file changed while the collector
runs takes effect within a second, ending the sessions of a removed or re-keyed token;
bad files are one line; the older one-token file still works."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from cmdare.analytics.db import Database
from cmdare.analytics.server.http import Guard, Limits, create_app
from cmdare.analytics.server.service import parse_http
from cmdare.analytics.server.sessions import Sessions
from cmdare.analytics.server.tokens import Token, TokenError, Tokens, digest, needs_admin, parse
from cmdare.collector.cli import cli as collector
from cmdare.collector.db import connect
from cmdare.dashboards.pages import mount


def table(name: str, scope: str, secret: str) -> str:
    return f'[[token]]\nname = "{name}"\nscope = "{scope}"\nsha256 = "{digest(secret)}"\n'


def test_token_hash_prints_a_table_that_matches_only_its_token() -> None:
    r = CliRunner().invoke(collector, ["token-hash", "--name", "ops", "--scope", "admin"], input="s3cret-1\n")
    assert r.exit_code == 0 and "s3cret" not in r.output
    [tok] = parse(r.output, "t.toml")
    assert tok == Token("ops", "admin", digest("s3cret-1"))
    tokens = Tokens([tok])
    assert tokens.match("s3cret-1") == tok and tokens.match("s3cret-2") is None and tokens.match("") is None
    for bad in (["--name", "a b"], ["--scope", "root"]):
        assert CliRunner().invoke(collector, ["token-hash", *bad], input="x\n").exit_code == 2
    assert CliRunner().invoke(collector, ["token-hash"], input="\n").exit_code == 2


@pytest.mark.parametrize(("text", "error"), [
    ("", "the file is empty"),
    ("a\nb\n", "one token on one line"),
    ("[[token]]\nname = 'x'\n", "expected name, scope and sha256"),
    ("[[token]]\nname = 'x'\nscope = 'root'\nsha256 = '" + "a" * 64 + "'\n", "scope: one of read, admin"),
    ("[[token]]\nname = 'x'\nscope = 'read'\nsha256 = 'hunter2'\n", "sha256: 64 hex digits"),
    ("[[token]]\nname = 'a b'\nscope = 'read'\nsha256 = '" + "a" * 64 + "'\n", "name: 1 to 64"),
    ("[[token]]\nname = 'x'\nscope = 'read'\ntoken = 'plain'\n", "never the token"),
    ("[[token]]\n" + "x" * 10, "not TOML"),
    ("[[token]]\nname='x'\nscope='read'\nsha256='" + "a" * 64 + "'\n[[token]]\nname='x'\nscope='admin'\nsha256='"
     + "b" * 64 + "'\n", "two tokens with one name (x)"),
    ("[[token]]\nname='x'\nscope='read'\nsha256='" + "a" * 64 + "'\n[[token]]\nname='y'\nscope='admin'\nsha256='"
     + "A" * 64 + "'\n", "two tokens with one secret (y)"),
    ("[other]\n[[token]]\n", "expected 1 to 1000 [[token]] tables and nothing else"),
])
def test_a_bad_token_file_is_one_line_naming_no_secret(tmp_path: Path, text: str, error: str) -> None:
    f = tmp_path / "t.toml"
    f.write_text(text)
    with pytest.raises(TokenError) as e:
        Tokens.load(f)
    assert error in str(e.value) and "\n" not in str(e.value) and "hunter2" not in str(e.value)
    with pytest.raises(ValueError, match="^--http-token-file "):
        parse_http("127.0.0.1:0", str(f))


def test_a_fifo_or_a_huge_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TokenError, match="not a regular file"):
        Tokens.load(fifo)
    big = tmp_path / "big"
    big.write_text("[[token]]\n" + "#" * (65 << 10))
    with pytest.raises(TokenError, match="larger than 64 KiB: not a token file$"):
        Tokens.load(big)


def test_the_older_one_token_file_is_an_admin_token(tmp_path: Path) -> None:
    f = tmp_path / "t"
    f.write_text("  plain-token \n")
    cfg = parse_http("127.0.0.1:0", str(f))
    assert cfg.token.match("plain-token") == Token("token", "admin", digest("plain-token"))
    assert "plain-token" not in repr(cfg.token.all())  # only the digest is kept


@pytest.mark.parametrize(("method", "path", "admin"), [
    ("GET", "/api/v1/nodes", False), ("POST", "/api/v1/sql", False), ("POST", "/api/v1/alerts/check", False),
    ("POST", "/api/v1/fits/speed", True), ("POST", "/api/v1/imports", True), ("POST", "/api/v1/findings/run", True),
    ("POST", "/api/v1/imports/checkpoints", True), ("HEAD", "/ui", False), ("DELETE", "/api/v1/x", True),
])
def test_what_needs_an_admin_token(method: str, path: str, admin: bool) -> None:
    assert needs_admin(method, path) is admin


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def served(tmp_path: Path):
    f = tmp_path / "tokens.toml"
    f.write_text(table("ops", "admin", "admin-secret") + table("dash", "read", "read-secret"))
    clock = Clock()
    tokens = Tokens(parse(f.read_text(), str(f)), f, clock=clock)
    connect(str(tmp_path / "x.duckdb")).close()
    sessions = Sessions()
    app = create_app(Database(tmp_path / "x.duckdb"), tokens, Limits(), sessions=sessions, ui=mount)
    return TestClient(Guard(app, tokens, Limits(), lambda: None, sessions), follow_redirects=False), f, clock


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_a_read_token_reads_and_cannot_write_an_admin_token_writes(served) -> None:
    c, _, _ = served
    assert c.get("/api/v1/nodes", headers=bearer("read-secret")).status_code == 200
    assert c.post("/api/v1/sql", json={"query": "SELECT 1"}, headers=bearer("read-secret")).status_code == 200
    r = c.post("/api/v1/findings/run", json={}, headers=bearer("read-secret"))
    assert r.status_code == 403
    assert r.json() == {"error": "token dash: its scope is read; POST /api/v1/findings/run needs an admin token"}
    assert c.post("/api/v1/findings/run", json={"store": False}, headers=bearer("admin-secret")).status_code == 200
    assert c.get("/api/v1/nodes", headers=bearer("wrong")).status_code == 401


def test_a_changed_token_file_takes_effect_and_ends_the_removed_tokens_sessions(served) -> None:
    c, f, clock = served
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert c.post("/ui/login", content="token=read-secret&next=/ui", headers=form).status_code == 303
    browser = c.cookies.get("cmdare_session")
    assert c.get("/api/v1/nodes").status_code == 200  # the session reads
    c.cookies.clear()
    # the read token re-keyed, a new one added; the admin one kept
    f.write_text(table("ops", "admin", "admin-secret") + table("dash", "read", "new-read") + table("ci", "read", "ci"))
    os.utime(f, (time.time() + 5, time.time() + 5))
    assert c.get("/api/v1/nodes", headers=bearer("read-secret")).status_code == 200  # not looked at within 1 s
    clock.t += 1.0
    assert c.get("/api/v1/nodes", headers=bearer("read-secret")).status_code == 401
    assert c.get("/api/v1/nodes", headers=bearer("new-read")).status_code == 200
    assert c.get("/api/v1/nodes", headers=bearer("ci")).status_code == 200
    assert c.get("/api/v1/nodes", cookies={"cmdare_session": browser}).status_code == 401  # its session ended
    # a broken file keeps the tokens read before
    f.write_text("[[token]]\nbroken")
    os.utime(f, (time.time() + 9, time.time() + 9))
    clock.t += 1.0
    assert c.get("/api/v1/nodes", headers=bearer("ci")).status_code == 200


def test_a_session_belongs_to_its_tokens_name_not_to_its_secret_alone(tmp_path: Path) -> None:
    """Issue 67: with held() ignoring the token's name, a removed token's sessions lived on
    under a new token that reuses its secret (another name, perhaps another scope)."""
    f = tmp_path / "tokens.toml"
    f.write_text(table("dash", "read", "shared-secret"))
    t = Tokens.load(f)
    assert t.held("dash", digest("shared-secret")) is not None
    f.write_text(table("ci", "admin", "shared-secret"))  # "dash" removed; its secret reused by "ci"
    t2 = Tokens.load(f)
    assert t2.held("dash", digest("shared-secret")) is None  # dash's sessions end
    assert t2.held("ci", digest("shared-secret")).name == "ci"
    assert t2.held("ci", digest("another")) is None
