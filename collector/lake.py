"""Lake mode: the collector's tables as Apache Iceberg tables (pyiceberg + pyarrow), Parquet
files partitioned by day, behind a SQL catalog (an SQLite file for one host, PostgreSQL for
many), written by any number of collectors at once and read by DuckDB or Spark.

How several collectors store every Kafka record exactly once with no coordinator of ours:

- each collector checks and types its records exactly as in single-file mode, into an
  in-memory DuckDB (the *staging* database: the same migrations, the same writer), and
  every ``commit_every`` seconds commits what it staged: one Iceberg append per table
  that has rows, then one row per source partition in ``lake_commits``;
- every commit records, in its snapshot's properties (``cmdare.positions``), how far into
  each source it covers (Kafka: ``topic/partition`` -> next offset; a spool directory:
  segment and offset), merged with what the table's current snapshot already said;
- appends are optimistic: the catalog swaps the table's metadata only if no one committed
  since this collector read it (pyiceberg's own retries are off: a retry must look again);
- before appending, a collector compares the table's positions with where its round
  started: when the table already holds records from inside the round (a collector that
  was thought dead committed them, or this one crashed between two tables' commits), the
  round's rows are first anti-joined with the table's rows in their time range by event
  id, so no event is stored twice;
- a collector given a partition (Kafka's group protocol) starts it where ``lake_commits``
  says everything is stored: at worst a round is read twice, and the step above keeps
  it once.

Kafka's group protocol and the catalog's atomic swap are the only coordination.

Tables: the event tables, ``dead_letters``, ``clock_skew`` and ``unknown_events`` are
appended; ``nodes`` gets one row per node per round (readers aggregate them: first seen
the least, role / labels of the newest); the tables ``analyze`` writes (findings, fits,
alerts, imported overhead records) are replaced whole by it.  The rollup tables and
positions of single-file mode have no lake counterpart (the lake's readers compute
5-minute GPU aggregates from the samples, partition-pruned by day).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import re
import time
import urllib.parse
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from cmdare.wire.registry import TABLES

from . import rollup
from .ingest import storage

log = logging.getLogger("cmdare.collector")

NAMESPACE = "cmdare"
POSITIONS = "cmdare.positions"  # snapshot property: {source: [position...]} (JSON)
WRITER = "cmdare.writer"  # snapshot property: which collector committed it
MARKER = "lake_commits"
# appended by collectors
EVENT_TABLES = tuple(sorted({*TABLES.values(), "unknown_events", "clock_skew", "dead_letters"}))
APPENDED = (*EVENT_TABLES, "nodes")
# written by analyze, replaced whole (small)
DERIVED = ("findings", "finding_coverage", "model_fits", "alerts", "alert_rules", "checkpoint_records",
           "startup_records", "spot_lives", "goodput_hours")
# single-file bookkeeping with no lake counterpart
LOCAL_ONLY = ("ingest_positions", "rollup_dirty", "rollup_horizon", *rollup.TABLES, "schema_migrations",
              "trace_ranks", "trace_kernels", "trace_steps")  # (profiler traces: imported into a file only)
# how one stored row is recognised when a round overlaps what a table holds (nodes rows
# are partial aggregates: storing one twice changes nothing a reader computes)
IDENTITY: dict[str, tuple[str, ...]] = {"dead_letters": ("origin", "line"), "nodes": ()}
TIME_COLUMN: dict[str, str] = {"dead_letters": "received_at", "nodes": "last_seen",
                               **{t: "bucket" for t in rollup.TABLES}}  # (built by maintain: lakerollup.py)
MARKER_SCHEMA = pa.schema([
    ("committed_at", pa.timestamp("us")), ("writer", pa.string()), ("source", pa.string()),
    ("start", pa.list_(pa.int64())), ("end", pa.list_(pa.int64())), ("rows", pa.int64()),
])
COMMIT_TRIES = 50  # optimistic commits lost to other collectors in a row before giving up
_CREDENTIALS = re.compile(r"//[^/@\s]*@")


class LakeError(Exception):
    """A lake that cannot be used, in one line (credentials never quoted)."""


def redact(text: str) -> str:
    """``text`` without the user:password of any URL in it."""
    return _CREDENTIALS.sub("//***@", str(text))


def time_column(table: str) -> str | None:
    if table in TIME_COLUMN:
        return TIME_COLUMN[table]
    return "ts" if "ts" in schema(table).names else None


@cache
def _schemas() -> dict[str, pa.Schema]:
    from .db import migrate

    con = duckdb.connect(":memory:")
    try:
        migrate(con)
        out = {}
        for (name,) in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
        ).fetchall():
            t = storage.logical(name)  # GPU samples: the view's columns, every field by name
            out[t] = con.sql(f"SELECT * FROM {t} LIMIT 0").to_arrow_table().schema
        return out
    finally:
        con.close()


def schema(table: str) -> pa.Schema:
    """The Arrow schema of one table, as the migrations define it (``lake_commits``: its own)."""
    return MARKER_SCHEMA if table == MARKER else _schemas()[table]


@dataclass(frozen=True)
class Location:
    """Where a lake lives: its warehouse (files) and its catalog (a SQLAlchemy URL)."""

    warehouse: str
    catalog: str
    local: Path | None  # the directory, for a local lake

    @classmethod
    def parse(cls, uri: str, catalog: str | None = None) -> Location:
        text = (uri or "").strip()
        if not text or len(text) > 1024 or any(ord(c) < 32 for c in text):
            raise LakeError("--lake: give a directory or an object-store URI (s3://bucket/path)")
        if catalog is not None:
            catalog = catalog.strip()
            scheme = catalog.split(":", 1)[0].lower()
            if not (scheme.startswith("postgresql") or scheme.startswith("sqlite")) or len(catalog) > 1024:
                raise LakeError(f"--catalog: a postgresql:// or sqlite:/// URL, not {redact(catalog)[:40]!r}")
        parsed = urllib.parse.urlsplit(text)
        if parsed.scheme in ("", "file"):
            try:
                d = Path(parsed.path if parsed.scheme == "file" else text).expanduser().resolve()
                if d.exists() and not d.is_dir():
                    raise LakeError(f"--lake {str(d)[:80]}: not a directory")
            except (OSError, RuntimeError) as e:  # a name over the system's limit, a symlink loop
                raise LakeError(f"--lake {text[:80]}: {getattr(e, 'strerror', None) or 'not a usable path'}") from None
            # the warehouse as a plain path: pyiceberg writes a file URI's %-escapes literally (a lake in
            # "sp ace" had its files under "sp%20ace"); DuckDB reads the same plain paths
            return cls(str(d), catalog or sqlite_url(d / "catalog.db"), d)
        if parsed.scheme in ("s3", "s3a", "gs", "gcs", "abfs", "abfss") and parsed.netloc:
            if parsed.username or parsed.password:
                raise LakeError("--lake: credentials do not belong in the URI (use the cloud's environment)")
            if catalog is None:
                raise LakeError(f"--lake {parsed.scheme}://...: an object-store lake needs --catalog postgresql://...")
            return cls(text.rstrip("/"), catalog, None)
        raise LakeError(f"--lake: unknown scheme {parsed.scheme[:20]!r} (a directory, s3://, gs://, abfs://)")


def sqlite_url(path: Path) -> str:
    """The SQLAlchemy URL of a SQLite file at any path (spaces, ``%``, ``?``, ``#``, unicode):
    SQLite's own URI form (``file:`` + %-escapes, ``uri=true``), escaped once more because
    SQLAlchemy unescapes a URL's database part before passing it on."""
    return "sqlite:///file:" + urllib.parse.quote(urllib.parse.quote(str(path))) + "?uri=true"


class Lake:
    """One lake: its catalog and tables."""

    def __init__(self, uri: str, catalog: str | None = None, create: bool = True) -> None:
        try:
            from pyiceberg.catalog.sql import SqlCatalog
        except ImportError:
            raise LakeError("lake mode needs pyiceberg: pip install 'cmdare[lake]'") from None

        self.location = Location.parse(uri, catalog)
        loc = self.location
        if loc.local is not None:
            if not loc.local.exists():
                if not create:
                    raise LakeError(f"{loc.local}: no such lake (write one with cmdare-collector --lake)")
                try:
                    loc.local.mkdir(parents=True)
                except OSError as e:
                    raise LakeError(f"--lake {str(loc.local)[:80]}: cannot make the directory: "
                                    f"{e.strerror or type(e).__name__}") from None
            elif not create and not (loc.local / "catalog.db").exists() and catalog is None:
                raise LakeError(f"{loc.local}: not a lake (no catalog.db; write one with cmdare-collector --lake)")
        try:
            made: list[Any] = []
            # collectors starting together race to create the catalog's own SQL tables too
            _settle(lambda: made.append(SqlCatalog(NAMESPACE, uri=loc.catalog, warehouse=loc.warehouse,
                                                   init_catalog_tables="true" if create else "false")),
                    lambda: False, tries=5 if create else 1)
            self.catalog = made[-1]
            if create:
                _settle(lambda: self.catalog.create_namespace_if_not_exists(NAMESPACE),
                        lambda: (NAMESPACE,) in self.catalog.list_namespaces())
            self.catalog.list_tables(NAMESPACE)  # reachable, and a cmdare lake
        except Exception as e:
            from pyiceberg.exceptions import NoSuchNamespaceError

            if isinstance(e, NoSuchNamespaceError):
                raise LakeError(f"{self.name}: not a cmdare lake (no namespace {NAMESPACE!r} in its catalog)") from None
            raise LakeError(f"lake catalog {redact(loc.catalog)[:120]}: {redact(_first(e))[:200]}") from None
        self._tables: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return str(self.location.local) if self.location.local else self.location.warehouse

    # -- tables ------------------------------------------------------------------------------
    def ensure(self, names: tuple[str, ...] = (*APPENDED, *DERIVED, MARKER)) -> None:
        """Create the tables that do not exist (partitioned by day of their time column)."""
        existing = self.names()
        for name in names:
            col = "committed_at" if name == MARKER else time_column(name)
            if name not in existing:  # another collector making it first: _settle finds it there
                _settle(lambda name=name: self.catalog.create_table(
                    f"{NAMESPACE}.{name}", schema=schema(name),
                    properties={"commit.retry.num-retries": "0", "write.parquet.compression-codec": "zstd",
                                # appends merge small manifests: planning stays cheap after many commits
                                "commit.manifest-merge.enabled": "true"}),
                    lambda name=name: self.exists(name))
            else:
                self._evolve(name)
                if not self.partition_missing(name, col):
                    continue
            if col is not None and name != "nodes":
                # (a collector that made the table may die before partitioning it: any later
                # ensure() does it; two at once: one wins, the other finds it done)
                _settle(lambda name=name, col=col: self._partition(name, col),
                        lambda name=name, col=col: not self.partition_missing(name, col))

    def _evolve(self, name: str) -> None:
        """Columns a later migration added (a lake made by an older cmdare): added to the
        table's schema (files written before read them as null)."""
        want = schema(name)
        have = set(self.table(name).schema().column_names)
        if all(f.name in have for f in want):
            return

        def add() -> None:
            with self.table(name).update_schema() as u:
                u.union_by_name(want)

        _settle(add, lambda: all(f.name in set(self.table(name).schema().column_names) for f in want))

    def partition_missing(self, name: str, col: str | None) -> bool:
        return col is not None and name != "nodes" and self.table(name).spec().is_unpartitioned()

    def _partition(self, name: str, col: str) -> None:
        from pyiceberg.transforms import DayTransform

        t = self.table(name)
        if t.spec().is_unpartitioned():
            with t.update_spec() as u:
                u.add_field(col, DayTransform(), f"{col}_day")

    def table(self, name: str, fresh: bool = True) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        if fresh or name not in self._tables:
            try:
                self._tables[name] = self.catalog.load_table(f"{NAMESPACE}.{name}")
            except NoSuchTableError:
                raise LakeError(f"{self.name}: no table {name} (is this a cmdare lake?)") from None
        return self._tables[name]

    def names(self) -> set[str]:
        """The tables the lake has (one catalog query)."""
        return {n for _, n in self.catalog.list_tables(NAMESPACE)}

    def locations(self) -> dict[str, str]:
        """Every table's metadata location, in one catalog query: a table whose location
        did not move has not changed (what a reader keeping what it read asks first)."""
        from sqlalchemy import text

        with self.catalog.engine.connect() as c:
            rows = c.execute(text("SELECT table_name, metadata_location FROM iceberg_tables "
                                  "WHERE catalog_name = :c AND table_namespace = :n"),
                             {"c": NAMESPACE, "n": NAMESPACE}).fetchall()
        return {str(n): str(loc) for n, loc in rows if loc}

    def exists(self, name: str) -> bool:
        return self.catalog.table_exists(f"{NAMESPACE}.{name}")

    def files(self, name: str, row_filter: Any = None, tbl: Any = None) -> list[str]:
        """The data files of the table's current snapshot (those that can hold rows passing
        ``row_filter``: Iceberg prunes by partition and column statistics)."""
        t = tbl if tbl is not None else self.table(name)
        if t.current_snapshot() is None:
            return []
        scan = t.scan(row_filter=row_filter) if row_filter is not None else t.scan()
        return [_path(task.file.file_path) for task in scan.plan_files()]

    def positions(self, name: str = MARKER, tbl: Any = None) -> dict[str, list[int]]:
        """How far each source is stored in a table (``lake_commits``: in every table)."""
        t = tbl if tbl is not None else self.table(name)
        return _positions(t.current_snapshot())

    # -- writing -----------------------------------------------------------------------------
    def append(self, name: str, rows: pa.Table, ranges: dict[str, tuple[list[int], list[int]]],
               writer: str) -> int:
        """Append ``rows`` (read from ``ranges``: source -> [start, end) positions), less
        those the table already holds (the same event id in the rows' time range: a record
        read twice, by this collector after a restart or by another after a rebalance, or
        an event an agent sent twice; the rule of a database file).  The rows stored."""
        from pyiceberg.exceptions import CommitFailedException

        delay = 0.05
        for _ in range(COMMIT_TRIES):
            t = self.table(name)
            base = self.positions(tbl=t)
            data = self._unseen(name, t, rows)
            merged = dict(base)
            for k, (_, end) in ranges.items():
                if not _lt(end, merged.get(k)):
                    merged[k] = list(end)
            if not data.num_rows:
                return 0  # (the table's positions lag: a later overlap costs an anti-join, no row)
            props = {POSITIONS: json.dumps(merged, sort_keys=True, separators=(",", ":")), WRITER: writer}
            try:
                _append(t, data, props)
                return data.num_rows
            except CommitFailedException:
                time.sleep(delay * (1 + random.random()))  # another collector committed first
                delay = min(delay * 2, 2.0)
        raise LakeError(f"{name}: lost {COMMIT_TRIES} commits in a row to other writers")

    def _unseen(self, name: str, t: Any, rows: pa.Table) -> pa.Table:
        """``rows`` less those the table holds (same identity), read from the files of the
        rows' time range only."""
        key = IDENTITY.get(name, tuple(c for c in ("node", "id") if c in rows.column_names) if "id" in rows.column_names
                           else ())  # an event is its sender's (node, id)
        col = time_column(name) if name != MARKER else None
        if not key or not rows.num_rows:
            return rows
        filt = None
        if col is not None:
            import pyarrow.compute as pc

            lo, hi = pc.min(rows[col]).as_py(), pc.max(rows[col]).as_py()
            if lo is not None:
                filt = in_range(col, lo, hi, closed=True)
        files = self.files(name, filt, tbl=t)
        if not files:
            return rows
        con = duckdb.connect(":memory:")
        try:
            con.register("_new", rows)
            on = " AND ".join(f'n."{c}" IS NOT DISTINCT FROM o."{c}"' for c in key)
            keys = ", ".join(f'"{c}"' for c in key)
            out = con.sql(f"SELECT n.* FROM _new n ANTI JOIN (SELECT DISTINCT {keys} FROM read_parquet({_list(files)})) o "
                          f"ON {on}").to_arrow_table()
            if out.num_rows < rows.num_rows:
                log.info("%s: %d of %d rows were stored already", name, rows.num_rows - out.num_rows, rows.num_rows)
            return out.cast(rows.schema)
        finally:
            con.close()

    def mark(self, ranges: dict[str, tuple[list[int], list[int]]], writer: str, rows: int) -> None:
        """Record a committed round in ``lake_commits`` (its positions: where a collector
        taking the sources over starts)."""
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        marker = pa.table({
            "committed_at": [now] * len(ranges), "writer": [writer] * len(ranges), "source": list(ranges),
            "start": [list(s) for s, _ in ranges.values()], "end": [list(e) for _, e in ranges.values()],
            "rows": [rows] * len(ranges),
        }, schema=MARKER_SCHEMA)
        self.append(MARKER, marker, ranges, writer)

    def replace(self, name: str, rows: pa.Table) -> None:
        """Replace a table's rows (the tables analyze writes); one a lake made by an older
        cmdare lacks is made first."""
        import warnings

        if not self.exists(name):
            self.ensure((name,))
        t = self.table(name)
        with warnings.catch_warnings():  # "Delete operation did not match any records": an empty table
            warnings.simplefilter("ignore", UserWarning)
            t.overwrite(rows.cast(schema(name)))


def _append(t: Any, rows: pa.Table, props: dict[str, str]) -> None:
    """``t.append(rows)`` without pyiceberg's generic partition split, which filters and
    copies the whole table once per partition even when there is one (most rounds hold
    one day): measured 1.8 us a GPU sample, twice the staging's own cost.  The rows are
    split by the table's one day partition here (a copy only when a round spans days),
    written by pyiceberg's own file writer and committed as a fast append."""
    import itertools
    import uuid as uuid_

    import pyarrow.compute as pc
    from pyiceberg.io.pyarrow import bin_pack_arrow_table, pyarrow_to_schema, write_file
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
    from pyiceberg.table import TableProperties, WriteTask
    from pyiceberg.transforms import DayTransform
    from pyiceberg.utils.properties import property_as_int

    meta = t.metadata
    spec, ice = meta.spec(), meta.schema()
    parts: list[tuple[Any, pa.Table]] = []
    if spec.is_unpartitioned():
        parts = [(None, rows)]
    else:
        (field,) = spec.fields
        assert isinstance(field.transform, DayTransform)
        col = ice.find_column_name(field.source_id)
        days = pc.divide(rows[col].cast(pa.int64()), pa.scalar(86_400_000_000, pa.int64()))
        # floor for times before 1970 (integer division truncates towards zero)
        days = pc.if_else(pc.less(rows[col].cast(pa.int64()), 0),
                          pc.subtract(days, pa.scalar(1, pa.int64())), days)
        uniq = pc.unique(days).to_pylist()
        for d in uniq:
            if len(uniq) == 1:
                part = rows  # one day (or only rows without a time): no copy
            else:
                part = rows.filter(pc.is_null(days) if d is None else pc.equal(days, pa.scalar(d, pa.int64())))
            key = PartitionKey(field_values=[PartitionFieldValue(field=field, value=None if d is None else int(d))],
                               partition_spec=spec, schema=ice)
            parts.append((key, part))
    task_schema = pyarrow_to_schema(rows.schema, name_mapping=ice.name_mapping, format_version=meta.format_version)
    target: Any = property_as_int(meta.properties, TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
                             TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT)
    write_uuid, counter = uuid_.uuid4(), itertools.count(0)
    tasks = (WriteTask(write_uuid=write_uuid, task_id=next(counter), record_batches=batches, partition_key=key,
                       schema=task_schema)
             for key, part in parts for batches in bin_pack_arrow_table(part, target))
    with t.transaction() as tx, tx.update_snapshot(snapshot_properties=props).fast_append() as fa:
        for data_file in write_file(t.io, meta, tasks):
            fa.append_data_file(data_file)


def load_database(lake: Lake, con: duckdb.DuckDBPyConnection, source: str,
                  progress: Any = None) -> tuple[dict[str, int], dict[str, int]]:
    """Copy a database file's tables into the lake (cmdare-collector to-lake): the appended
    tables exactly once by event identity (node, id) (a second run stores no event again), the tables
    analyze writes replacing the lake's; (event rows stored, rows replaced) per table."""
    have = {storage.logical(t) for (t,) in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'").fetchall()}
    ranges = {f"db:{Path(source).name}"[:200]: ([0], [1])}
    who = f"to-lake:{Path(source).name}"[:200]
    out: dict[str, int] = {}
    replaced: dict[str, int] = {}
    for name in (*APPENDED, *DERIVED):
        if name not in have:
            continue
        cols = ", ".join(f'"{c}"' for c in schema(name).names)
        rows = con.sql(f"SELECT {cols} FROM {name}").to_arrow_table().cast(schema(name))
        if progress is not None:
            progress(f"{name}: {rows.num_rows:,} rows")
        if name in DERIVED:
            if rows.num_rows:
                lake.replace(name, rows)
                replaced[name] = rows.num_rows
        elif rows.num_rows:
            out[name] = lake.append(name, rows, ranges, who)
    lake.mark(ranges, who, sum(out.values()))
    return out, replaced


def _settle(act: Any, done: Any, tries: int = 20) -> None:
    """Run ``act`` until it works or ``done()`` says another process did it (collectors
    starting together race to create the lake's namespace, tables and partitions)."""
    for i in range(tries):
        try:
            act()
            return
        except Exception:
            time.sleep(0.05 * (i + 1) * (1 + random.random()))
            try:
                if done():
                    return
            except Exception:
                pass
            if i == tries - 1:
                raise


def lake_io(e: OSError) -> str:
    """A file of the lake that cannot be read, in one line."""
    return (f"cannot read the lake's files ({redact(_first(e))[:160]}); Iceberg metadata holds absolute paths: "
            "a lake moved or copied elsewhere cannot be read there")


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)


def _path(uri: str) -> str:
    """A file URI as DuckDB reads it (a local path, or the object-store URI)."""
    if uri.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(uri).path)
    return uri


def _list(files: list[str]) -> str:
    return "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"


def _positions(snapshot: Any) -> dict[str, list[int]]:
    if snapshot is None or snapshot.summary is None:
        return {}
    raw = snapshot.summary[POSITIONS]
    try:
        out = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): [int(x) for x in v] for k, v in out.items() if isinstance(v, list)}


def _lt(a: list[int], b: list[int] | None) -> bool:
    """a < b, positions compared in order; a missing position ``b`` is before all."""
    return b is not None and list(a) < list(b)


def in_range(col: str, lo: dt.datetime, hi: dt.datetime, *, closed: bool = False) -> Any:
    """An Iceberg row filter: ``col`` from ``lo`` to before ``hi`` (to ``hi`` itself when
    ``closed``).  The predicates are built by keyword: pyiceberg's pydantic models hide their
    positional ``(term, literal)`` constructor from type checkers."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan, LessThanOrEqual, Reference, literal

    upper = LessThanOrEqual if closed else LessThan
    return And(GreaterThanOrEqual(term=Reference(col), value=literal(lo.isoformat())),
               upper(term=Reference(col), value=literal(hi.isoformat())))


def before(col: str, t: dt.datetime) -> Any:
    """An Iceberg row filter: ``col`` before ``t`` (see ``in_range``)."""
    from pyiceberg.expressions import LessThan, Reference, literal

    return LessThan(term=Reference(col), value=literal(t.isoformat()))


def day_partitions(t: Any) -> dict[dt.date, list[Any]]:
    """Data files per day partition (tables partitioned by day only)."""
    out: dict[dt.date, list[Any]] = {}
    if t.current_snapshot() is None or not t.spec().fields:
        return out
    for task in t.scan().plan_files():
        day = task.file.partition[0]
        if day is not None:
            out.setdefault(dt.date(1970, 1, 1) + dt.timedelta(days=int(day)), []).append(task.file)
    return out
