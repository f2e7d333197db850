"""How a type's fields are stored in DuckDB: most tables hold each field in a column of its
own name; GPU samples are stored in ``gpu_samples_packed`` with the GPU-depth fields (issue
38) packed into three columns, and read through the view ``gpu_samples``, which gives every
field its name back.  Queries read ``sm_active_ratio`` or ``mig_profile`` from
``gpu_samples`` as before; a GPU that sends none of them costs next to nothing to store.

Why: DuckDB pays per column per row on insert (NULL or not) and computes generated
columns on every insert; a view costs nothing there and unpacks only the columns a query
names (the measurements: docs/benchmarks.md, "Ingest", "With the GPU-depth fields").

- ``gpm`` (DOUBLE[]): the GPM metrics in the order of ``PACKED`` (NULL when the sample has
  none: a GPU before Hopper, profiling off).
- ``health`` (BIGINT[]): row remapping, retired pages and the NVLink error counter
  (booleans as 0 / 1), read by the rollups and detectors on every row: a list, not JSON
  text, so reading them parses nothing.
- ``mig`` (JSON): a MIG instance's identity (parent, profile, instance ids, share): only the
  fields the sample carries, by name (NULL on a whole GPU).

``energy_joules_total`` and ``nvlink`` (the per-link list, JSON already) stay columns of
their own (every GPU since Volta reports energy, different each tick; the link list is
long and read only where asked for).  Writes (the collector's inserts, retention's
deletes) go to the stored table; the lake (Iceberg) stores the view's rows, every field a
column of its own (Parquet stores an absent column for nearly nothing).  Migration 018
made the stored table; ``create_views`` makes the view (collector.db.migrate, on every
open for writing), so ``unpack_sql`` here is the one definition of how a field is read
back (tests/collector/test_storage.py).
"""

from __future__ import annotations

from collections.abc import Callable

from cmdare.wire.kinds import BOOL, FLOAT, INT, STR
from cmdare.wire.registry import DATA_FIELDS

# table -> packed column -> (its type: a typed list or a JSON object, fields in their order)
PACKED: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "gpu_samples": {
        "gpm": ("DOUBLE[]", (
            "gr_engine_active_ratio", "sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio",
            "fp16_active_ratio", "fp32_active_ratio", "fp64_active_ratio", "dram_active_ratio",
            "nvlink_total_rx_bytes_per_second", "nvlink_total_tx_bytes_per_second",
        )),
        "health": ("BIGINT[]", (  # booleans as 0 / 1
            "remapped_rows_correctable", "remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failed",
            "nvlink_errors_total", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending",
        )),
        "mig": ("JSON", (
            "parent_index", "mig_profile", "gpu_instance_id", "compute_instance_id", "mig_slice_ratio",
        )),
        # migration 024: the scheduler's holder of the GPU (Kubernetes pod, Slurm job)
        "sched": ("JSON", ("namespace", "pod", "container", "slurm_job", "slurm_user")),
    },
}

# logical table (a view where packed) -> the table rows are stored in
STORED = {"gpu_samples": "gpu_samples_packed"}
_TYPE_OF = {"gpu_samples": "gpu"}
_SQL_TYPE = {FLOAT: "DOUBLE", INT: "BIGINT", BOOL: "BOOLEAN"}


def packed_in(table: str) -> dict[str, str]:
    """field -> the packed column holding it, for ``table``."""
    return {f: col for col, (_, fields) in PACKED.get(table, {}).items() for f in fields}


def _kind(table: str, field: str) -> str:
    return DATA_FIELDS[_TYPE_OF[table]][field][0]


def unpack_sql(table: str, field: str) -> str:
    """The SQL reading a packed ``field`` back from the stored row, typed."""
    col = packed_in(table)[field]
    how, fields = PACKED[table][col]
    kind = _kind(table, field)
    if how != "JSON":
        item = f"{col}[{fields.index(field) + 1}]"
        return f"CAST({item} AS BOOLEAN)" if kind == BOOL else item
    if kind == STR:
        return f"json_extract_string({col}, '$.{field}')"
    return f"CAST(json_extract_string({col}, '$.{field}') AS {_SQL_TYPE[kind]})"


def insert_parts(table: str, fields: list[str], value: Callable[[str], str]) -> tuple[list[str], list[str]]:
    """(stored columns, SELECT expressions) that store ``fields`` of a row in ``table``,
    ``value(field)`` being the SQL of a field's checked value.  A packed column is named
    when some of its fields are given, built from them (the others NULL in it); a row with
    none of them stores NULL there."""
    where = packed_in(table)
    cols: list[str] = []
    exprs: list[str] = []
    given = set(fields)
    for f in fields:
        if f not in where:
            cols.append(f)
            exprs.append(value(f))
    for col, (how, packed) in PACKED.get(table, {}).items():
        have = [f for f in packed if f in given]
        if not have:
            continue
        cols.append(col)
        if how != "JSON":
            item = how[:-2]
            items = [(f"CAST({value(f)} AS {item})" if _kind(table, f) == BOOL else value(f)) if f in given
                     else f"NULL::{item}" for f in packed]
            # NULL, not a list of NULLs, where the sample has none (reads back the same, stores less)
            exprs.append(f"CASE WHEN {' OR '.join(f'{value(f)} IS NOT NULL' for f in have)} "
                         f"THEN [{', '.join(items)}]::{how} END")
        else:
            parts = ", ".join(f"""'"{f}":' || to_json({value(f)})""" for f in have)
            exprs.append(f"CAST(nullif('{{' || concat_ws(',', {parts}) || '}}', '{{}}') AS JSON)")
    return cols, exprs


def stored(table: str) -> str:
    """The table ``table``'s rows are written to and deleted from."""
    return STORED.get(table, table)


def logical(name: str) -> str:
    """The name queries read a stored table by (``gpu_samples_packed`` -> ``gpu_samples``)."""
    return _LOGICAL.get(name, name)


_LOGICAL = {v: k for k, v in STORED.items()}


def view_sql(table: str) -> str:
    """The SELECT of the view ``table`` over its stored table: the envelope, then every
    field by its name in the registry's order (the columns' order before the packing)."""
    where = packed_in(table)
    sel = ['"id"', '"ts"', '"node"', '"job"']
    sel += [f'{unpack_sql(table, f)} AS "{f}"' if f in where else f'"{f}"' for f in DATA_FIELDS[_TYPE_OF[table]]]
    return f"SELECT {', '.join(sel)} FROM {stored(table)}"


def create_views(con) -> None:
    """(Re-)create the view of each packed table (after the migrations: they hold tables only)."""
    for table in STORED:
        con.execute(f"CREATE OR REPLACE VIEW {table} AS {view_sql(table)}")


def insert_sql(con, table: str, names: list[str]) -> str:
    """The INSERT storing one row of columns ``names`` (``?`` parameters in that order) in
    ``table`` the way the collector stores it: for rows written directly (an alert rule
    test's rows, tools).  A packed table's fields are typed and packed as ``insert_parts``
    packs them; any other table is a plain INSERT."""
    if table not in STORED:
        return f"INSERT INTO {_q(table)} ({', '.join(map(_q, names))}) VALUES ({', '.join('?' * len(names))})"
    types = {r[0]: r[1] for r in con.execute(f"DESCRIBE {table}").fetchall()}
    fields = DATA_FIELDS[_TYPE_OF[table]]
    row = ", ".join(f"CAST(? AS {types[n]}) AS {_q(n)}" for n in names)
    env = [n for n in names if n not in fields]
    cols, exprs = insert_parts(table, [n for n in names if n in fields], lambda n: f"v.{_q(n)}")
    return (f"INSERT INTO {stored(table)} ({', '.join(map(_q, env + cols))}) "
            f"SELECT {', '.join([f'v.{_q(n)}' for n in env] + exprs)} FROM (SELECT {row}) v")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
