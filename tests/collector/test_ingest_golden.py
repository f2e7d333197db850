"""The database a collector writes is the same for the same input, table by table: a
mixed JSON / row form / column-block input with malformed lines and a redelivery
(tests/fixtures/ingest_golden/messages.jsonl) loaded into a fresh database, every table
compared with expected.json, which the collector of an earlier release wrote.

To accept a deliberate change: CMDARE_UPDATE_GOLDEN=1 pytest this file, and read the diff."""

from __future__ import annotations

import base64
import json
import math
import os
from pathlib import Path

from cmdare.collector.db import connect
from cmdare.collector.ingest import storage
from cmdare.collector.writer import Writer

HERE = Path(__file__).parent.parent / "fixtures" / "ingest_golden"
# columns that hold the time of loading, not anything from the input
VOLATILE = {("dead_letters", "received_at"), ("schema_migrations", "applied_at"),
            ("ingest_positions", "updated_at"), ("model_fits", "fitted_at")}


def _value(v):
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else str(v)
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, list | tuple):
        return [_value(x) for x in v]
    if isinstance(v, dict):
        return {k: _value(x) for k, x in v.items()}
    if v is None or isinstance(v, bool | int | str):
        return v
    return str(v)


def dump(con) -> dict[str, list]:
    out = {}
    # what queries read: GPU samples through their view (every field by name), whatever the
    # stored layout (collector/ingest/storage.py)
    tables = [storage.logical(r[0]) for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND NOT temporary ORDER BY table_name").fetchall()]
    for t in tables:
        cols = [r[0] for r in con.execute(f"DESCRIBE {t}").fetchall()]
        keep = [c for c in cols if (t, c) not in VOLATILE]
        sel = ", ".join(f'"{c}"' for c in keep)
        rows = con.execute(f"SELECT {sel} FROM {t}").fetchall()
        out[t] = {"columns": keep, "rows": sorted(
            json.dumps(_value(list(r)), sort_keys=True) for r in rows)}
    return out


def test_the_database_written_for_a_mixed_input_is_unchanged(tmp_path: Path) -> None:
    msgs = [json.loads(x) for x in (HERE / "messages.jsonl").read_text().splitlines()]
    msgs = [(m["origin"], base64.b64decode(m["raw"])) for m in msgs]
    con = connect(tmp_path / "g.duckdb")
    w = Writer(con)
    w.write(msgs[:3], position=("spool:golden", 1, 123))
    w.write(msgs[3:], position=("spool:golden", 2, 45))
    got = dump(con)
    con.close()
    path = HERE / "expected.json"
    if os.environ.get("CMDARE_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert sorted(got) == sorted(want)
    for t in want:
        assert got[t]["columns"] == want[t]["columns"], t
        assert got[t]["rows"] == want[t]["rows"], t
