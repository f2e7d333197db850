"""The one place that writes ``dead_letters``: what was refused, where it came from (origin
and line; line 0 is the whole message), the reason (``cmdare.wire.validation.RULES``), and
the raw bytes (capped at ``RAW_CAP``; ``raw_bytes`` is the original size).

A message delivered again (Kafka after a crash before the offset commit, a spool re-read)
refuses the same lines at the same origin: those are not written twice.
"""

from __future__ import annotations

from typing import Any

import duckdb

RAW_CAP = 64 << 10  # bytes of a rejected message kept in dead_letters.raw

# the raw line comes from the input (_batch), which is joined only for the rejected rows (a
# column block's row has no line: its ``raw`` is the row re-made as text)
_FROM_ROWS_SQL = f"""
INSERT INTO dead_letters
SELECT ?::TIMESTAMP, s.origin, s.line_no, s.reason, encode(left(coalesce(s.raw, b.line), {RAW_CAP})), s.n
FROM (SELECT * FROM {{src}} WHERE reason IS NOT NULL) s
LEFT JOIN _batch b ON b.origin = s.origin AND b.line_no = s.line_no
WHERE NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.origin = s.origin AND d.line = s.line_no)
"""


def from_rows(con: duckdb.DuckDBPyConnection, src: str, now: Any) -> int:
    """Dead-letter the rows of ``src`` (a table or view of checked rows: origin, line_no, n,
    reason, raw) that have a reason; how many were written."""
    return con.execute(_FROM_ROWS_SQL.format(src=src), [now]).fetchall()[0][0]


def from_messages(con: duckdb.DuckDBPyConnection, dead: list[tuple[str, int, str, bytes, int]], now: Any) -> int:
    """Dead-letter what Python refused before SQL saw it: ``(origin, line, reason, raw,
    size)`` (a message that is not UTF-8, an unreadable column block, no value)."""
    written = 0
    for origin, line, reason, raw, size in dead:
        if con.execute(
            "SELECT count(*) FROM dead_letters WHERE origin = ? AND line = ?", [origin, line]
        ).fetchall()[0][0]:
            continue  # a redelivered message
        con.execute("INSERT INTO dead_letters VALUES (?, ?, ?, ?, ?, ?)", [now, origin, line, reason, raw, size])
        written += 1
    return written
