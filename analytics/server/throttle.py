"""Failed sign-ins, slowed per client address and overall, with no way around it for a
client that holds one valid token.

A wrong bearer token or a wrong token typed into ``/ui/login`` is a failure of the client's
address (IPv6: its /64, the block one host is given). After ``free`` failures in a row the
address waits before its next attempt is even looked at, the wait doubling with each
further failure up to ``cap``; failures are forgotten only after a further ``cap`` seconds with none.
A success never clears them: it makes *that credential* trusted from that address a while
(as OWASP's device cookies do), so the client that signed in keeps working through its
address's waits, while every other credential presented from there still waits, unchecked.
(An attacker holding one valid token learns nothing by presenting it: its answer was known.)

Across every address, failures are a token bucket (``rate`` a second, ``burst`` at once):
while it is empty, a failure costs its address the whole ``cap`` at once instead of ``free``
tries, so guessing from many addresses gets one guess per address per ``cap``; an attempt
from a fresh address is still looked at, so a client presenting a valid credential is never
starved by others' failures. A request without credentials is no failure (a browser sent to
the login page), nor is a stale page cookie (a restart ends sessions; a session id is 256
random bits, not guessable): both are counted apart. Tables are bounded (the oldest entry
goes first); nothing here holds a token: trust is kept as a keyed hash (a random key of
this process) of the credential.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("cmdare.analytics.server.throttle")

HOW = ("bearer", "login", "cookie")  # what failed: a bearer token, the login form, a page cookie (not throttled)


@dataclass
class _Client:
    failures: int = 0
    until: float = 0.0  # no attempt looked at before this (monotonic seconds)
    last: float = 0.0  # the latest failure


class Throttle:
    def __init__(self, free: int = 5, base: float = 1.0, cap: float = 300.0, rate: float = 10.0,
                 burst: float = 100.0, trusted_for: float = 3600.0, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.free, self.base, self.cap, self.rate, self.burst = free, base, cap, rate, burst
        self.trusted_for, self.max_clients, self.clock = trusted_for, max_clients, clock
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self._trusted: OrderedDict[tuple[str, bytes], float] = OrderedDict()  # (address, credential) -> until
        self._key = secrets.token_bytes(32)  # credentials are kept as HMACs under it, never as themselves
        self._tokens, self._filled = burst, clock()
        self._overall_said = False
        self._lock = threading.Lock()
        self.failures: Counter[str] = Counter()  # by HOW (for /metrics)
        self.throttled = 0  # attempts answered 429 unchecked

    @staticmethod
    def key(address: str | None) -> str:
        """The throttled unit of an address: itself, or an IPv6 address's /64."""
        if not address:
            return "?"
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return address[:64]
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.ipv4_mapped is not None:
                return str(ip.ipv4_mapped)
            return str(ipaddress.ip_network(f"{ip}/64", strict=False))
        return str(ip)

    def _mark(self, credential: str | None) -> bytes:
        return hmac.new(self._key, (credential or "").encode("utf-8", "replace"), hashlib.sha256).digest()

    def wait(self, address: str | None, credential: str | None = None) -> float:
        """Seconds before an attempt from ``address`` presenting ``credential`` (the token's
        text) is looked at (0: now). A credential that succeeded from this address lately
        is looked at through the address's wait."""
        k, now = self.key(address), self.clock()
        with self._lock:
            c = self._clients.get(k)
            if c is None or c.until <= now:
                return 0.0
            if credential and self._trusted.get((k, self._mark(credential)), 0.0) > now:
                return 0.0
            self.throttled += 1
            return c.until - now

    def failed(self, address: str | None, how: str) -> None:
        """A failed sign-in from ``address`` (``how``: one of HOW)."""
        self.failures[how] += 1
        if how == "cookie":
            return
        k, now = self.key(address), self.clock()
        with self._lock:
            c = self._clients.pop(k, None) or _Client()
            self._clients[k] = c  # most recent last
            while len(self._clients) > self.max_clients:
                self._clients.popitem(last=False)
            if c.failures and now - max(c.until, c.last) >= self.cap:
                c.failures = 0  # none for a cap after its wait: a new row
            c.failures, c.last = c.failures + 1, now
            self._refill(now)
            self._tokens = max(0.0, self._tokens - 1)
            over = c.failures - self.free + 1  # the free-th failure in a row starts the waits
            if self._tokens < 1:  # failures from everywhere: no free tries, the longest wait
                c.until = max(c.until, now + self.cap)
                if not self._overall_said:
                    self._overall_said = True
                    log.warning("API: over %.0f failed sign-ins a second from all addresses: each further failure "
                                "makes its address wait %.0f s", self.rate, self.cap)
            elif over > 0:
                c.until = now + min(self.cap, self.base * 2.0 ** min(over - 1, 30))
                if over == 1:
                    log.warning("API: %d failed sign-ins in a row from %s: each further attempt waits (up to %.0f s)",
                                c.failures, k, self.cap)

    def succeeded(self, address: str | None, credential: str | None = None) -> None:
        """A sign-in with ``credential`` that worked: that credential is trusted from this
        address a while (its failures stay: they are other credentials')."""
        if not credential:
            return
        k, now = self.key(address), self.clock()
        t = (k, self._mark(credential))
        with self._lock:
            if self._trusted.get(t, 0.0) - now < self.trusted_for / 2:  # renewed now and then, not each request
                self._trusted.pop(t, None)
                self._trusted[t] = now + self.trusted_for
                while len(self._trusted) > self.max_clients:
                    self._trusted.popitem(last=False)

    def _refill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._filled) * self.rate)
        self._filled = now
        if self._tokens >= self.burst:
            self._overall_said = False
