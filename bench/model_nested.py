"""Nested leave-one-architecture-out errors on CM-DARE's real measurements (issue 65).

    python bench/model_nested.py [--data DIR]

The data: ``../shared/data/cmdare`` (or ``$CMDARE_REAL_DATA``, or ``--data``), imported
with ``analyze import tensorboard`` as a user would. For each architecture in turn,
everything the fits choose by looking at data (the speed fit's family, the cluster fit's
law) is chosen on the other architectures only (``fit_speed`` and ``fit_cluster`` make
those choices on what they are given), and the held-out architecture is predicted:

- speed: each of its single-GPU runs, from its declaration (target 6 %);
- cluster from a measured run: each 2-8 worker run, from the series' own 1-worker run
  (target 10 %);
- cluster from the declaration: the same runs, the single-worker time from the speed fit
  (target 13 %).

Prints each architecture's errors, the mean over runs, and the law each fold chose.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import ROOT

TARGETS = {"speed": 0.06, "cluster from a measured run": 0.10, "cluster from the declaration": 0.13}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("CMDARE_REAL_DATA") or
                                                          ROOT.parent / "shared" / "data" / "cmdare"))
    a = ap.parse_args()
    os.environ["CMDARE_REAL_DATA"] = str(a.data)
    sys.path.insert(0, str(ROOT))
    import duckdb

    from cmdare.analytics import models
    from tests.analytics.conftest import _import_real

    if not (a.data / "jobs.csv").is_file():
        raise SystemExit(f"no CM-DARE measurements at {a.data} (give --data or $CMDARE_REAL_DATA)")
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "real.duckdb"
        _import_real(db)
        con = duckdb.connect(str(db), read_only=True)
        jobs, _ = models.job_speeds(con)
        con.close()
    errs: dict[str, dict[str, list[float]]] = {k: {} for k in TARGETS}
    laws: dict[str, str] = {}
    for arch in sorted({j.model for j in jobs}):
        train = [j for j in jobs if j.model != arch]
        sp = models.fit_speed(train)
        speed_fit = {"model": sp.model, "family": sp.family}
        for j in jobs:
            if j.model == arch and j.workers == 1:
                p = models.predict_speed(speed_fit, j.acc, j.flops_per_step, j.params, j.tensors)[0]
                errs["speed"].setdefault(arch, []).append(abs(p - j.speed) / j.speed)
        series: dict[tuple[str, int], dict[int, models.JobSpeed]] = {}
        for j in jobs:
            if j.model == arch and j.job.startswith("cmdare-cluster_size"):
                series.setdefault((j.accelerator, j.ps), {})[j.workers] = j
        if not any(len(r) > 1 for r in series.values()):
            continue
        cf = models.fit_cluster(train, None)
        laws[arch] = cf.cv["law"]
        cl = {"model": cf.model}
        for (_, ps), runs in series.items():
            one = runs[1]
            for key, t1 in (("cluster from a measured run", 1 / one.speed),
                            ("cluster from the declaration", 1 / models.predict_speed(
                                speed_fit, one.acc, one.flops_per_step, one.params, one.tensors)[0])):
                for w, j in runs.items():
                    if w >= 2:
                        r = models.predict_cluster(cl, [t1] * w, ps, j.params)
                        errs[key].setdefault(arch, []).append(abs(r["steps_per_second"] - j.speed) / j.speed)
    print(f"CM-DARE's shared half ({a.data}): {len(jobs)} runs; every choice made inside each fold")
    for what, by in errs.items():
        allv = [e for v in by.values() for e in v]
        print(f"\n{what}: nested MAPE {np.mean(allv) * 100:.1f}% over {len(allv)} runs "
              f"(target {TARGETS[what] * 100:.0f}%{': met' if np.mean(allv) <= TARGETS[what] else ': NOT met'})")
        for arch, v in sorted(by.items(), key=lambda x: -np.mean(x[1])):
            law = f"  law chosen without it: {laws[arch]}" if what != "speed" and arch in laws else ""
            print(f"  {arch:24s} {np.mean(v) * 100:5.1f}%  max {max(v) * 100:5.1f}%  ({len(v)} runs){law}")


if __name__ == "__main__":
    main()
