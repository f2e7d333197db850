"""PyTorch profiler (Kineto) traces: ``analyze import trace`` and ``analyze trace``.

A trace is Chrome-trace JSON, one file per rank (``.json`` or ``.json.gz``). Each file is
read by DuckDB in a connection of its own (bounded memory, the file's size bounded) and
reduced the way Holistic Trace Analysis (HTA 0.5.0, PyTorch's trace analyser) reads it:

- events with a duration and a category (not ``Trace``); when any time stamp is fractional
  (a nanosecond trace) each start is rounded up and each end down to the microsecond;
- GPU kernels: a stream and a correlation id >= 0 (or an ``Event Sync`` / ``Context Sync``);
  with two profiler steps or more, only the kernels launched by a CPU event that started
  before the last ``ProfilerStep#N`` (the profiler's stop cuts that one short);
- a kernel's kind from its name: ``^nccl.*Kernel`` communication; ``^Memcpy``, ``^Memset``,
  ``^dma`` memory; otherwise computation, unless it names Memcpy or Sync (other);
- the step of a kernel: the ``ProfilerStep#N`` its launching CPU event started in.

``breakdown`` then gives each rank HTA's temporal breakdown (idle, compute and non-compute
share of the time from its first kernel's start to its last one's end, overlapping kernels
merged) and its computation-communication overlap (the share of merged communication time
during which computation also ran), and per step the communication computation did not hide
and the slowest rank.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from .. import csvstream
from ..db import AnalyticsError
from ..output import one_line

MAX_FILE = 1 << 30  # bytes of one trace file as stored (gzip or not)
MAX_JSON = 512 << 20  # bytes of one trace's JSON once decompressed (DuckDB's maximum_object_size: it
#                     allocates twice that, within MEMORY)
MEMORY = "2GB"  # DuckDB's memory limit while one file is read
COMM = r"^nccl.*Kernel"
MEMORY_KERNEL = r"^(Memcpy|Memset|dma)"
NOT_COMPUTE = r"^(nccl.*Kernel|.*Memcpy|Memset|.*Sync)"  # HTA's NCCL_COMPUTE_KERNEL_RE, re.match


@dataclass
class RankTrace:
    """One rank's reduced trace, ready to store."""

    source: str
    sha256: str
    rank: int
    world_size: int | None
    kernels: Any  # pyarrow.Table: step, ts, dur, kind, stream
    steps: Any  # pyarrow.Table: step, ts, dur


def find(paths: Sequence[str | Path]) -> list[Path]:
    """The trace files under ``paths`` (files, or directories walked for *.json, *.json.gz)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise AnalyticsError(f"{p}: no such file or directory")
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith((".json", ".json.gz")))
            if not found:
                raise AnalyticsError(f"{p}: no trace files (*.json, *.json.gz)")
            out += found
        elif p.name.endswith((".json", ".json.gz")):
            out.append(p)
        else:
            raise AnalyticsError(f"{p}: not a trace file (*.json or *.json.gz)")
    return out


def read(path: Path, tmp: Path) -> RankTrace:
    """One trace file, reduced (see the module doc); AnalyticsError (one line) if it is not
    a readable PyTorch profiler trace. ``tmp``: a private folder DuckDB may spill to."""
    name = _shown(path)
    digest = hashlib.sha256()
    with csvstream.open_regular(path, MAX_FILE, "a trace file") as fh:
        head = fh.read(2)
        digest.update(head)
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
        fh.seek(0)
        total = 0
        if head == b"\x1f\x8b":  # the JSON's size, decompressed and counted (never held): a bomb stops here
            try:
                with gzip.GzipFile(fileobj=fh) as z:
                    while chunk := z.read(1 << 20):
                        total += len(chunk)
                        if total > MAX_JSON:
                            break
            except (OSError, EOFError, gzip.BadGzipFile) as e:
                raise AnalyticsError(f"{name}: not a readable gzip file ({one_line(str(e), 60)})") from None
        else:
            total = path.stat().st_size
        if total > MAX_JSON:
            raise AnalyticsError(f"{name}: more than {MAX_JSON >> 20:,} MiB of JSON once decompressed")
    # an in-memory database of its own, bounded, for the parse (no database file is opened here)
    con = duckdb.connect(":memory:", config={"memory_limit": MEMORY, "threads": 2, "temp_directory": str(tmp / "spill")})
    gz = head == b"\x1f\x8b"
    try:  # DuckDB allocates its object bound up front: the JSON's own size, known now
        return _reduce(con, path, "gzip" if gz else "none", name, digest.hexdigest(), total + (1 << 20))
    except duckdb.Error as e:
        text = str(e)
        if head == b"\x1f\x8b" and ("gzip" in text.lower() or "compress" in text.lower()):
            raise AnalyticsError(f"{name}: not a readable gzip file ({one_line(text, 60)})") from None
        raise AnalyticsError(f"{name}: not a PyTorch profiler trace ({one_line(text, 80)})") from None
    finally:
        con.close()


def _shown(path: Path) -> str:
    """A file's path for a message: whole, or its last 120 characters (its name stays)."""
    text = one_line(str(path), 10_000)
    return text if len(text) <= 120 else "..." + text[-117:]


def _reduce(con: duckdb.DuckDBPyConnection, src: Path, compression: str, name: str, sha: str,
            bound: int) -> RankTrace:
    con.execute(
        """CREATE TEMP TABLE top AS SELECT distributedInfo, traceEvents
           FROM read_json(?, columns={'distributedInfo': 'JSON', 'traceEvents': 'JSON[]'}, format='unstructured',
                          maximum_object_size=?, compression=?)""", [str(src), bound, compression])
    top = con.execute("SELECT distributedInfo, traceEvents IS NULL FROM top").fetchall()
    if len(top) != 1 or top[0][1]:
        raise AnalyticsError(f"{name}: no traceEvents: not a PyTorch profiler trace")
    info = top[0][0]
    con.execute(
        """CREATE TEMP TABLE ev AS
           WITH raw AS (SELECT unnest(traceEvents) AS e FROM top)
           SELECT e->>'cat' AS cat, e->>'name' AS name, json_type(e, '$.ts') AS ts_type,
                  TRY_CAST(e->>'ts' AS DOUBLE) AS ts, TRY_CAST(e->>'dur' AS DOUBLE) AS dur,
                  CASE json_type(e, '$.args.stream')
                       WHEN 'VARCHAR' THEN coalesce(TRY_CAST(e->'args'->>'stream' AS BIGINT), -1)
                       WHEN 'DOUBLE' THEN CAST(trunc(CAST(e->'args'->>'stream' AS DOUBLE)) AS BIGINT)
                       WHEN 'BIGINT' THEN CAST(e->'args'->>'stream' AS BIGINT)
                       WHEN 'UBIGINT' THEN TRY_CAST(e->'args'->>'stream' AS BIGINT)
                       ELSE -1 END AS stream,
                  coalesce(TRY_CAST(e->'args'->>'correlation' AS BIGINT), -1) AS corr
           FROM raw""")
    con.execute("DROP TABLE top")
    # HTA rounds a nanosecond trace's times to whole microseconds (start up, end down)
    frac = con.execute("SELECT bool_or(ts_type = 'DOUBLE' OR ts IS NULL) FROM ev").fetchall()[0][0]
    con.execute(f"""CREATE TEMP TABLE k AS
        SELECT cat, name, stream, corr,
               {"ceil(ts)" if frac else "ts"}::BIGINT AS ts,
               {"floor(ts + dur) - ceil(ts)" if frac else "dur"}::BIGINT AS dur,
               (stream >= 0 AND corr >= 0) OR name IN ('Event Sync', 'Context Sync') AS gpu,
               CAST(regexp_extract(name, 'ProfilerStep\\s*#\\s*(\\d+)', 1) AS VARCHAR) AS step_no
        FROM ev WHERE dur IS NOT NULL AND ts IS NOT NULL AND cat IS NOT NULL AND cat <> 'Trace'""")
    steps = con.sql(
        """SELECT TRY_CAST(step_no AS INTEGER) AS step, ts, dur FROM k
           WHERE NOT gpu AND contains(name, 'ProfilerStep') AND step_no <> '' ORDER BY ts""").to_arrow_table()
    n_steps = con.execute("SELECT count(DISTINCT name) FROM k WHERE contains(name, 'ProfilerStep')").fetchall()[0][0]
    # with two steps or more: the kernels launched before the last step began (HTA's filter)
    keep = ("SELECT corr FROM k WHERE NOT gpu AND ts < (SELECT max(ts) FROM k WHERE NOT gpu "
            "AND contains(name, 'ProfilerStep'))") if n_steps >= 2 else None
    kernels = con.sql(
        f"""WITH launch AS (SELECT corr, min(ts) AS at FROM k WHERE NOT gpu AND corr >= 0 GROUP BY corr),
                st AS (SELECT TRY_CAST(step_no AS INTEGER) AS step, ts, ts + dur AS e FROM k
                       WHERE NOT gpu AND step_no <> '')
           SELECT (SELECT max(st.step) FROM st WHERE launch.at >= st.ts AND launch.at < st.e) AS step,
                  g.ts, g.dur,
                  CASE WHEN regexp_matches(g.name, '{COMM}') THEN 'communication'
                       WHEN regexp_matches(g.name, '{MEMORY_KERNEL}') THEN 'memory'
                       WHEN NOT regexp_matches(g.name, '{NOT_COMPUTE}') THEN 'computation'
                       ELSE 'other' END AS kind,
                  g.stream
           FROM k g LEFT JOIN launch USING (corr)
           WHERE g.gpu {f"AND g.corr IN ({keep})" if keep else ""}
           ORDER BY g.ts""").to_arrow_table()
    rank, world = _rank(info, name)
    return RankTrace(src.name, sha, rank, world, kernels, steps)


def _rank(info: Any, name: str) -> tuple[int, int | None]:
    """(rank, world size) from the trace's ``distributedInfo``."""
    import json

    try:
        d = json.loads(info) if isinstance(info, str) else info
    except ValueError:
        d = None
    if not isinstance(d, dict):
        raise AnalyticsError(f"{name}: no distributedInfo: which rank it is cannot be told "
                             "(a trace of a torch.distributed job names its rank)")
    rank, world = d.get("rank"), d.get("world_size")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < 1 << 20:
        raise AnalyticsError(f"{name}: distributedInfo.rank {one_line(repr(rank), 20)} is not a rank")
    if not (isinstance(world, int) and not isinstance(world, bool) and rank < world <= 1 << 20):
        world = None
    return rank, world


def store(con: duckdb.DuckDBPyConnection, job: str, traces: list[RankTrace]) -> dict[str, Any]:
    """Store the ranks of ``job`` (each replaces that rank's rows) in one transaction; a rank
    whose file is the one stored already is left as it is. Counts stored."""
    if not job or len(job) > 512:
        raise AnalyticsError("--job must be a name of 1 to 512 characters")
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank in seen:
            raise AnalyticsError(f"{t.source} and {seen[t.rank]} are both rank {t.rank}: import one file a rank")
        seen[t.rank] = t.source
    out: dict[str, Any] = {"job": job, "ranks": [], "kernels": 0, "unchanged": 0}
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    con.execute("BEGIN")
    try:
        for t in traces:
            old = con.execute("SELECT sha256 FROM trace_ranks WHERE job = ? AND rank = ?", [job, t.rank]).fetchone()
            out["ranks"].append(t.rank)
            if old and old[0] == t.sha256:
                out["unchanged"] += 1
                continue
            for table in ("trace_kernels", "trace_steps", "trace_ranks"):
                con.execute(f"DELETE FROM {table} WHERE job = ? AND rank = ?", [job, t.rank])
            con.register("_trace_k", t.kernels)
            con.register("_trace_s", t.steps)
            try:
                con.execute("INSERT INTO trace_kernels SELECT ?, ?, step, ts, dur, kind, stream FROM _trace_k",
                            [job, t.rank])
                con.execute("INSERT INTO trace_steps SELECT ?, ?, step, ts, dur FROM _trace_s WHERE step IS NOT NULL",
                            [job, t.rank])
            finally:
                con.unregister("_trace_k")
                con.unregister("_trace_s")
            con.execute("INSERT INTO trace_ranks VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [job, t.rank, t.world_size, t.source, t.sha256, t.kernels.num_rows, t.steps.num_rows, now])
            out["kernels"] += t.kernels.num_rows
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return out


def read_all(paths: Sequence[str | Path], progress: Callable[[Path, int, int], None] | None = None) -> list[RankTrace]:
    """Every trace file under ``paths`` read and reduced (one line for the first bad one, or
    for two files of one rank), before anything is stored or sent."""
    import tempfile

    files = find(paths)
    out: list[RankTrace] = []
    seen: dict[int, str] = {}
    for i, f in enumerate(files):
        with tempfile.TemporaryDirectory(prefix="cmdare-trace-") as tmp:
            t = read(f, Path(tmp))
        if t.rank in seen:
            raise AnalyticsError(f"{t.source} and {seen[t.rank]} are both rank {t.rank}: import one file a rank")
        seen[t.rank] = t.source
        out.append(t)
        if progress:
            progress(f, i + 1, len(files))
    return out


def import_files(con: duckdb.DuckDBPyConnection, paths: Sequence[str | Path], job: str,
                 progress: Callable[[Path, int, int], None] | None = None) -> dict[str, Any]:
    """Read every file first (read_all), then store them."""
    traces = read_all(paths, progress)
    res = store(con, job, traces)
    res["files"] = len(traces)
    return res


RANK_SQL = """
WITH k AS (SELECT rank, ts, ts + dur AS e, kind FROM trace_kernels WHERE job = $job AND stream <> -1),
m AS (  -- merged intervals per rank and set (all kernels, computation, communication)
    SELECT rank, s, min(ts) AS ts, max(e) AS e FROM (
        SELECT rank, s, ts, e, sum(brk) OVER (PARTITION BY rank, s ORDER BY ts, e ROWS UNBOUNDED PRECEDING) AS grp
        FROM (SELECT rank, s, ts, e,
                     CASE WHEN ts > max(e) OVER (PARTITION BY rank, s ORDER BY ts, e
                                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                          THEN 1 ELSE 0 END AS brk
              FROM (SELECT rank, 'all' AS s, ts, e FROM k
                    UNION ALL SELECT rank, 'comp', ts, e FROM k WHERE kind = 'computation'
                    UNION ALL SELECT rank, 'comm', ts, e FROM k WHERE kind = 'communication')))
    GROUP BY rank, s, grp),
per AS (SELECT rank, max(e) FILTER (WHERE s = 'all') - min(ts) FILTER (WHERE s = 'all') AS span,
               sum(e - ts) FILTER (WHERE s = 'all') AS busy, coalesce(sum(e - ts) FILTER (WHERE s = 'comp'), 0) AS comp,
               coalesce(sum(e - ts) FILTER (WHERE s = 'comm'), 0) AS comm
        FROM m GROUP BY rank),
ov AS (SELECT a.rank, sum(least(a.e, b.e) - greatest(a.ts, b.ts)) AS both_
       FROM m a JOIN m b ON a.rank = b.rank AND a.s = 'comp' AND b.s = 'comm' AND a.ts < b.e AND b.ts < a.e
       GROUP BY a.rank)
SELECT per.rank, r.world_size, round(100 * (span - busy) / span, 2) AS idle_pct,
       round(100 * comp / span, 2) AS compute_pct, round(100 * (busy - comp) / span, 2) AS non_compute_pct,
       CASE WHEN comm > 0 THEN round(100 * coalesce(both_, 0) / comm, 2) END AS overlap_pct,
       round(span / 1e3, 3) AS kernel_time_ms, round(comm / 1e3, 3) AS comm_ms,
       round((comm - coalesce(both_, 0)) / 1e3, 3) AS exposed_comm_ms
FROM per LEFT JOIN ov USING (rank) LEFT JOIN trace_ranks r ON r.job = $job AND r.rank = per.rank
WHERE span > 0 ORDER BY per.rank"""

STEP_SQL = """
WITH k AS (SELECT rank, step, ts, ts + dur AS e, kind FROM trace_kernels
           WHERE job = $job AND stream <> -1 AND step IS NOT NULL AND kind IN ('computation', 'communication')),
m AS (
    SELECT rank, step, kind, min(ts) AS ts, max(e) AS e FROM (
        SELECT *, sum(brk) OVER (PARTITION BY rank, step, kind ORDER BY ts, e ROWS UNBOUNDED PRECEDING) AS grp
        FROM (SELECT *, CASE WHEN ts > max(e) OVER (PARTITION BY rank, step, kind ORDER BY ts, e
                                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                             THEN 1 ELSE 0 END AS brk FROM k))
    GROUP BY rank, step, kind, grp),
comm AS (SELECT rank, step, sum(e - ts) AS comm FROM m WHERE kind = 'communication' GROUP BY rank, step),
hid AS (SELECT a.rank, a.step, sum(least(a.e, b.e) - greatest(a.ts, b.ts)) AS hidden
        FROM m a JOIN m b ON a.rank = b.rank AND a.step = b.step AND a.kind = 'computation'
             AND b.kind = 'communication' AND a.ts < b.e AND b.ts < a.e GROUP BY a.rank, a.step),
r AS (SELECT s.step, s.rank, s.dur, coalesce(c.comm, 0) - coalesce(h.hidden, 0) AS exposed
      FROM trace_steps s LEFT JOIN comm c USING (rank, step) LEFT JOIN hid h USING (rank, step)
      WHERE s.job = $job  -- steps that launched kernels (the last, cut short by the profiler, did not count)
        AND EXISTS (SELECT 1 FROM trace_kernels t WHERE t.job = $job AND t.rank = s.rank AND t.step = s.step))
SELECT step, count(*) AS ranks, arg_max(rank, dur) AS slowest_rank, round(max(dur) / 1e3, 3) AS slowest_ms,
       round(median(dur) / 1e3, 3) AS median_ms, round(avg(exposed) / 1e3, 3) AS exposed_comm_ms,
       round(100 * avg(exposed / nullif(dur, 0)), 2) AS exposed_comm_pct
FROM r GROUP BY step ORDER BY step"""


def breakdown(con: duckdb.DuckDBPyConnection, job: str) -> dict[str, Any]:
    """Per rank HTA's temporal breakdown and overlap; per step the exposed communication and
    the slowest rank. AnalyticsError when the job has no imported trace."""
    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'trace_ranks'").fetchall()[0][0] \
            or not con.execute(
            "SELECT count(*) FROM trace_ranks WHERE job = ?", [job]).fetchall()[0][0]:
        raise AnalyticsError(f"job {job!r} has no imported trace (analyze import trace PATH... --job {job})")
    cur = con.execute(RANK_SQL, {"job": job})
    ranks = [dict(zip([d[0] for d in cur.description], r, strict=True)) for r in cur.fetchall()]
    cur = con.execute(STEP_SQL, {"job": job})
    steps = [dict(zip([d[0] for d in cur.description], r, strict=True)) for r in cur.fetchall()]
    return {"job": job, "ranks": ranks, "steps": steps,
            "note": "HTA's definitions: time from a rank's first kernel to its last; idle with no kernel running; "
                    "non-compute: kernels running, none computation; overlap: share of communication time with "
                    "computation running"}



KINDS = ("computation", "communication", "memory", "other")
MAX_KERNELS = 5_000_000  # kernels of one rank sent to a collector (about 60 bytes each as JSON)


def payload(t: RankTrace) -> dict[str, Any]:
    """One reduced rank as the import resource takes it: columns as JSON lists."""
    k, s = t.kernels.to_pydict(), t.steps.to_pydict()
    return {"rank": t.rank, "world_size": t.world_size, "source": t.source, "sha256": t.sha256,
            "kernels": {c: k[c] for c in ("step", "ts", "dur", "kind", "stream")},
            "steps": {c: s[c] for c in ("step", "ts", "dur")}}


def from_payload(d: dict[str, Any]) -> RankTrace:
    """A rank sent to the import resource, checked (columns of one length, whole numbers in
    range, known kinds): AnalyticsError (one line) for the first fault."""
    import pyarrow as pa

    def column(part: str, name: str, n: int | None) -> list[Any]:
        v = (d.get(part) or {}).get(name)
        if not isinstance(v, list) or (n is not None and len(v) != n):
            raise AnalyticsError(f"import trace: {part}.{name} must be a list of {n if n is not None else 'the'} values")
        return v

    def ints(vals: list[Any], what: str, lo: int, nullable: bool = False) -> list[Any]:
        for x in vals:
            if x is None and nullable:
                continue
            if type(x) is not int or not lo <= x < 1 << 62:
                raise AnalyticsError(f"import trace: {what} holds {one_line(repr(x), 24)}, not a whole number "
                                     f"from {lo:,}")
        return vals

    ts = column("kernels", "ts", None)
    n = len(ts)
    if n > MAX_KERNELS:
        raise AnalyticsError(f"import trace: {n:,} kernels in one rank: at most {MAX_KERNELS:,}")
    kind = column("kernels", "kind", n)
    bad = next((x for x in kind if x not in KINDS), None)
    if bad is not None or any(x is None for x in kind):
        raise AnalyticsError(f"import trace: kind {one_line(repr(bad), 24)} is not one of {', '.join(KINDS)}")
    kernels = pa.table({
        "step": pa.array(ints(column("kernels", "step", n), "kernels.step", -(1 << 31), True), pa.int32()),
        "ts": pa.array(ints(ts, "kernels.ts", -(1 << 62)), pa.int64()),
        "dur": pa.array(ints(column("kernels", "dur", n), "kernels.dur", 0), pa.int64()),
        "kind": pa.array(kind, pa.string()),
        "stream": pa.array(ints(column("kernels", "stream", n), "kernels.stream", -(1 << 62)), pa.int64())})
    sts = column("steps", "ts", None)
    m = len(sts)
    if m > 1_000_000:
        raise AnalyticsError(f"import trace: {m:,} profiler steps in one rank: at most 1,000,000")
    steps = pa.table({
        "step": pa.array(ints(column("steps", "step", m), "steps.step", -(1 << 31)), pa.int32()),
        "ts": pa.array(ints(sts, "steps.ts", -(1 << 62)), pa.int64()),
        "dur": pa.array(ints(column("steps", "dur", m), "steps.dur", 0), pa.int64())})
    rank, world = d.get("rank"), d.get("world_size")
    if type(rank) is not int or not 0 <= rank < 1 << 20:
        raise AnalyticsError(f"import trace: rank {one_line(repr(rank), 20)} is not a rank")
    if world is not None and (type(world) is not int or not rank < world <= 1 << 20):
        raise AnalyticsError(f"import trace: world_size {one_line(repr(world), 20)} does not hold rank {rank}")
    sha, source = d.get("sha256"), d.get("source")
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise AnalyticsError("import trace: sha256 must be the file's SHA-256 in hex")
    if not isinstance(source, str) or not 0 < len(source) <= 512:
        raise AnalyticsError("import trace: source must name the file (1 to 512 characters)")
    return RankTrace(source, sha, rank, world, kernels, steps)
