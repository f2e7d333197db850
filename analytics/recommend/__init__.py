"""Recommenders: what to do about it (data workers, input placement, cluster size and PS
count, spot provisioning, region), with the predicted outcome and its cost.

One recommender per file, ``analytics/recommend/<name>.py`` (the name is the ``analyze
recommend KIND``), registered with ``@RECOMMENDERS.register`` on a ``Recommender``
subclass, with typed ``OPTIONS`` and ``REQUIRES`` (a ``fit`` requirement names the model
kind it predicts with), a ``## name`` heading in docs/recommendations.md and
tests/analytics/recommend/test_<name>.py (tests/test_docs.py fails without them).
``recommend(name, con, scope, **options)`` (cmdare.analytics.units) runs one by name.
"""

from __future__ import annotations

from cmdare.wire.plugin import load_units

from ..units import RECOMMENDERS, Recommendation, Recommender, Scope, recommend

__all__ = ["RECOMMENDERS", "Recommendation", "Recommender", "Scope", "recommend"]

load_units(__name__, __path__)
