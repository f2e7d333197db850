"""The price catalogue: $/hour per VM type, on-demand and spot, per cloud and region, from a
CSV data file users extend or replace (``analytics/data/prices.csv``, plus
``$CMDARE_PRICES``: a CSV in the same format whose rows add to or replace the built-in ones
by cloud, region and instance type; a file with the line ``# cmdare-prices: replace``
replaces the whole catalogue). Every row carries the date its figures were read
(``as_of``), which every cost printed from it names.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .db import AnalyticsError

ENV = "CMDARE_PRICES"
COLUMNS = ("cloud", "region", "instance_type", "accelerator", "accelerator_count", "on_demand", "spot", "as_of")
REPLACE = "# cmdare-prices: replace"


@dataclass(frozen=True)
class Price:
    cloud: str
    region: str
    instance_type: str
    accelerator: str
    accelerator_count: int
    on_demand: float | None  # $/hour; None: not recorded
    spot: float | None
    as_of: str


def _price(r: dict[str, str], i: int, k: str, where: str) -> float | None:
    v = (r.get(k) or "").strip()
    if not v:
        return None
    try:
        x = float(v)
    except ValueError:
        raise AnalyticsError(f"{where}: row {i}: {k} must be a number of $/hour, got {v!r}") from None
    if not x >= 0 or x != x or x == float("inf"):
        raise AnalyticsError(f"{where}: row {i}: {k} must be a price >= 0, got {v!r}")
    return x


def _read(text: str, where: str) -> dict[tuple[str, str, str], Price]:
    rows = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.DictReader(rows)
    if tuple(h.strip() for h in reader.fieldnames or ()) != COLUMNS:
        raise AnalyticsError(f"{where}: header must be {','.join(COLUMNS)}")
    out: dict[tuple[str, str, str], Price] = {}
    for i, r in enumerate(reader, start=2):
        cloud, region, itype = ((r.get(k) or "").strip() for k in COLUMNS[:3])
        if not (cloud and region and itype):
            raise AnalyticsError(f"{where}: row {i}: cloud, region and instance_type must not be empty")
        count_s = (r.get("accelerator_count") or "").strip() or "0"
        if not count_s.isdigit():
            raise AnalyticsError(f"{where}: row {i}: accelerator_count must be a whole number, got {count_s!r}")
        as_of = (r.get("as_of") or "").strip()
        if not re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", as_of):
            raise AnalyticsError(f"{where}: row {i}: as_of must be a date (YYYY-MM or YYYY-MM-DD), got {as_of!r}")
        p = Price(cloud, region, itype, (r.get("accelerator") or "").strip(), int(count_s),
                  _price(r, i, "on_demand", where), _price(r, i, "spot", where), as_of)
        if p.on_demand is None and p.spot is None:
            raise AnalyticsError(f"{where}: row {i}: {itype} has neither an on_demand nor a spot price")
        out[(cloud, region, itype)] = p
    return out


def load() -> dict[tuple[str, str, str], Price]:
    """(cloud, region, instance_type) -> Price: the shipped rows, then ``$CMDARE_PRICES``."""
    cat = _read(resources.files("cmdare.analytics").joinpath("data/prices.csv").read_text(), "prices.csv")
    extra = os.environ.get(ENV)
    if extra:
        p = Path(extra)
        try:
            text = p.read_text()
        except OSError as e:
            raise AnalyticsError(f"${ENV}: {p}: cannot read: {e.strerror}") from None
        mine = _read(text, str(p))
        if any(line.strip().lower() == REPLACE for line in text.splitlines()):
            return mine
        cat.update(mine)
    return cat


def lookup(instance_type: str, region: str | None = None,
           cat: dict[tuple[str, str, str], Price] | None = None) -> Price | None:
    """The row for an instance type (in ``region`` where given); None when the catalogue has
    none; a one-line error when the type is listed in several regions and none was named."""
    cat = cat if cat is not None else load()
    rows = [p for (c, r, t), p in cat.items() if t == instance_type and (region is None or r == region)]
    if not rows:
        return None
    if len(rows) > 1:
        regions = ", ".join(sorted(p.region for p in rows))
        raise AnalyticsError(f"{instance_type} has prices in several regions ({regions}): name the region")
    return rows[0]


def attached(instance_type: str, region: str | None, accelerator: str, count: int,
             cat: dict[tuple[str, str, str], Price] | None = None) -> Price | None:
    """A GCE VM with ``count`` GPUs attached, priced as GCE bills it: the VM's own row plus
    ``count`` times the GPU's price, the GPU's price read off a catalogue row of a VM with
    one such GPU (``X+1xACC``) less that VM's row (``X``) in the same region. None when
    either is missing; a spot price only where every part has one."""
    cat = cat if cat is not None else load()
    if count <= 0 or "+" in instance_type:
        return None
    vm = next((p for (c, r, t), p in cat.items() if t == instance_type and (region is None or r == region)
               and not p.accelerator_count), None)
    if vm is None:
        return None
    gpu_od = gpu_spot = None
    for (c, r, t), p in sorted(cat.items()):
        if r != vm.region or not t.endswith(f"+1x{accelerator}") or p.accelerator_count != 1:
            continue
        base = cat.get((c, r, t.split("+")[0]))
        if base is None:
            continue
        if p.on_demand is not None and base.on_demand is not None:
            gpu_od = p.on_demand - base.on_demand
        if p.spot is not None and base.spot is not None:
            gpu_spot = p.spot - base.spot
        break
    if gpu_od is None:
        return None

    def total(v: float | None, g: float | None) -> float | None:
        return None if v is None or g is None else round(v + count * g, 6)

    return Price(vm.cloud, vm.region, f"{instance_type}+{count}x{accelerator}", accelerator, count,
                 total(vm.on_demand, gpu_od), total(vm.spot, gpu_spot), vm.as_of)
