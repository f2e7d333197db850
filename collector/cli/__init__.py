"""cmdare-collector command line: thin commands over the collector's root (collector/cli/root.py)
and its one typed config (collector/cli/config.py, where every flag of ``kafka`` and ``spool``
is declared once)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from cmdare.wire.kafka import client_logging
from cmdare.wire.units import ConfigError

from ..db import DatabaseError, connect
from . import config, lakecli, root

DB_HELP = "DuckDB database file (default: $CMDARE_DB, else ./cmdare.duckdb)"


def _open(db: str):
    try:
        return connect(db)
    except DatabaseError as e:
        raise click.ClickException(str(e)) from None


def _run(ctx: click.Context, command: str, target: str, config_file: str | None, params: dict[str, Any]) -> None:
    """Build the config from the flags (and --config), then one collector run; ConfigError
    is a usage error, CollectorError a failure, each one line."""
    given = {k for k in params if ctx.get_parameter_source(k) in (click.core.ParameterSource.COMMANDLINE,
                                                                    click.core.ParameterSource.ENVIRONMENT)}
    try:
        cfg = config.build(command, target, params, given, config_file)
        root.run(cfg, lambda line: click.echo(line, err=True))
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    except root.CollectorError as e:
        raise click.ClickException(str(e)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cmdare", prog_name="cmdare-collector")
def cli() -> None:
    """Load cmdare telemetry events into a DuckDB database file, or an Iceberg lake (--lake).

    \b
    Examples:
      cmdare-collector kafka kafka://10.0.0.5:9092/cmdare.events --db fleet.duckdb
      cmdare-collector spool /var/lib/cmdare/spool --db cmdare.duckdb
      cmdare-collector kafka kafka://10.0.0.5:9092/cmdare.events --lake /srv/cmdare-lake
      cmdare-collector maintain --lake /srv/cmdare-lake
    """
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    client_logging()


@cli.command()
@click.argument("url")
@config.click_options("kafka")
@click.pass_context
def kafka(ctx: click.Context, url: str, config_file: str | None, **params: Any) -> None:
    """Consume URL (kafka://host:port[,host:port]/topic) as a consumer group into --db.

    Offsets are committed only after the rows are committed in DuckDB; events delivered
    twice are stored once; bad messages go to the dead_letters table.  Brokers with
    SASL and TLS: --sasl-username and --sasl-password-file (or $CMDARE_KAFKA_PASSWORD),
    --ssl-cafile, and a client certificate where the brokers require one.  Every flag can
    also be given in a --config file (docs/collector.md).

    \b
    Examples:
      cmdare-collector kafka kafka://127.0.0.1:9092/cmdare.events --db fleet.duckdb
      cmdare-collector kafka kafka://b1:9093/cmdare.events --sasl-username collector --sasl-password-file /etc/cmdare/kafka.pw --ssl-cafile /etc/cmdare/kafka-ca.pem
      cmdare-collector kafka kafka://b1:9092/cmdare.events --lake /srv/cmdare-lake   # several hosts: --catalog postgresql://...
      cmdare-collector kafka kafka://b1:9092/cmdare.events --config /etc/cmdare/collector.toml

    With --lake, each member of the group writes the same Iceberg tables; the lake
    records the offsets each commit covers, and a member given partitions starts where
    the lake has everything: every record is stored once (docs/scale.md).
    """
    _run(ctx, "kafka", url, config_file, params)


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@config.click_options("spool")
@click.pass_context
def spool(ctx: click.Context, directory: Path, config_file: str | None, **params: Any) -> None:
    """Load an agent's spool DIRECTORY (the embedded default: no Kafka) into --db.

    The position reached is stored in the database, so running it again loads only what
    is new.

    \b
    Example:
      cmdare-collector spool /var/lib/cmdare/spool --db cmdare.duckdb
      cmdare-collector spool /var/lib/cmdare/spool --follow --db cmdare.duckdb   # with the API, for analyze
    """
    _run(ctx, "spool", str(directory), config_file, params)


@cli.command()
@click.option("--db", envvar="CMDARE_DB", default="cmdare.duckdb", show_default=True, help=DB_HELP)
def migrate(db: str) -> None:
    """Create --db or bring its schema up to date, and list the applied migrations."""
    con = _open(db)
    for v, name, at in con.execute(
        "SELECT version, name, applied_at FROM schema_migrations ORDER BY 1"
    ).fetchall():
        click.echo(f"{v:03d} {name:<24} {at:%Y-%m-%d %H:%M:%S}")
    con.close()


@cli.command("token-hash")
@click.option("--name", default="token", show_default=True, help="the token's name (what logs and errors say)")
@click.option("--scope", type=click.Choice(["read", "admin"]), default="read", show_default=True,
              help="read: every GET, SQL and rule checks; admin: writes too (fits, imports, stored findings)")
def token_hash(name: str, scope: str) -> None:
    """Read a token from stdin and print its [[token]] table for --http-token-file (its
    SHA-256, never the token; docs/service.md).

    Example:
      openssl rand -hex 24 | tee ops.token | cmdare-collector token-hash --name ops --scope admin >> tokens.toml
    """
    import sys

    from cmdare.analytics.server.tokens import _NAME, digest

    if not _NAME.match(name):
        raise click.BadParameter("1 to 64 of A-Z a-z 0-9 _ . @ -", param_hint="--name")
    secret = sys.stdin.read(4097).strip()
    if not secret or len(secret) > 4096 or any(ord(c) < 32 for c in secret):
        raise click.UsageError("give the token on stdin: one line of 1 to 4,096 printable characters")
    click.echo(f'[[token]]\nname = "{name}"\nscope = "{scope}"\nsha256 = "{digest(secret)}"\n')


@cli.command("serve")
@click.option("--lake", envvar="CMDARE_LAKE", metavar="URI", required=True,
              help="the lake to serve: its directory, or an object-store URI with --catalog ($CMDARE_LAKE)")
@click.option("--catalog", envvar="CMDARE_LAKE_CATALOG", metavar="URL", help=config.BY_KEY["catalog"].option.help)
@click.option("--http", envvar="CMDARE_HTTP", default="127.0.0.1:8765", show_default=True, metavar="ADDR:PORT",
              help="where to serve the API and the pages (port 0: any free port, said on stderr)")
@click.option("--http-token-file", help=config.BY_KEY["http_token_file"].option.help)
@click.option("--http-tls-cert", help=config.BY_KEY["http_tls_cert"].option.help)
@click.option("--http-tls-key", help=config.BY_KEY["http_tls_key"].option.help)
@click.option("--ui-url", envvar="CMDARE_UI_URL", metavar="URL", help=config.BY_KEY["ui_url"].option.help)
@click.option("--session-ttl", default="12h", show_default=True, help=config.BY_KEY["session_ttl"].option.help)
@click.option("--refresh", default="2s", show_default=True,
              help="how often to read what the ingest collectors committed (data is visible --commit-every "
                   "plus this late)")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path),
              help="where to keep what was read (a DuckDB file, kept across restarts: a restart reads only what the "
                   "lake changed since; default: a private temporary directory, removed at exit)")
@click.option("--sql-workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="worker processes that run user SQL (POST /api/v1/sql, analyze sql), each capped at "
                   "$CMDARE_SQL_WORKER_MEMORY of address space (default 2GiB), a CPU-time and a wall deadline")
@click.option("--notices", metavar="URL", envvar="CMDARE_NOTICES",
              help="kafka://host:port/topic: the ruler reads revocation notices and lifecycle events from the "
                   "agents' topic itself, ahead of the lake's commits (alerts within seconds); with --rules")
@click.option("--notices-group", default="cmdare-ruler", show_default=True,
              help="the Kafka consumer group of --notices (one per lake)")
@click.option("--commit-every", default="10s", show_default=True,
              help="the ingest collectors' --commit-every: how far the lake's horizon trails when they keep up")
@config.click_options("serve")
@click.pass_context
def serve_command(ctx: click.Context, config_file: str | None, **params: Any) -> None:  # (serve: the module)
    """Serve the API, the pages and /metrics over an Iceberg lake (--lake): the server tier
    past one machine. Ingest collectors (cmdare-collector kafka URL --lake) write the lake;
    any number of servers read it, each stateless apart from the lake and its catalog, and
    answer as a collector serving a database file does (docs/scale.md).

    With --rules (or the detectors, --detect-every), the servers elect one ruler through
    the catalog (a PostgreSQL advisory lock; a lock file beside a SQLite catalog): it
    evaluates the rules, sends the alerts and keeps the findings current; its alert state
    lives in the catalog, so another server takes over within seconds of its death,
    sending nothing twice and losing nothing.

    \b
    Examples:
      cmdare-collector serve --lake /srv/cmdare-lake --http 127.0.0.1:8765
      cmdare-collector serve --lake s3://telemetry/cmdare --catalog postgresql+psycopg2://cmdare@pg/cmdare \\
          --http 0.0.0.0:8765 --http-token-file /etc/cmdare/tokens.toml
      cmdare-collector serve --lake /srv/cmdare-lake --rules default --alertmanager http://am:9093 \
          --notices kafka://b1:9092/cmdare.events
      analyze --server http://127.0.0.1:8765 bottlenecks --since 1h
    """
    from cmdare.analytics.server.sqlpool import memory_cap
    from cmdare.wire.kafka import parse_kafka_url
    from cmdare.wire.units import parse_duration

    from . import serve as serving

    own = ("lake", "catalog", "http", "http_token_file", "http_tls_cert", "http_tls_key", "ui_url", "session_ttl",
           "refresh", "cache_dir", "sql_workers", "notices", "notices_group", "commit_every")
    lake, catalog, http, http_token_file, http_tls_cert, http_tls_key, ui_url, session_ttl, refresh, cache_dir, \
        sql_workers, notices, notices_group, commit_every = (params.pop(k) for k in own)
    try:
        try:
            cap = memory_cap()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        every = parse_duration("--refresh", refresh)
        if not 0.1 <= every <= 3600:
            raise ConfigError(f"--refresh: {refresh[:20]!r} must be from 100ms to 1h")
        ttl = config.parse_value(config.BY_KEY["session_ttl"], "--session-ttl", session_ttl)
        if not lake.strip():
            raise ConfigError("--lake: empty: give the lake's directory or object-store URI")
        given = {k for k in params if ctx.get_parameter_source(k) in (click.core.ParameterSource.COMMANDLINE,
                                                                        click.core.ParameterSource.ENVIRONMENT)}
        settings = config.build("serve", "", params, given, config_file)
        url = None
        if notices is not None:
            if not settings.rules:
                raise ConfigError("--notices: the ruler reads notices for its rules: give them with --rules")
            url = parse_kafka_url("--notices", notices)
            url.security = settings.security
        if not 1 <= len(notices_group) <= 200 or any(ord(c) < 32 for c in notices_group):
            raise ConfigError("--notices-group: 1 to 200 printable characters")
        commit = parse_duration("--commit-every", commit_every)
        if not 0.1 <= commit <= 3600:
            raise ConfigError(f"--commit-every: {commit_every[:20]!r} must be from 100ms to 1h")
        cfg = serving.ServeConfig(lake, catalog, serving.http_config(http, http_token_file, http_tls_cert,
                                                                     http_tls_key, ui_url, ttl), every, cache_dir,
                                    sql_workers, cap, settings, url, notices_group, commit)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    try:
        serving.run(cfg, lambda line: click.echo(line, err=True))
    except ConfigError as e:  # (a rule file that does not hold against the lake)
        raise click.UsageError(str(e)) from None
    except serving.ServeError as e:
        raise click.ClickException(str(e)) from None


cli.add_command(lakecli.maintain)
cli.add_command(lakecli.to_lake)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
