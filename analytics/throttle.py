"""Failed sign-ins, slowed per client address and overall.

A wrong bearer token or a wrong token typed into ``/ui/login`` is a failure of the client's
address (IPv6: its /64, the block one host is given). After ``free`` failures in a row the
address waits before its next attempt is even looked at, the wait doubling with each
further failure up to ``cap``; a success clears it. Across every address, failures are a
token bucket (``rate`` a second, ``burst`` at once): while it is empty, addresses that have
not signed in successfully lately get the same answer (429, ``Retry-After``) without their
credentials being checked, so guessing from many addresses gains nothing, and clients that
did sign in keep working. A request without credentials is no failure (a browser sent to
the login page), nor is a stale page cookie (a restart ends sessions; a session id is 256
random bits, not guessable): both are counted apart. Tables are bounded (the oldest entry
goes first); nothing here ever holds a token.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("cmdare.analytics.throttle")

HOW = ("bearer", "login", "cookie")  # what failed: a bearer token, the login form, a page cookie (not throttled)


@dataclass
class _Client:
    failures: int = 0
    until: float = 0.0  # no attempt looked at before this (monotonic seconds)


class Throttle:
    def __init__(self, free: int = 5, base: float = 1.0, cap: float = 300.0, rate: float = 10.0,
                 burst: float = 100.0, trusted_for: float = 3600.0, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.free, self.base, self.cap, self.rate, self.burst = free, base, cap, rate, burst
        self.trusted_for, self.max_clients, self.clock = trusted_for, max_clients, clock
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self._trusted: OrderedDict[str, float] = OrderedDict()  # address -> until when
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

    def wait(self, address: str | None) -> float:
        """Seconds before an attempt from ``address`` is looked at (0: now)."""
        k, now = self.key(address), self.clock()
        with self._lock:
            c = self._clients.get(k)
            if c is not None and c.until > now:
                self.throttled += 1
                return c.until - now
            self._refill(now)
            if self._tokens < 1 and self._trusted.get(k, 0.0) <= now:
                self.throttled += 1
                return (1 - self._tokens) / self.rate
        return 0.0

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
            c.failures += 1
            over = c.failures - self.free + 1  # the free-th failure in a row starts the waits
            if over > 0:
                c.until = now + min(self.cap, self.base * 2.0 ** min(over - 1, 30))
                if over == 1:
                    log.warning("API: %d failed sign-ins in a row from %s: each further attempt waits (up to %.0f s)",
                                c.failures, k, self.cap)
            self._refill(now)
            self._tokens = max(0.0, self._tokens - 1)
            if self._tokens < 1 and not self._overall_said:
                self._overall_said = True
                log.warning("API: over %.0f failed sign-ins a second from all addresses: attempts from addresses "
                            "without a recent sign-in wait", self.rate)

    def succeeded(self, address: str | None) -> None:
        """A sign-in that worked: the address's failures forgotten, and it is trusted a while."""
        k, now = self.key(address), self.clock()
        with self._lock:
            self._clients.pop(k, None)
            if self._trusted.get(k, 0.0) - now < self.trusted_for / 2:  # renewed now and then, not each request
                self._trusted.pop(k, None)
                self._trusted[k] = now + self.trusted_for
                while len(self._trusted) > self.max_clients:
                    self._trusted.popitem(last=False)

    def _refill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._filled) * self.rate)
        self._filled = now
        if self._tokens >= self.burst:
            self._overall_said = False
