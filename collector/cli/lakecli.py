"""cmdare-collector's lake commands (collector/lake.py): ``maintain`` and ``to-lake``
(collector/cli/__init__.py adds them; the --lake mode of ``kafka`` and ``spool`` runs in root.py)."""

from __future__ import annotations

import click

from cmdare.wire.units import ConfigError

from ..lake import Lake, LakeError, lake_io
from .config import LAKE_HELP, duration_or_off


@click.command()
@click.option("--lake", envvar="CMDARE_LAKE", metavar="URI", required=True, help=LAKE_HELP)
@click.option("--catalog", envvar="CMDARE_LAKE_CATALOG", metavar="URL", help="the lake's SQL catalog (as for kafka)")
@click.option("--retain-raw", default="7d", show_default=True,
              help="delete raw GPU / host / TPU samples older than this (whole days, once rolled up); off: keep all")
@click.option("--retain-rollups", default="400d", show_default=True,
              help="delete rollup rows this much older than their newest day (whole days); off: keep all")
@click.option("--compact-files", default=8, show_default=True, type=click.IntRange(2, 100_000),
              help="rewrite a day partition held in more files than this as one file per partition")
@click.option("--expire-snapshots", default="1d", show_default=True,
              help="drop snapshots older than this (time travel back that far), then their unreferenced files; off: keep")
@click.option("--findings", "findings_window", default="off", show_default=True, metavar="DURATION|off",
              help="run every detector over every job of the last DURATION (e.g. 1d) and store the findings "
                   "(in lake mode no collector keeps them current); on Spark, a task per detector")
@click.option("--engine", type=click.Choice(["duckdb", "spark"]), default="duckdb", show_default=True,
              help="spark: compaction, rollups and snapshot expiry run on Apache Spark (pyspark; under spark-submit "
                   "its session, else a local one with scripts/sparkjars' jars)")
@click.option("--spark-master", envvar="CMDARE_SPARK_MASTER", metavar="URL",
              help="the Spark master for --engine spark outside spark-submit [default: local[*]]")
def maintain(lake: str, catalog: str | None, retain_raw: str, retain_rollups: str, compact_files: int,
             expire_snapshots: str, findings_window: str, engine: str, spark_master: str | None) -> None:
    """Lake maintenance: compaction of small files, the 1- and 5-minute rollups of every
    day that changed, goodput by the hour, the fleet's findings (--findings), retention of
    raw samples (a day once rolled up) and of rollups, snapshot expiry.  Safe while collectors write (a step that loses to a collector's commit is
    left for the next run); run it hourly or daily (a systemd timer, cron), or use the
    Spark procedures on big lakes (docs/scale.md).

    \b
    Example:
      cmdare-collector maintain --lake /srv/cmdare-lake --retain-raw 7d
      cmdare-collector maintain --lake /srv/cmdare-lake --engine spark --spark-master spark://head:7077
    """
    from ..lakemaint import maintain as run

    dur = duration_or_off

    try:
        rr, ex = dur("--retain-raw", retain_raw), dur("--expire-snapshots", expire_snapshots)
        ru = dur("--retain-rollups", retain_rollups)
        fw = dur("--findings", findings_window, 60)
        if spark_master is not None and engine != "spark":
            raise ConfigError("--spark-master: only with --engine spark")
        if spark_master is not None and (not spark_master.strip() or len(spark_master) > 256
                                         or any(ord(c) < 32 for c in spark_master)):
            raise ConfigError("--spark-master: a Spark master URL (local[N], spark://host:port, yarn, k8s://...), "
                              "at most 256 characters, one line")
        lk = Lake(lake, catalog, create=False)
        from .root import lake_findings, lake_goodput

        if engine == "spark":
            from .. import lakespark

            spark = lakespark.session(lk, spark_master)
            rep = lakespark.maintain(lk, spark, rr, compact_files, ex, retain_rollups=ru, derive=lake_goodput(spark),
                                     findings=lake_findings(fw, spark) if fw is not None else None)
        else:
            rep = run(lk, rr, compact_files, ex, retain_rollups=ru, derive=lake_goodput(),
                      findings=lake_findings(fw) if fw is not None else None)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    except LakeError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"{lake}: {lake_io(e)}") from None
    for line in rep.lines():
        click.echo(line)



@click.command("to-lake")
@click.option("--db", envvar="CMDARE_DB", default="cmdare.duckdb", show_default=True,
              help="the DuckDB database file to copy (read-only)")
@click.option("--lake", envvar="CMDARE_LAKE", metavar="URI", required=True, help=LAKE_HELP)
@click.option("--catalog", envvar="CMDARE_LAKE_CATALOG", metavar="URL", help="the lake's SQL catalog (as for kafka)")
def to_lake(db: str, lake: str, catalog: str | None) -> None:
    """Copy a database file into a lake: every event table, the nodes, and the findings,
    fits, alerts and imported records (which replace the lake's).  Events the lake already
    holds are not stored twice, so it can be run again, or on several files of one fleet.

    \b
    Example:
      cmdare-collector to-lake --db fleet.duckdb --lake /srv/cmdare-lake
    """
    from ..db import DatabaseError, connect
    from ..lake import load_database

    try:
        con = connect(db, read_only=True)
    except DatabaseError as e:
        raise click.ClickException(str(e)) from None
    try:
        lk = Lake(lake, catalog)
        lk.ensure()
        stored, replaced = load_database(lk, con, db, progress=lambda t: click.echo(f"to-lake: {t}", err=True))
    except LakeError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"{lake}: {lake_io(e)}") from None
    finally:
        con.close()
    events = sum(n for t, n in stored.items() if t != "nodes")
    click.echo(f"{db} -> lake {lk.name}: {events:,} new event rows stored"
               + (f"; {', '.join(f'{t} ({n:,} rows)' for t, n in replaced.items())} replaced" if replaced else ""))
