"""``analyze bottlenecks`` and ``analyze alerts [check|test]``: findings and alerts."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from ..db import AnalyticsError
from . import render
from .common import call, cli, cutoff, db_option, json_object_option, json_option, since_option, where


def _detector_names() -> list[str]:
    from ..detectors import DETECTORS

    return list(DETECTORS)


def _listed(f):  # type: ignore[no-untyped-def]
    """``f``'s help with the detectors filled in, in their order: what each finds and its
    name (from the units: adding one adds it here)."""
    from ..detectors import DETECTORS

    units = [DETECTORS.get(n) for n in DETECTORS]
    finds = [u.FINDS or u.name for u in units]
    f.__doc__ = f.__doc__.format(finds=", ".join(finds[:-1]) + " and " + finds[-1] if len(finds) > 1 else finds[0],
                                 names=", ".join(u.name for u in units))
    return f


@cli.command()
@_listed
@click.option("--job", help="only this job (default: every job)")
@since_option
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(_detector_names()),
    help="only this detector (repeatable; default: all)",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="CMDARE_ANALYZE_CONFIG",
    help="TOML file of detector thresholds, [detectors.<name>] tables ($CMDARE_ANALYZE_CONFIG)",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="DETECTOR.OPTION=VALUE",
    help="override one threshold for this run (repeatable), e.g. ps_bound.min_efficiency=0.7",
)
@click.option("--no-store", is_flag=True, help="compute only: do not write the findings table")
@db_option
@json_option
def bottlenecks(
    job: str | None,
    since: str | None,
    kinds: tuple[str, ...],
    config_path: str | None,
    sets: tuple[str, ...],
    no_store: bool,
    db: str,
    as_json_: bool,
) -> None:
    """What is wrong with which job, how sure, and the numbers: {finds} (the detectors
    {names}; --kind picks some). Sorted by severity (critical, warning, info), then
    confidence.

    Findings are stored in the findings table (replacing those of the same detectors and
    scope: running it again stores nothing twice); a read-only database is analysed
    without storing, and says so. A detector without the data it needs says what it
    needed, once, on stderr; the others still run. Thresholds: docs/detectors.md.

    \b
    Examples:
      analyze bottlenecks
      analyze bottlenecks --job resnet50-a --since 6h --json
      analyze bottlenecks --kind ps_bound --set ps_bound.min_efficiency=0.7
      analyze bottlenecks --config thresholds.toml
    """
    from .. import api, findings

    try:
        config = findings.load_config(config_path) if config_path else {}
        options = api.detector_options(config, list(sets))
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    out = call(db, api.bottlenecks, job=job, since=cutoff(since), kinds=list(kinds), options=options, store=not no_store)
    render.bottlenecks(out, as_json_, where(db))
@cli.group(name="alerts", invoke_without_command=True)
@click.option("--rule", "rule_filter", help="only this rule (group/alert or alert name)")
@db_option
@json_option
@click.pass_context
def alerts_(ctx: click.Context, rule_filter: str | None, db: str, as_json_: bool) -> None:
    """Active alerts (pending, firing, inhibited, recently resolved) with their state, since,
    value and labels, and each rule's health, as the collector's rule evaluation last saved
    them (cmdare-collector --rules FILE...).

    \b
    Examples:
      analyze alerts
      analyze alerts --json
      analyze alerts check rules/*.yml
    """
    if ctx.invoked_subcommand:
        return
    render.alerts(call(db, api.alerts, rule=rule_filter), as_json_)


@alerts_.command(name="check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@db_option
@json_object_option
def alerts_check(files: tuple[str, ...], db: str, as_json_: bool) -> None:
    """Validate rule FILES: YAML shape, durations, labels, templates, and each rule's SQL
    against the database's tables (--db; without one, an empty database of the current
    schema). Exit 1 with one line naming the file, group, rule and problem.

    \b
    Examples:
      analyze alerts check my-rules.yml --db fleet.duckdb
      analyze alerts check default          # the shipped pack
    """
    from .. import alerting as alerts

    tests = [f for f in files if f.endswith((".test.yml", ".test.yaml"))]
    for f in tests:  # rules/*.yml takes in the unit test files beside the rules
        click.echo(render.fold(f"note: skipped {f}: a rule unit test file (run it with analyze alerts test)"), err=True)
    files = tuple(f for f in files if f not in tests)
    if not files:
        raise click.ClickException("alerts check: only rule unit test files given: name rule files")
    try:
        texts = alerts.read_files(files)
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    if Path(db).exists():
        r = call(db, api.check_rules, files=texts)
    else:  # no database: an empty one of the current schema
        try:
            r = api.check_rules(None, texts)
        except AnalyticsError as e:
            raise click.ClickException(str(e)) from None
    if as_json_:
        import json

        click.echo(json.dumps({"ok": True, "files": list(files), "groups": r.groups, "rules": r.rules,
                               "skipped": tests}))
        return
    click.echo(f"{len(files)} file(s), {r.groups} group(s), {r.rules} rule(s): ok")


@alerts_.command(name="test")
@click.argument("file", type=click.Path(dir_okay=False))
@json_object_option
def alerts_test(file: str, as_json_: bool) -> None:
    """Run the unit tests of FILE against the rules it names, as `promtool test rules`
    does: each test loads its input rows into an empty database (times as offsets: 0s, 90s,
    5m), evaluates the rules every evaluation_interval, and compares the firing alerts at each
    eval_time with exp_alerts. Exit 1 when a test fails. Format: docs/alerts.md.

    \b
    Example:
      analyze alerts test rules/gpu.test.yml
    """
    from .. import alerting as alerts

    try:
        results = alerts.run_tests(file, api.empty_db)
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    failed = sum(bool(r.failures) for r in results)
    if as_json_:
        import json

        click.echo(json.dumps({"tests": [{"name": r.name, "ok": not r.failures, "failures": list(r.failures)}
                                         for r in results], "failed": failed}))
    else:
        for r in results:
            click.echo(f"{'ok  ' if not r.failures else 'FAIL'} {r.name}")
            for f in r.failures:
                click.echo(f"     {f}")
        click.echo(f"{len(results)} test(s), {failed} failed")
    if failed:
        raise SystemExit(1)
