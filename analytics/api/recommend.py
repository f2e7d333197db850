"""Recommendations: run a recommender by name, its option table."""

from __future__ import annotations

from typing import Any

from ..db import Database
from ..units import Recommendation, Scope


def recommend(db: Database | None, kind: str, **options: Any) -> list[Recommendation]:
    """Recommender ``kind`` (cmdare.analytics.recommend) with its options (as user input);
    ``db`` None for a recommender given everything it needs in its options."""
    from ..recommend import recommend as run

    name = kind.replace("-", "_")
    if db is None:
        return run(name, None, Scope(), **options)  # type: ignore[arg-type]
    with db.read() as con:
        return run(name, con, Scope(), **options)


def recommender_options(kind: str) -> dict[str, Any]:
    """The recommender's option table (name -> Option), which the CLI and the API are built from."""
    from ..recommend import RECOMMENDERS

    return dict(RECOMMENDERS.get(kind.replace("-", "_")).OPTIONS)


# recommender options that name a file on the caller's machine: not taken by the HTTP API
PATH_OPTIONS = frozenset({"profile", "trace"})
