"""Detectors: what is wrong with which job, how sure, and the numbers it stands on.

One detector per file, ``analytics/detectors/<name>.py``, registered by name::

    from cmdare.wire.plugin import Option, Requirement

    from cmdare.analytics.units import DETECTORS, Detector, Finding, Scope


    @DETECTORS.register
    class PsBound(Detector):
        name = "ps_bound"
        ORDER = 10  # where analyze bottlenecks runs and lists it
        FINDS = "PS-bound jobs"  # how its --help names what it finds
        OPTIONS = {"min_efficiency": Option("float", 0.7, "scaling efficiency below which ...", lo=0, hi=1)}
        REQUIRES = (Requirement("table", "steps"), Requirement("table", "jobs"))

        def run(self, con, scope: Scope) -> list[Finding]:
            ...

with a ``## ps_bound`` heading in docs/detectors.md and tests/analytics/detectors/
test_ps_bound.py (tests/test_docs.py fails without them).  Verdict thresholds come from
cmdare.analytics.verdicts, never restated.  ``detect(name, con, scope)``
(cmdare.analytics.units) runs one by name: options parsed, requirements checked up
front, results checked.
"""

from __future__ import annotations

from cmdare.wire.plugin import load_units

from ..units import DETECTORS, Detector, Finding, Scope, detect

__all__ = ["DETECTORS", "Detector", "Finding", "Scope", "detect"]

load_units(__name__, __path__)
# the order analyze bottlenecks runs and lists them in: each unit's ORDER
DETECTORS.order(tuple(sorted(DETECTORS, key=lambda n: (DETECTORS.get(n).ORDER, n))))
