"""User SQL (``analyze sql``, ``POST /api/v1/sql``, alerting rules' ``expr``) that can read
the database and nothing else.

- It runs on a connection that cannot write: a file opened read-only, or (in the collector)
  a cursor in a ``READ ONLY`` transaction that is always rolled back (cmdare.analytics.db).
- The statement tree is checked: a data-modifying statement anywhere in it (``WITH x AS
  (DELETE ... RETURNING ...) SELECT ...``) is refused with one line before anything runs.

- The connection is read-only and opened with DuckDB's guards: ``enable_external_access``
  off (no file or network access: ``read_csv``, ``COPY ... TO``, ``ATTACH``, ``INSTALL``,
  ``LOAD``, ``EXPORT`` all fail), extension auto-install / auto-load off, replacement scans of
  Python objects off (``FROM host`` must not find a Python variable named ``host``), and
  ``lock_configuration`` on (no ``SET``), with the thread count and memory bounded.
- Before it runs, the text must be exactly one ``SELECT`` statement (``WITH ...`` and
  ``FROM t`` queries are SELECTs); anything else (``PRAGMA``, ``SET``, ``COPY``, ``CALL``,
  ``CREATE``, several statements, nothing) is refused with one line naming what it was.
- A row limit (``max_rows``: the first rows are kept and the result says it was cut) and a
  time limit (the query is interrupted; one line says so).
- A size limit checked inside DuckDB, before a value reaches Python: a row whose text,
  binary and nested values hold more than ``max_bytes`` stops the query in one line
  (``SELECT string_agg(repeat('x', 100000000), '') FROM range(20)`` is refused; it grew
  the collector past 6 GB). Rows under it are summed as they are fetched and the result is
  cut at ``max_bytes`` (``cut_by: bytes``).
- A memory limit: while the query runs and its rows are fetched, the process's resident
  memory is sampled every 5 ms, and a query that grows it by more than ``MEMORY`` (1 GiB)
  is interrupted (one line). DuckDB cannot be read by a second process while the collector
  writes it, so queries run in the collector's process; this is their bound there. DuckDB
  looks at an interrupt between vectors only: one operator call on one vector
  (``string_agg`` over 85 rows of 10 MB) can pass the limit before it is stopped (measured
  +1.8 GiB for that query).
- One budget for all queries together (``Budget``, ``$CMDARE_SQL_MEMORY_TOTAL``, default
  ``TOTAL`` = 2 GiB): a query is admitted only while the budgets of those running plus its
  own fit the total; otherwise it waits (at most its own time limit) and then gets one line
  (``SqlBusy``: 503 with ``Retry-After``), and while queries run, the process's growth over
  what it held when they started is watched against the total: past it, every running
  query is stopped. Six parallel attacks cost two queries' memory, not six.
- The answer's size counts what is sent: a string's bytes as the API's JSON writes them
  (a control character is six: ``\u0001``), so ``repeat(chr(1), 600)`` rows are cut at
  the limit of what is sent, not at six times it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import duckdb

from .db import AnalyticsError

CONFIG: dict[str, object] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,
    "threads": 2,
    "memory_limit": "2GB",
    "lock_configuration": True,
}
MAX_ROWS = 10_000
TIMEOUT = 30.0
MAX_BYTES = 64 << 20  # a result's size as sent (sent_size: JSON-escaped strings, other values 8 bytes)
MAX_QUERY = 100_000  # characters of SQL text
MEMORY = 1 << 30  # bytes a query may grow the process by while it runs and is fetched
TOTAL = 2 << 30  # bytes all running queries together may grow it by (Budget)
SAMPLE = 0.005  # seconds between looks at the process's memory
_FIXED = ("BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
          "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL", "DATE", "TIME", "TIMESTAMP", "INTERVAL", "UUID")
_TOO_BIG = "cmdare: a row of the result is over the byte limit"
# query nodes a read may hold (DuckDB's parse tree, json_serialize_sql)
READ_NODES = {"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"}


class SqlRefused(AnalyticsError):
    """A query that is not one read-only SELECT, or that ran past its limits."""


class SqlBusy(SqlRefused):
    """A query not admitted: the memory budget was in use by others until its deadline."""

    retry_after = 5


def env_size(name: str, default: int, lo: int, hi: int, lo_text: str) -> int:
    """A size from environment variable ``name`` (bytes, or with K/M/G), else ``default``;
    a one-line ValueError naming the variable for anything else or outside [lo, hi]."""
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    from cmdare.wire.units import parse_size

    try:
        n = int(parse_size(f"${name}", v))
    except Exception:  # noqa: BLE001  (one line, whatever the parser raised)
        raise ValueError(f"${name}: expected a size like 2GiB, got {v[:40]!r}") from None
    if not lo <= n <= hi:
        raise ValueError(f"${name}: {v[:40]!r} must be from {lo_text} to 1TiB")
    return n


def total_budget() -> int:
    """$CMDARE_SQL_MEMORY_TOTAL (bytes, or with K/M/G), else TOTAL."""
    return env_size("CMDARE_SQL_MEMORY_TOTAL", TOTAL, 64 << 20, 1 << 40, "64MiB")


class Budget:
    """The memory all user queries of one process may take together: admission (a query
    waits while the running ones' budgets and its own pass ``total``) and one watcher of the
    process's growth over what it held when the first of them started (past ``total``:
    every running query interrupted)."""

    def __init__(self, total: int | None = None) -> None:
        self.total = total if total is not None else total_budget()
        self._cond = threading.Condition()
        self._held = 0
        self._running: dict[int, tuple[duckdb.DuckDBPyConnection, threading.Event]] = {}
        self._base = 0
        self._watcher: threading.Thread | None = None
        self.refused = 0  # queries not admitted (a metric)
        self.stopped = 0  # queries interrupted by the total

    @contextlib.contextmanager
    def admit(self, con: duckdb.DuckDBPyConnection, need: int, wait: float) -> Iterator[threading.Event]:
        """Hold ``need`` bytes of the budget while ``con`` runs a query (waiting at most
        ``wait`` seconds for them); the event yielded is set when the total stopped it."""
        need = min(need, self.total)
        deadline = time.monotonic() + wait
        with self._cond:
            while self._held + need > self.total:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.refused += 1
                    raise SqlBusy(f"the server is busy: {len(self._running)} queries hold its SQL memory budget "
                                  f"({self.total >> 20:,} MiB); try again shortly")
                self._cond.wait(left)
            if not self._running:
                import psutil

                self._base = psutil.Process().memory_info().rss
            self._held += need
            fired = threading.Event()
            self._running[id(fired)] = (con, fired)
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch, name="cmdare-sql-budget", daemon=True)
                self._watcher.start()
        try:
            yield fired
        finally:
            with self._cond:
                self._held -= need
                self._running.pop(id(fired), None)
                self._cond.notify_all()

    def _watch(self) -> None:
        import psutil

        proc = psutil.Process()
        while True:
            time.sleep(SAMPLE)
            with self._cond:
                if not self._running:
                    self._watcher = None
                    return
                over = proc.memory_info().rss - self._base > self.total
                if over:
                    for con, fired in self._running.values():
                        if not fired.is_set():
                            fired.set()
                            self.stopped += 1
                            con.interrupt()


BUDGET = Budget(TOTAL)  # the process's; Service sets its total from $CMDARE_SQL_MEMORY_TOTAL


GRACE = 1.0  # seconds past its time limit a caller waits for a query DuckDB has not stopped yet


def answered_by(read: Callable[[], Any], timeout: float) -> Any:
    """``read()`` (a query under ``run``'s limits) in a thread of its own, its answer within
    ``timeout`` + ``GRACE`` seconds whatever DuckDB does: an interrupt is seen between
    vectors only, so one scalar call on one vector (a regular expression over 2,000 rows of
    1 MB) can run on for seconds past its time limit. Past the wait the caller gets one
    line; the thread finishes, closes its own cursor and gives its budget back when DuckDB
    stops (while it runs, it holds its share of the budget: such queries cannot pile up)."""
    import contextvars

    box: dict[str, Any] = {}
    done = threading.Event()
    ctx = contextvars.copy_context()  # the request's scope (analytics/scoping.py) goes with it

    def work() -> None:
        try:
            box["answer"] = ctx.run(read)
        except BaseException as e:  # noqa: BLE001  (handed to the caller)
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=work, name="cmdare-sql", daemon=True).start()
    if not done.wait(timeout + GRACE):
        STATS["answered_before_stopped"] += 1
        raise SqlRefused(f"query stopped after {timeout:g} s (the time limit; narrow it with WHERE or LIMIT)")
    if "error" in box:
        raise box["error"]
    return box["answer"]


STATS = {"answered_before_stopped": 0}  # answers given at the deadline while DuckDB still ran the query


def sent_size(v: Any) -> int:
    """About what a value costs in the API's JSON answer: a string as written between its
    quotes (UTF-8, escapes included: ``chr(1)`` is six), bytes as hex (two a byte), anything
    else 8."""
    if isinstance(v, str):
        if v.isascii() and v.isprintable() and '"' not in v and "\\" not in v:
            return len(v)
        return len(json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")) - 2
    if isinstance(v, bytes):
        return 2 * len(v)
    return 8


@dataclass
class SqlResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool  # more rows than max_rows (or bytes than max_bytes): the first ones are in rows
    cut_by: str = ""  # "rows" or "bytes" when truncated


def check(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """SqlRefused unless ``query`` is exactly one SELECT statement that modifies nothing
    anywhere in its tree."""
    if len(query) > MAX_QUERY:
        raise SqlRefused(f"the query is {len(query):,} characters: at most {MAX_QUERY:,}")
    if not query.strip():
        raise SqlRefused("empty query: give one SELECT statement, e.g. SELECT count(*) FROM nodes")
    try:
        stmts = con.extract_statements(query)
    except duckdb.Error as e:
        raise SqlRefused(f"query does not parse: {_first(e)}") from None
    if not stmts:
        raise SqlRefused("empty query: give one SELECT statement, e.g. SELECT count(*) FROM nodes")
    if len(stmts) > 1:
        raise SqlRefused(f"one statement at a time: the query has {len(stmts)}")
    (stmt,) = stmts
    if stmt.type != duckdb.StatementType.SELECT:
        # the user's own word (INSTALL, RESET, CHECKPOINT say more than DuckDB's LOAD, SET,
        # CALL), except a WITH: then what the statement does (WITH ... DELETE: DELETE)
        words = stmt.query.split()
        name = words[0].upper() if words and words[0].isalpha() else ""
        if name in ("", "WITH"):
            name = stmt.type.name
        raise SqlRefused(f"only SELECT queries may run here (read-only, database only), not {name}")
    inner, around = _writing_node(con, query)
    if inner:
        raise SqlRefused(f"only SELECT queries may run here (read-only, database only), not {inner} inside a SELECT")
    if around:
        from .scoping import current

        raise SqlRefused(f"token {getattr(current(), 'token', '?')} sees its labels' nodes and jobs only: "
                         f"not {around}")


def _writing_node(con: duckdb.DuckDBPyConnection, query: str) -> tuple[str | None, str | None]:
    """The first query node of the parse tree that is not a read (``DELETE`` for a
    ``DELETE_QUERY_NODE`` in a WITH), or None; under a label-filtered token's scope, what
    would read around its views (analytics/scoping.py), or None. A tree DuckDB cannot
    serialise is refused."""
    import json

    from . import scoping

    try:
        (text,) = con.execute("SELECT json_serialize_sql($q::VARCHAR)", {"q": query}).fetchone() or ("",)
        tree = json.loads(text)
    except RecursionError:
        raise SqlRefused("the query nests too deeply to be checked: write it flatter (a CTE per level)") from None
    except (duckdb.Error, ValueError) as e:
        raise SqlRefused(f"query does not parse: {_first(e)}") from None
    if tree.get("error"):
        raise SqlRefused(f"query does not parse: {str(tree.get('error_message', ''))[:200]}")
    stack: list[object] = [tree.get("statements", [])]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            t = x.get("type")
            if isinstance(t, str) and t.endswith("_NODE") and t not in READ_NODES:
                return t.partition("_")[0], None
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return None, (scoping.refused(tree) if scoping.current() is not None else None)


@contextlib.contextmanager
def interrupt_after(con: duckdb.DuckDBPyConnection, timeout: float) -> Iterator[threading.Event]:
    """Interrupt what ``con`` runs once ``timeout`` seconds have passed; the event yielded
    is set when it did (so that the caller can say the time limit stopped it)."""
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        con.interrupt()

    timer = threading.Timer(timeout, stop)  # cancelled below, whatever happens
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()


@contextlib.contextmanager
def memory_guard(con: duckdb.DuckDBPyConnection, budget: int = MEMORY) -> Iterator[threading.Event]:
    """Interrupt what ``con`` runs once the process's resident memory has grown by more than
    ``budget`` bytes since it started (sampled every SAMPLE s); the event yielded is set
    when it did."""
    import psutil

    proc = psutil.Process()
    start = proc.memory_info().rss
    fired, done = threading.Event(), threading.Event()

    def watch() -> None:
        while not done.wait(SAMPLE):
            if proc.memory_info().rss - start > budget:
                fired.set()
                con.interrupt()
                return

    t = threading.Thread(target=watch, name="cmdare-sql-memory", daemon=True)
    t.start()
    try:
        yield fired
    finally:
        done.set()
        t.join()


def sized(con: duckdb.DuckDBPyConnection, query: str, max_bytes: int) -> str:
    """``query`` stopped inside DuckDB at a row over ``max_bytes`` (its text, binary and
    nested values), before the row is handed to Python; the query as it is when its column
    names repeat (it cannot be wrapped) or all of its columns are fixed-size."""
    desc = con.execute(f"DESCRIBE {query}").fetchall()
    names = [d[0] for d in desc]
    if len(set(names)) != len(names):
        return query
    parts = []
    for name, typ, *_ in desc:
        c = '__q."' + name.replace('"', '""') + '"'
        t = str(typ).upper()
        if t.startswith(_FIXED):
            continue
        if t == "VARCHAR":
            parts.append(f"coalesce(strlen({c}), 0)")
        elif t == "BLOB":
            parts.append(f"coalesce(octet_length({c}), 0)")
        else:  # nested, JSON, enums, bit strings: their text
            parts.append(f"coalesce(strlen(CAST({c} AS VARCHAR)), 0)")
    if not parts:
        return query
    return (f"SELECT * FROM (\n{_body(query)}\n) AS __q WHERE CASE WHEN {' + '.join(parts)} > {int(max_bytes)} "
            f"THEN error('{_TOO_BIG}') ELSE true END")


def _body(query: str) -> str:
    """One statement's text without the semicolon that ends it (and the comments after
    it), so that it can stand inside parentheses; a line comment at its end is ended by
    the caller's newline."""
    toks = duckdb.tokenize(query)
    last = len(toks)
    while last and toks[last - 1][1] == duckdb.token_type.comment:
        last -= 1
    if last and toks[last - 1][1] == duckdb.token_type.operator and query[toks[last - 1][0]:].lstrip().startswith(";"):
        return query[:toks[last - 1][0]]
    return query


def run(con: duckdb.DuckDBPyConnection, query: str, max_rows: int = MAX_ROWS, timeout: float = TIMEOUT,
        max_bytes: int = MAX_BYTES, memory: int = MEMORY, budget: Budget | None = None) -> SqlResult:
    """Run one checked SELECT on a connection that cannot write, within the limits (and,
    given ``budget``, admitted by it: waiting at most ``timeout`` for it)."""
    check(con, query)
    t0 = time.monotonic()
    held = budget.admit(con, memory, timeout) if budget is not None else contextlib.nullcontext(threading.Event())
    with held as total, interrupt_after(con, max(0.001, timeout - (time.monotonic() - t0))) as fired, \
            memory_guard(con, memory) as grown:
        try:
            cur = con.execute(sized(con, query, max_bytes))
            cols = [d[0] for d in cur.description or []]
            rows: list[tuple[Any, ...]] = []
            size = 0
            while len(rows) <= max_rows:
                chunk = cur.fetchmany(min(2048, max_rows + 1 - len(rows)))
                if not chunk:
                    break
                for r in chunk:
                    size += sum(sent_size(v) for v in r)
                    if size > max_bytes:
                        return SqlResult(cols, rows, True, "bytes")
                    rows.append(r)
        except duckdb.Error as e:
            if total.is_set():
                raise SqlRefused(f"query stopped: the queries running together needed more than "
                                 f"{budget.total >> 20 if budget else 0:,} MiB of memory (the server's SQL budget; "
                                 "try again, or narrow it with WHERE or LIMIT)") from None
            if grown.is_set():
                raise SqlRefused(f"query stopped: it needed more than {memory >> 20:,} MiB of memory "
                                 "(narrow it with WHERE, LIMIT or fewer columns)") from None
            if fired.is_set():
                raise SqlRefused(f"query stopped after {timeout:g} s (the time limit; narrow it with WHERE or LIMIT)") from None
            if _TOO_BIG in str(e):
                raise SqlRefused(f"a row of the result is over {max_bytes:,} bytes (the size limit): select less "
                                 "of it (left(), substr(), fewer columns)") from None
            if isinstance(e, duckdb.PermissionException):
                raise SqlRefused(
                    "the query may read the database only: file, network and extension access are off "
                    f"({_first(e).rpartition(': ')[2]})"
                ) from None
            raise SqlRefused(f"query failed: {_first(e)}") from None
    return SqlResult(cols, rows[:max_rows], len(rows) > max_rows, "rows" if len(rows) > max_rows else "")


def _first(e: BaseException) -> str:
    """The error's first line, with DuckDB's "Did you mean ...?" hint where it gives one."""
    lines = [x for x in str(e).splitlines() if x.strip()] or [type(e).__name__]
    if len(lines) > 1 and lines[1].startswith("Did you mean"):
        return f"{lines[0]} {lines[1]}"
    return lines[0]
