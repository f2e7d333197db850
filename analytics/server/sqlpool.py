"""User SQL in worker processes (a lake server's ``POST /api/v1/sql``): a query that takes
more memory or CPU than it may costs its own worker, never the server.

A lake's files are immutable and any number of processes may read them, so each worker
opens the lake itself (``LakeDatabase``: views over the Parquet files its tables' current
snapshots plan, with DuckDB's guards: external access limited to the lake's files) and
plans it again only when the catalog says a table moved. Each worker runs under

- a hard cap on its address space (``RLIMIT_AS``, default ``MEMORY_CAP`` = 2 GiB;
  ``$CMDARE_SQL_WORKER_MEMORY``): past it allocation fails inside the worker;
- a CPU-time cap per query (``RLIMIT_CPU`` set to what it used so far plus the query's
  share: its threads times its time limit, plus a margin): past it the kernel stops it;
- a wall deadline (the query's time limit plus ``GRACE``): past it the server kills it;

and inside it the same checks and limits as a collector's user SQL (analytics/safesql.py:
one read-only SELECT, row, byte and time limits, the memory guard), and the same label
filter for a scoped token (analytics/scoping.py: the views are made in the worker). A
worker that died or was killed is replaced; the request gets one line. Requests beyond
the pool's size wait for a worker (at most the query's own deadline)."""

from __future__ import annotations

import contextlib
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from ..db import AnalyticsError

MEMORY_CAP = 2 << 30  # bytes of address space per worker
WORKERS = 2
GRACE = 5.0  # seconds past a query's time limit before its worker is killed
STARTUP = 120.0  # seconds a worker may take to start (imports, the first planning of the lake)


def memory_cap() -> int:
    """The workers' address-space cap: $CMDARE_SQL_WORKER_MEMORY (bytes, or with K/M/G), else
    MEMORY_CAP."""
    from ..safesql import env_size

    return env_size("CMDARE_SQL_WORKER_MEMORY", MEMORY_CAP, 256 << 20, 1 << 40, "256MiB")


class SqlPool:
    """``size`` worker processes over the lake ``uri`` (catalog ``catalog``), started as
    requests need them."""

    def __init__(self, uri: str, catalog: str | None, size: int = WORKERS, memory: int | None = None,
                 fast: bool = False) -> None:
        self.uri, self.catalog = uri, catalog
        self.fast = fast  # the workers plan lakedb.FAST tables as a ruler's replica holds them (rules' pool)
        self.memory = memory if memory is not None else memory_cap()
        self.size = size
        self._idle: list[_Worker] = []
        self._cond = threading.Condition()
        self._made = 0
        self.killed = 0  # workers stopped for a cap or a deadline (a metric)

    def run(self, query: str, max_rows: int, timeout: float, max_bytes: int, scope: Any = None) -> Any:
        """One query in a worker: its SqlResult, or SqlRefused / AnalyticsError in one line."""
        from ..safesql import SqlRefused

        kind, value = self._call(("sql", query, max_rows, timeout, max_bytes, scope), timeout)
        if kind == "ok":
            return value
        if kind == "refused":
            raise SqlRefused(value)
        raise AnalyticsError(value)

    def rule(self, rule: Any, at: Any, timeout: float, horizon: Any = None, lag: float = 0.0,
             fast: dict[str, Any] | None = None) -> list[Any]:
        """One alert rule's expression evaluated in a worker (alerting/evaluate.py's
        ``evaluate``, under the worker's caps): its instances, or RuleError in one line.
        ``fast``: per ``lakedb.FAST`` table, the rows a ruler read ahead of the lake (Arrow)."""
        from ..alerting import RuleError
        from ..safesql import SqlRefused

        try:
            kind, value = self._call(("rule", rule, at, timeout, horizon, lag, fast or {}), timeout)
        except SqlRefused as e:
            raise RuleError(_expr(str(e))) from None
        if kind == "ok":
            return value
        raise RuleError(value)

    def _call(self, msg: tuple[Any, ...], timeout: float) -> tuple[str, Any]:
        """``msg`` to a worker and its answer; SqlRefused in one line when the worker died or
        ran past the deadline (it is then stopped and replaced)."""
        from ..safesql import SqlRefused

        deadline = time.monotonic() + timeout + GRACE
        w = self._take(deadline)
        ok = False
        try:
            w.conn.send(msg)
            left = deadline - time.monotonic()
            if not w.conn.poll(max(0.0, left)):
                self.killed += 1
                raise SqlRefused(f"query stopped after {timeout:g} s (the time limit; narrow it with WHERE or LIMIT)")
            try:
                answer = w.conn.recv()
            except (EOFError, OSError):
                self.killed += 1
                raise SqlRefused(self._died(w)) from None
            ok = True
        finally:
            self._give(w, ok)
        return answer

    def _died(self, w: _Worker) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(2)
        code = w.exitcode
        if code == -signal.SIGXCPU:
            why = "its CPU-time cap"
        else:
            return OUT_OF_MEMORY.format(cap=self.memory >> 20)
        return f"query stopped: it ran past {why}; its worker was stopped (narrow it with WHERE, LIMIT or fewer columns)"

    def _take(self, deadline: float) -> _Worker:
        with self._cond:
            while not self._idle and self._made >= self.size:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                    from ..safesql import SqlRefused

                    raise SqlRefused("every SQL worker stayed busy past the query's time limit: try again")
            while self._idle:
                w = self._idle.pop()
                if w.alive():
                    return w
                w.stop()  # died while idle (the kernel's OOM killer, an operator): made again below
                self._made -= 1
            self._made += 1
        try:
            return _Worker(self)
        except BaseException:
            with self._cond:
                self._made -= 1
                self._cond.notify()
            raise

    def _give(self, w: _Worker, ok: bool) -> None:
        with self._cond:
            if ok and w.alive():
                self._idle.append(w)
            else:
                w.stop()
                self._made -= 1
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
        for w in idle:
            w.stop()


class _Worker:
    """A fresh interpreter (``python -m cmdare.analytics.server.sqlpool``: a fork would copy the
    server's threads and DuckDB's state), spoken to over a socket pair; the lake's URI and
    catalog go over the socket, never on a command line others can read."""

    def __init__(self, pool: SqlPool) -> None:
        mine, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "cmdare.analytics.server.sqlpool", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send((pool.uri, pool.catalog, pool.memory, pool.fast))
        if not self.conn.poll(STARTUP):
            self.stop()
            raise AnalyticsError("an SQL worker did not start")
        try:
            kind, msg = self.conn.recv()
        except (EOFError, OSError):
            self.stop()
            raise AnalyticsError("an SQL worker did not start (it died)") from None
        if kind != "ready":
            self.stop()
            raise AnalyticsError(msg)

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(5)
        with contextlib.suppress(OSError):
            self.conn.close()


# -- in the worker ----------------------------------------------------------------------------

def _serve(conn: Any) -> None:
    """A worker's loop: limits first, then the lake, then one query per message."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the server stops its workers itself)
    uri, catalog, memory, fast = conn.recv()
    try:  # (a seccomp filter without @resources refuses it: no worker runs uncapped)
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError) as e:
        conn.send(("error", f"an SQL worker cannot cap its memory ({e}): allow setrlimit (@resources)"))
        return
    try:
        src = _Lake(uri, catalog, memory, fast)
    except Exception as e:  # noqa: BLE001  (said to the server in one line)
        conn.send(("error", str(e).splitlines()[0][:300] if str(e) else type(e).__name__))
        return
    conn.send(("ready", ""))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(_rule(src, *msg[1:]) if msg[0] == "rule" else _one(src, *msg[1:]))


class _Lake:
    """The lake as this worker last planned it: the tables whose metadata location moved
    since are planned again (``LakeDatabase.replan``), the rest kept."""

    def __init__(self, uri: str, catalog: str | None, memory: int, fast: bool = False) -> None:
        from ..lakedb import LakeDatabase

        self.db = LakeDatabase(uri, catalog)
        self.memory = memory
        self.fast = fast
        self.at: dict[str, str] = {}
        self.con: Any = None
        self.made: Any = None

    def connection(self) -> Any:
        from .. import safesql
        from ..scoping import Made

        locs = self.db.lake.locations()
        if self.con is None:
            # DuckDB's own limit under the cap: a query past it stops in DuckDB, with room to say so
            config = {**{k: v for k, v in safesql.CONFIG.items() if k != "lock_configuration"},
                      "memory_limit": f"{self.memory // 2 >> 20}MB"}
            self.con = self.db._open(config, self.fast)
            self.at, self.made = locs, Made()
        elif locs != self.at:
            moved = {t for t in set(locs) | set(self.at) if locs.get(t) != self.at.get(t)}
            try:
                self.db.replan(self.con, moved, self.fast)
            except BaseException:  # half planned: planned whole at the next query
                self.con.close()
                self.con = None
                raise
            self.at = locs
        return self.con


OUT_OF_MEMORY = ("query stopped: it needed more memory than the SQL worker's cap ({cap:,} MiB) allows (narrow it "
                 "with WHERE, LIMIT or fewer columns)")


def _expr(msg: str) -> str:
    """A worker's one line said of a rule's expression."""
    return "expr " + msg[len("query "):] if msg.startswith("query ") else f"expr not evaluated: {msg}"


def _cap() -> int:
    return resource.getrlimit(resource.RLIMIT_AS)[0]


def _cpu_cap(timeout: float) -> None:
    """The CPU-time cap for the next query: what this worker used so far plus the query's
    share (its threads times its time limit) and a margin."""
    from .. import safesql

    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    threads = int(safesql.CONFIG["threads"])  # type: ignore[call-overload]
    cap = int(used + threads * timeout + GRACE) + 1
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (cap, resource.RLIM_INFINITY))


def _line(e: BaseException) -> str:
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__


def _cursor(src: _Lake, timeout: float) -> Any:
    """A cursor of the lake as planned now, the CPU cap set for a query of ``timeout``; or
    the error answer when the lake cannot be planned."""
    try:
        con = src.connection()
    except Exception as e:  # noqa: BLE001
        return ("error", f"the lake: {_line(e)}")
    _cpu_cap(timeout)
    return con.cursor()


def _rule(src: _Lake, rule: Any, at: Any, timeout: float, horizon: Any, lag: float,
          fast: dict[str, Any]) -> tuple[str, Any]:
    """A rule's expression at ``at`` over the lake and the rows read ahead of it."""
    from ..alerting import RuleError
    from ..alerting.evaluate import evaluate
    from ..lakedb import FAST

    cur = _cursor(src, timeout)
    if isinstance(cur, tuple):
        return cur
    try:
        for t in FAST:  # (this worker's own copy: one message at a time)
            cur.execute(f"DELETE FROM fast_{t}")
            rows = fast.get(t)
            if rows is not None and rows.num_rows:
                cur.register("_fast", rows)
                cur.execute(f"INSERT INTO fast_{t} BY NAME SELECT * FROM _fast")
                cur.unregister("_fast")
        return ("ok", evaluate(cur, rule, at, timeout, horizon, lag))
    except RuleError as e:
        if "Out of Memory" in str(e):  # an allocation refused under the address-space cap
            return ("refused", _expr(OUT_OF_MEMORY.format(cap=_cap() >> 20)))
        return ("refused", str(e))
    except MemoryError:
        return ("refused", _expr(OUT_OF_MEMORY.format(cap=_cap() >> 20)))
    except Exception as e:  # noqa: BLE001  (one line)
        return ("refused", f"expr failed: {_line(e)}")
    finally:
        with contextlib.suppress(Exception):
            cur.close()


def _one(src: _Lake, query: str, max_rows: int, timeout: float, max_bytes: int, scope: Any) -> tuple[str, Any]:
    from .. import safesql, scoping

    cur = _cursor(src, timeout)
    if isinstance(cur, tuple):
        return cur
    attached = None
    try:
        if scope is not None:
            attached = scoping.attach(cur, scope, src.made)
        cur.execute("BEGIN TRANSACTION READ ONLY")
        with scoping.active(scope):
            r = safesql.run(cur, query, max_rows, timeout, max_bytes)
        return ("ok", r)
    except safesql.SqlRefused as e:
        if "Out of Memory" in str(e):  # an allocation refused under the address-space cap
            return ("refused", OUT_OF_MEMORY.format(cap=_cap() >> 20))
        return ("refused", str(e))
    except AnalyticsError as e:
        return ("error", str(e))
    except MemoryError:
        return ("refused", OUT_OF_MEMORY.format(cap=_cap() >> 20))
    except Exception as e:  # noqa: BLE001  (DuckDB's own failures: one line)
        return ("refused", f"query failed: {_line(e)}")
    finally:
        with contextlib.suppress(Exception):
            cur.execute("ROLLBACK")
        if attached is not None:
            with contextlib.suppress(Exception):
                scoping.detach(cur, attached, src.made)
        with contextlib.suppress(Exception):
            cur.close()


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
