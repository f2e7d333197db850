"""Lake maintenance on Apache Spark (``cmdare-collector maintain --engine spark``): the same
work as collector/lakemaint.py, with the heavy parts run by Spark's executors, so a lake
past one host is maintained by the cluster that reads it:

- **compaction**: Iceberg's rewrite action (bin-pack, ``rewrite_data_files``) on every
  day partition held in more than ``compact_files`` files, carrying the table's source
  positions forward;
- **rollups**: every pending day of every rollup, aggregated by Spark SQL from the source
  snapshot the fingerprint was taken of (``snapshot-id``), written as one dynamic partition
  overwrite per rollup table with the days' fingerprints (``cmdare.rolled``): the same rows
  as collector/lakerollup.py's DuckDB build (sums to the last bit or two of a double);
- **snapshot expiry**: ``expire_snapshots`` (the current snapshot kept), then, for a local
  lake, ``remove_orphan_files`` (files older than a day: Iceberg's procedure refuses less;
  the DuckDB engine deletes them after an hour).

Retention stays a metadata-only delete of whole days (collector/lakemaint.py's, through
pyiceberg): it reads no data.  Each rollup's aggregates are collector/rollup.py's, turned
into Spark SQL here (``spark_sql``), so a rollup is defined once.

The session: under ``spark-submit``, one on its master with its jars and configuration;
else a local one (``--spark-master``, default ``local[*]``) with the jars
``scripts/sparkjars`` fetched; either way a session of its own whose catalog ``cmdare``
is the lake's.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import lakerollup, rollup
from .lake import NAMESPACE, Lake, LakeError, day_partitions, redact, time_column
from .lakemaint import ORPHAN_AGE, Report, _props

log = logging.getLogger("cmdare.collector")
CATALOG = "cmdare"  # the Spark catalog name: the lake's tables are cmdare.cmdare.<table>
JARS = Path(os.environ.get("CMDARE_SPARK_JARS", Path(__file__).resolve().parents[1] / ".cache" / "spark-jars"))


# -- the rollups' SQL in Spark's dialect ----------------------------------------------------------
_TO_MICROS = re.compile(r"ts - to_microseconds\((CAST\(.+? AS BIGINT\))\)")


# a host counter summed over the JSON list's entries (collector/rollup.py ``_counter``)
_COUNTER = re.compile(r"""list_sum\(list_transform\(from_json\((\w+), '\[\{"(\w+)":"UBIGINT"\}\]'\), """
                      r"""lambda x: x\.\w+\)\)::DOUBLE""")


def spark_sql(expr: str) -> str:
    """One aggregate of collector/rollup.py in Spark SQL: identifiers quoted with backticks,
    DuckDB's microsecond arithmetic on timestamps spelled with Spark's functions, a JSON
    list's counter summed with Spark's higher-order functions, ``arg_min`` / ``arg_max`` as
    ``min_by`` / ``max_by``."""
    out = _COUNTER.sub(lambda m: (f"aggregate(transform(from_json({m[1]}, 'array<struct<{m[2]}:bigint>>'), "
                                  f"x -> CAST(x.{m[2]} AS DOUBLE)), CAST(0 AS DOUBLE), (a, b) -> a + b)"), expr)
    out = re.sub(r"\barg_min\(", "min_by(", re.sub(r"\barg_max\(", "max_by(", out))
    if "lambda " in out or "list_sum" in out:
        raise ValueError(f"no Spark spelling for {expr[:60]!r}")
    out = _TO_MICROS.sub(r"timestamp_micros(unix_micros(CAST(ts AS TIMESTAMP)) - \1)", out)
    out = out.replace("epoch(ts)", "(unix_micros(CAST(ts AS TIMESTAMP)) / 1e6)")  # DuckDB's: micros / 1e6, a double
    if "to_microseconds" in out or "time_bucket" in out or "epoch(" in out:
        raise ValueError(f"no Spark spelling for {expr[:60]!r}")
    return re.sub(r'"([A-Za-z_][A-Za-z0-9_]*)"', r"`\1`", out)


def select(r: rollup.Rollup, src: str) -> str:
    """The rollup's rows from the raw rows in view ``src`` (the caller's WHERE after it)."""
    us = r.seconds * 1_000_000
    t = "unix_micros(CAST(ts AS TIMESTAMP))"  # (the session's time zone is UTC: the lake's naive UTC)
    bucket = f"CAST(timestamp_micros({t} - pmod({t}, {us})) AS TIMESTAMP_NTZ)"
    key = ", ".join(f"`{c}`" for c, _ in r.key)
    aggs = ", ".join(f"{spark_sql(raw)} AS `{c}`" for c, _, raw, _ in r.columns)
    return f"SELECT {bucket} AS bucket, {key}, {aggs} FROM {src}"


# -- the session ---------------------------------------------------------------------------------
def jdbc(lake: Lake) -> tuple[str, dict[str, str]]:
    """The lake's PostgreSQL catalog as a JDBC URL and the properties it needs (user,
    password).  An SQLite catalog is refused: Spark's SQLite JDBC driver keeps a read
    transaction open on the catalog file (measured: collectors' commits then fail with
    "database is locked", and in WAL mode Spark reads a stale table list), so Spark
    maintains lakes whose catalog is a server, as lakes past one host have."""
    url = lake.location.catalog
    if not url.startswith("postgresql"):
        raise LakeError("--engine spark: the lake's catalog must be PostgreSQL (--catalog postgresql://...); "
                        "Spark's SQLite driver holds the catalog file locked: on one host use --engine duckdb")
    from sqlalchemy.engine import make_url

    u = make_url(url)
    host = u.host or "localhost"
    port = f":{u.port}" if u.port else ""
    props = {k: v for k, v in (("user", u.username), ("password", u.password)) if v}
    return f"jdbc:postgresql://{host}{port}/{urllib.parse.quote(u.database or '')}", props


def session(lake: Lake, master: str | None = None) -> Any:
    """A SparkSession with the lake's catalog as ``cmdare`` (UTC session time zone)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise LakeError("--engine spark needs pyspark: pip install 'cmdare[spark]'") from None
    url, props = jdbc(lake)
    warehouse = lake.location.local.as_uri() if lake.location.local is not None else lake.location.warehouse
    conf = {f"spark.sql.catalog.{CATALOG}": "org.apache.iceberg.spark.SparkCatalog",
            f"spark.sql.catalog.{CATALOG}.type": "jdbc", f"spark.sql.catalog.{CATALOG}.uri": url,
            f"spark.sql.catalog.{CATALOG}.warehouse": warehouse, "spark.sql.session.timeZone": "UTC",
            # collectors commit meanwhile: every read asks the catalog for the table's metadata
            f"spark.sql.catalog.{CATALOG}.cache-enabled": "false"}
    conf |= {f"spark.sql.catalog.{CATALOG}.jdbc.{k}": v for k, v in props.items()}
    active = SparkSession.getActiveSession()
    if active is None:
        b = SparkSession.builder.appName("cmdare-maintain").config(
            "spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit: a local Spark of our own
            jars = sorted(str(p) for p in JARS.glob("*.jar")) if JARS.is_dir() else []
            if not jars:
                raise LakeError(f"--engine spark: no Iceberg Spark runtime in {JARS} (run scripts/sparkjars, "
                                "or spark-submit with --jars)")
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the tasks import cmdare: this Python
            b = (b.master(master or "local[*]").config("spark.jars", ",".join(jars)).config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false"))
        try:
            active = b.getOrCreate()
        except Exception as e:  # a master that cannot be reached, a JVM that does not start
            raise LakeError(f"Spark: {redact(_one_line(e))[:240]}") from None
    # a session of its own (its catalogs are its own: the Spark catalog must be named as the
    # lake's catalog rows are, "cmdare", whichever lake the application read before)
    s = active.newSession()
    for k, v in conf.items():
        s.conf.set(k, v)
    # a first statement: the session's catalog is made from this configuration now (the JVM
    # calls below reach the catalog directly), and an unreachable catalog fails here
    s.sql(f"SHOW TABLES IN {CATALOG}.{NAMESPACE}").collect()
    return s


def _name(table: str) -> str:
    return f"{CATALOG}.{NAMESPACE}.{table}"


# -- the work ------------------------------------------------------------------------------------
def maintain(lake: Lake, spark: Any, retain_raw: float | None = 7 * 86400, compact_files: int | None = 8,
             expire_after: float | None = 86400, now: dt.datetime | None = None,
             retain_rollups: float | None = 400 * 86400, derive: Callable[[Lake], int] | None = None,
             findings: Callable[[Lake], int] | None = None) -> Report:
    """collector/lakemaint.maintain with compaction, rollups and snapshot expiry on Spark
    (``derive``: as there; ``distributed`` spreads its work over the executors); a failed
    Spark job is a LakeError of one line (its first, credentials redacted)."""
    try:
        return _maintain(lake, spark, retain_raw, compact_files, expire_after, now, retain_rollups, derive, findings)
    except LakeError:
        raise
    except Exception as e:
        if type(e).__module__.split(".")[0] not in ("pyspark", "py4j"):
            raise
        raise LakeError(f"Spark: {redact(_one_line(e))[:240]}") from None


_PY_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b: \S")


def _one_line(e: BaseException) -> str:
    """A Spark failure's line that says what failed: its first, or, where that only names
    the JVM call, the last exception a task raised (a Python worker's traceback)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    first = lines[0] if lines else type(e).__name__
    if first.startswith("An error occurred while calling"):
        told = [ln for ln in lines if _PY_ERROR.match(ln) and not ln.startswith(("py4j", "java.", "org.apache"))]
        if told:
            return told[-1]
    return first


def _maintain(lake: Lake, spark: Any, retain_raw: float | None, compact_files: int | None,
              expire_after: float | None, now: dt.datetime | None, retain_rollups: float | None,
              derive: Callable[[Lake], int] | None, findings: Callable[[Lake], int] | None) -> Report:
    from . import lakemaint
    from .lake import APPENDED, MARKER

    rep = Report()
    tables = [n for n in (*APPENDED, MARKER) if lake.exists(n)]
    if compact_files is not None:
        for name in tables:
            _compact(lake, spark, name, compact_files, rep)
    rep.rolled = build(lake, spark, rep.skipped)
    # retention (metadata only) as the DuckDB engine does it; then expiry here
    sub = lakemaint.maintain(lake, retain_raw, None, None, now, retain_rollups, rollups=False, derive=derive,
                             findings=findings)
    rep.deleted_partitions, rep.kept_unrolled = sub.deleted_partitions, sub.kept_unrolled
    rep.goodput_hours, rep.findings = sub.goodput_hours, sub.findings
    rep.rollup_days_deleted, rep.skipped = sub.rollup_days_deleted, rep.skipped + sub.skipped
    if expire_after is not None:
        wall = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        for name in (*tables, *(r.table for r in rollup.ROLLUPS)):
            if lake.exists(name):
                _expire(lake, spark, name, wall - dt.timedelta(seconds=expire_after), rep)
    return rep


def _compact(lake: Lake, spark: Any, name: str, compact_files: int, rep: Report) -> None:
    """Iceberg's rewrite action (bin-pack) per day partition over ``compact_files`` files,
    through the JVM (the action takes snapshot properties; the SQL procedure of this
    runtime does not): the source positions carried forward.  The table's commits are not
    retried: one that loses to a collector's is skipped, as the DuckDB engine does."""
    col = time_column(name) if name != "lake_commits" else "committed_at"
    t = lake.table(name)
    if col is None or not t.spec().fields:
        return
    days = sorted(d for d, fs in day_partitions(t).items() if len(fs) > compact_files)
    if not days:
        return
    jvm = spark._jvm
    ex = jvm.org.apache.iceberg.expressions.Expressions
    before = after = 0
    for day in days:
        props = _props(lake.table(name))
        lo = dt.datetime.combine(day, dt.time())
        where = getattr(ex, "and")(ex.greaterThanOrEqual(col, lo.isoformat()),
                                   ex.lessThan(col, (lo + dt.timedelta(days=1)).isoformat()))
        jt = _iceberg_table(spark, name)
        action = (jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession).rewriteDataFiles(jt)
                  .filter(where).option("min-input-files", str(compact_files + 1))
                  .option("partial-progress.enabled", "false"))
        for k, v in props.items():
            action = action.snapshotProperty(k, v)
        try:
            res = action.execute()
        except Exception as e:  # a collector committed meanwhile: the next run
            if "CommitFailed" not in str(e) and "ValidationException" not in str(e):
                raise
            rep.skipped.append(f"compaction of {name} {day}")
            continue
        before += int(res.rewrittenDataFilesCount())
        after += int(res.addedDataFilesCount())
    if before:
        rep.compacted[name] = (before, after)


def _iceberg_table(spark: Any, name: str) -> Any:
    """The Java Iceberg table behind ``cmdare.cmdare.<name>`` in this session's catalog."""
    jvm = spark._jvm
    ns = spark.sparkContext._gateway.new_array(jvm.java.lang.String, 1)
    ns[0] = NAMESPACE
    cat = spark._jsparkSession.sessionState().catalogManager().catalog(CATALOG)
    return cat.loadTable(jvm.org.apache.spark.sql.connector.catalog.Identifier.of(ns, name)).table()


def build(lake: Lake, spark: Any, skipped: list[str]) -> dict[str, int]:
    """collector/lakerollup.build on Spark: per rollup table, every day not held as its
    source now is, in one Spark job and one commit; rollup table -> days (re)built."""
    lakerollup.ensure(lake)
    names = lake.names()
    out: dict[str, int] = {}
    for src in rollup.SOURCES:
        if src not in names:
            continue
        t = lake.table(src)
        snap = t.current_snapshot()
        if snap is None:
            continue
        days = lakerollup.day_files(t)
        view = f"cmdare_src_{src}"
        spark.read.option("snapshot-id", str(snap.snapshot_id)).table(_name(src)).createOrReplaceTempView(view)
        for r in (r for r in rollup.ROLLUPS if r.source == src):
            rt = lake.table(r.table)
            state = lakerollup.rolled(rt)
            todo = {d: lakerollup.fingerprint(fs, r.version) for d, fs in sorted(days.items())
                    if state.get(d) != lakerollup.fingerprint(fs, r.version)}
            if not todo:
                continue
            cond = " OR ".join(f"(ts >= TIMESTAMP_NTZ '{d} 00:00:00' AND ts < TIMESTAMP_NTZ '{_next(d)} 00:00:00')"
                               for d in todo)
            df = spark.sql(f"{select(r, view)} WHERE {cond} GROUP BY ALL")
            target = {f.name: f for f in rt.schema().fields}
            df = df.select(*(df[c].cast(_spark_type(target[c])).alias(c) for c in target))
            props = {lakerollup.ROLLED: json.dumps({**state, **todo})}
            try:
                df.writeTo(_name(r.table)).option(f"snapshot-property.{lakerollup.ROLLED}", props[lakerollup.ROLLED]) \
                    .overwritePartitions()
            except Exception as e:  # a commit lost to another maintenance run: the next run
                if "CommitFailed" not in str(e) and "ValidationException" not in str(e):
                    raise
                skipped.extend(f"rollup {r.table} {d}" for d in todo)
                continue
            out[r.table] = out.get(r.table, 0) + len(todo)
        spark.catalog.dropTempView(view)
    return out


def _next(day: str) -> str:
    return (dt.date.fromisoformat(day) + dt.timedelta(days=1)).isoformat()


def _spark_type(f: Any) -> str:
    from pyiceberg.types import BooleanType, DoubleType, IntegerType, LongType, StringType, TimestampType

    for cls, name in ((LongType, "bigint"), (IntegerType, "int"), (DoubleType, "double"), (StringType, "string"),
                      (TimestampType, "timestamp_ntz"), (BooleanType, "boolean")):
        if isinstance(f.field_type, cls):
            return name
    raise LakeError(f"rollup column {f.name}: type {f.field_type} has no Spark cast here")


def _expire(lake: Lake, spark: Any, name: str, older: dt.datetime, rep: Report) -> None:
    t = lake.table(name)
    cur = t.current_snapshot()
    ms = int(older.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
    if not any(s.timestamp_ms < ms and s.snapshot_id != cur.snapshot_id for s in t.snapshots()):
        return  # nothing to expire (no Spark job)
    stamp = older.isoformat(sep=" ", timespec="seconds")
    row = spark.sql(f"""CALL {CATALOG}.system.expire_snapshots(table => '{_name(name)}',
                          older_than => TIMESTAMP '{stamp}', retain_last => 1)""").collect()[0]
    rep.expired_snapshots += int(row["deleted_manifest_lists_count"])
    if lake.location.local is not None:  # (Iceberg's procedure refuses files younger than a day)
        cut = (dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(seconds=max(ORPHAN_AGE, 86400)))
        rows = spark.sql(f"""CALL {CATALOG}.system.remove_orphan_files(table => '{_name(name)}',
                               older_than => TIMESTAMP '{cut.isoformat(sep=' ', timespec='seconds')}')""").collect()
        rep.orphans_deleted += len(rows)


def distributed(spark: Any, compute: Callable[[str, str | None, list], list[list]],
                per_task: int = 64) -> Callable[[str, str | None, list], list[list]]:
    """A ``compute_rows`` for analytics/goodhours.refresh_lake that runs on the executors:
    the planned hours grouped by job (a job's hours in one task: its sweep reads its data
    once), ``per_task`` hours or so a task, each task reading the lake on its own; the rows
    come back to the driver, which stores them.  The executors need cmdare installed (the
    same version as the driver)."""

    def run(uri: str, catalog: str | None, todo: list) -> list[list]:
        if not todo:
            return []
        groups: list[list] = []
        for job in sorted({t[0] for t in todo}):
            hours = [t for t in todo if t[0] == job]
            if groups and len(groups[-1]) + len(hours) <= per_task:
                groups[-1].extend(hours)
            else:
                groups.append(hours)
        rdd = spark.sparkContext.parallelize(groups, len(groups))
        return rdd.flatMap(lambda part: compute(uri, catalog, part)).collect()

    return run


def by_detector(spark: Any, run: Callable[[str, str | None, Any, list[str]], Any],
                merge: Callable[[list[Any]], Any]) -> Callable[[str, str | None, Any, list[str]], Any]:
    """A ``run_kinds`` for analytics/findings.keep_lake that runs on the executors: one
    task per detector over the whole scope, each reading the lake on its own; the
    outcomes merged on the driver (the same findings as one run: the detectors are
    independent units; what they share within a run only saves reads)."""

    def go(uri: str, catalog: str | None, since: Any, kinds: list[str]) -> Any:
        rdd = spark.sparkContext.parallelize(kinds, len(kinds))
        return merge(rdd.map(lambda k: run(uri, catalog, since, [k])).collect())

    return go
