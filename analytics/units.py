"""What analytics units share: detectors (``analytics/detectors/``) and recommenders
(``analytics/recommend/``) are pluggable units (cmdare.wire.plugin) that get a database
connection and a ``Scope`` and return typed results carrying their evidence numbers.

- ``Scope``: which job (or all), which time window, as of when;
- ``Finding``: what a detector concluded about a job, node or device: severity,
  confidence, a one-line summary and the numbers it stands on (``evidence``), and which
  recommendations answer it (``suggests``);
- ``Recommendation``: what a recommender proposes: the action (counts, types, placement),
  the predicted outcome with an interval, its cost, the fits it used, its assumptions and
  a one-line why;
- ``check_requirements``: a unit's ``REQUIRES`` against the database, before it runs
  (``table``: the table or view exists and has rows; ``fit``: a stored model fit of that
  kind; ``module``: a Python module).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import duckdb

from cmdare.wire.plugin import Registry, Requirement, Unit
from cmdare.wire.units import ConfigError

from .db import AnalyticsError

Number = float | int | str | bool | None  # an evidence value (a count, a ratio, a name)
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Scope:
    """What a unit looks at: one job (None: every job), events from ``since`` (None: all)
    up to ``until`` (None: now)."""

    job: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    # what the detectors of one run share (cmdare.analytics.detectors.evidence: job spans, per-GPU
    # and per-host time buckets), computed once per run; not part of the scope's identity
    cache: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def where(self, ts: str = "ts", job: str = "job") -> tuple[str, list[Any]]:
        """A SQL condition (never empty) and its parameters for this scope."""
        clauses: list[str] = ["true"]
        params: list[Any] = []
        if self.job is not None:
            clauses.append(f"{job} = ?")
            params.append(self.job)
        if self.since is not None:
            clauses.append(f"{ts} >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append(f"{ts} <= ?")
            params.append(self.until)
        return " AND ".join(clauses), params


def _check_evidence(what: str, evidence: dict[str, Number]) -> None:
    for k, v in evidence.items():
        if not isinstance(k, str) or not (v is None or isinstance(v, str | bool | int | float)):
            raise AssertionError(f"{what}: evidence {k!r} must be a number, string, bool or None, got {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise AssertionError(f"{what}: evidence {k!r} is {v} (use None for unknown)")


@dataclass(frozen=True)
class Finding:
    kind: str  # the detector's name
    job: str | None
    summary: str  # one line
    severity: str = "warning"
    confidence: float = 1.0  # 0..1: how sure, from the evidence that was available
    node: str | None = None
    subject: str | None = None  # a GPU (index or uuid), a PS node... within the job or node
    evidence: dict[str, Number] = field(default_factory=dict)
    suggests: tuple[str, ...] = ()  # recommendation kinds that answer it
    rank: int | None = None  # the training rank it is about, where one applies
    window_start: dt.datetime | None = None  # the telemetry it stands on
    window_end: dt.datetime | None = None
    fit_ids: tuple[str, ...] = ()  # stored model fits it used

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise AssertionError(f"finding {self.kind}: severity {self.severity!r} not in {SEVERITIES}")
        if not 0.0 <= self.confidence <= 1.0:
            raise AssertionError(f"finding {self.kind}: confidence {self.confidence} outside 0..1")
        _check_evidence(f"finding {self.kind}", self.evidence)

    def to_json(self) -> dict[str, Any]:
        """The documented JSON object (times as ISO 8601 UTC strings)."""
        d = asdict(self)
        return {
            "kind": self.kind,
            "job": self.job,
            "node": self.node,
            "rank": self.rank,
            "subject": self.subject,
            "severity": self.severity,
            "confidence": round(self.confidence, 3),
            "window_start": None if self.window_start is None else self.window_start.isoformat(),
            "window_end": None if self.window_end is None else self.window_end.isoformat(),
            "summary": self.summary,
            "evidence": d["evidence"],
            "fit_ids": list(self.fit_ids),
            "suggests": list(self.suggests),
        }


@dataclass(frozen=True)
class Recommendation:
    kind: str  # the recommender's name
    action: dict[str, Any]  # counts use the documented keys: workers, ps, remote, local, instances
    predicted: dict[str, Number]  # e.g. steps_per_second, hours, with the interval below
    why: str  # one line
    interval: dict[str, tuple[float, float]] = field(default_factory=dict)  # predicted key -> (lo, hi)
    cost: dict[str, Number] = field(default_factory=dict)
    fit_ids: tuple[str, ...] = ()
    assumptions: dict[str, Number] = field(default_factory=dict)  # prices, quotas, measured vs predicted

    def __post_init__(self) -> None:
        _check_evidence(f"recommendation {self.kind}", self.predicted)
        _check_evidence(f"recommendation {self.kind}", self.cost)
        _check_evidence(f"recommendation {self.kind}", self.assumptions)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["interval"] = {k: list(v) for k, v in self.interval.items()}
        out["fit_ids"] = list(self.fit_ids)
        return out


class AnalyticsUnit(Unit):
    """Base of detectors and recommenders: options, requirements, and ``run``."""

    RESULT: ClassVar[type]  # Finding or Recommendation

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    def run(self, con: duckdb.DuckDBPyConnection, scope: Scope) -> list[Any]:
        raise NotImplementedError


# table -> table_missing's answer, within one run of several units (``remembered``): each
# check is a statement, and on a lake opens a Parquet file (10-20 ms: a third of a
# fleet-wide detector run in lake mode asked the same few tables again and again)
_checked: contextvars.ContextVar[dict[str, str | None] | None] = contextvars.ContextVar("checked", default=None)


@contextlib.contextmanager
def remembered() -> Iterator[None]:
    """Within the block, each table's check runs once (the units of one run see one answer)."""
    token = _checked.set({})
    try:
        yield
    finally:
        _checked.reset(token)


def table_missing(con: duckdb.DuckDBPyConnection, r: Requirement) -> str | None:
    """Why the requirement's table is not there to read (None: it has rows); ``a|b``: any
    of them with rows will do."""
    memo = _checked.get()
    if memo is not None:
        if r.name not in memo:
            memo[r.name] = _table_missing(con, r)
        return memo[r.name]
    return _table_missing(con, r)


def _table_missing(con: duckdb.DuckDBPyConnection, r: Requirement) -> str | None:
    if "|" in r.name:
        names = r.name.split("|")
        if any(table_missing(con, Requirement(r.kind, n)) is None for n in names):
            return None
        return f"no rows in {' or '.join(names)} yet"
    exists = con.execute(
        "SELECT count(*) FROM (SELECT table_name AS n FROM duckdb_tables() UNION ALL "
        "SELECT view_name FROM duckdb_views()) WHERE n = ?",
        [r.name],
    ).fetchall()[0][0]
    if not exists:
        return f"the database has no table {r.name} (an older schema? run cmdare-collector migrate)"
    if not con.execute(f'SELECT count(*) FROM (SELECT 1 FROM "{r.name}" LIMIT 1)').fetchall()[0][0]:
        return f"no rows in {r.name} yet"
    return None


def _fit_missing(con: duckdb.DuckDBPyConnection, r: Requirement) -> str | None:
    n = con.execute("SELECT count(*) FROM model_fits WHERE kind = ?", [r.name]).fetchall()[0][0]
    return None if n else f"no {r.name} model fitted yet (run analyze fit {r.name})"


def check_requirements(registry: Registry[Any], name: str, con: duckdb.DuckDBPyConnection) -> None:
    """``registry.check`` with the database checks; AnalyticsError with the one-line reason."""
    try:
        registry.check(
            name,
            {"table": lambda r: table_missing(con, r), "fit": lambda r: _fit_missing(con, r)},
        )
    except ConfigError as e:
        raise AnalyticsError(str(e)) from None


def run_unit(
    registry: Registry[Any], name: str, con: duckdb.DuckDBPyConnection, scope: Scope, options: dict[str, Any]
) -> list[Any]:
    """Run unit ``name`` of ``registry``: options parsed (``options``: user input, as text or
    typed), requirements checked, results checked to be the unit's result type."""
    cls = registry.get(name)
    try:
        opts = cls.parse_options(name, options)
    except ConfigError as e:
        raise AnalyticsError(str(e)) from None
    check_requirements(registry, name, con)
    out = cls(opts).run(con, scope)
    for r in out:
        if not isinstance(r, cls.RESULT) or r.kind != name:
            raise AssertionError(f"{registry.kind} {name} returned {r!r}, not a {cls.RESULT.__name__} of its kind")
    return out


class Detector(AnalyticsUnit):
    """Base of detectors (``analytics/detectors/<name>.py``): ``run`` returns ``Finding``s;
    ``ACTION``: what to do about a finding in one line, ``{name}`` filled from its evidence
    (shown where no recommender answers it); ``ORDER`` and ``FINDS``: where it runs and
    how ``analyze bottlenecks --help`` names it (the unit is the only list)."""

    RESULT: ClassVar[type] = Finding
    ACTION: ClassVar[str] = ""
    ORDER: ClassVar[int] = 1000  # where analyze bottlenecks runs and lists it (lower first; ties by name)
    FINDS: ClassVar[str] = ""  # what it finds, a plural phrase: analyze bottlenecks --help lists them

    @classmethod
    def action(cls, f: Finding) -> str:
        """``ACTION`` for finding ``f``: the evidence's numbers filled in (one the evidence
        lacks reads "?", never a KeyError)."""
        import re

        return re.sub(r"\{(\w+)\}", lambda m: str(f.evidence.get(m.group(1), "?")), cls.ACTION)


class Recommender(AnalyticsUnit):
    """Base of recommenders (``analytics/recommend/<name>.py``): ``run`` returns
    ``Recommendation``s.  Its ``analyze recommend NAME`` command is made from the unit
    (analytics/cli/recommend.py): the class docstring is its help, ``OPTIONS`` its flags,
    and these say the rest."""

    RESULT: ClassVar[type] = Recommendation
    # when the command reads the database: "always"; "job" (only with the ``job`` option:
    # the other figures come on the command line); "optional" (when --db is given or the
    # default database exists)
    DATABASE: ClassVar[str] = "always"
    NEEDS: ClassVar[dict[str, str]] = {}  # option -> the option it needs on the command line
    # per option, how the terminal shows it (click's keywords, as data: "decls", "multiple",
    # "metavar", "help", "required", "hidden"; "path": a file on the caller's machine);
    # "db": the --db option's help where the database is optional
    TERMINAL: ClassVar[dict[str, dict[str, Any]]] = {}


DETECTORS: Registry[type[Detector]] = Registry("detector")
RECOMMENDERS: Registry[type[Recommender]] = Registry("recommender")


def detect(name: str, con: duckdb.DuckDBPyConnection, scope: Scope, **options: Any) -> list[Finding]:
    """The findings of detector ``name`` in ``scope`` (options as user input)."""
    return run_unit(DETECTORS, name, con, scope, options)


def recommend(name: str, con: duckdb.DuckDBPyConnection, scope: Scope, **options: Any) -> list[Recommendation]:
    """The recommendations of recommender ``name`` in ``scope`` (options as user input)."""
    return run_unit(RECOMMENDERS, name, con, scope, options)
