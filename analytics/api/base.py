"""The library's shared result type: a table of rows with their column names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..db import Database


@dataclass
class Table:
    """Rows of one query, in order, with their column names."""

    columns: list[str]
    rows: list[Any]  # each a tuple or a list of the columns' values
    notes: list[str] = field(default_factory=list)  # what the rows leave out, in words


def _table(db: Database, fn: Any, *args: Any) -> Table:
    with db.read() as con:
        cols, rows = fn(con, *args)
    return Table(list(cols), [tuple(r) for r in rows])
