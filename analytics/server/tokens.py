"""The API's bearer tokens: one token (``$CMDARE_HTTP_TOKEN``, or a token file holding just
it), or a token file of named, scoped tokens stored as their SHA-256 only::

    [[token]]
    name = "ops"
    scope = "admin"            # fits, imports, stored findings: every write
    sha256 = "9f86d081884c..."  # cmdare-collector token-hash < token

    [[token]]
    name = "dashboards"
    scope = "read"             # every GET, user SQL, rule checks

    [[token]]
    name = "vision"
    scope = "read"
    labels = { team = "vision" }  # sees only nodes with these labels, and their jobs

A token file is read again when it changes (looked at once a second at most): a token
added works at once, a token removed or given a new secret stops at once, and the page
sessions signed in with it end. A file that cannot be read or parsed keeps the tokens
before it (said once in the log); at start it is a one-line error. Tokens are compared as
their digests, each against every entry, in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("cmdare.analytics.server.tokens")

SCOPES = ("read", "admin")
MAX_FILE = 64 << 10  # bytes of a token file
MAX_TOKENS = 1000
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_HEX = re.compile(r"^[0-9a-f]{64}$")
MAX_LABELS = 8
_LABEL_KEY = re.compile(r"^[A-Za-z0-9_./-]{1,63}$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9_.:/@ -]{1,128}$")


class TokenError(ValueError):
    """A token file that cannot be used, in one line (never quoting a secret)."""


def digest(token: str) -> str:
    """What a token file keeps of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Token:
    name: str
    scope: str
    sha256: str
    labels: tuple[tuple[str, str], ...] = ()  # a label filter: what its reads see (analytics/scoping.py)


def parse(text: str, where: str) -> list[Token]:
    """The tokens of a token file's text: ``[[token]]`` tables, or (the older form) the
    file's one line, the token itself (named ``token``, scope admin)."""
    if "[[token]]" not in text:
        secret = text.strip()
        if not secret:
            raise TokenError(f"{where}: the file is empty")
        if "\n" in secret or any(ord(c) < 32 for c in secret):
            raise TokenError(f"{where}: one token on one line, or [[token]] tables (name, scope, sha256)")
        return [Token("token", "admin", digest(secret))]
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TokenError(f"{where}: not TOML: {str(e).splitlines()[0][:120]}") from None
    rows = doc.get("token")
    if set(doc) != {"token"} or not isinstance(rows, list) or not rows or len(rows) > MAX_TOKENS:
        raise TokenError(f"{where}: expected 1 to {MAX_TOKENS} [[token]] tables and nothing else")
    out: list[Token] = []
    for i, t in enumerate(rows):
        at = f"{where}: token[{i}]"
        if not isinstance(t, dict) or not {"name", "scope", "sha256"} <= set(t) <= {"name", "scope", "sha256", "labels"}:
            raise TokenError(f"{at}: expected name, scope and sha256 (the token's SHA-256, "
                             "never the token: cmdare-collector token-hash), and optionally labels")
        name, scope, sha = t["name"], t["scope"], t["sha256"]
        if not isinstance(name, str) or not _NAME.match(name):
            raise TokenError(f"{at}: name: 1 to 64 of A-Z a-z 0-9 _ . @ -")
        if scope not in SCOPES:
            raise TokenError(f"{at} ({name}): scope: one of {', '.join(SCOPES)}")
        if not isinstance(sha, str) or not _HEX.match(sha.lower()):
            raise TokenError(f"{at} ({name}): sha256: 64 hex digits (cmdare-collector token-hash)")
        out.append(Token(name, scope, sha.lower(), _labels(t.get("labels"), f"{at} ({name})", scope)))
    for what, key in (("name", lambda x: x.name), ("secret", lambda x: x.sha256)):
        seen: set[str] = set()
        for tok in out:
            if key(tok) in seen:
                raise TokenError(f"{where}: two tokens with one {what} ({tok.name})")
            seen.add(key(tok))
    return out


def _labels(v: object, at: str, scope: str) -> tuple[tuple[str, str], ...]:
    """A token's label filter: ``{team = "vision"}`` (every label must match), read tokens only."""
    if v is None:
        return ()
    if not isinstance(v, dict) or not 1 <= len(v) <= MAX_LABELS:
        raise TokenError(f"{at}: labels: a table of 1 to {MAX_LABELS} names and values, like {{ team = \"vision\" }}")
    if scope != "read":
        raise TokenError(f"{at}: labels: a label filter is for read tokens (an admin token sees and writes all)")
    for k, x in v.items():
        if not _LABEL_KEY.match(k):
            raise TokenError(f"{at}: labels: name {k[:40]!r}: 1 to 63 of A-Z a-z 0-9 _ . / -")
        if not isinstance(x, str) or not _LABEL_VALUE.match(x):
            raise TokenError(f"{at}: labels: {k}: a value of 1 to 128 of A-Z a-z 0-9 _ . : / @ - and spaces")
    return tuple(sorted(v.items()))


def read(path: str | Path) -> list[Token]:
    """A token file's tokens (a regular file of at most 64 KiB: a FIFO is refused unread)."""
    from ..db import read_text_file

    return parse(read_text_file(path, MAX_FILE, "a token file", str(path), error=TokenError), str(path))


class Tokens:
    """The tokens the API takes (thread-safe; a file's are re-read when it changes)."""

    def __init__(self, tokens: list[Token], path: str | Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._tokens = tuple(tokens)
        self.path = Path(path) if path is not None else None
        self.clock = clock
        self._stamp = self._stat()
        self._looked = clock()
        self._said = False
        self._lock = threading.Lock()

    @classmethod
    def of(cls, value: Tokens | str | None) -> Tokens | None:
        """``value`` as tokens: a Tokens, one token's text (admin), or None (no token)."""
        if value is None or isinstance(value, Tokens):
            return value
        return cls([Token("token", "admin", digest(value))])

    @classmethod
    def load(cls, path: str | Path) -> Tokens:
        return cls(read(path), path)

    def all(self) -> tuple[Token, ...]:
        self._reload()
        return self._tokens

    def match(self, presented: str) -> Token | None:
        """The token ``presented`` is, or None: every entry compared, in constant time."""
        d = digest(presented).encode()
        found = None
        for t in self.all():
            if hmac.compare_digest(d, t.sha256.encode()):
                found = t
        return found

    def holds(self, name: str, sha256: str) -> bool:
        """Whether the token of that name still has that secret (a session's check)."""
        return self.held(name, sha256) is not None

    def held(self, name: str, sha256: str) -> Token | None:
        """The token of that name if it still has that secret (a session's token)."""
        found = None
        for t in self.all():
            if t.name == name and hmac.compare_digest(t.sha256, sha256):
                found = t
        return found

    def _stat(self) -> tuple[float, int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime, st.st_size, st.st_ino)

    def _reload(self) -> None:
        if self.path is None:
            return
        now = self.clock()
        if now - self._looked < 1.0:
            return
        with self._lock:
            if now - self._looked < 1.0:
                return
            self._looked = now
            stamp = self._stat()
            if stamp == self._stamp:
                return
            try:
                tokens = read(self.path)
            except TokenError as e:
                if not self._said:
                    log.error("API tokens: %s: keeping the %d token(s) read before", e, len(self._tokens))
                    self._said = True
                return
            self._stamp, self._said = stamp, False
            old = {t.name for t in self._tokens}
            self._tokens = tuple(tokens)
            log.warning("API tokens: %s read again: %d token(s) (added: %s; removed: %s)", self.path, len(tokens),
                        ", ".join(sorted({t.name for t in tokens} - old)) or "none",
                        ", ".join(sorted(old - {t.name for t in tokens})) or "none")


def needs_admin(method: str, path: str) -> bool:
    """What only an admin token may do: every write (fits, imports, stored findings); a
    read token has every GET, user SQL (read-only) and rule checks."""
    return method not in ("GET", "HEAD") and path not in ("/api/v1/sql", "/api/v1/alerts/check")
