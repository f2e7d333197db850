"""Running the detectors (``analyze bottlenecks``): all of them or some, over one scope,
sharing what they read (cmdare.analytics.detectors.evidence), with options from a config file and
per-run overrides; storing what they found in the ``findings`` table.

Storage is idempotent: a run of detectors K over a scope replaces the stored findings of
kinds K (of the scope's job, when it names one) whose window overlaps the scope's, so
running it again stores nothing twice; a finding seen before (same kind, job, node, rank
and subject) keeps its ``first_detected``.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from cmdare.wire.units import ConfigError

from ..db import AnalyticsError
from ..detectors import DETECTORS
from ..units import Finding, Scope, check_requirements, remembered, run_unit

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
EPOCH = dt.datetime(1970, 1, 1)  # a coverage that starts with the data
COLUMNS = ("kind, job, node, rank, subject, severity, confidence, window_start, window_end, summary, evidence, "
           "fit_ids, suggests, first_detected, detected_at")
CONFIG_ENV = "CMDARE_ANALYZE_CONFIG"


@dataclass
class Outcome:
    findings: list[Finding] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one line per detector that could not run
    ran: list[str] = field(default_factory=list)


def load_config(path: str | Path) -> dict[str, dict[str, Any]]:
    """``[detectors.<name>]`` tables of a TOML file: detector -> options (checked later, by
    the detector).  A one-line AnalyticsError for an unreadable file or an unknown detector."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    p = Path(path)
    try:
        tree = tomllib.loads(p.read_text())
    except OSError as e:
        raise AnalyticsError(f"{p}: cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise AnalyticsError(f"{p}: not valid TOML: {e}") from None
    unknown = sorted(set(tree) - {"detectors"})
    if unknown:
        raise AnalyticsError(f"{p}: unknown table [{unknown[0]}] (known: [detectors.<name>])")
    dets = tree.get("detectors", {})
    if not isinstance(dets, dict):
        raise AnalyticsError(f"{p}: [detectors] must be a table of [detectors.<name>] tables")
    out: dict[str, dict[str, Any]] = {}
    for name, opts in dets.items():
        if name not in DETECTORS:
            raise AnalyticsError(f"{p}: unknown detector [detectors.{name}] (known: {', '.join(sorted(DETECTORS))})")
        if not isinstance(opts, dict):
            raise AnalyticsError(f"{p}: detectors.{name} must be a table of options")
        out[name] = dict(opts)
    return out


def parse_set(items: list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``KIND.OPTION=VALUE`` overrides (the value as text; a list option splits on commas)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, eq, value = item.partition("=")
        kind, dot, opt = key.strip().partition(".")
        if not eq or not dot or not opt:
            raise AnalyticsError(f"--set {item!r}: expected DETECTOR.OPTION=VALUE, e.g. ps_bound.min_efficiency=0.7")
        try:
            cls = DETECTORS.get(kind)
        except ConfigError as e:
            raise AnalyticsError(f"--set {item!r}: {e}") from None
        o = cls.OPTIONS.get(opt)
        v: Any = value.strip()
        if o is not None and o.kind == "list":
            v = [x.strip() for x in v.split(",") if x.strip()]
        out.setdefault(kind, {})[opt] = v
    return out


def merged(config: dict[str, dict[str, Any]], overrides: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {k: dict(v) for k, v in config.items()}
    for k, v in overrides.items():
        out.setdefault(k, {}).update(v)
    return out


def check_options(options: dict[str, dict[str, Any]]) -> None:
    """Every detector's options parse (before any runs): a one-line error naming the key."""
    for name, opts in options.items():
        try:
            DETECTORS.get(name).parse_options(name, opts)
        except ConfigError as e:
            raise AnalyticsError(str(e)) from None


def run(
    con: duckdb.DuckDBPyConnection,
    scope: Scope,
    kinds: list[str] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> Outcome:
    """Run detectors ``kinds`` (all when None) over ``scope``; a detector whose data is
    missing is skipped with one line saying what it needed, and the others still run."""
    options = options or {}
    names = list(kinds) if kinds else list(DETECTORS)
    for n in names:
        try:
            DETECTORS.get(n)
        except ConfigError as e:
            raise AnalyticsError(str(e)) from None
    check_options(options)
    out = Outcome()
    with remembered():  # each table's has-rows check once for all the detectors
        for name in names:
            try:
                check_requirements(DETECTORS, name, con)
            except AnalyticsError as e:
                out.skipped.append(str(e))
                continue
            out.findings += run_unit(DETECTORS, name, con, scope, options.get(name, {}))
            out.ran.append(name)
    for key in list(scope.cache):  # the shared temp tables go with the run
        name = scope.cache.pop(key)
        if isinstance(name, str) and name.startswith("_cmdare_"):
            con.execute(f"DROP TABLE IF EXISTS {name}")
    out.findings.sort(key=_order)
    return out


def _order(f: Finding) -> tuple:
    return (SEVERITY_RANK[f.severity], -f.confidence, f.kind, f.job or "", f.node or "", f.rank or 0)


def merge(parts: list[Outcome]) -> Outcome:
    """One Outcome of runs over one scope by disjoint detector sets (Spark's tasks, one
    detector each): as one run of them all reports it."""
    out = Outcome()
    for p in parts:
        out.findings += p.findings
        out.skipped += p.skipped
        out.ran += p.ran
    out.findings.sort(key=_order)
    return out


def keep_lake(uri: str, catalog: str | None, since: dt.datetime, run_kinds: Any = None) -> int:
    """Every detector over every job from ``since``, stored into the lake's findings
    (``cmdare-collector maintain --findings``: in lake mode no collector keeps them
    current); ``run_kinds(uri, catalog, since, kinds)`` runs them elsewhere (Spark's
    tasks) and returns one Outcome.  The findings stored."""
    from ..lakedb import LakeDatabase

    scope = Scope(None, since, None)
    with LakeDatabase(uri, catalog).write() as con:
        out = run(con, scope) if run_kinds is None else run_kinds(uri, catalog, since, list(DETECTORS))
        return store(con, out, scope)


def run_lake(uri: str, catalog: str | None, since: dt.datetime, kinds: list[str]) -> Outcome:
    """``run`` of ``kinds`` over every job from ``since`` on a lake read of its own (one
    Spark task)."""
    from ..lakedb import LakeDatabase

    with LakeDatabase(uri, catalog).read() as con:
        return run(con, Scope(None, since, None), kinds)


def record_coverage(con: duckdb.DuckDBPyConnection, kinds: list[str], job: str | None, since: dt.datetime | None,
                    until: dt.datetime, now: dt.datetime, extend: bool = False) -> None:
    """The detectors ``kinds`` looked at [since, until] for ``job`` (None: every job); with
    ``extend``, the latest row of the same kinds and job reaching ``since`` grows instead
    (a schedule's consecutive rounds). Inside the caller's transaction."""
    start = since or EPOCH
    if extend:
        row = con.execute(
            """SELECT rowid FROM finding_coverage
               WHERE job IS NOT DISTINCT FROM $job AND kinds = $kinds::VARCHAR[] AND window_end >= $start
               ORDER BY window_end DESC LIMIT 1""", {"job": job, "kinds": sorted(kinds), "start": start}).fetchone()
        if row is not None:
            con.execute("UPDATE finding_coverage SET window_end = greatest(window_end, $until), ran_at = $now "
                        "WHERE rowid = $r", {"until": until, "now": now, "r": row[0]})
            return
    con.execute("INSERT INTO finding_coverage VALUES ($job, $kinds::VARCHAR[], $start, $until, $now)",
                {"job": job, "kinds": sorted(kinds), "start": start, "until": until, "now": now})


def _key(kind: str, job: Any, node: Any, rank: Any, subject: Any) -> tuple:
    return (kind, job, node, rank, subject)


def store(
    con: duckdb.DuckDBPyConnection, outcome: Outcome, scope: Scope, now: dt.datetime | None = None
) -> int:
    """Replace the stored findings of the kinds that ran (see the module doc); the number stored."""
    now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    if not outcome.ran:
        return 0
    cond = ["kind IN (SELECT unnest($kinds))"]
    params: dict[str, Any] = {"kinds": outcome.ran}
    if scope.job is not None:
        cond.append("job = $job")
        params["job"] = scope.job
    if scope.since is not None:
        cond.append("(window_end IS NULL OR window_end >= $since)")
        params["since"] = scope.since
    if scope.until is not None:
        cond.append("(window_start IS NULL OR window_start <= $until)")
        params["until"] = scope.until
    where = " AND ".join(cond)
    con.execute("BEGIN")
    try:
        first = {
            _key(*r[:5]): r[5]
            for r in con.execute(
                f"SELECT kind, job, node, rank, subject, min(first_detected) FROM findings WHERE {where} GROUP BY ALL",
                params,
            ).fetchall()
        }
        con.execute(f"DELETE FROM findings WHERE {where}", params)
        rows = [
            (
                f.kind,
                f.job,
                f.node,
                f.rank,
                f.subject,
                f.severity,
                f.confidence,
                f.window_start,
                f.window_end,
                f.summary,
                json.dumps(f.evidence),
                json.dumps(list(f.fit_ids)),
                json.dumps(list(f.suggests)),
                first.get(_key(f.kind, f.job, f.node, f.rank, f.subject), now),
                now,
            )
            for f in outcome.findings
        ]
        if rows:
            con.executemany(f"INSERT INTO findings ({COLUMNS}) VALUES (" + ", ".join("?" * 15) + ")", rows)
        record_coverage(con, outcome.ran, scope.job, scope.since, scope.until or now, now)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return len(rows)


# -- what to do about them -------------------------------------------------------------------

@dataclass
class NextStep:
    """One ``analyze recommend`` command answering findings, tried before it is shown: ``ok``
    with the gist of its answer, or not, with the one-line reason (a recommendation the data
    cannot give is never suggested)."""

    kind: str  # the recommender
    job: str
    command: str  # the analyze command line
    ok: bool
    answer: str = ""  # e.g. "workers 4, ps 2"
    reason: str = ""  # why it cannot answer (when not ok)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "job": self.job, "command": self.command, "ok": self.ok,
                "answer": self.answer or None, "reason": self.reason or None}


# recommender -> (its option naming the job, the flag)
_NEXT = {"cluster": ("from_job", "--from-job"), "data-workers": ("job", "--job"), "placement": ("job", "--job")}
NEXT_OPTIONS = _NEXT  # recommender -> (its job option, the flag): what a finding's next step passes


def next_steps(con: duckdb.DuckDBPyConnection, found: list[Finding]) -> list[NextStep]:
    """The recommendations the findings suggest, each run once on this database: those that
    answer, with their gist, and those that cannot, with why."""
    import shlex

    from ..recommend import recommend

    out: list[NextStep] = []
    seen: set[tuple[str, str]] = set()
    for f in found:
        for kind in f.suggests:
            if not f.job or kind not in _NEXT or (kind, f.job) in seen:
                continue
            seen.add((kind, f.job))
            opt, flag = _NEXT[kind]
            cmd = f"analyze recommend {kind} {flag} {shlex.quote(f.job)}"
            try:
                recs = recommend(kind.replace("-", "_"), con, Scope(), **{opt: f.job})
            except AnalyticsError as e:
                out.append(NextStep(kind, f.job, cmd, False, reason=str(e).split("\n")[0][:200]))
                continue
            gist = "; ".join(
                ", ".join(f"{k} {v}" for k, v in r.action.items() if not isinstance(v, dict)) for r in recs
            )
            out.append(NextStep(kind, f.job, cmd, True, answer=gist))
    return out
