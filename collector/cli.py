"""cmdare-collector command line."""

from __future__ import annotations

import logging
import signal
import sys
import urllib.parse
from pathlib import Path

import click
import duckdb

from cmdare.wire.kafka import client_logging, parse_kafka_security, parse_kafka_url
from cmdare.wire.units import ConfigError, parse_duration, parse_size

from .consumer import KafkaIngest, SpoolIngest, Totals
from .db import DatabaseError, connect
from .writer import Retention

DB_HELP = "DuckDB database file (default: $CMDARE_DB, else ./cmdare.duckdb)"
SKEW_HELP = (
    "an event stamped further than this from the time it is stored is stored all the same, listed in the "
    "clock_skew table and left out of liveness and lifetime verdicts (analyze nodes shows it); off: no check"
)


def _skew_option(f):
    return click.option("--max-clock-skew", default="1d", show_default=True, help=SKEW_HELP)(f)


def _max_skew(text: str) -> float | None:
    """--max-clock-skew: seconds, or None for ``off``."""
    if text.strip().lower() == "off":
        return None
    v = parse_duration("--max-clock-skew", text)
    if v <= 0:
        raise ConfigError(f"--max-clock-skew: {text!r} must be more than 0 (or off)")
    return v


def _progress(t: Totals) -> None:
    click.echo(f"cmdare-collector: {t.line()}", err=True)


HTTP_HELP = (
    "serve the API (queries while collecting; analyze finds it by itself) on ADDR:PORT; port 0: any free "
    "port (written to DB.service.json); off: none"
)


def _http_options(f):
    f = click.option("--ui-url", envvar="CMDARE_UI_URL", metavar="URL",
                     help="where people open the pages (/ui) when a proxy stands in front: alerts link to "
                          "URL/ui/alerts; default: the API's own address")(f)
    f = click.option("--http-tls-key", type=click.Path(dir_okay=False), help="TLS private key for the API")(f)
    f = click.option("--http-tls-cert", type=click.Path(dir_okay=False), help="TLS certificate for the API")(f)
    f = click.option("--http-token-file", type=click.Path(dir_okay=False),
                     help="bearer token clients must send (needed off loopback; or $CMDARE_HTTP_TOKEN)")(f)
    return click.option("--http", envvar="CMDARE_HTTP", default="127.0.0.1:0", show_default=True, help=HTTP_HELP)(f)


def _kafka_security_options(f):
    """SASL / TLS for the kafka:// source (cmdare.wire.kafka.KafkaSecurity)."""
    f = click.option("--ssl-no-check-hostname", "ssl_no_check_hostname", is_flag=True,
                     help="do not check that the broker's certificate names the host (not recommended)")(f)
    f = click.option("--ssl-keyfile", envvar="CMDARE_KAFKA_SSL_KEYFILE", help="client private key (PEM)")(f)
    f = click.option("--ssl-certfile", envvar="CMDARE_KAFKA_SSL_CERTFILE",
                     help="client certificate (PEM), for brokers that require one")(f)
    f = click.option("--ssl-cafile", envvar="CMDARE_KAFKA_SSL_CAFILE",
                     help="CA certificates (PEM) that sign the brokers' certificates (default: the system's)")(f)
    f = click.option("--sasl-password-file", envvar="CMDARE_KAFKA_PASSWORD_FILE",
                     help="file holding the SASL password (or $CMDARE_KAFKA_PASSWORD); never logged")(f)
    f = click.option("--sasl-username", envvar="CMDARE_KAFKA_USERNAME", help="SASL user name")(f)
    f = click.option("--sasl-mechanism", envvar="CMDARE_KAFKA_SASL_MECHANISM",
                     help="PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 (default with a user: SCRAM-SHA-512)")(f)
    return click.option("--security-protocol", envvar="CMDARE_KAFKA_SECURITY_PROTOCOL",
                        help="PLAINTEXT | SSL | SASL_SSL | SASL_PLAINTEXT (default: PLAINTEXT; SASL_SSL once a "
                             "user is given; SSL once a TLS file is given)")(f)


def _alert_options(f):
    f = click.option("--alert-password-file", "alert_password_files", multiple=True, metavar="NAME=FILE",
                     help="send Basic auth to receiver NAME, user:password read from FILE (repeatable)")(f)
    f = click.option("--alert-token-file", "alert_token_files", multiple=True, metavar="NAME=FILE",
                     help="send a bearer token to receiver NAME, read from FILE (repeatable)")(f)
    f = click.option("--alert-resend", default="1m", show_default=True,
                     help="re-send firing alerts to the receivers this often")(f)
    f = click.option("--alert-kafka", "alert_kafka", multiple=True, metavar="URL",
                     help="publish alerts to this Kafka topic, kafka://host:port/topic (repeatable; the kafka "
                          "command's SASL / TLS options apply)")(f)
    f = click.option("--alert-webhook", "alert_webhooks", multiple=True, metavar="[NAME=]URL",
                     help="POST alerts to this URL in Alertmanager's webhook format (repeatable; metrics and logs "
                          "name it NAME, else its host only; user:password in the URL goes as Basic auth)")(f)
    f = click.option("--alertmanager", "alertmanagers", multiple=True, metavar="[NAME=]URL", envvar="CMDARE_ALERTMANAGER",
                     help="deliver alerts to this Alertmanager (its v2 API; repeatable; $CMDARE_ALERTMANAGER; "
                          "named as --alert-webhook)")(f)
    f = click.option("--liveness-grace", default="45s", show_default=True,
                     help="after the collector was behind (a restart, a Kafka outage, a backlog), node-loss verdicts "
                          "wait this long once it has caught up, for agents to re-send what they spooled")(f)
    f = click.option("--inhibit-window", default="30m", show_default=True,
                     help="after a revocation notice, how long rules marked inhibit_on_revocation stay quiet for "
                          "that node and its job")(f)
    return click.option("--rules", "rules", multiple=True, envvar="CMDARE_RULES", metavar="FILE",
                        help="alerting rule file, evaluated live (repeatable; 'default': the shipped pack; "
                             "$CMDARE_RULES: space-separated); docs/alerts.md")(f)


def _alerting(con, rules: tuple[str, ...], inhibit_window: str, alertmanagers: tuple[str, ...] = (),
              webhooks: tuple[str, ...] = (), resend: str = "1m", kafka_topics: tuple[str, ...] = (),
              security=None, token_files: tuple[str, ...] = (), password_files: tuple[str, ...] = (),
              grace: str = "45s"):
    """Load, validate (against this database) and start the rule evaluation; None without
    --rules.  A bad rule file stops the collector before it consumes anything."""
    from cmdare.analytics.alerting import RuleError
    from cmdare.analytics.alerting.notify import read_secret
    from cmdare.analytics.alerting.schedule import load

    if (alertmanagers or webhooks or kafka_topics) and not rules:
        raise click.UsageError("--alertmanager / --alert-webhook / --alert-kafka: give the rules to evaluate with --rules")
    topics = []
    for k in kafka_topics:
        try:
            ku = parse_kafka_url("--alert-kafka", k)
        except ConfigError as e:
            raise click.UsageError(str(e)) from None
        ku.security = security
        topics.append(ku)
    from cmdare.analytics.alerting.notify import receiver_label

    for u in (*alertmanagers, *webhooks):
        name, url, _ = receiver_label(u)
        if not url.startswith(("http://", "https://")) or not urllib.parse.urlsplit(url).hostname:
            raise click.UsageError(f"receiver {name!r}: alert receivers are [NAME=]http:// or https:// URLs "
                                   "with a host")
    if not rules:
        return None
    try:
        iw = parse_duration("--inhibit-window", inhibit_window)
        rs = parse_duration("--alert-resend", resend)
        secrets = {}
        for opt, how, specs in (("--alert-token-file", "bearer", token_files),
                                ("--alert-password-file", "basic", password_files)):
            for spec in specs:
                name, secret = read_secret(opt, spec)
                secrets[name] = (how, secret)
        al = load(con, rules, iw, alertmanagers, webhooks, rs, kafka_topics=tuple(topics), secrets=secrets)
        al.grace = parse_duration("--liveness-grace", grace)
    except (ConfigError, RuleError) as e:
        raise click.UsageError(str(e)) from None
    return al


def _start_alerting(al, svc, ui_url: str | None) -> None:
    """Start the rule evaluation once the pages' address is known (every alert's
    generatorURL opens URL/ui/alerts?rule=...)."""
    if al is None:
        return
    if svc is not None:
        al.link_base(svc.pages_url())
    elif ui_url:
        al.link_base(ui_url.rstrip("/"))
    n = al.start()
    nr = sum(len(g.rules) for g in al.engine.groups)
    click.echo(f"cmdare-collector: evaluating {nr} alert rules in {len(al.engine.groups)} groups"
               f"{f' ({n} alerts restored)' if n else ''}", err=True)


def _http_config(http: str, token_file, cert, key, ui_url=None):
    """--http and its token / TLS options, checked before the database is opened."""
    from cmdare.analytics.service import parse_http

    try:
        return parse_http(http, token_file, cert, key, ui_url)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _serve(con, db: str, cfg, totals, al=None):
    """The API on the collector's connection, or None with --http off. When it cannot
    start, the rule evaluation already running is stopped first (no thread left in a query
    while the process exits)."""
    from cmdare.analytics.service import Service

    if cfg is None:
        return None
    svc = Service(con, db, cfg, totals)
    try:
        url = svc.start()
    except OSError as e:
        svc.stop()
        if al:
            al.stop()
        con.close()
        raise click.ClickException(str(e)) from None
    click.echo(f"cmdare-collector: API on {url} (analyze finds it through {db}.service.json); "
               f"pages on {url}/ui", err=True)
    return svc


LAKE_HELP = ("write an Apache Iceberg lake instead of --db: a directory (its catalog: DIR/catalog.db) or an "
             "object-store URI with --catalog; several collectors in one group may write one lake ($CMDARE_LAKE)")


def _lake_options(f):
    f = click.option("--commit-every", default="10s", show_default=True,
                     help="with --lake: commit what is staged this often (data is visible to analyze this late)")(f)
    f = click.option("--catalog", envvar="CMDARE_LAKE_CATALOG", metavar="URL",
                     help="with --lake: the Iceberg SQL catalog, postgresql://user@host/db (many hosts) or "
                          "sqlite:///file ($CMDARE_LAKE_CATALOG; default: DIR/catalog.db)")(f)
    return click.option("--lake", envvar="CMDARE_LAKE", metavar="URI", help=LAKE_HELP)(f)


def _retention_options(f):
    f = click.option("--retain-rollups", default="400d", show_default=True,
                     help="delete 1- and 5-minute rollup rows this much older than the newest (off: keep all)")(f)
    return click.option("--retain-raw", default="7d", show_default=True,
                        help="delete raw GPU / host / TPU samples this much older than the newest, once rolled up "
                             "(off: keep all; a lake: cmdare-collector maintain)")(f)


def _retention(ctx: click.Context, lake: str | None, retain_raw: str, retain_rollups: str) -> Retention:
    """The --retain-* options (ConfigError when bad or given with --lake)."""
    if lake:
        for name in ("retain_raw", "retain_rollups"):
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
                raise ConfigError(f"--{name.replace('_', '-')}: a lake's retention is cmdare-collector maintain's")

    return Retention(duration_or_off("--retain-raw", retain_raw, 300), duration_or_off("--retain-rollups", retain_rollups, 300))


def duration_or_off(flag: str, text: str, least: float = 0.0) -> float | None:
    """A duration option that may be ``off`` (None); ConfigError under ``least`` seconds."""
    if text.strip().lower() == "off":
        return None
    v = parse_duration(flag, text)
    if v < least:
        what = "negative" if least == 0 else f"under {least:g} s"
        raise ConfigError(f"{flag}: {text[:20]!r} must not be {what}; 'off' keeps all")
    return v


def _open(db: str):
    try:
        return connect(db)
    except DatabaseError as e:
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
@click.option("--db", envvar="CMDARE_DB", default="cmdare.duckdb", show_default=True, help=DB_HELP)
@click.option("--group", default="cmdare-collector", show_default=True, help="Kafka consumer group")
@click.option(
    "--batch-bytes",
    default="64MiB",
    show_default=True,
    help="write a transaction at about this much message data (polls are sized to fit; at most three batches are in memory, "
    "one written, one waiting, one fetched); smaller batches send more rows through DuckDB's WAL: a backlog loads "
    "1.5-2x slower per sample at 16MiB",
)
@click.option("--max-wait", default="1s", show_default=True, help="...or after this long")
@click.option(
    "--idle-exit",
    default=None,
    help="exit once no message came for this long with partitions assigned (e.g. 30s); default: run until stopped",
)
@click.option("--progress-every", default="10s", show_default=True, help="how often to print progress")
@_skew_option
@_retention_options
@_lake_options
@_kafka_security_options
@_http_options
@_alert_options
@click.pass_context
def kafka(
    ctx: click.Context,
    url: str,
    db: str,
    group: str,
    batch_bytes: str,
    max_wait: str,
    idle_exit: str | None,
    progress_every: str,
    max_clock_skew: str,
    retain_raw: str,
    retain_rollups: str,
    lake: str | None,
    catalog: str | None,
    commit_every: str,
    http: str,
    http_token_file: str | None,
    http_tls_cert: str | None,
    http_tls_key: str | None,
    ui_url: str | None,
    security_protocol: str | None,
    sasl_mechanism: str | None,
    sasl_username: str | None,
    sasl_password_file: str | None,
    ssl_cafile: str | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    ssl_no_check_hostname: bool,
    rules: tuple[str, ...],
    inhibit_window: str,
    alertmanagers: tuple[str, ...],
    alert_webhooks: tuple[str, ...],
    alert_kafka: tuple[str, ...],
    alert_resend: str,
    alert_token_files: tuple[str, ...],
    alert_password_files: tuple[str, ...],
    liveness_grace: str,
) -> None:
    """Consume URL (kafka://host:port[,host:port]/topic) as a consumer group into --db.

    Offsets are committed only after the rows are committed in DuckDB; events delivered
    twice are stored once; bad messages go to the dead_letters table.  Brokers with
    SASL and TLS: --sasl-username and --sasl-password-file (or $CMDARE_KAFKA_PASSWORD),
    --ssl-cafile, and a client certificate where the brokers require one.

    \b
    Examples:
      cmdare-collector kafka kafka://127.0.0.1:9092/cmdare.events --db fleet.duckdb
      cmdare-collector kafka kafka://b1:9093/cmdare.events --sasl-username collector --sasl-password-file /etc/cmdare/kafka.pw --ssl-cafile /etc/cmdare/kafka-ca.pem
      cmdare-collector kafka kafka://b1:9092/cmdare.events --lake /srv/cmdare-lake   # several hosts: --catalog postgresql://...

    With --lake, each member of the group writes the same Iceberg tables; the lake
    records the offsets each commit covers, and a member given partitions starts where
    the lake has everything: every record is stored once (docs/scale.md).
    """
    try:
        u = parse_kafka_url("URL", url)
        given = {
            "security_protocol": security_protocol, "sasl_mechanism": sasl_mechanism,
            "sasl_username": sasl_username, "sasl_password_file": sasl_password_file,
            "ssl_cafile": ssl_cafile, "ssl_certfile": ssl_certfile, "ssl_keyfile": ssl_keyfile,
            "ssl_check_hostname": False if ssl_no_check_hostname else None,
        }
        u.security = parse_kafka_security("--", {k: v for k, v in given.items() if v is not None})
        client_logging(secrets=(u.security.password,))
        bb = parse_size("--batch-bytes", batch_bytes)
        mw = parse_duration("--max-wait", max_wait)
        ie = parse_duration("--idle-exit", idle_exit) if idle_exit else None
        pe = parse_duration("--progress-every", progress_every)
        skew = _max_skew(max_clock_skew)
        keep = _retention(ctx, lake, retain_raw, retain_rollups)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    if lake:
        from .lakecli import _kafka_lake

        _kafka_lake(ctx, u, lake, catalog, commit_every, group, bb, mw, ie, pe, skew)
        return
    hc = _http_config(http, http_token_file, http_tls_cert, http_tls_key, ui_url)
    con = _open(db)
    try:
        al = _alerting(con, rules, inhibit_window, alertmanagers, alert_webhooks, alert_resend, alert_kafka,
                       u.security, alert_token_files, alert_password_files, liveness_grace)
    except click.UsageError:
        con.close()
        raise
    ing = KafkaIngest(con, u, group, bb, mw, progress=_progress, progress_every=pe, max_skew=skew, retention=keep)
    if al:
        ing.totals.on_batch = al.on_batch
        al.caught_up = lambda: ing.totals.caught_up_at
    svc = _serve(con, db, hc, lambda: ing.totals, al)
    _start_alerting(al, svc, ui_url)
    if svc:
        svc.alerting = al
    try:
        ing.open()
    except ConnectionError as e:
        if al:
            al.stop()
        if svc:
            svc.stop()
        raise click.ClickException(str(e)) from None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: ing.stop())
    sec = f" over {u.security.describe()}" if u.security and u.security.protocol != "PLAINTEXT" else ""
    click.echo(f"cmdare-collector: consuming {u.text}{sec} (group {group}) into {db}", err=True)
    if svc:
        svc.ready = True
    try:
        t = ing.run(idle_exit=ie)
    except duckdb.Error as e:
        raise click.ClickException(
            f"{db}: writing failed, the failed batch was rolled back and its offsets "
            f"not committed: {str(e).splitlines()[0]}"
        ) from None
    finally:
        if al:
            al.stop()
        if svc:
            svc.stop()
        ing.close()
        con.close()
    click.echo(f"cmdare-collector: done: {t.line()}", err=True)


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--db", envvar="CMDARE_DB", default="cmdare.duckdb", show_default=True, help=DB_HELP)
@click.option("--follow", is_flag=True, help="keep loading new events until stopped")
@click.option("--interval", default="1s", show_default=True, help="with --follow: how often to look")
@_skew_option
@_retention_options
@_lake_options
@_http_options
@_alert_options
@click.pass_context
def spool(ctx: click.Context, directory: Path, db: str, follow: bool, interval: str, max_clock_skew: str,
          retain_raw: str, retain_rollups: str, lake: str | None, catalog: str | None, commit_every: str, http: str,
          http_token_file: str | None, http_tls_cert: str | None, http_tls_key: str | None, ui_url: str | None,
          rules: tuple[str, ...], inhibit_window: str, alertmanagers: tuple[str, ...],
          alert_webhooks: tuple[str, ...], alert_kafka: tuple[str, ...], alert_resend: str,
          alert_token_files: tuple[str, ...], alert_password_files: tuple[str, ...], liveness_grace: str) -> None:
    """Load an agent's spool DIRECTORY (the embedded default: no Kafka) into --db.

    The position reached is stored in the database, so running it again loads only what
    is new.

    \b
    Example:
      cmdare-collector spool /var/lib/cmdare/spool --db cmdare.duckdb
      cmdare-collector spool /var/lib/cmdare/spool --follow --db cmdare.duckdb   # with the API, for analyze
    """
    try:
        iv = parse_duration("--interval", interval)
        skew = _max_skew(max_clock_skew)
        keep = _retention(ctx, lake, retain_raw, retain_rollups)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    hc = _http_config(http, http_token_file, http_tls_cert, http_tls_key, ui_url) if follow else None
    if not directory.is_dir():
        raise click.ClickException(f"{directory}: no such spool directory")
    if lake:
        from .lakecli import _spool_lake

        _spool_lake(ctx, directory, lake, catalog, commit_every, follow, iv, skew)
        return
    if rules and not follow:
        raise click.UsageError("--rules: alert rules are evaluated while collecting: add --follow")
    con = _open(db)
    try:
        al = _alerting(con, rules, inhibit_window, alertmanagers, alert_webhooks, alert_resend, alert_kafka,
                       None, alert_token_files, alert_password_files, liveness_grace)
    except click.UsageError:
        con.close()
        raise
    ing = SpoolIngest(con, directory, progress=_progress, max_skew=skew, retention=keep)
    if al:
        ing.totals.on_batch = al.on_batch
        al.caught_up = lambda: ing.totals.caught_up_at
    svc = _serve(con, db, hc, lambda: ing.totals, al) if follow else None
    _start_alerting(al, svc, ui_url)
    if svc:
        svc.alerting = al
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: ing.stop())
    try:
        if follow:
            if svc:
                svc.ready = True
            ing.follow(iv)
        else:
            ing.load_available()
    except duckdb.Error as e:
        raise click.ClickException(
            f"{db}: writing failed, the failed batch was rolled back and the spool "
            f"position kept: {str(e).splitlines()[0]}"
        ) from None
    finally:
        if al:
            al.stop()
        if svc:
            svc.stop()
        con.close()
    click.echo(f"cmdare-collector: {directory} -> {db}: {ing.totals.line()}", err=True)


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


def main() -> None:
    cli()


from . import lakecli  # noqa: E402,F401  (registers maintain and to-lake)

if __name__ == "__main__":
    main()
