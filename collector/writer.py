"""Batched, transactional, idempotent loading of wire-format events into DuckDB.

One ``Writer.write(messages)`` call is one transaction:

1. read: ``ingest.batch`` splits messages into lines and decodes column blocks into Arrow
   (on the consumer's thread, for Kafka);
2. check and type, per encoding: ``ingest.json_sql`` (JSON lines), ``ingest.row_sql`` (row
   lines), ``ingest.block_sql`` (column blocks, with a fast path for clean blocks), each
   giving typed rows with a reason column (``ingest.typed`` puts a type's rows together);
3. store: rows without a reason into their table (de-duplicated), rows with one into
   ``ingest.dead_letters``, the envelopes into ``ingest.nodes``, the caller's position
   (spool) into ``ingest_positions``.

De-duplication: an event delivered twice carries the same node, id *and ts*, so a new row
is dropped when a row of its node with its id exists in the batch's ts range (an anti-join
that zone maps keep cheap) or earlier in the same batch.  An event's identity is its
sender's (node, id): a sender that reuses another node's ids loses nothing of either.  No
unbounded in-memory index.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from cmdare.wire import columns
from cmdare.wire.registry import DATA_FIELDS, TABLES
from cmdare.wire.rowform import ROW_START

from . import rollup
from .ingest import dead_letters, nodes, storage
from .ingest.batch import LEAN_SCHEMAS, Batch, WriteResult, block_table, lines_table, warm_up
from .ingest.block_sql import envelope_ok, fast_sql
from .ingest.json_sql import ENVELOPE_SQL
from .ingest.row_sql import KINDS_SQL, LABELS_SQL, OTHER_ROWS_SQL
from .ingest.sql import q
from .ingest.typed import TYPE_SQL, ev_view, r_table_sql

__all__ = ["RAW_CAP", "Batch", "WriteResult", "Writer"]
RAW_CAP = dead_letters.RAW_CAP
log = logging.getLogger("cmdare.collector")
ROLLUP_EVERY = 60.0  # seconds between rollup runs while ingesting
GOODPUT_EVERY = 600.0  # seconds between refreshes of goodput by the hour (an hour completes once an hour)
RETAIN_EVERY = 3600.0  # seconds between retention runs while ingesting


@dataclass(frozen=True)
class Retention:
    """How long raw samples and rollup rows are kept (seconds before the newest row of
    their table; None: for ever), applied every ``every`` seconds (collector/rollup.py)."""

    raw: float | None = 7 * 86400.0
    rollups: float | None = 400 * 86400.0
    every: float = RETAIN_EVERY


@dataclass
class _Scratch:
    """What one batch put into DuckDB besides its rows: Arrow views and temp tables."""

    registered: list[str] = field(default_factory=list)  # Arrow tables registered as views
    row_types: list[str] = field(default_factory=list)  # types with a _r_<type> table
    fast: dict[str, list[columns.Block]] = field(default_factory=dict)  # types stored by the fast path
    has_json: bool = False
    has_rows: bool = False
    text_types: set[str] = field(default_factory=set)  # types seen as row lines

    def register(self, con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> None:
        con.register(name, table)
        self.registered.append(name)

    def drop(self, con: duckdb.DuckDBPyConnection) -> None:
        for name in self.registered:
            con.unregister(name)
        for t in self.row_types:  # free the batch's memory now, not at the next batch
            con.execute(f"DROP TABLE IF EXISTS _r_{t}")

    @property
    def checked(self) -> bool:
        """Whether any event went through the checked paths (the ``_ev`` view exists)."""
        return self.has_json or self.has_rows or bool(self.row_types)


class Writer:
    """``max_skew``: seconds an event's ts may be from the time its batch is stored before
    the event is listed in ``clock_skew`` (stored all the same); None: no check (imports of
    past runs, where old timestamps are the point)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, max_skew: float | None = None,
                 rollup_every: float | None = ROLLUP_EVERY, retention: Retention | None = None) -> None:
        self.con = con
        self.retention = retention  # None: nothing is deleted
        self._retained_at: float | None = None  # the first batch runs it
        self.max_skew = max_skew
        # rollups (collector/rollup.py) brought up to date at most this often, between
        # batches (None: only by rollup()); reads are exact whatever their lag
        self.rollup_every = rollup_every
        self._rolled_at = time.monotonic()
        self._goodput_at = -GOODPUT_EVERY  # the first rollup run refreshes them too
        # a table derived from the rollups, kept with them every GOODPUT_EVERY seconds: the
        # collector's root sets goodput by the hour (cmdare.analytics.goodput.goodhours.refresh); the
        # writer itself knows no analytics
        self.derive: Callable[[duckdb.DuckDBPyConnection], int] | None = None
        self._window: tuple[dt.datetime, dt.datetime] | None = None
        self._now: dt.datetime | None = None
        # DuckDB appends from all threads at once (a plain Arrow insert runs 2x faster);
        # nothing reads rows in stored order: queries order, the in-batch de-dup included
        con.execute("SET preserve_insertion_order = false")
        warm_up(con)

    def write(
        self, messages: list[tuple[str, bytes | None]], position: tuple[str, int, int] | None = None
    ) -> WriteResult:
        """Load ``[(origin, raw message)]`` in one transaction; ``position`` =
        (spool source, segment, offset) is recorded in the same transaction."""
        batch = Batch()
        for origin, raw in messages:
            batch.add(origin, raw)
        return self.write_batch(batch, position)

    def write_batch(self, batch: Batch, position: tuple[str, int, int] | None = None) -> WriteResult:
        """``write`` of messages already read into a ``Batch`` (on any thread)."""
        con, res, now = self.con, WriteResult(empty=batch.empty, not_utf8=batch.not_utf8), _ts(time.time())
        s = _Scratch()
        self._now = now
        if self.max_skew is not None:
            skew = dt.timedelta(seconds=self.max_skew)
            self._window = (now - skew, now + skew)
        try:
            con.execute("BEGIN")
        except duckdb.TransactionException as e:
            # a transaction left open by a ROLLBACK that failed (out of memory while queries
            # held it, here or in a rollup): it stored nothing; end it and begin this one
            log.warning("ingest: ending a transaction a failed rollback left open (%s)", str(e)[:120])
            con.execute("ROLLBACK")
            con.execute("BEGIN")
        try:
            if batch.lines or batch.blocks:
                self._check(batch, s, res)
                self._store(s, res, now)
            res.dead += dead_letters.from_messages(con, batch.py_dead, now)
            if position is not None:
                con.execute(
                    """INSERT INTO ingest_positions VALUES (?, ?, ?, ?)
                    ON CONFLICT (source) DO UPDATE SET segment = excluded.segment, "offset" = excluded."offset",
                    updated_at = excluded.updated_at""",
                    [*position, now],
                )
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:  # the error raised below is the one to report
                pass  # a failed COMMIT ends the transaction itself; one left open is ended at the next BEGIN
            try:
                s.drop(con)
            except duckdb.Error:  # in a transaction left aborted: its tables end with it; never mask the cause
                pass
            raise
        s.drop(con)
        self.housekeep()
        return res

    def _rollup_due(self) -> bool:
        return self.rollup_every is not None and time.monotonic() - self._rolled_at >= self.rollup_every

    def _retain_due(self) -> bool:
        r = self.retention
        return r is not None and (self._retained_at is None or time.monotonic() - self._retained_at >= r.every)

    def due(self) -> bool:
        """Whether a rollup or a retention run is due (see housekeep)."""
        return self._rollup_due() or self._retain_due()

    def housekeep(self) -> None:
        """The rollups and the retention, each when its interval has passed: after every
        write, and from the ingest loops while nothing arrives, so a fleet gone quiet
        still has its old rows rolled up and deleted on schedule (on the writer's thread)."""
        if self._rollup_due():
            self.rollup()
        if self._retain_due():
            self.retain()

    def retain(self) -> dict[str, int]:
        """Apply the retention now (rollups first; a failure is logged and retried at the
        next run); rows deleted per table."""
        self._retained_at = time.monotonic()
        r = self.retention
        if r is None:
            return {}
        try:
            out = rollup.retain(self.con, r.raw, r.rollups)
        except duckdb.Error as e:
            log.warning("retention: %s (retried at the next run)", str(e).splitlines()[0][:200])
            return {}
        if out:
            log.info("retention: deleted %s", ", ".join(f"{n:,} {t}" for t, n in sorted(out.items())))
        return out

    def rollup(self) -> int:
        """Bring the rollups up to date now (a failure is logged and retried at the next
        run: the samples are stored, and reads stay exact meanwhile); rollup rows written."""
        self._rolled_at = now = time.monotonic()
        try:
            n = sum(rollup.run(self.con).values())
        except duckdb.Error as e:
            log.warning("rollup: %s (retried at the next run)", str(e).splitlines()[0][:200])
            return 0
        if self.derive is not None and now - self._goodput_at >= GOODPUT_EVERY:
            self.keep_derived()
        return n

    def keep_derived(self) -> int:
        """The derived table (``derive``: goodput by the hour) brought up to date from what the
        rollups hold (a failure is logged and retried at the next run: its reads stay exact
        without it); rows written."""
        self._goodput_at = time.monotonic()
        if self.derive is None:
            return 0
        try:
            return self.derive(self.con)
        except duckdb.Error as e:
            log.warning("goodput hours: %s (retried at the next run)", str(e).splitlines()[0][:200])
            return 0

    # -- 2. check and type -------------------------------------------------------------------
    def _check(self, batch: Batch, s: _Scratch, res: WriteResult) -> None:
        """Every encoding of the batch checked and typed: JSON envelopes (``_evj``), row lines
        and checked blocks per type (``_r_<type>``), other row lines (``_rows``); clean
        column blocks stored at once by the fast path."""
        con = self.con
        s.register(con, "_batch", lines_table(batch.origins, batch.line_nos, batch.lines))
        # the JSON pass costs ~25 ms to plan: skipped when no line needs it (a big batch is not
        # scanned for it: the pass costs little beside it)
        s.has_json = len(batch.lines) > 4096 or any(not ROW_START.match(x) for x in batch.lines)
        s.has_rows = batch.has_rows
        if s.has_json:
            con.execute(ENVELOPE_SQL)
        if s.has_rows:
            con.execute(KINDS_SQL)
            s.text_types = {t for (t,) in con.execute("SELECT DISTINCT type FROM _kinds").fetchall()}
        if batch.blocks:
            self._blocks(batch, s, res)
        elif s.has_rows:
            con.execute(LABELS_SQL)
        s.row_types = [t for t in TABLES if t in s.text_types or (t in batch.blocks and t not in s.fast)]
        for t in s.row_types:
            con.execute(r_table_sql(t, t in s.text_types, t in batch.blocks))
        if s.has_rows:
            con.execute(OTHER_ROWS_SQL)

    def _blocks(self, batch: Batch, s: _Scratch, res: WriteResult) -> None:
        """Column blocks: a type whose blocks are all clean goes straight into its table (the
        fast path); the others are registered for the checked path (``_cb_<type>``)."""
        con = self.con
        if not s.has_rows:
            con.execute("CREATE OR REPLACE TEMP TABLE _kinds (type VARCHAR, lraw VARCHAR)")
        con.executemany("INSERT INTO _kinds VALUES (?, ?)", sorted(batch.block_labels))
        con.execute(LABELS_SQL)
        bad_labels = {x for (x,) in con.execute("SELECT lraw FROM _lab WHERE NOT lok").fetchall()}
        for t, bl in batch.blocks.items():
            if t not in s.text_types and all(envelope_ok(b, bad_labels) for _, _, b in bl):
                n = self._fast(t, batch.lean[t], s, [b for _, _, b in bl])
                if n is not None:
                    s.fast[t] = [b for _, _, b in bl]
                    res.rows[TABLES[t]], res.lines = n[0], res.lines + n[1]
                    continue
            s.register(con, f"_cb_{t}", block_table(bl))
        if s.fast:
            s.register(con, "_bn", nodes.block_envelopes([b for bl in s.fast.values() for b in bl]))

    def _fast(self, type_: str, lean: list[pa.RecordBatch], s: _Scratch,
              blocks: list[columns.Block]) -> tuple[int, int] | None:
        """Insert a type's column blocks straight from Arrow when every row is clean and no
        id repeats in them: (rows inserted, rows); None (nothing written) otherwise.  Only
        the fields some block carries a value of are read (the others stay NULL): the row
        form is positional, so a GPU without GPM metrics still sends their empty places."""
        con = self.con
        carried = {n for b in blocks for n, a in b.arrays.items() if a.null_count < len(a)}
        present = tuple(n for n in DATA_FIELDS[type_] if n in carried)
        table = pa.Table.from_batches(lean, schema=LEAN_SCHEMAS[type_]).select(["id", "ts", "node", "job", *present])
        s.register(con, f"_cf_{type_}", table)
        lookups, check, insert = fast_sql(type_, present)
        for sql in lookups:
            con.execute(sql)
        ((clean, repeats, lo, hi, n),) = con.execute(check).fetchall()
        if not clean or repeats or self._skewed(lo, hi):
            return None  # the checked path finds each row's reason (or skew)
        (inserted,) = con.execute(insert, [lo, hi]).fetchall()[0]
        if inserted and TABLES[type_] in rollup.SOURCES:
            con.execute(rollup.dirty_sql(TABLES[type_], f"_cf_{type_}",
                                         "make_timestamp(TRY_CAST(round(ts * 1e6) AS BIGINT))"))
        return inserted, n

    # -- 3. store -----------------------------------------------------------------------------
    def _store(self, s: _Scratch, res: WriteResult, now: Any) -> None:
        """Rows without a reason into their tables, the others into dead_letters, the
        envelopes into nodes."""
        con = self.con
        env_dead = valid = repeats = 0
        forms: dict[str, tuple[bool, bool]] = {}  # type -> (has JSON lines, has rows)
        if s.checked:
            con.execute(ev_view(s.row_types, s.has_rows, s.has_json))
            lines_n, env_dead, valid, repeats = con.execute(
                "SELECT count(*), count(reason), count(*) - count(reason), "
                "count(id) FILTER (WHERE reason IS NULL) - count(DISTINCT (node, id)) FILTER (WHERE reason IS NULL) "
                "FROM _ev"
            ).fetchall()[0]
            res.lines += lines_n
            if env_dead:
                res.dead += dead_letters.from_rows(con, "_ev", now)
            forms = {
                t: (js, rows)
                for t, js, rows in con.execute(
                    "SELECT type, bool_or(js), bool_or(NOT js) FROM _ev WHERE reason IS NULL GROUP BY type"
                    if s.row_types
                    else "SELECT DISTINCT type, true, false FROM _ev WHERE reason IS NULL"
                ).fetchall()
            }
        field_dead = 0
        for type_, table in TABLES.items():
            if type_ in s.fast:
                continue
            if type_ not in forms:
                res.rows[table] = 0
                continue
            if forms[type_] == (False, True) and not repeats:  # rows only: no copy
                src, cols = f"(SELECT * FROM _r_{type_} WHERE ereason IS NULL)", list(DATA_FIELDS[type_])
            else:
                sql, cols = TYPE_SQL[(type_, repeats > 0, *forms[type_])]
                con.execute(sql)
                src = "_t"
            (bad,) = con.execute(f"SELECT count(reason) FROM {src}").fetchall()[0]
            if bad:
                field_dead += bad
                res.dead += dead_letters.from_rows(con, src, now)
            res.rows[table] = self._insert_dedup(table, cols, src, res)
        res.rows["unknown_events"] = self._unknown_types(res) if set(forms) - set(TABLES) else 0
        nodes.upsert(
            con,
            ([nodes.FROM_EVENTS] if forms else []) + ([nodes.FROM_FAST_BLOCKS] if s.fast else []),
            self._window,
        )
        valid += sum(b.rows for bl in s.fast.values() for b in bl)
        res.duplicates = valid - res.inserted - field_dead

    def _insert_dedup(self, table: str, cols: list[str], src: str, res: WriteResult) -> int:
        lo, hi, n = self.con.execute(
            f"SELECT min(ts), max(ts), count(*) FROM {src} WHERE reason IS NULL"
        ).fetchall()[0]
        if not n:
            return 0
        if self._skewed(lo, hi):
            res.skewed += self._note_skew(table, src, lo, hi)
        stored, exprs = storage.insert_parts(table, cols, lambda c: f's."{c}"')
        (inserted,) = self.con.execute(
            f"""
            INSERT INTO {storage.stored(table)} (id, ts, node, job, {", ".join(f'"{c}"' for c in stored)})
            SELECT id, ts, node, job, {", ".join(exprs)} FROM {src} s
            WHERE reason IS NULL AND NOT EXISTS (
                SELECT 1 FROM {storage.stored(table)} x WHERE x.ts BETWEEN ? AND ? AND x.id = s.id AND x.node = s.node)""",
            [lo, hi],
        ).fetchall()[0]
        if inserted and table in rollup.SOURCES:
            self.con.execute(rollup.dirty_sql(table, src, where="reason IS NULL"))
        return inserted

    def _skewed(self, lo: dt.datetime | None, hi: dt.datetime | None) -> bool:
        """Whether any ts in [lo, hi] is outside the batch's clock window."""
        w = self._window
        # errs only towards the checked path, whose SQL applies the exact window (cost only):
        return w is not None and lo is not None and hi is not None and (lo < w[0] or hi > w[1])

    def _note_skew(self, table: str, src: str, lo: dt.datetime, hi: dt.datetime) -> int:
        """List the new events of ``src`` outside the clock window in ``clock_skew``."""
        assert self._window is not None
        (n,) = self.con.execute(
            f"""
            INSERT INTO clock_skew
            SELECT id, ts, node, '{table}', $now, epoch(ts) - epoch($now::TIMESTAMP) FROM {src} s
            WHERE reason IS NULL AND (ts < $w0 OR ts > $w1)
              AND NOT EXISTS (SELECT 1 FROM {table} x WHERE x.ts BETWEEN $lo AND $hi AND x.id = s.id AND x.node = s.node)
              AND NOT EXISTS (SELECT 1 FROM clock_skew c WHERE c.id = s.id AND c.node = s.node)""",
            {"now": self._now, "w0": self._window[0], "w1": self._window[1], "lo": lo, "hi": hi},
        ).fetchall()[0]
        return n

    def _unknown_types(self, res: WriteResult) -> int:
        """Events of types this collector does not know: kept whole (data as JSON)."""
        known = ", ".join(q(t) for t in TABLES)
        self.con.execute(f"""CREATE OR REPLACE TEMP TABLE _t AS
            SELECT e.id, e.ts, e.node, e.job, e.type, json_extract(b.line, '$.data') AS data,
                   NULL::VARCHAR AS reason
            FROM (SELECT * FROM _evj WHERE reason IS NULL AND type NOT IN ({known})) e
            JOIN _batch b ON b.origin = e.origin AND b.line_no = e.line_no
            QUALIFY row_number() OVER (PARTITION BY e.node, e.id ORDER BY e.origin, e.line_no) = 1""")
        return self._insert_dedup("unknown_events", ["type", "data"], "_t", res)


def _ts(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).replace(tzinfo=None)
