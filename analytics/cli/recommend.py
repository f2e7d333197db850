"""``analyze recommend KIND``: what to do about it, one command per recommender, each made
from its unit (``analytics/recommend/<name>.py``): the class docstring is the help, its
``OPTIONS`` the flags, ``DATABASE``, ``NEEDS`` and ``TERMINAL`` the rest
(``analytics.units.Recommender``).  A new recommender gets its command with no line here."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import click

from .. import api
from ..db import AnalyticsError, default_db
from ..recommend import RECOMMENDERS
from ..units import Recommender
from . import render
from .common import call, cli, db_option, json_option
from .options import table_options, table_values


def _recommend(db: str | None, kind: str, **options: Any) -> list[Any]:
    """Recommender ``kind`` on ``db`` (locally or through its collector), or with no
    database when its options give it everything."""
    if db is not None:
        return call(db, api.recommend, kind=kind, **options)
    try:
        return api.recommend(None, kind, **options)
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None


@cli.group()
def recommend() -> None:
    """What to do about it: each answer gives the action, the predicted outcome with an
    interval, its cost where prices are known, the fits used, the assumptions and a one-line
    why (docs/recommendations.md).

    \b
    Example:
      analyze recommend data-workers --consumer-ms 10,10 --worker-ms 40,40,40,400
    """


def _shape(terminal: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The unit's terminal shapes as click keywords (``path``: a file on this machine)."""
    out = {}
    for name, kw in terminal.items():
        kw = dict(kw)
        if kw.pop("path", False):
            kw["type"] = click.Path(dir_okay=False)
        out[name] = kw
    return out


def _database(unit: type[Recommender], db: str | None, o: dict[str, Any]) -> str | None:
    """The database the unit reads this time (None: its options give it everything)."""
    if unit.DATABASE == "job":
        return db if o["job"] else None
    if unit.DATABASE == "optional":
        return db if db is not None else (default_db() if Path(default_db()).exists() else None)
    return db


def _command(unit: type[Recommender]) -> None:
    kind = unit.name
    table = api.recommender_options(kind)
    terminal = dict(unit.TERMINAL)
    db_help = terminal.pop("db", {}).get("help")

    def command(db: str | None, as_json_: bool, **given: Any) -> None:
        o = table_values(table, given)
        for opt, needed in unit.NEEDS.items():
            if o[opt] and not o[needed]:
                raise click.UsageError(f"--{opt.replace('_', '-')} needs --{needed.replace('_', '-')}")
        for r in _recommend(_database(unit, db, o), kind, **o):
            render.recommendation(r, as_json_)

    f: Any = json_option(command)
    if unit.DATABASE == "optional":
        f = click.option("--db", default=None, show_default="$CMDARE_DB or ./cmdare.duckdb where it exists",
                         help=db_help or "DuckDB database written by cmdare-collector")(f)
    else:
        f = db_option(f)
    f = table_options(table, **_shape(terminal))(f)
    recommend.command(name=kind.replace("_", "-"), help=inspect.cleandoc(unit.__doc__ or ""))(f)


for _name, _unit in RECOMMENDERS.items():
    _command(_unit)
