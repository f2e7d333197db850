"""Recommenders: what to do about it (data workers, input placement, cluster size and PS
count, spot provisioning, region), with the predicted outcome and its cost.

One recommender per file, ``analytics/recommend/<name>.py`` (the name is the ``analyze
recommend KIND``), registered with ``@RECOMMENDERS.register`` on a ``Recommender``
subclass, with typed ``OPTIONS`` and ``REQUIRES`` (a ``fit`` requirement names the model
kind it predicts with), a ``## name`` heading in docs/recommendations.md and
tests/analytics/recommend/test_<name>.py (tests/test_docs.py fails without them).
``run(name, con, scope, **options)`` runs one by name.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, ClassVar

import duckdb

from cmdare.wire.plugin import Registry

from ..units import AnalyticsUnit, Recommendation, Scope, run_unit

RECOMMENDERS: Registry[type[Recommender]] = Registry("recommender")


class Recommender(AnalyticsUnit):
    RESULT: ClassVar[type] = Recommendation

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Recommendation]:
        raise NotImplementedError


def run(name: str, con: duckdb.DuckDBPyConnection, scope: Scope, **options: Any) -> list[Recommendation]:
    """The recommendations of recommender ``name`` in ``scope``."""
    return run_unit(RECOMMENDERS, name, con, scope, options)


__all__ = ["RECOMMENDERS", "Recommendation", "Recommender", "Scope", "run"]


def _load_all() -> None:
    """Import every module of this package: each registers its unit (one new file is one
    new unit, nothing else to edit)."""
    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")


_load_all()
