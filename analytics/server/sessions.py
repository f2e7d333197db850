"""The pages' sign-in sessions: a browser that signed in with the collector's token holds a
random session id in an HttpOnly, SameSite=Strict cookie; the collector keeps, per session,
the fingerprint of the token it signed in with and when it expires.

- a session ends when it expires (``--session-ttl``, default 12 h), when the browser signs
  out (``POST /ui/logout``), when the token it signed in with is no longer the collector's
  (removed from the token file or given a new secret: analytics/server/tokens.py), and when the
  collector restarts (the store is memory: sign in again);
- the store is bounded per token (``MAX_PER_TOKEN``: a token's oldest session goes first,
  never another token's) and in all (``MAX_SESSIONS``: the oldest session of the token
  holding the most goes first), so sign-ins cannot grow the collector, and signing in
  over and over with one token ends no session of another;
- the session id is never stored: the store is keyed by its SHA-256, and a cookie is
  compared by that digest, so neither a memory dump nor a timing difference gives one out.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

COOKIE = "cmdare_session"
SESSION_TTL = 12 * 3600.0  # seconds a sign-in lasts
MAX_SESSIONS = 10_000  # sessions kept at once; the oldest of the token holding the most goes first
MAX_PER_TOKEN = 100  # sessions one token may hold; its oldest goes first
MAX_COOKIE_HEADER = 8192  # bytes of a Cookie header looked at


def _who(token: Any) -> tuple[str, str]:
    """What a session remembers of its token: its name and SHA-256 (never the token);
    ``token``: an analytics.server.tokens.Token, or a token's text."""
    from cmdare.analytics.server.tokens import Tokens

    if isinstance(token, str):
        (token,) = Tokens.of(token).all()  # type: ignore[union-attr]
    return token.name, token.sha256


def _key(sid: str) -> str:
    return hashlib.sha256(sid.encode("latin-1", "replace")).hexdigest()


def session_id(headers: dict[bytes, bytes]) -> str | None:
    """The session cookie's value in a request's headers (the first of that exact name)."""
    raw = headers.get(b"cookie", b"")[:MAX_COOKIE_HEADER].decode("latin-1")
    for part in raw.split(";"):
        k, eq, v = part.strip().partition("=")
        if k == COOKIE and eq:
            return v.strip()
    return None


class Sessions:
    """The signed-in browsers of one collector (thread-safe: the API's threads share it)."""

    def __init__(self, ttl: float = SESSION_TTL, max_sessions: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.time, max_per_token: int = MAX_PER_TOKEN) -> None:
        if not ttl > 0 or max_sessions < 1 or max_per_token < 1:
            raise ValueError("a session lasts more than 0 s and the store holds at least one")
        self.ttl, self.max_sessions, self.clock = ttl, max_sessions, clock
        self.max_per_token = max_per_token
        self._by_key: OrderedDict[str, tuple[tuple[str, str], float]] = OrderedDict()  # key -> (who, expiry)
        self._of: dict[str, OrderedDict[str, None]] = {}  # token name -> its sessions' keys, oldest first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_key)

    def open(self, token: Any) -> str:
        """A new session for a browser that gave ``token`` (a Token, or a token's text): its
        id, for the cookie."""
        who = _who(token)
        sid = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            self._prune(now)
            mine = self._of.setdefault(who[0], OrderedDict())
            while len(mine) >= self.max_per_token:
                self._drop(next(iter(mine)))
            while len(self._by_key) >= self.max_sessions:
                most = max(self._of.values(), key=len)
                self._drop(next(iter(most)))
            k = _key(sid)
            self._by_key[k] = (who, now + self.ttl)
            self._of.setdefault(who[0], OrderedDict())[k] = None
        return sid

    def _drop(self, k: str) -> None:
        got = self._by_key.pop(k, None)
        if got is None:
            return
        name = got[0][0]
        mine = self._of.get(name)
        if mine is not None:
            mine.pop(k, None)
            if not mine:
                del self._of[name]

    def check(self, sid: str | None, tokens: Any) -> bool:
        """Whether ``sid`` is a live session signed in with a token ``tokens`` still holds
        (an analytics.server.tokens.Tokens, or one token's text)."""
        return self.token(sid, tokens) is not None

    def token(self, sid: str | None, tokens: Any) -> Any:
        """The token (analytics.server.tokens.Token) of live session ``sid``, if ``tokens`` still
        holds it; else None."""
        from cmdare.analytics.server.tokens import Tokens

        if not sid:
            return None
        k = _key(sid)
        with self._lock:
            got = self._by_key.get(k)
            if got is None:
                return None
            (name, sha), expiry = got
            if self.clock() >= expiry:
                self._drop(k)
                return None
        held = Tokens.of(tokens)
        return held.held(name, sha) if held is not None else None

    def close(self, sid: str | None) -> bool:
        """Sign-out: the session ends (True when there was one)."""
        if not sid:
            return False
        k = _key(sid)
        with self._lock:
            there = k in self._by_key
            self._drop(k)
            return there

    def _prune(self, now: float) -> None:
        """Expired sessions dropped (they are in order of expiry: one TTL for all)."""
        while self._by_key:
            k, (_, expiry) = next(iter(self._by_key.items()))
            if expiry > now:
                break
            self._drop(k)


def login_redirect(path: str, query: str) -> str:
    """Where a browser without a session is sent: the sign-in page, back to ``path`` after."""
    return "/ui/login?next=" + quote(path + ("?" + query if query else ""), safe="")
