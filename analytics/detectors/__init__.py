"""Detectors: what is wrong with which job, how sure, and the numbers it stands on.

One detector per file, ``analytics/detectors/<name>.py``, registered by name::

    from cmdare.wire.plugin import Option, Requirement

    from . import DETECTORS, Detector
    from ..units import Finding, Scope


    @DETECTORS.register
    class PsBound(Detector):
        name = "ps_bound"
        OPTIONS = {"min_efficiency": Option("float", 0.7, "scaling efficiency below which ...", lo=0, hi=1)}
        REQUIRES = (Requirement("table", "steps"), Requirement("table", "jobs"))

        def run(self, con, scope: Scope) -> list[Finding]:
            ...

with a ``## ps_bound`` heading in docs/detectors.md and tests/analytics/detectors/
test_ps_bound.py (tests/test_docs.py fails without them).  Verdict thresholds come from
cmdare.analytics.verdicts, never restated.  ``run(name, con, scope)`` runs one by name:
options parsed, requirements checked up front, results checked.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, ClassVar

import duckdb

from cmdare.wire.plugin import Registry

from ..units import AnalyticsUnit, Finding, Scope, run_unit

DETECTORS: Registry[type[Detector]] = Registry("detector")


class Detector(AnalyticsUnit):
    RESULT: ClassVar[type] = Finding

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Finding]:
        raise NotImplementedError


def run(name: str, con: duckdb.DuckDBPyConnection, scope: Scope, **options: Any) -> list[Finding]:
    """The findings of detector ``name`` in ``scope``."""
    return run_unit(DETECTORS, name, con, scope, options)


__all__ = ["DETECTORS", "Detector", "Finding", "Scope", "run"]


def _load_all() -> None:
    """Import every module of this package: each registers its unit (one new file is one
    new unit, nothing else to edit)."""
    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")


_load_all()
