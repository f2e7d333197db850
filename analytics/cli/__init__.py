"""``analyze``: a thin click layer over the analytics library (cmdare.analytics.api). Each
command parses its options, calls one library function through ``call`` (on the database
file, or through the API of the collector holding it: cmdare.analytics.cli.client) and prints
the result (cli/render.py); library errors become one-line ``Error:`` messages.  What the
commands share is in cli/common.py; loading the command modules registers them."""

from __future__ import annotations

from . import findings, imports, models, recommend, report, telemetry  # noqa: F401  (register the commands)
from .common import call, cli, main

__all__ = ["call", "cli", "main"]
