"""The accelerator catalogue: peak throughput, memory and bandwidth per device, from a CSV
data file users can extend (``analytics/data/accelerators.csv``, plus
``$CMDARE_ACCELERATORS``: a CSV in the same format whose rows add to or replace the
built-in ones by name).

Telemetry names accelerators many ways ("Tesla V100-SXM2-16GB", "nvidia-tesla-v100",
"v100"); ``lookup`` normalises a name (lower case, letters and digits only) and picks the
entry whose name or alias is the longest substring of it.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .db import AnalyticsError

ENV = "CMDARE_ACCELERATORS"
COLUMNS = (
    "name",
    "aliases",
    "fp32_tflops",
    "fp16_tflops",
    "tf32_tflops",
    "memory_gb",
    "memory_bandwidth_gbs",
)


@dataclass(frozen=True)
class Accelerator:
    name: str
    aliases: tuple[str, ...]
    fp32_tflops: float | None
    fp16_tflops: float | None
    tf32_tflops: float | None
    memory_gb: float | None
    memory_bandwidth_gbs: float | None

    @property
    def peak_flops(self) -> float:
        """FLOP/s the speed models divide by: FP32 where the device has it (the CNN
        measurements of the CM-DARE era are FP32), else the FP16/BF16 peak (TPUs)."""
        t = self.fp32_tflops or self.fp16_tflops
        assert t, self.name
        return t * 1e12

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s."""
        return (self.memory_bandwidth_gbs or 0.0) * 1e9


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def _num(r: dict[str, str], i: int, k: str, where: str) -> float | None:
    v = (r.get(k) or "").strip()
    if not v:
        return None
    try:
        x = float(v)
    except ValueError:
        raise AnalyticsError(f"{where}: row {i}: {k} must be a number, got {v!r}") from None
    if not x > 0:
        raise AnalyticsError(f"{where}: row {i}: {k} must be positive, got {v!r}")
    return x


def _read(text: str, where: str) -> dict[str, Accelerator]:
    rows = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    out: dict[str, Accelerator] = {}
    reader = csv.DictReader(rows)
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise AnalyticsError(f"{where}: header must be {','.join(COLUMNS)}")
    for i, r in enumerate(reader, start=2):
        name = (r.get("name") or "").strip()
        if not name:
            raise AnalyticsError(f"{where}: row {i}: empty name")
        acc = Accelerator(
            name,
            tuple(a.strip() for a in (r.get("aliases") or "").split("|") if a.strip()),
            *(_num(r, i, k, where) for k in COLUMNS[2:]),
        )
        if not (acc.fp32_tflops or acc.fp16_tflops):
            raise AnalyticsError(f"{where}: row {i}: {name} needs fp32_tflops or fp16_tflops")
        out[name] = acc
    return out


def load() -> dict[str, Accelerator]:
    cat = _read(
        resources.files("cmdare.analytics").joinpath("data/accelerators.csv").read_text(), "accelerators.csv"
    )
    extra = os.environ.get(ENV)
    if extra:
        p = Path(extra)
        try:
            text = p.read_text()
        except OSError as e:
            raise AnalyticsError(f"${ENV}: {p}: cannot read: {e.strerror}") from None
        cat.update(_read(text, str(p)))
    return cat


def lookup(name: str, cat: dict[str, Accelerator] | None = None) -> Accelerator:
    """The catalogue entry for a telemetry or user name; a one-line error naming what the
    catalogue has when nothing matches."""
    cat = cat if cat is not None else load()
    q = _norm(name)
    if q:
        for a in cat.values():
            if _norm(a.name) == q:
                return a
        best: tuple[int, Accelerator] | None = None
        for a in cat.values():
            for key in (a.name, *a.aliases):
                k = _norm(key)
                if k and k in q and (best is None or len(k) > best[0]):
                    best = (len(k), a)
        if best is not None:
            return best[1]
    raise AnalyticsError(
        f"unknown accelerator {name!r}: the catalogue has {', '.join(sorted(cat))} "
        f"(add yours with ${ENV}=extra.csv)"
    )
