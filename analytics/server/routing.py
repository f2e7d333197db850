"""Names in paths: a job's name is one path segment whatever it holds (``/``, spaces,
quotes, ``%``, unicode), percent-encoded on the wire as the client (``quote(safe="")``) and
the pages (``encodeURIComponent``) send it. The routes under ``NAMED`` match the raw path
and decode the name once, so an encoded ``/`` never splits a name into two segments. (The
names ``.`` and ``..`` alone cannot be a segment: clients resolve them as URL steps.)"""

from __future__ import annotations

import urllib.parse
from typing import Any

from starlette.convertors import Convertor, register_url_convertor

NAMED = ("/api/v1/jobs/", "/ui/jobs/")  # routes whose segment after the prefix is a name


class _Name(Convertor):  # type: ignore[type-arg]
    """A job's name as one path segment: percent-encoded on the wire (``/`` is ``%2F``;
    spaces, quotes, ``%`` and unicode likewise), decoded here once. The routes of names
    match the raw path (``RawNames``), so a ``/`` inside a name never splits it."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return urllib.parse.unquote(value)

    def to_string(self, value: str) -> str:
        return urllib.parse.quote(value, safe="")


register_url_convertor("cmdare_name", _Name())


class RawNames:
    """Requests under ``NAMED`` are routed on their raw (still percent-encoded) path."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(NAMED) and scope.get("raw_path"):
            scope = dict(scope, path=scope["raw_path"].split(b"?", 1)[0].decode("latin-1"))
        await self.app(scope, receive, send)


def named(route: str) -> str:
    """A route with its ``{job}`` segment read as a name."""
    return route.replace("{job}", "{job:cmdare_name}")
