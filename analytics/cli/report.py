"""``analyze report --html FILE``: the pages as one self-contained file."""

from __future__ import annotations

import click

from .common import cli, cutoff, db_option, json_object_option, since_option


@cli.command()
@click.option("--html", "html_path", required=True, metavar="FILE", help="write the report here (replaced whole)")
@click.option("--job", help="only this job's page (default: the jobs with findings, then the most recent, at most 50)")
@since_option
@db_option
@json_object_option
def report(html_path: str, job: str | None, since: str | None, db: str, as_json_: bool) -> None:
    """The fleet, jobs, each job, findings and alerts as one HTML file: the pages of the
    collector (/ui) with their data inlined, openable offline, for a postmortem or a CI
    artefact. The data are the collector API's answers: through the collector that holds
    --db, else read from the file.

    \b
    Example:
      analyze report --html fleet.html --since 24h
      analyze report --html sim-ps-5.html --job sim-ps-5
    """
    from cmdare.analytics.cli.client import Local, backend
    from cmdare.analytics.db import AnalyticsError
    from cmdare.dashboards import report as rep

    ctx = click.get_current_context()
    obj = ctx.find_root().obj or {}
    try:
        if obj.get("lake"):
            from cmdare.analytics.lakedb import LakeDatabase

            b = Local(db)
            b.db = LakeDatabase(obj["lake"], obj.get("catalog"))
        else:
            b = backend(db, obj.get("server"))
        if isinstance(b, Local):
            if not b.db.exists():
                raise AnalyticsError(f"{db}: no such database (cmdare-collector writes it)")
            get = rep.local_get(b.db)
        else:
            def get(route, params):
                return b.request("GET", route, params)
        import contextlib

        # a file's hundreds of reads on one connection (opening it was half of each call)
        with b.db.held() if isinstance(b, Local) else contextlib.nullcontext():
            data = rep.gather(get, job, cutoff(since), lambda what: click.echo(f"report: {what}", err=True))
        if job and "error" in data.get("/api/v1/jobs/" + job, {}):
            raise AnalyticsError(data["/api/v1/jobs/" + job]["error"])
        n = rep.write(html_path, rep.render(data))
    except AnalyticsError as e:
        raise click.ClickException(str(e)) from None
    if as_json_:  # what was written, for a CI step to check
        import json

        click.echo(json.dumps({"html": html_path, "bytes": n, "jobs": list(data["$report"]["jobs"])}))
        return
    click.echo(f"wrote {html_path} ({n / 1e6:.1f} MB, {len(data['$report']['jobs'])} job pages): "
               f"open it in a browser, no network needed")
