"""Where alerts go: the log (each change of state), Alertmanager's v2 API, webhooks in
Alertmanager's webhook format, Kafka topics. Delivery follows Alertmanager's client
semantics (docs/alerts.md, "Delivery"): a new firing at once, repeats every resend
interval, a resolution once, owed across restarts; each receiver on its own thread with
retries and a deadline on the whole delivery. Receivers are named (``NAME=URL``, else the
URL's host and port): a URL's credentials, path and query never reach metrics or logs."""

from __future__ import annotations

import base64
import urllib.parse
from pathlib import Path

from ..rulefmt import RuleError, read_text

MAX_SECRET_BYTES = 4096


def receiver_label(spec: str) -> tuple[str, str, str]:
    """``NAME=URL`` or ``URL`` -> (the name shown in metrics and logs: NAME, else the URL's
    host and port only; the URL without user:password; that user:password as a Basic
    credential, base64, or ""). Paths and query strings often hold tokens (Slack-style
    hooks): they are never part of the name."""
    name, eq, url = spec.partition("=")
    if not eq or "://" in name:
        name, url = "", spec
    u = urllib.parse.urlsplit(url)
    basic = ""
    if u.username is not None or u.password is not None:
        cred = f"{urllib.parse.unquote(u.username or '')}:{urllib.parse.unquote(u.password or '')}"
        basic = base64.b64encode(cred.encode()).decode()
        host = u.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (f":{u.port}" if u.port else "")
        url = urllib.parse.urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))
    if not name:
        name = (u.hostname or "?") + (f":{u.port}" if u.port else "")
    return name.strip()[:64], url, basic


def read_secret(option: str, spec: str) -> tuple[str, str]:
    """``NAME=FILE`` -> (NAME, the file's first line): a receiver's token or user:password,
    kept out of URLs and command lines. Errors name the option and file, never its text."""
    name, eq, path = spec.partition("=")
    if not eq or not name.strip() or not path:
        raise RuleError(f"{option}: expected NAME=FILE (NAME: the receiver's name), got {spec[:40]!r}")
    lines = read_text(Path(path), MAX_SECRET_BYTES, "a secret file", f"{option}: {path}").splitlines()
    secret = lines[0].strip() if lines else ""
    if not secret or any(ord(c) < 32 for c in secret):
        raise RuleError(f"{option}: {path}: empty, or holds control characters")
    return name.strip(), secret
