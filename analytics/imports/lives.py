"""``analyze import lives``: spot VM lives a team already has, as CSV, in either of two
shapes (columns by name, others ignored; docs/models.md, "Spot VM lives"):

- CM-DARE's measurements: ``accelerator``, ``region``, ``lifetime_s`` (seconds from start to
  end), ``ended_by``, optional ``vm``, ``purchase``;
- a cloud's instance logs: ``created`` and ``ended`` (ISO 8601 times) instead of
  ``lifetime_s``, optional ``zone`` (the region is read from it when ``region`` is not
  given), ``instance_type``, ``vm``.

``ended_by`` is ``preempted`` (a revocation), ``max_lifetime`` (the provider's cap, e.g.
GCE's 24 hours for preemptible VMs: not a revocation), ``deleted`` (by its owner) or
``running`` (still alive: ``ended`` may be empty and the life is censored at the file's
modification time). Only ``preempted`` is an event of the lifetime fit; every other life is
censored at its length. Rows go through the overhead importer's stream (analytics/
overheads.py): checked a line at a time, stored in one transaction, idempotent.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import duckdb

from ..db import EARLIEST, LATEST, AnalyticsError
from ..output import one_line

ENDED_BY = ("preempted", "max_lifetime", "deleted", "running")
MAX_LIFE = 400 * 86400.0  # seconds: no VM life here is longer
_ZONE = re.compile(r"^([a-z]+(?:-[a-z]+)*\d+)-[a-z0-9]{1,8}$")  # us-east1-b, europe-west4-a


def time_value(text: str, name: str, where: str) -> dt.datetime:
    """An ISO 8601 time as naive UTC (a time without a zone is read as UTC)."""
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise AnalyticsError(f"{where}: {name} {one_line(text, 32)!r} is not an ISO 8601 time") from None
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if not EARLIEST <= t < LATEST:
        raise AnalyticsError(f"{where}: {name} {one_line(text, 32)!r} is out of range (1970 to 2200)")
    return t


def region_of_zone(zone: str) -> str | None:
    m = _ZONE.match(zone)
    return m.group(1) if m else None


def finish(rec: dict[str, Any], where: str, as_of: dt.datetime | None) -> None:
    """A life's derived values (``lifetime_seconds``, the region from the zone, spot by
    default), or one line saying what is missing."""
    if rec["ended_by"] not in ENDED_BY:
        raise AnalyticsError(f"{where}: ended_by {one_line(str(rec['ended_by']), 24)!r} is not one of "
                             f"{', '.join(ENDED_BY)}")
    if rec.get("zone"):
        r = region_of_zone(rec["zone"])
        if r is None:
            raise AnalyticsError(f"{where}: zone {one_line(rec['zone'], 32)!r} is not a zone name (like us-east1-b)")
        if rec.get("region") and rec["region"] != r:
            raise AnalyticsError(f"{where}: zone {rec['zone']} is not in region {rec['region']}")
        rec["region"] = r
    if not rec.get("region"):
        raise AnalyticsError(f"{where}: region is empty (give region, or zone)")
    rec["purchase"] = rec.get("purchase") or "spot"
    if rec.get("lifetime_s") is not None:
        secs = float(rec["lifetime_s"])
    elif rec.get("created") is None:
        raise AnalyticsError(f"{where}: give lifetime_s, or created and ended")
    else:
        end = rec.get("ended")
        if end is None:
            if rec["ended_by"] != "running":
                raise AnalyticsError(f"{where}: ended is empty (only a running VM may leave it)")
            if as_of is None:
                raise AnalyticsError(f"{where}: ended is empty and the file's time is unknown")
            end = rec["as_of"] = as_of  # sent along through a collector
        secs = (end - rec["created"]).total_seconds()
        if secs <= 0:
            raise AnalyticsError(f"{where}: ended is not after created")
    if not 0 < secs <= MAX_LIFE:
        raise AnalyticsError(f"{where}: a life of {secs:g} s is out of range (above 0, at most 400 days)")
    rec["lifetime_seconds"] = secs


def latest(con: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    """The imported spot lives the lifetime fit reads, each VM once in its final state
    (a VM exported twice, running then preempted, is its preempted life; rows without a
    ``vm`` are each their own VM): (vm, region, accelerator, hours, revoked, first, last)."""
    from ..queries import needs_schema

    needs_schema(con, 21, "imported spot lives")
    return con.execute(
        """SELECT coalesce(vm, id), region, accelerator, lifetime_seconds / 3600.0, ended_by = 'preempted',
                  created, coalesce(ended, created + to_microseconds(CAST(lifetime_seconds * 1e6 AS BIGINT)))
           FROM spot_lives WHERE purchase = 'spot'
           QUALIFY row_number() OVER (PARTITION BY coalesce(vm, id), region, accelerator
                                      ORDER BY ended_by = 'running', lifetime_seconds DESC, id) = 1"""
    ).fetchall()
