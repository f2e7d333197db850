"""How ``analyze`` prints the library's results: aligned tables and JSON."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click

from .. import api
from ..output import as_json, table

# columns shown by default whenever any row holds something in them (the job of the pod or
# Slurm job holding a GPU: empty on a fleet no scheduler runs)
ALARMS = ("clock_skew_s", "skewed_events", "held_by")


def rows(t: api.Table, as_json_: bool, columns: str | None = None, default: tuple[str, ...] | None = None,
         wide: bool = False) -> None:
    """A table as text or JSON. ``columns`` (A,B,...): those, in that order; else text shows
    ``default`` (the columns that fit 120 characters; a time bucket first) unless ``wide``,
    and says which it left out; JSON has them all."""
    cols = list(t.columns)
    if columns:
        want = [c.strip() for c in columns.split(",") if c.strip()]
        unknown = [c for c in want if c not in cols]
        if unknown or not want:
            raise click.BadParameter(f"unknown column {unknown[0]!r} (columns: {', '.join(cols)})"[:400] if unknown
                                     else "name at least one column", param_hint="--columns")
        cols = want
    elif default and not wide and not as_json_:
        # a default column, or one that matters whenever it holds anything (a clock skew)
        shown = {c for c in ALARMS if c in cols and any(r[cols.index(c)] not in (None, 0, "") for r in t.rows)}
        picked = [c for c in cols if c == "bucket" or c in default or c in shown]
        order = sorted(picked, key=lambda c: (c != "bucket", default.index(c) if c in default else len(default)))
        keep = set(_fit(t, order, skip=True))  # by the default's priority, shown in the table's order
        cols = [c for c in picked if c in keep]
    elif not wide and not as_json_:
        cols = _fit(t, cols)  # the columns that fit WIDTH, from the left
    idx = [t.columns.index(c) for c in cols]
    data = [tuple(r[i] for i in idx) for r in t.rows]
    if as_json_:
        click.echo(as_json(cols, data))
    elif not data:
        click.echo("(no rows)")
    else:
        click.echo(table(cols, data, None if (wide or columns) else WIDTH))
        hidden = [c for c in t.columns if c not in cols]
        if hidden and not columns:
            how = "--wide, or --columns" if default else "--json has them all"
            click.echo(fold(f"({len(hidden)} more columns: {', '.join(hidden)}: {how})"), err=True)
    for n in t.notes:  # what the rows leave out, or how they are judged (stderr: JSON stays whole)
        click.echo(fold(f"note: {n}"), err=True)


WIDTH = 120  # characters: the widest line a default text output prints


def fold(text: str, indent: str = "") -> str:
    """``text`` folded at WIDTH (continuation lines indented two more than ``indent``)."""
    import textwrap

    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False)


def _fit(t: api.Table, cols: list[str], skip: bool = False) -> list[str]:
    """The leading columns whose aligned text fits WIDTH (at least the first); ``skip``: one
    that does not fit is passed over for narrower ones after it."""
    from ..output import _cell

    kept: list[Any] = []
    used = -2
    for c in cols:
        i = t.columns.index(c)
        w = max([len(c)] + [len(_cell(r[i])) for r in t.rows])
        if kept and used + 2 + w > WIDTH:
            if skip:
                continue  # a narrower one further down may fit
            break
        kept.append(c)
        used += 2 + w
    return kept


def sql(r: Any, as_json_: bool, max_rows: int) -> None:
    rows(api.Table(r.columns, r.rows), as_json_)
    if r.truncated and r.cut_by == "bytes":
        click.echo(f"note: the result is larger than the byte limit: showing the first {len(r.rows):,} rows "
                   "(add LIMIT or select fewer columns)", err=True)
    elif r.truncated:
        click.echo(f"note: more than {max_rows:,} rows: showing the first {max_rows:,} (--max-rows; or add LIMIT)", err=True)


def bottlenecks(out: api.Bottlenecks, as_json_: bool, db: str) -> None:
    for line in out.skipped:
        click.echo(f"note: {line}", err=True)
    if as_json_:
        click.echo(json.dumps([f.to_json() for f in out.findings], indent=1))
    elif not out.findings:
        click.echo(f"no findings ({len(out.ran)} detector{'s' if len(out.ran) != 1 else ''} ran: {', '.join(out.ran) or 'none'})")
    else:
        def when(t: dt.datetime | None) -> str:
            return "" if t is None else t.strftime("%m-%d %H:%M")

        cols = ["severity", "kind", "job", "node", "rank", "conf", "from", "to"]
        shown = [
            (f.severity, f.kind, f.job or "", f.node or "", "" if f.rank is None else f.rank, f"{f.confidence:.2f}",
             when(f.window_start), when(f.window_end))
            for f in out.findings
        ]
        lines = table(cols, shown, WIDTH).split("\n")
        click.echo("\n".join(lines[:2]))
        for line, f in zip(lines[2:], out.findings, strict=True):  # each finding, its summary under it
            click.echo(line)
            click.echo(fold(f.summary, "    "))
        ok = [n for n in out.next if n.ok]
        if ok:  # each was run on this database: it answers
            click.echo("\nwhat to do about them:")
            width = max(len(n.command) for n in ok)
            for n in ok:
                click.echo(fold(f"{n.command:<{width}}  # {n.answer}", "  "))
        for n in out.next:
            if not n.ok:
                click.echo(fold(f"note: not suggested: {n.command}: {n.reason}"), err=True)
    if out.stored is not None:
        click.echo(f"stored {out.stored} finding{'s' if out.stored != 1 else ''} in {db} (table findings)", err=True)
    elif out.not_stored == "no-store":
        click.echo("not stored (--no-store)", err=True)
    else:
        click.echo(f"{db} is read-only: findings computed, not stored", err=True)


def alerts(a: api.Alerts, as_json_: bool) -> None:
    if as_json_:
        out = [dict(zip(a.columns, r, strict=True)) | {"labels": json.loads(r[4])} for r in a.rows]
        rules = [dict(zip(["rule", "health", "last_error", "last_eval", "eval_seconds", "instances"], h, strict=True))
                 for h in a.health]
        click.echo(json.dumps({"alerts": out, "rules": rules}, default=str))
        return
    if not a.health:
        click.echo("(no rules evaluated yet: start the collector with --rules FILE...)")
        return
    shown = [(r[0], r[1], r[2], r[3], ",".join(f"{k}={v}" for k, v in sorted(json.loads(r[4]).items())
                                              if k != "alertname"), r[5] or r[6] or "") for r in a.rows]
    click.echo(table(["rule", "state", "since", "value", "labels", "summary"], shown, WIDTH) if shown else "(no active alerts)")
    bad = [h for h in a.health if h[1] != "ok"]
    click.echo(f"\n{len(a.health)} rules, {len(a.health) - len(bad)} healthy")
    for h in bad:
        click.echo(f"  {h[0]}: {h[1]}{': ' + h[2] if h[2] else ''}")


def fit(f: api.FitResult, as_json_: bool) -> None:
    from ..models.store import clean

    out, kind = f.summary, f.kind

    def echo(text: str) -> None:  # a line folded at WIDTH, its indent kept
        click.echo(fold(text.lstrip(" "), " " * (len(text) - len(text.lstrip(" ")))))

    if as_json_:
        click.echo(json.dumps(clean(out), indent=1))
        return
    mape = "n/a" if out["cv_mape"] is None else f"{out['cv_mape'] * 100:.1f}%"
    r2 = "n/a" if out["cv_r2"] is None else f"{out['cv_r2']:.3f}"
    echo(f"fit {out['fit_id']}: {kind} ({out['family']}) from {out['rows']} rows, {out['groups']} groups")
    echo(f"held-out error (leave one group out): MAPE {mape}, R^2 {r2}")
    fams = f.cv.get("families")
    if fams:
        echo(
            "families tried (held-out MAPE): "
            + ", ".join(f"{k} {v['cv_mape'] * 100:.1f}%" for k, v in sorted(fams.items(), key=lambda x: x[1]["cv_mape"]))
        )
    if f.cv.get("law_choice"):  # the cluster fit: which law, why, and the nested error of that choice
        ch, nested = f.cv["law_choice"], f.cv.get("nested") or {}
        tried = ", ".join(f"{law} {v['mape'] * 100:.1f}%" for law, v in ch["compared"].items() if v["mape"] is not None)
        echo(f"law: {f.cv['law']} ({ch['why']}); multi-worker runs held out by architecture: {tried or 'none'}")
        if nested.get("mape") is not None:
            per = ", ".join(f"{a} {v['mape'] * 100:.1f}% ({v['law']})" for a, v in nested["by_architecture"].items())
            echo(f"nested held-out error (the law chosen inside each fold, on the others only): "
                       f"MAPE {nested['mape'] * 100:.1f}% [{per}]")
    if f.cv.get("worst"):
        echo("predicted worst (held out): " + ", ".join(f"{w['group']} {w['ape'] * 100:.1f}%" for w in f.cv["worst"]))
    if f.cv.get("in_range"):
        parts = [f"{what} {'n/a' if p['mape'] is None else format(p['mape'] * 100, '.1f') + '%'} ({p['rows']} rows)"
                 for what, p in (("inside the fitted ranges", f.cv["in_range"]),
                                 ("extrapolated", f.cv["extrapolated"]))]
        echo("held-out MAPE " + ", ".join(parts) + " (predictions past the ranges say so)")
    for k, v in out["coefficients"].items():
        echo(f"  {k} = {v:.6g}")
    if kind == "overhead":
        for k in ("resume_after_revocation_seconds", "resume_after_restart_seconds"):
            if k in f.model:
                m = f.model[k]
                echo(f"  {k}: mean {m['mean']:.1f}{_ci(m)}, n={m['n']}")
        for part, what in (("checkpoint_save", "checkpoint save"), ("vm_startup", "VM start-up (cloud phases)")):
            if part in f.model:
                m = f.model[part]
                fam = ", ".join(f"{k} {v * 100:.1f}%" for k, v in m["cv"]["families"].items())
                echo(f"  {what}: {m['family']}, held-out MAPE {m['cv']['mape'] * 100:.1f}% over "
                           f"{m['cv']['rows']} records ({m['cv']['imported']} imported, {m['cv']['live']} live); "
                           f"families tried: {fam}")
        for g, m in f.model.get("vm_startup_seconds", {}).items():
            echo(f"  vm start-up {g}: mean {m['mean']:.1f}s{_ci(m)}, n={m['n']} "
                       f"({m.get('covers', 'kernel boot to agent ready')})")
    if kind == "lifetime":
        cv = f.cv
        if "brier" in cv:
            echo(
                f"held-out (5 folds by VM) Brier score of P(revoked within {cv['horizon_hours']:.2f} h): "
                f"{cv['brier']:.4f} (one pooled curve: {cv['brier_pooled']:.4f})"
            )
        for g, c in f.model["curves"].items():
            med = "not reached" if c["median_hours"] is None else f"{c['median_hours']:.2f} h"
            echo(f"  {g}: {c['n']} lives, {c['events']} revoked, median lifetime {med}")
    for n in out["notes"][:20]:
        echo(f"  note: {n}")


def _ci(m: dict[str, Any]) -> str:
    """' (95% lo..hi)', or nothing where there is no interval (one sample)."""
    lo, hi = m.get("lower"), m.get("upper")
    if lo is None or hi is None or lo != lo or hi != hi:
        return " (one sample: no interval)" if m.get("n") == 1 else ""
    return f" (95% {lo:.1f}..{hi:.1f})"


def prediction(out: dict[str, Any], as_json_: bool, unit: str) -> None:
    if as_json_:
        from ..models.store import clean

        click.echo(json.dumps(clean(out)))
        return
    if out.get("interval") is None:
        said = out.get("no_interval") or "a rough guide, no 95% interval"
        click.echo(f"{out['prediction']:.4g} {unit} ({said}; fit {out['fit_id']})")
        if out.get("rough"):
            click.echo(fold("why: " + out["rough"], "  "))
    else:
        lo, hi = out["interval"]
        widened = f", widened {out['interval_widened']:g}x in log space" if out.get("interval_widened") else ""
        click.echo(f"{out['prediction']:.4g} {unit} (95% interval {lo:.4g} .. {hi:.4g}{widened}; fit {out['fit_id']})")
    if out.get("extrapolated"):
        click.echo(fold("extrapolates: " + "; ".join(out.get("extrapolation") or []), "  "))
    elif out.get("extrapolated") is None and out.get("extrapolation"):
        click.echo(fold("note: " + "; ".join(out["extrapolation"]), "  "))
    for k, v in out.items():
        if k in ("predicted", "prediction", "interval", "fit_id", "extrapolated", "extrapolation", "interval_widened",
                 "rough", "no_interval"):
            continue
        if isinstance(v, dict):
            v = ", ".join(f"{a} {b:.4g}" if isinstance(b, float) else f"{a} {b}" for a, b in v.items()) or "-"
        elif isinstance(v, list) and not v:
            continue
        click.echo(f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}")


def recommendation(rec: Any, as_json_: bool) -> None:
    if as_json_:
        from ..models.store import clean

        click.echo(json.dumps(clean({"kind": rec.kind.replace("_", "-"), **{k: v for k, v in rec.to_json().items() if k != "kind"}})))
        return
    act = ", ".join(
        f"{k} " + (", ".join(f"{n} x {t}" for t, n in v.items()) if isinstance(v, dict) else str(v))
        for k, v in rec.action.items()
    )
    click.echo(fold(f"{rec.kind.replace('_', '-')}: {act}"))
    click.echo(fold(f"why: {rec.why}", "  "))
    for k, v in rec.predicted.items():
        iv = rec.interval.get(k)
        shown = iv and f"{iv[0]:.4g}" != f"{iv[1]:.4g}"  # a zero-width interval says nothing
        click.echo(f"  predicted {k}: {v:.4g}" + (f" (interval {iv[0]:.4g} .. {iv[1]:.4g})" if shown else ""))
    for k, v in rec.cost.items():
        click.echo(f"  cost {k}: {v}")
    if rec.assumptions.get("extrapolated"):
        click.echo(fold(f"extrapolates: {rec.assumptions.get('extrapolated_because') or 'outside what was measured or fitted'}", "  "))
    if rec.fit_ids:
        click.echo(f"  fits: {', '.join(rec.fit_ids)}")
    click.echo(fold("assumptions: " + ", ".join(f"{k}={v}" for k, v in rec.assumptions.items() if v is not None), "  "))
