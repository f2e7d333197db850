"""The one place that upserts ``nodes``: each node's role, job and labels, first and last
seen, from the envelopes of a batch's valid events."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa

from cmdare.wire import columns
from cmdare.wire.registry import HELD_JOB_TYPES, TRAIN_PREFIX

# First and last seen count only events inside the batch's clock window (a node whose clock
# is years off would otherwise never look silent): a node seen only through skewed events
# has none (clock_skew lists them).
# A node's role, job and labels are those of its latest event, and only a batch with events
# as new as the node's latest stored one replaces them (a spool of older events loaded later
# leaves them alone).  The job is the agent's (its config): train_* events carry the
# training job's id in their envelope, and a GPU sample its pod's or Slurm job's where a
# scheduler holds the GPU (HELD_JOB_TYPES), so they never set it.
_UPSERT_SQL = """
INSERT INTO nodes
SELECT node, arg_max(role, ts), arg_max(job, ts) FILTER (WHERE agent), arg_max(labels, ts)::JSON,
    min(ts) FILTER (WHERE {in_window}), max(ts) FILTER (WHERE {in_window})
FROM ({src}) GROUP BY node
ON CONFLICT (node) DO UPDATE SET
    role = CASE WHEN excluded.last_seen >= nodes.last_seen THEN excluded.role ELSE nodes.role END,
    job = CASE WHEN excluded.job IS NOT NULL AND excluded.last_seen >= nodes.last_seen
               THEN excluded.job ELSE nodes.job END,
    labels = CASE WHEN excluded.last_seen >= nodes.last_seen THEN excluded.labels ELSE nodes.labels END,
    first_seen = least(nodes.first_seen, excluded.first_seen),
    last_seen = greatest(nodes.last_seen, excluded.last_seen)
"""
# the checked envelopes of the batch (JSON lines, row lines, checked blocks)
_HELD = ", ".join(f"'{t}'" for t in HELD_JOB_TYPES)
FROM_EVENTS = (
    f"SELECT node, role, job, labels, ts, NOT starts_with(type, '{TRAIN_PREFIX}') AND type NOT IN ({_HELD}) AS agent "
    "FROM _ev WHERE reason IS NULL"
)
# a fast-path block's envelope, once at its first and once at its last ts (``_bn``)
FROM_FAST_BLOCKS = """SELECT b.node, b.role, b.job, _lab.labels::JSON AS labels,
    make_timestamp(TRY_CAST(round(b.ts * 1e6) AS BIGINT)) AS ts, b.agent
    FROM _bn b JOIN _lab ON _lab.lraw = b.lraw"""


def upsert(con: duckdb.DuckDBPyConnection, sources: list[str], window: tuple[Any, Any] | None = None) -> None:
    """Upsert the nodes seen in ``sources`` (``FROM_EVENTS``, ``FROM_FAST_BLOCKS``); first
    and last seen from the events with ts in ``window`` (all when None)."""
    if sources:
        cond = "true" if window is None else "ts BETWEEN $1 AND $2"
        con.execute(_UPSERT_SQL.format(src=" UNION ALL ".join(sources), in_window=cond), list(window or ()))


_BN = pa.schema(
    [
        ("node", pa.string()),
        ("role", pa.string()),
        ("job", pa.string()),
        ("lraw", pa.string()),
        ("ts", pa.float64()),
        ("agent", pa.bool_()),
    ]
)


def block_envelopes(blocks: list[columns.Block]) -> pa.Table:
    """Each block's envelope at its first and its last ts (``_bn``, for ``FROM_FAST_BLOCKS``)."""
    cols: list[list[Any]] = [[], [], [], [], [], []]
    for b in blocks:
        ts = b.arrays["ts"].to_numpy()
        agent = not b.type.startswith(TRAIN_PREFIX) and b.type not in HELD_JOB_TYPES
        for t in (float(ts.min()), float(ts.max())):
            for c, v in zip(cols, (b.node, b.role, b.job, b.labels, t, agent), strict=True):
                c.append(v)
    return pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(cols, _BN, strict=True)], schema=_BN)
