"""The cluster fit's knee against the measured knee on CM-DARE's shared half (issue 51):
per (model, accelerator, PS count) series measured at 3 or more worker counts, the knee
rule (Cachew's, 7 %) over the measured speeds and over the fit's predictions at the same
counts, from the series' measured single-worker time. Prints each series and how many are
within one worker; the target is every one.

    .venv/bin/python bench/cluster_knees.py [--data ../shared/data/cmdare]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

from cmdare.analytics import models
from cmdare.analytics.cli import cli
from cmdare.analytics.models.cluster import predict_cluster
from cmdare.analytics.recommend.cluster import knee


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "cmdare"))
    a = ap.parse_args()
    data = Path(a.data)
    db = Path(tempfile.mkdtemp()) / "real.duckdb"
    for r in csv.DictReader(open(data / "jobs.csv")):
        args = ["import", "tensorboard", str(data / r["file"]), "--db", str(db), "--job", r["job"],
                "--gpu-type", r["gpu_type"], "--workers", r["workers"], "--ps", r["ps"], "--model", r["model"],
                "--flops-per-step", r["flops_per_step"], "--params", r["params"], "--tensors", r["tensors"],
                "--batch-size", r["batch_size"]]
        res = CliRunner().invoke(cli, args)
        if res.exit_code:
            sys.exit(res.output)
    import duckdb

    con = duckdb.connect(str(db))
    jobs, _ = models.job_speeds(con)
    models.save(con, models.fit_speed(jobs))
    models.save(con, models.fit_cluster(jobs, models.latest(con, "speed")))
    cf = models.latest(con, "cluster")
    singles = {(j.model, j.accelerator): 1 / j.speed for j in jobs if j.workers == 1}
    series: dict[tuple, dict[int, list[float]]] = {}
    params: dict[str, float] = {}
    for j in jobs:
        if j.ps >= 1:
            series.setdefault((j.model, j.accelerator, j.ps), {}).setdefault(j.workers, []).append(j.speed)
            params[j.model] = j.params
    ok = total = 0
    print(f"{'model':<22} {'acc':<5} {'ps':>2}  {'measured knee':>14}  {'fit knee':>9}  {'fit plateau/meas max':>20}")
    for (m, acc, p), ws in sorted(series.items()):
        if len(ws) < 3 or (m, acc) not in singles:
            continue
        meas = {w: statistics.median(v) for w, v in ws.items()}
        t1 = singles[(m, acc)]
        pred = {w: predict_cluster(cf, [t1] * w, p, params[m])["steps_per_second"] for w in sorted(meas)}
        km, kf = knee(meas, 0.07)[0], knee(pred, 0.07)[0]
        total += 1
        ok += abs(km - kf) <= 1
        print(f"{m:<22} {acc:<5} {p:>2}  {km:>14}  {kf:>9}  {max(pred.values()) / max(meas.values()):>20.2f}")
    print(f"within one worker: {ok} of {total} series (cluster fit {cf['fit_id']}, held-out MAPE {cf.get('cv_mape')})")


if __name__ == "__main__":
    main()
