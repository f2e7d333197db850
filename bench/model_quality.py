"""Model-quality report on a simulated fleet with known ground truth.

    python bench/model_quality.py [--out bench/out/models] [--seed 0]

The fleet simulator (tests/fakes/fleet.py) writes what real runs send: 15 CNN-like
architectures on K80, P100, V100 and T4 (single worker), parameter-server clusters of 2-8
workers with 1-2 PS on K80 and V100 (the PS saturates), checkpoint timings, and spot VM
lives in three (region, accelerator) groups with exponential lifetimes and owner stops;
step telemetry carries noise, ramp-up, stragglers and a partial tail.  Everything goes
through the collector's writer into a DuckDB file, then each model is fitted as
``analyze fit`` does.  Prints a table (held-out error, recovered vs true parameters) and
writes PNG plots: held-out predicted vs measured step time, cluster speed against workers,
Kaplan-Meier curves against the true survival.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
from common import ROOT

from cmdare.analytics import catalog, models
from cmdare.collector.db import connect
from cmdare.collector.writer import Writer
from cmdare.wire.events import encode_many
from tests.fakes.fleet import MODELS, Fleet, Truth


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "models"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    truth = Truth()
    f = Fleet(truth, seed=a.seed)
    for m in MODELS:
        for acc in ("k80", "p100", "v100", "t4"):
            f.job(m, acc, checkpoints=2)
        for acc in ("k80", "v100"):
            for w, p in ((2, 1), (4, 1), (6, 1), (8, 1), (4, 2), (8, 2)):
                f.job(m, acc, workers=w, ps=p, intervals=15)
    f.vm_lives(per_group=80)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        con = connect(Path(tmp) / "fleet.duckdb")
        Writer(con).write([("sim", encode_many(f.events))])
        jobs, skipped = models.job_speeds(con)
        sp = models.fit_speed(jobs)
        models.save(con, sp)
        cl = models.fit_cluster(jobs, models.latest(con, "speed"))
        ov = models.fit_overhead(con)
        lt = models.fit_lifetime(con)
        con.close()
    took = time.perf_counter() - t0
    print(
        f"simulated {len(f.events):,} events, {len(jobs)} jobs ({len(skipped)} left out); loaded and fitted in {took:.1f}s"
    )
    print()
    print(f"{'model':10s} {'family':14s} {'rows':>5s} {'groups':>6s} {'held-out MAPE':>14s} {'R^2':>7s}")
    for fit in (sp, cl, ov):
        print(
            f"{fit.kind:10s} {fit.family:14s} {fit.rows:5d} {fit.groups:6d} {fit.cv['mape'] * 100:13.2f}% {fit.cv['r2']:7.4f}"
        )
    print(f"{'lifetime':10s} {lt.family:14s} {lt.rows:5d} {lt.groups:6d} {'(survival)':>14s}")
    print(
        "  speed families tried (held-out MAPE): "
        + ", ".join(f"{k} {v['cv_mape'] * 100:.1f}%" for k, v in sp.cv["families"].items())
    )
    print()
    print("recovered vs true")
    c = sp.model["coefficients"]
    for k, tv in (("compute_s", truth.a), ("weights_s", truth.b), ("tensors", truth.c), ("const", truth.d)):
        print(f"  speed   {k:28s} {c[k]:10.4g}  true {tv:10.4g}")
    c = cl.model["coefficients"]
    for k, tv in (("t1_s", 1.0), ("weights_gb", truth.e), ("weights_gb_x_workers_per_ps", truth.f)):
        print(f"  cluster {k:28s} {c[k]:10.4g}  true {tv:10.4g}")
    c = ov.model["coefficients"]
    for k, tv in (
        ("save_seconds_per_gb", truth.save_per_gb),
        ("save_fixed_seconds", truth.save_fixed),
        ("restore_seconds_per_gb", truth.restore_per_gb),
        ("restore_fixed_seconds", truth.restore_fixed),
    ):
        print(f"  ckpt    {k:28s} {c[k]:10.4g}  true {tv:10.4g}")
    hz = truth.hazard_per_hour
    for k, v in lt.model["coefficients"].items():
        print(f"  life    {k:28s} {v:10.4g}")
    print(
        f"  (true hazard ratios: v100/k80 {hz[('us-central1', 'v100')] / hz[('us-central1', 'k80')]:.3g}, "
        f"us-central1/europe-west4 {hz[('us-central1', 'v100')] / hz[('europe-west4', 'v100')]:.3g})"
    )
    for (region, acc), rate in hz.items():
        key = f"{region}/{catalog.load()[acc].name}"
        for h in (2, 8):
            p = models.predict_revocation({"fit_id": "bench", "model": lt.model}, region, acc, h)
            print(
                f"  P(revoked within {h} h) {key:22s} {p['probability']:.3f} "
                f"[{p['lower']:.3f}, {p['upper']:.3f}]  true {1 - math.exp(-rate * h):.3f}"
            )
    plots(out, truth, jobs, sp, cl, lt)
    print(f"\nplots: {', '.join(sorted(p.name for p in out.glob('*.png')))} in {out}")


def plots(out: Path, truth: Truth, jobs: list, sp, cl, lt) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    single = [j for j in jobs if j.workers == 1]
    meas = np.array([1 / j.speed for j in single])
    pred = np.array(sp.cv["predictions"])
    fig, ax = plt.subplots(figsize=(5, 5))
    for acc in sorted({j.accelerator for j in single}):
        m = np.array([j.accelerator == acc for j in single])
        ax.scatter(meas[m] * 1e3, pred[m] * 1e3, s=12, label=acc)
    lim = [min(meas.min(), pred.min()) * 1e3 * 0.8, max(meas.max(), pred.max()) * 1e3 * 1.2]
    ax.plot(lim, lim, "k--", lw=0.8)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="measured step time (ms)",
        ylabel="held-out prediction (ms)",
        title=f"speed: leave-one-architecture-out MAPE {sp.cv['mape'] * 100:.1f}%",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "speed_heldout.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("resnet50", "vgg16"):
        for acc, ps in (("v100", 1), ("v100", 2)):
            pts = sorted(
                (j.workers, j.speed) for j in jobs if j.model == name and j.accelerator == acc and j.ps == ps
            )
            if not pts:
                continue
            t1 = next(
                1 / j.speed for j in jobs if j.model == name and j.accelerator == acc and j.workers == 1
            )
            params = next(j.params for j in jobs if j.model == name)
            ws = np.arange(1, 17)
            curve = [models.predict_cluster({"model": cl.model}, [t1] * int(w), ps, params)["steps_per_second"] for w in ws]
            line = ax.plot(ws, curve, lw=1, label=f"{name} {acc} {ps} PS (fit)")[0]
            ax.scatter(*zip(*pts, strict=False), color=line.get_color(), s=14)
    ax.set(xlabel="workers", ylabel="cluster steps/s", title="cluster speed: measured (dots) and fitted")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "cluster_scaling.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, c in lt.model["curves"].items():
        region, acc = key.split("/")
        rate = next(
            v for (r, a), v in truth.hazard_per_hour.items() if r == region and catalog.load()[a].name == acc
        )
        line = ax.step([0, *c["times"]], [1, *c["surv"]], where="post", label=f"{key} (KM)")[0]
        hs = np.linspace(0, max(c["times"]), 100)
        ax.plot(hs, np.exp(-rate * hs), "--", color=line.get_color(), lw=0.8)
    ax.set(
        xlabel="hours since boot",
        ylabel="P(not yet revoked)",
        title="spot lifetimes: Kaplan-Meier vs truth (dashed)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "lifetimes.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
