"""A batch of messages read for one write: the Python side of ingest.

``Batch.add`` splits each message into lines (JSON or row form) or decodes its column
blocks into Arrow arrays over the message's bytes; what cannot be read at all (not UTF-8,
an unreadable block, no value) is kept for the dead letters.  This is Python work, so a
consumer does it on its own thread while the writer's thread runs the previous batch's SQL
(which releases the GIL).  The Arrow tables the SQL reads are made here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from cmdare.wire import columns
from cmdare.wire.registry import DATA_FIELDS, TABLES
from cmdare.wire.validation import reason

from .dead_letters import RAW_CAP

CHUNK = 16384  # lines per Arrow record batch handed to DuckDB


@dataclass
class WriteResult:
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows inserted
    duplicates: int = 0
    dead: int = 0
    lines: int = 0
    empty: int = 0  # messages with an empty value (nothing stored, nothing dead-lettered)
    not_utf8: int = 0
    skewed: int = 0  # of the rows inserted: stamped beyond the clock window (``clock_skew``)
    seconds: float = 0.0  # the write transaction's wall time (the collector's batch-time metric)

    @property
    def inserted(self) -> int:
        return sum(self.rows.values())


# warm_up's mutants change only when DuckDB's one-time Arrow costs are paid (cost):
_warm = False


def warm_up(con: duckdb.DuckDBPyConnection) -> None:
    """Pay DuckDB's one-time costs of reading Arrow data now, not inside the first batch.

    The first Arrow table a process hands to DuckDB makes it import pandas and
    pyarrow.compute (~0.4 s here): inside the first batch's transaction, and holding the
    GIL while the consumer is fetching the next one."""
    global _warm
    if _warm:
        return
    con.register("_warm_up", pa.table({"x": pa.array([1], pa.int64())}))
    try:
        con.execute("SELECT count(*) FROM _warm_up").fetchall()
    finally:
        con.unregister("_warm_up")
    _warm = True


class Batch:
    """Messages read for one ``Writer.write_batch``: split into lines, column blocks decoded
    into Arrow arrays over the message bytes.  Python work, so a consumer does it on its
    own thread, while the writer's thread runs the previous batch's SQL (which releases
    the GIL)."""

    def __init__(self) -> None:
        self.origins: list[str] = []
        self.line_nos: list[int] = []
        self.lines: list[str] = []
        self.py_dead: list[tuple[str, int, str, bytes, int]] = []
        self.has_rows = False
        self.blocks: dict[str, list[tuple[str, int, columns.Block]]] = {}
        self.block_labels: set[tuple[str, str]] = set()
        self.lean: dict[str, list[pa.RecordBatch]] = {}  # per type, for the fast path
        self.messages = 0
        self.bytes = 0  # message values read, the bound --batch-bytes sets
        self.empty = 0  # messages with an empty value
        self.not_utf8 = 0  # lines dead-lettered for bytes that are not UTF-8
        # Kafka: per topic/partition, the batch's first offset and the one after its last
        self.first: dict[str, int] = {}
        self.next: dict[str, int] = {}

    def __len__(self) -> int:
        return self.messages

    def add(self, origin: str, raw: bytes | None) -> None:
        self.messages += 1
        if raw is None:
            self.py_dead.append((origin, 0, reason("no_value"), b"", 0))
            return
        self.bytes += len(raw)
        if not raw:
            self.empty += 1  # counted, nothing to dead-letter
            return
        message_blocks: list[columns.Block] = []
        if columns.is_block(raw):
            try:
                text, message_blocks = columns.read_blocks(raw, KNOWN)
            except columns.BlockError as e:
                self.py_dead.append((origin, 0, reason("block", detail=str(e)), bytes(raw[:RAW_CAP]), len(raw)))
                return
        else:
            text = raw
        try:
            parts = text.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            parts = self._lines_one_by_one(origin, text)
        if parts[-1] == "":
            parts.pop()
        if not self.has_rows and (text[:1] == b"r" or b"\nr" in text):
            self.has_rows = True
        if parts:
            self.lines += parts
            self.origins += [origin] * len(parts)
            self.line_nos += range(1, len(parts) + 1)
        first = len(parts) + 1  # a block's rows are numbered after the message's lines
        for b in message_blocks:
            self.blocks.setdefault(b.type, []).append((origin, first, b))
            self.lean.setdefault(b.type, []).append(lean_batch(b))
            self.block_labels.add((b.type, b.labels))
            first += b.rows


    def _lines_one_by_one(self, origin: str, text: bytes) -> list[str]:
        """The lines of a message that is not UTF-8 throughout, decoded one by one: a line
        with bad bytes (a bad sector, a stray write) is dead-lettered on its own, with the
        offset of its first bad byte, and left empty here so that the lines after it keep
        their numbers; every other line loads."""
        parts = []
        for i, line in enumerate(text.split(b"\n"), 1):
            try:
                parts.append(line.decode("utf-8"))
            except UnicodeDecodeError as e:
                self.py_dead.append((origin, i, reason("utf8", got=e.start), bytes(line[:RAW_CAP]), len(line)))
                self.not_utf8 += 1
                parts.append("")
        return parts


_LINES = pa.schema([("origin", pa.string()), ("line_no", pa.int64()), ("line", pa.large_string())])
KNOWN = set(TABLES)  # the types this collector stores


def _block_schema(type_: str) -> pa.Schema:
    env = [("origin", pa.string()), ("line_no", pa.int64()), ("n", pa.int64()), ("id", pa.string())]
    env += [("ts", pa.float64()), ("node", pa.string()), ("role", pa.string()), ("job", pa.string())]
    env += [("labels", pa.string())]
    return pa.schema(env + [(n, columns.arrow_type(k)) for n, (k, _) in DATA_FIELDS[type_].items()])


_BLOCK_SCHEMAS = {t: _block_schema(t) for t in TABLES}


def block_batch(origin: str, first: int, b: columns.Block) -> pa.RecordBatch:
    """A block as rows of ``_cb_<type>``: its arrays as they are (over the message's bytes),
    the envelope repeated, fields it does not carry as NULL."""
    n = b.rows
    schema = _BLOCK_SCHEMAS[b.type]
    const = [pa.repeat(pa.scalar(v, pa.string()), n) for v in (b.node, b.role, b.job, b.labels)]
    arrays = [
        pa.repeat(pa.scalar(origin, pa.string()), n),
        pa.array(np.arange(first, first + n, dtype=np.int64)),
        pa.array(b.nbytes),
        b.arrays["id"],
        b.arrays["ts"],
        *const,
    ]
    arrays += [b.arrays[f.name] if f.name in b.arrays else pa.nulls(n, f.type) for f in list(schema)[9:]]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


LEAN_SCHEMAS = {
    t: pa.schema([s.field(n) for n in ("id", "ts", "node", "job")] + list(s)[9:])
    for t, s in _BLOCK_SCHEMAS.items()
}
def lean_batch(b: columns.Block) -> pa.RecordBatch:
    """A block's rows for the fast path: id, ts, node, job and the data fields (no origin,
    line, size: nothing is dead-lettered from it)."""
    schema = LEAN_SCHEMAS[b.type]
    n = b.rows
    arrays = [b.arrays["id"], b.arrays["ts"]]
    arrays += [pa.repeat(pa.scalar(v, pa.string()), n) for v in (b.node, b.job)]
    arrays += [b.arrays[f.name] if f.name in b.arrays else pa.nulls(n, f.type) for f in list(schema)[4:]]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def block_table(blocks: list[tuple[str, int, columns.Block]]) -> pa.Table:
    return pa.Table.from_batches([block_batch(origin, first, b) for origin, first, b in blocks])


def lines_table(origins: list[str], line_nos: list[int], lines: list[str]) -> pa.Table:
    """One row per line, in several record batches so that DuckDB parses them on all cores."""
    if not lines:
        return _LINES.empty_table()
    return pa.Table.from_batches(
        [
            pa.record_batch(
                [
                    pa.array(origins[i : i + CHUNK], pa.string()),
                    pa.array(line_nos[i : i + CHUNK], pa.int64()),
                    pa.array(lines[i : i + CHUNK], pa.large_string()),
                ],
                names=["origin", "line_no", "line"],
            )
            for i in range(0, len(lines), CHUNK)
        ]
    )


