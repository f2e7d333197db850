"""Click options generated from a unit's option table (``OPTIONS``: name -> Option), so
that a recommender's options are declared once, where it is written, and the CLI and the
HTTP API cannot drift apart. A command may reshape an option for the terminal (a flag
name, repeatable, required) but never restates its type, bounds, default or meaning."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from cmdare.wire.plugin import Option


def _type(opt: Option) -> Any:
    if opt.choices:
        return click.Choice(list(opt.choices))
    if opt.kind == "int":
        return click.IntRange(0 if opt.lo is None else int(opt.lo), None if opt.hi is None else int(opt.hi))
    if opt.kind == "float":
        if opt.lo is None and opt.hi is None:
            return float
        return click.FloatRange(opt.lo, opt.hi, min_open=opt.lo_open)
    return str


def table_options(table: dict[str, Option], **shape: dict[str, Any]) -> Callable[[Any], Any]:
    """One click option per entry of ``table``, in its order: ``--name-with-dashes``, the
    option's type and bounds, its help, and its default (shown) unless it is empty. A list
    option takes comma-separated values. ``shape[name]``: click keywords for the terminal
    (``decls`` replaces the flag names; e.g. ``{"decls": ["--price"], "multiple": True}``)."""
    def deco(f: Any) -> Any:
        for name, opt in reversed(list(table.items())):
            kw: dict[str, Any] = dict(shape.get(name, {}))
            flag = "--" + name.replace("_", "-")
            decls = kw.pop("decls", None) or ([f"{flag}/--no-{flag[2:]}"] if opt.kind == "bool" else [flag])
            kw.setdefault("help", opt.help + (" (comma-separated)" if opt.kind == "list" and not kw.get("multiple") else ""))
            if opt.kind == "bool":
                kw.setdefault("default", bool(opt.default))
                kw.setdefault("show_default", True)
            elif opt.kind not in ("list", "duration"):
                kw.setdefault("type", _type(opt))
                if opt.default not in ("", 0, 0.0, None) and not kw.get("required"):
                    kw.setdefault("default", opt.default)
                    kw.setdefault("show_default", True)
            f = click.option(*decls, name, **kw)(f)
        return f

    return deco


def table_values(table: dict[str, Option], given: dict[str, Any]) -> dict[str, Any]:
    """What the command line gave, as the unit takes it: an option not given is the table's
    default; a list option's comma-separated text (or repeated values) a list."""
    out = {}
    for name, opt in table.items():
        v = given.get(name)
        if opt.kind == "list":
            items = v if isinstance(v, (list, tuple)) else (v or "").split(",")
            out[name] = [x.strip() for x in items if x and x.strip()]
        else:
            out[name] = opt.default if v is None else v
    return out
