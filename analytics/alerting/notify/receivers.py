"""Receiver kinds by name: ``notify/<kind>.py`` registers one (``@RECEIVERS.register``),
with its typed options, the collector flag that adds one, and how it is built. The
collector's config file names them as ``[[receivers]]`` tables (``kind = "webhook"`` and
the kind's option keys); its flags add one per value. A new kind is one new file here, a
docs heading in docs/alerts.md and a test: the collector, its flags and ``schedule.load``
know kinds only through this registry."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from cmdare.wire.plugin import Option, Registry, Unit
from cmdare.wire.units import ConfigError

from . import MAX_SECRET_BYTES, receiver_label


@dataclass(frozen=True)
class ReceiverSpec:
    """One receiver to build: its kind and its parsed options."""

    kind: str
    options: Mapping[str, Any]

    @property
    def name(self) -> str:
        return RECEIVERS.get(self.kind).label(self.options)


class ReceiverKind(Unit):
    """Base of receiver kinds. ``FLAG``: the collector's repeatable flag that adds one of
    this kind from one text (``from_flag``); ``build`` makes the delivering receiver."""

    FLAG: ClassVar[str] = ""
    FLAG_METAVAR: ClassVar[str] = "URL"
    FLAG_ENVVAR: ClassVar[str | None] = None
    FLAG_HELP: ClassVar[str] = ""
    SECRETS: ClassVar[bool] = False  # takes --alert-token-file / --alert-password-file by its name

    @classmethod
    def from_flag(cls, value: str) -> dict[str, Any]:
        """The raw options one flag value gives."""
        return {"url": value}

    @classmethod
    def label(cls, options: Mapping[str, Any]) -> str:
        """The receiver's name in metrics, logs and secrets."""
        return str(options.get("name") or options.get("url", ""))

    @classmethod
    def spec(cls, where: str, raw: Mapping[str, Any]) -> ReceiverSpec:
        """Options checked (ConfigError naming ``where``): a spec that builds."""
        return ReceiverSpec(cls.name, cls.parse_options(where, raw))

    @classmethod
    def build(cls, options: Mapping[str, Any], resend: float, generator: str, security: Any = None) -> Any:
        raise NotImplementedError


RECEIVERS: Registry[type[ReceiverKind]] = Registry("receiver")


def _load() -> None:
    from cmdare.wire.plugin import load_units

    load_units(__package__ or "cmdare.analytics.alerting.notify", [str(Path(__file__).parent)])
    RECEIVERS.order(tuple(k for k in ("alertmanager", "webhook") if k in RECEIVERS))  # the flags' order


def kinds() -> Registry[type[ReceiverKind]]:
    """The registry with every kind of this package loaded."""
    _load()
    return RECEIVERS


def spec_of(where: str, raw: Mapping[str, Any]) -> ReceiverSpec:
    """A ``[[receivers]]`` table (``kind`` and the kind's keys) as a spec."""
    raw = dict(raw)
    kind = raw.pop("kind", None)
    if not isinstance(kind, str):
        raise ConfigError(f"{where}.kind: expected one of {', '.join(kinds())}, got {kind!r}")
    return kinds().get(kind).spec(where, raw)


def build_all(specs: Sequence[ReceiverSpec], resend: float, generator: str, security: Any = None) -> list[Any]:
    return [kinds().get(s.kind).build(s.options, resend, generator, security) for s in specs]


# -- the HTTP kinds (alertmanager, webhook) share their options and checks -------------------

def _read_secret(where: str, path: str) -> str:
    from ..rulefmt import read_text

    lines = read_text(Path(path), MAX_SECRET_BYTES, "a secret file", f"{where}: {path}").splitlines()
    secret = lines[0].strip() if lines else ""
    if not secret or any(ord(c) < 32 for c in secret):
        raise ConfigError(f"{where}: {path}: empty, or holds control characters")
    return secret


class HttpKind(ReceiverKind):
    """A receiver that POSTs to an http(s) URL (notify/http.py delivers)."""

    FLAG_METAVAR = "[NAME=]URL"
    SECRETS = True
    OPTIONS: ClassVar[Mapping[str, Option]] = {
        "url": Option("str", "", "http:// or https:// URL with a host (user:password in it goes as Basic auth)"),
        "name": Option("str", "", "the name metrics and logs show (default: the URL's host and port)"),
        "token_file": Option("str", "", "file whose first line is a bearer token to send"),
        "password_file": Option("str", "", "file whose first line is user:password to send as Basic auth"),
    }

    @classmethod
    def from_flag(cls, value: str) -> dict[str, Any]:
        name, eq, url = value.partition("=")
        if not eq or "://" in name:
            return {"url": value}
        return {"url": url, "name": name.strip()}

    @classmethod
    def label(cls, options: Mapping[str, Any]) -> str:
        url = options["url"]
        return receiver_label(f"{options['name']}={url}" if options.get("name") else url)[0]

    @classmethod
    def spec(cls, where: str, raw: Mapping[str, Any]) -> ReceiverSpec:
        s = super().spec(where, raw)
        url = s.options["url"]
        if not url.startswith(("http://", "https://")) or not urllib.parse.urlsplit(receiver_label(url)[1]).hostname:
            raise ConfigError(f"receiver {cls.label(s.options)!r}: alert receivers are [NAME=]http:// or https:// URLs "
                              "with a host")
        if s.options["token_file"] and s.options["password_file"]:
            raise ConfigError(f"receiver {cls.label(s.options)!r}: a bearer token or a password, not both")
        return s

    @classmethod
    def build(cls, options: Mapping[str, Any], resend: float, generator: str, security: Any = None) -> Any:
        from .http import HttpReceiver

        token = _read_secret("--alert-token-file", options["token_file"]) if options["token_file"] else None
        basic = _read_secret("--alert-password-file", options["password_file"]) if options["password_file"] else None
        url = options["url"]
        return HttpReceiver(cls.name, f"{options['name']}={url}" if options["name"] else url, resend,
                            generator=generator, token=token, basic=basic)
