"""The analytics library: what the ``analyze`` CLI, the collector's HTTP API and the pages
call. Plain arguments in, plain data out; no click, no printing, no HTTP.

Every function takes a ``Database`` (cmdare.analytics.db): a file opened per call, or the
live database of the collector serving it. Reads run on connections that cannot write;
the functions that write (``fit``, ``import_events``, ``bottlenecks(store=True)``) say so.
Problems a user can fix raise ``AnalyticsError`` with one line.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import duckdb

from cmdare.wire.plugin import Option

from . import queries
from .db import AnalyticsError, Database
from .queries import needs_schema
from .units import Finding, Recommendation, Scope


@dataclass
class Table:
    """Rows of one query, in order, with their column names."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    notes: list[str] = field(default_factory=list)  # what the rows leave out, in words


def _table(db: Database, fn: Any, *args: Any) -> Table:
    with db.read() as con:
        cols, rows = fn(con, *args)
    return Table(list(cols), [tuple(r) for r in rows])


# -- telemetry ------------------------------------------------------------------------------

def nodes(db: Database, lost_after: float = 3, label: str | None = None) -> Table:
    """Every node seen (cmdare.analytics.queries.nodes); ``label``: KEY=VALUE."""
    return _table(db, queries.nodes, lost_after, queries.parse_label(label))


def instances(db: Database, lost_after: float = 3, since: dt.datetime | None = None, region: str | None = None,
              gpu_type: str | None = None) -> Table:
    """Every life of every VM."""
    return _table(db, queries.instances, lost_after, since, region, gpu_type)


def revocations(db: Database, since: dt.datetime | None = None, region: str | None = None,
                gpu_type: str | None = None) -> Table:
    """Revocation and maintenance notices and the work they cost."""
    return _table(db, queries.revocations, since, region, gpu_type)


def gpu(db: Database, node: str | None = None, since: dt.datetime | None = None, until: dt.datetime | None = None,
        label: str | None = None, every: float | None = None) -> Table:
    """Per GPU (per ``every`` seconds): utilisation, memory, power, temperature, throttling, errors."""
    return _table(db, queries.gpu, node, since, until, queries.parse_label(label), every)


def tpu(db: Database, node: str | None = None, since: dt.datetime | None = None, until: dt.datetime | None = None,
        label: str | None = None) -> Table:
    """Per TPU device: TensorCore duty cycle, HBM used and bandwidth, the jobs on its node."""
    return _table(db, queries.tpu, node, since, until, queries.parse_label(label))


def gpu_processes(db: Database, node: str | None = None, since: dt.datetime | None = None,
                  until: dt.datetime | None = None, job: str | None = None) -> Table:
    """Per GPU and process: the job and rank it is (by PID), its share of the GPU's samples,
    SM / memory share and memory; ``job``: that job's only."""
    return _table(db, queries.gpu_processes, node, since, until, job)


def host(db: Database, node: str | None = None, since: dt.datetime | None = None, until: dt.datetime | None = None,
         label: str | None = None, every: float | None = None) -> Table:
    """Per node (per ``every`` seconds): CPU, load, memory, processes, network and disk."""
    return _table(db, queries.host, node, since, until, queries.parse_label(label), every)


def jobs(db: Database, since: dt.datetime | None = None) -> Table:
    """Training jobs with their speed and input-bound verdict."""
    return _table(db, queries.jobs, since)


def steps(db: Database, job: str, node: str | None = None, since: dt.datetime | None = None) -> Table:
    """One job per run and rank."""
    return _table(db, queries.steps, job, node, since)


def goodput(db: Database, job: str, since: dt.datetime | None = None, until: dt.datetime | None = None,
            every: float | None = None) -> Table:
    """A job's accelerator time (within [since, until) when given; per window of ``every``
    seconds) in closed goodput / badput buckets, GPU-hours and dollars (cmdare.analytics.accounting)."""
    from .accounting import job_table
    from .goodput import epoch

    with db.read() as con:
        cols, rows = job_table(con, job, epoch(since), epoch(until), every)
        notes = queries.gpu_use_notes(con, job, since, until)
    return Table(list(cols), [tuple(r) for r in rows], notes=notes)


def fleet_goodput(db: Database, since: dt.datetime | None = None, until: dt.datetime | None = None,
                  by: str = "fleet", every: float | None = None, detect: bool = False) -> Table:
    """Every job's accelerator time in the range, rolled up ``by`` job, region, accelerator,
    fleet or a node label (e.g. team); ``notes`` says what was not counted."""
    from .accounting import fleet_table

    with db.read() as con:
        cols, rows, notes = fleet_table(con, since, until, by, every, detect)
    return Table(cols, rows, notes=notes)


def sql(db: Database, query: str, max_rows: int | None = None, timeout: float | None = None,
        max_bytes: int | None = None) -> Any:
    """One read-only SELECT within row, byte and time limits (cmdare.analytics.safesql)."""
    from . import safesql

    with db.read(safesql.CONFIG) as con:
        return safesql.run(con, query, max_rows or safesql.MAX_ROWS, timeout or safesql.TIMEOUT,
                           max_bytes or safesql.MAX_BYTES)


# -- findings -------------------------------------------------------------------------------

@dataclass
class Bottlenecks:
    """What ``bottlenecks`` found: the findings (sorted), one line per detector that could
    not run, the detectors that ran, and how many were stored (None: not stored, and why)."""

    findings: list[Finding]
    skipped: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    stored: int | None = None
    not_stored: str = ""  # "no-store" or "read-only" when stored is None
    next: list[Any] = field(default_factory=list)  # findings.NextStep: the recommendations they suggest, tried


def _known_job(con: Any, job: str) -> None:
    known = con.execute(
        "SELECT (SELECT count(*) FROM jobs WHERE job = $j) + (SELECT count(*) FROM steps WHERE job = $j)", {"j": job}
    ).fetchall()[0][0]
    if not known:
        raise AnalyticsError(f"--job {job}: no such job in the database (analyze jobs lists them)")


def detector_options(config: dict[str, dict[str, Any]] | None, sets: list[str] | None) -> dict[str, dict[str, Any]]:
    """Detector options: a config file's tables, then ``DETECTOR.OPTION=VALUE`` overrides
    (``bottlenecks`` checks them, before it opens anything)."""
    from . import findings

    return findings.merged(config or {}, findings.parse_set(list(sets or [])))


def bottlenecks(db: Database, job: str | None = None, since: dt.datetime | None = None,
                kinds: list[str] | None = None, options: dict[str, dict[str, Any]] | None = None,
                store: bool = True, next_steps: bool = True) -> Bottlenecks:
    """Run the detectors over ``job`` (None: all) since ``since``; with ``store``, replace
    the findings table's rows of this scope (a database that cannot be written is analysed
    without storing: ``not_stored`` says why); with ``next_steps``, run the recommendations
    the findings suggest and say which answer (``next``)."""
    from . import findings

    options = options or {}
    findings.check_options(options)
    writable = store and db.writable()
    ctx = db.write() if writable else db.read()
    with ctx as con:
        if job is not None:
            _known_job(con, job)
        scope = Scope(job, since, None)
        out = findings.run(con, scope, list(kinds or []) or None, options)
        stored = findings.store(con, out, scope) if writable else None
        nxt = findings.next_steps(con, out.findings) if next_steps else []
    return Bottlenecks(out.findings, out.skipped, out.ran, stored,
                       "" if writable else ("no-store" if not store else "read-only"), nxt)


# -- alerts ---------------------------------------------------------------------------------

@dataclass
class Alerts:
    """The alerts table (rule, state, since, value, labels JSON, summary, description) and
    each rule's health (rule, health, last_error, last_eval, eval_seconds, instances)."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    health: list[tuple[Any, ...]]


def alerts(db: Database, rule: str | None = None) -> Alerts:
    from . import alerting as al

    try:
        with db.read() as con:
            needs_schema(con, 10, "analyze alerts")
            cols, rows, health = al.listing(con)
    except duckdb.Error as e:
        raise AnalyticsError(str(e).splitlines()[0]) from None
    if rule:
        rows = [r for r in rows if r[0] == rule or r[0].split("/", 1)[-1] == rule]
        health = [h for h in health if h[0] == rule or h[0].split("/", 1)[-1] == rule]
    return Alerts(list(cols), [tuple(r) for r in rows], [tuple(h) for h in health])


@dataclass
class RulesChecked:
    files: int
    groups: int
    rules: int


def check_rules(db: Database | None, files: list[tuple[str, str]]) -> RulesChecked:
    """Validate rule files given as (name, text): structure, durations, templates, and each
    rule's SQL bound against ``db``'s tables (None: an empty database of the current
    schema). Nothing is read but the texts and the database."""
    from . import alerting as al

    groups = al.load_texts(files)
    if db is not None and db.exists():
        with db.read(SCHEMA_CONFIG) as con:
            al.validate(con, groups)
    else:
        con = empty_db()
        try:
            al.validate(con, groups)
        finally:
            con.close()
    return RulesChecked(len(files), len(groups), sum(len(g.rules) for g in groups))


# no file, network, extension or Python-object access while rule SQL is bound
SCHEMA_CONFIG: dict[str, object] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,
}


def empty_db() -> duckdb.DuckDBPyConnection:
    """An in-memory database with the collector's current schema and views, which reads
    nothing else (rule checks and rule unit tests run on it)."""
    from cmdare.collector.db import migrate
    from cmdare.collector.views import apply

    con = duckdb.connect(":memory:")
    migrate(con)
    apply(con)
    for k, v in SCHEMA_CONFIG.items():
        con.execute(f"SET {k} = {str(v).lower()}")
    return con


# -- models ---------------------------------------------------------------------------------

FIT_KINDS = ("speed", "cluster", "overhead", "lifetime")


@dataclass
class FitResult:
    """A stored fit: its summary (fit_id, family, rows, groups, cv_mape, cv_r2,
    coefficients, notes), held-out details (``cv``) and the model's own numbers."""

    kind: str
    summary: dict[str, Any]
    cv: dict[str, Any]
    model: dict[str, Any]


def latest_or_none(con: Any, kind: str) -> dict[str, Any] | None:
    from . import models

    try:
        return models.latest(con, kind)
    except AnalyticsError:
        return None


def fit(db: Database, kind: str, lost_after: float = 3) -> FitResult:
    """Fit a model of ``kind`` from the database and store it in model_fits (writes)."""
    from . import models

    if kind not in FIT_KINDS:
        raise AnalyticsError(f"fit: unknown kind {kind!r} (known: {', '.join(FIT_KINDS)})")
    if not db.exists():
        raise AnalyticsError(f"{db.path}: no such database (load one with cmdare-collector, or pass --db)")
    with db.write() as con:
        if kind in ("speed", "cluster"):
            js, skipped = models.job_speeds(con)
            f = models.fit_speed(js) if kind == "speed" else models.fit_cluster(js, latest_or_none(con, "speed"))
            f.notes += skipped
        elif kind == "overhead":
            f = models.fit_overhead(con)
        else:
            f = models.fit_lifetime(con, lost_after)
        models.save(con, f)
    return FitResult(kind, f.summary(), dict(f.cv), dict(f.model))


@dataclass(frozen=True)
class ModelSpec:
    """The model a prediction is for, when no job supplies it."""

    flops_per_step: float
    params: float
    tensors: int
    batch_size: int | None = None

    @classmethod
    def of(cls, flops_per_step: float, params: float, tensors: int | None = None,
           batch_size: int | None = None) -> ModelSpec:
        """With the default tensor count (params / 1e5, at least 1) when none is given."""
        return cls(flops_per_step, params, tensors or max(1, round(params / 1e5)), batch_size)


def _measured(a: Any) -> dict[str, Any]:
    """What a --from-job job supplied (the keys every such prediction adds)."""
    j = a.job
    return {
        "from_job": j.job,
        "measured_steps_per_second": j.speed,
        "measured_accelerator": j.accelerator,
        "measured_workers": j.workers,
        "measured_ps": j.ps,
        "single_worker_step_seconds": a.t1,
        "single_worker_from": "cluster fit" if a.derived else "measured",
    }


# each prediction's options, declared once: the CLI's options are generated from these
# tables, and the HTTP API's query parameters carry the same names and bounds
MODEL_OPTIONS: dict[str, Any] = {
    "from_job": Option("str", "", "a job in the database: its model, accelerator and measured steady-state speed "
                                  "(instead of the options below)"),
    "flops_per_step": Option("float", 0.0, "FLOPs per training step", lo=0, lo_open=True),
    "params": Option("float", 0.0, "parameter count", lo=0, lo_open=True),
    "tensors": Option("int", 0, "parameter tensors (default: params / 1e5, at least 1)", lo=1, hi=1 << 31),
    "batch_size": Option("int", 0, "per-worker batch size (adds examples/s)", lo=1, hi=1 << 31),
}
PREDICTIONS: dict[str, dict[str, Any]] = {
    "speed": {"gpu_type": Option("str", "", "accelerator (catalogue name or alias, e.g. v100)"), **MODEL_OPTIONS},
    "cluster": {
        "gpu_type": Option("str", "", "accelerator of every worker (with workers)"),
        "workers": Option("int", 0, "number of workers (with gpu_type)", lo=1, hi=65536),
        "gpus": Option("str", "", "heterogeneous workers, TYPE:COUNT,... e.g. k80:2,p100:2"),
        "ps": Option("int", 0, "parameter servers", lo=1, hi=4096),
        **MODEL_OPTIONS,
    },
    "revocation": {
        "region": Option("str", "", "the region (e.g. us-central1)"),
        "gpu_type": Option("str", "", "the accelerator (catalogue name or alias)"),
        "hours": Option("float", 0.0, "hours after boot", lo=0, lo_open=True, hi=1e6),
    },
    "checkpoint": {
        "size_mb": Option("float", 0.0, "checkpoint size, MB", lo=0, lo_open=True, hi=1e8),
        "tensors": Option("int", 0, "parameter tensors of the model (where known)", lo=1, hi=10**9),
        "params": Option("int", 0, "parameters of the model (where known)", lo=1, hi=10**15),
    },
    "startup": {
        "region": Option("str", "", "the region (e.g. us-east1)"),
        "purchase": Option("str", "spot", "purchase option: spot or on-demand", choices=("spot", "on-demand")),
        "gpu_type": Option("str", "", "the accelerator (e.g. p100)"),
    },
}


def predict_speed(db: Database, gpu_type: str, model: ModelSpec | None = None, from_job: str | None = None,
                  batch_size: int | None = None) -> dict[str, Any]:
    """Single-worker steps/s of a model (or of job ``from_job``'s) on an accelerator."""
    from . import catalog, models

    with db.read() as con:
        acc = catalog.lookup(gpu_type)
        f = models.latest(con, "speed")
        if model is None:
            if not from_job:
                raise AnalyticsError("give --flops-per-step and --params, or --from-job JOB")
            a = models.anchor(con, from_job, latest_or_none(con, "cluster"))
            j = a.job
            v_fit, lo, hi = models.predict_speed(f, acc, j.flops_per_step, j.params, j.tensors)
            v = 1.0 / a.t1_on(acc, f)
            k = v / v_fit  # the fit's interval, carried to the measured level
            out = {"prediction": v, "interval": [lo * k, hi * k], "fit_id": f["fit_id"], **_measured(a)}
            bs = batch_size or j.batch_size
            spec = models.range_inputs(j.flops_per_step, j.params, j.tensors)
        else:
            v, lo, hi = models.predict_speed(f, acc, model.flops_per_step, model.params, model.tensors)
            out = {"prediction": v, "interval": [lo, hi], "fit_id": f["fit_id"]}
            bs = model.batch_size
            spec = models.range_inputs(model.flops_per_step, model.params, model.tensors)
        _extrapolation(out, f, **spec, accelerator=acc.name)
    out |= {"accelerator": acc.name, "step_seconds": 1 / v}
    if bs:
        out["examples_per_second"] = v * bs
    return out


def predict_cluster(db: Database, gpus: list[tuple[str, int]], ps: int, model: ModelSpec | None = None,
                    from_job: str | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """Cluster steps/s of a PS job on workers ``gpus`` ((type, count); type "" is the job's)."""
    with db.read() as con:
        return cluster_prediction(con, gpus, ps, model, from_job, batch_size)


def cluster_prediction(con: duckdb.DuckDBPyConnection, gpus: list[tuple[str, int]], ps: int,
                       model: ModelSpec | None = None, from_job: str | None = None, batch_size: int | None = None,
                       cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """``predict_cluster`` on an open connection; ``cache``: the fits and the job's anchor kept
    across calls (a scaling curve predicts one job at many worker counts)."""
    from . import catalog, models

    cache = cache if cache is not None else {}
    if "fits" not in cache:
        cache["fits"] = models.latest(con, "speed"), models.latest(con, "cluster")
    sfit, cfit = cache["fits"]
    extra: dict[str, Any] = {}
    ws: list[float] = []
    if model is None:
        if not from_job:
            raise AnalyticsError("give --flops-per-step and --params, or --from-job JOB")
        if cache.get("anchor_of") != from_job:
            cache["anchor"], cache["anchor_of"] = models.anchor(con, from_job, cfit), from_job
        a = cache["anchor"]
        params, bs = a.job.params, batch_size or a.job.batch_size
        for name, n in gpus:
            acc = catalog.lookup(name) if name else a.job.acc
            ws += [a.t1_on(acc, sfit)] * n
        extra = _measured(a)
    else:
        params, bs = model.params, model.batch_size
        for name, n in gpus:
            acc = catalog.lookup(name)
            v1 = models.predict_speed(sfit, acc, model.flops_per_step, model.params, model.tensors)[0]
            ws += [1.0 / v1] * n
    r = models.predict_cluster(cfit, ws, ps, params)
    out = {
        "prediction": r.pop("steps_per_second"),
        "interval": [r.pop("lower"), r.pop("upper")],
        "fit_id": cfit["fit_id"],
        "speed_fit_id": sfit["fit_id"],
        "workers": len(ws),
        **r,
        **extra,
    }
    accs = sorted({catalog.lookup(n).name if n else a.job.acc.name for n, _ in gpus if n or a.job.acc})
    _extrapolation(out, cfit, workers=len(ws), ps=ps, workers_per_ps=len(ws) / max(ps, 1), params=params,
                   accelerator=accs)
    if bs:
        out["examples_per_second"] = out["prediction"] * bs
    return out


def _extrapolation(out: dict[str, Any], fit: dict[str, Any], **inputs: Any) -> None:
    """``extrapolated`` (None: the fit cannot tell), the reasons, and the interval widened
    by the decades outside the fitted ranges (cmdare.analytics.models.ranges)."""
    from .models.ranges import check, widen

    ex, reasons, decades = check(fit, **inputs)
    out["extrapolated"] = ex
    if reasons:
        out["extrapolation"] = reasons
    if ex and decades > 0:
        lo, hi = out["interval"]
        out["interval"] = list(widen(out["prediction"], lo, hi, decades))
        out["interval_widened"] = round(1 + decades, 3)


def predict_revocation(db: Database, region: str, gpu_type: str, hours: float) -> dict[str, Any]:
    """P(a spot VM of this region and accelerator is revoked within ``hours`` of boot)."""
    from . import models

    with db.read() as con:
        f = models.latest(con, "lifetime")
        r = models.predict_revocation(f, region, gpu_type, hours)
    return {"prediction": r.pop("probability"), "interval": [r.pop("lower"), r.pop("upper")],
            "fit_id": f["fit_id"], **r}


# -- recommendations ------------------------------------------------------------------------

def recommend(db: Database | None, kind: str, **options: Any) -> list[Recommendation]:
    """Recommender ``kind`` (cmdare.analytics.recommend) with its options (as user input);
    ``db`` None for a recommender given everything it needs in its options."""
    from .recommend import recommend as run

    name = kind.replace("-", "_")
    if db is None:
        return run(name, None, Scope(), **options)  # type: ignore[arg-type]
    with db.read() as con:
        return run(name, con, Scope(), **options)


def recommender_options(kind: str) -> dict[str, Any]:
    """The recommender's option table (name -> Option), which the CLI and the API are built from."""
    from .recommend import RECOMMENDERS

    return dict(RECOMMENDERS.get(kind.replace("-", "_")).OPTIONS)


# -- imports --------------------------------------------------------------------------------

IMPORT_TYPES = ("train_job", "train_steps", "train_scalar")


def import_events(db: Database, job: str, lines: list[bytes]) -> dict[str, Any]:
    """Store prepared import events (wire-format JSON lines of ``job``: train_job,
    train_steps, train_scalar only) through the collector's writer (writes); the counts
    stored. Anything else is refused whole, with nothing written."""
    import json

    if getattr(db, "lake", None) is not None:
        raise AnalyticsError("import into a lake: events reach a lake through a collector "
                             "(write them to a spool and run cmdare-collector spool DIR --lake URI)")

    from cmdare.collector.writer import Writer

    for i, line in enumerate(lines):
        try:
            ev = json.loads(line)
        except ValueError:
            raise AnalyticsError(f"import: event {i + 1} is not JSON") from None
        if not isinstance(ev, dict) or ev.get("type") not in IMPORT_TYPES or ev.get("job") != job:
            raise AnalyticsError(f"import: event {i + 1} is not a {'/'.join(IMPORT_TYPES)} event of job {job!r}")
    with db.write() as con:
        if not lines:  # only open it (the CLI checks the database before reading files)
            return {"steps": 0, "scalars": 0, "duplicates": 0}
        w = Writer(con).write([(f"import:{job}", b"".join(x if x.endswith(b"\n") else x + b"\n" for x in lines))])
    if w.dead:
        raise AnalyticsError(f"{w.dead} imported events were rejected by the writer; see dead_letters")
    return {"steps": w.rows.get("steps", 0), "scalars": w.rows.get("scalars", 0), "duplicates": w.duplicates}


# -- one job, stored findings -----------------------------------------------------------------

# recommender options that name a file on the caller's machine: not taken by the HTTP API
PATH_OPTIONS = frozenset({"profile", "trace"})


def stored_findings(db: Database, job: str | None = None, since: dt.datetime | None = None) -> Table:
    """The findings table (what the last ``bottlenecks`` runs stored), worst first."""
    with db.read() as con:
        needs_schema(con, 8, "stored findings")
        cur = con.execute(
            """SELECT kind, job, node, rank, subject, severity, confidence, window_start, window_end, summary,
                      evidence::VARCHAR AS evidence, first_detected, detected_at
               FROM findings WHERE ($job IS NULL OR job = $job) AND ($since IS NULL OR window_end >= $since)
               ORDER BY CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, confidence DESC,
                        kind, job, node""",
            {"job": job, "since": since})
        return Table([d[0] for d in cur.description], cur.fetchall())


def job_detail(db: Database, job: str) -> dict[str, Table]:
    """One job: its row of ``jobs``, its steps per run and rank, its stored findings."""
    summary = jobs(db)
    i = summary.columns.index("job")
    rows = [r for r in summary.rows if r[i] == job]
    if not rows:
        raise AnalyticsError(f"no such job {job!r} (analyze jobs lists them)")
    return {"summary": Table(summary.columns, rows), "steps": steps(db, job), "findings": stored_findings(db, job)}


# the overheads' calls (import records, predict a save and a VM start-up)
from .overheadapi import import_overheads, predict_checkpoint, predict_startup  # noqa: E402, F401

# the pages' resources (the fleet, one job over time, a job's advice and scaling, stored fits)
from .pageapi import (  # noqa: E402, F401  (re-exported; they call the functions above)
    fleet_summary,
    gpu_heatmap,
    job_advice,
    job_series,
    scaling_curve,
    stored_fits,
)
