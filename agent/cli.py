"""cmdare-agent command line (argparse: the agent stays free of click)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import __version__
from .config import DEFAULT_PATH, AgentConfig, ConfigError, coerce_text, load

EPILOG = """\
examples:
  cmdare-agent --check                       validate config, probe sources and sink
  cmdare-agent --once                        print one round of samples as JSON
  cmdare-agent --spool-dir ./spool --interval 1s --duration 30
  cmdare-agent --sink kafka://10.0.0.5:9092/cmdare.events
  cmdare-agent --set sources.gpu.enabled=false --set labels.team=vision

Config precedence: defaults < TOML file < CMDARE_AGENT_* environment
(CMDARE_AGENT_SPOOL__DIR=/x sets spool.dir) < flags.
"""

log = logging.getLogger("cmdare.agent")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="cmdare-agent",
        description="Sample this training VM (host, GPUs, heartbeat) into a local spool and ship to Kafka.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config", metavar="PATH", help=f"TOML config file (default {DEFAULT_PATH}, or $CMDARE_AGENT_CONFIG)"
    )
    p.add_argument(
        "--set", metavar="KEY=VALUE", action="append", default=[], help="set any config key (repeatable)"
    )
    p.add_argument("--node", help="node id (default: hostname)")
    p.add_argument("--role", help="worker | ps | chief | data | client")
    p.add_argument("--job", help="job id stamped on every event")
    p.add_argument("--interval", help="sampling interval, e.g. 10s (default 10s)")
    p.add_argument("--spool-dir", metavar="DIR", help="spool directory (default /var/lib/cmdare/spool)")
    p.add_argument("--sink", metavar="URL", help="kafka://host:port[,host:port]/topic (default: spool only)")
    p.add_argument("--log-level", help="debug | info | warning | error")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="validate config, probe every source and sink, exit"
    )
    mode.add_argument("--once", action="store_true", help="print one round of samples as JSON and exit")
    p.add_argument("--duration", type=float, metavar="SECONDS", help="run this long, then stop cleanly")
    p.add_argument("--version", action="version", version=f"cmdare-agent {__version__}")
    return p.parse_args(argv)


def build_config(a: argparse.Namespace) -> AgentConfig:
    overrides: dict[str, Any] = {}
    for item in a.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = coerce_text(value)
    for flag, key in (
        ("node", "node"),
        ("role", "role"),
        ("job", "job"),
        ("interval", "interval"),
        ("spool_dir", "spool.dir"),
        ("sink", "sink.url"),
        ("log_level", "log_level"),
    ):
        v = getattr(a, flag)
        if v is not None:
            overrides[key] = v
    return load(a.config, required=a.config is not None, overrides=overrides)


def check(cfg: AgentConfig) -> int:
    from .runtime import Agent
    from .sinks.kafka import KafkaSink, SinkError
    from .sources import SourceUnavailable

    ok = True
    print(
        f"config    ok     {cfg.path or '(defaults)'}: node={cfg.node} role={cfg.role} "
        f"job={cfg.job or '-'} interval={cfg.interval:g}s"
    )
    # checks only: nothing is created (the spool directory and the train socket's are made
    # when the agent runs)
    d = cfg.spool.dir
    up = d
    while not up.exists() and up != up.parent:
        up = up.parent
    if d.exists() and not d.is_dir():
        ok = False
        print(f"spool     error  {d}: exists and is not a directory")
    elif not os.access(up, os.W_OK | os.X_OK):
        ok = False
        print(f"spool     error  {d}: {up} is not writable by this user")
    else:
        made = "" if d.exists() else f" (to be created in {up})"
        print(f"spool     ok     {d}{made} (max {cfg.spool.max_bytes} bytes, {cfg.spool.max_age:g}s)")
    agent = Agent(cfg)
    for r in agent.runners:
        src = r.source
        try:
            print(f"source    ok     {src.name}: {src.check()}")
        except SourceUnavailable as e:
            print(f"source    n/a    {src.name}: {e}")
        except Exception as e:
            ok = False
            print(f"source    error  {src.name}: {type(e).__name__}: {e}")
        finally:
            src.close()
    if cfg.sink.kafka:
        sink = KafkaSink(cfg.sink.kafka, cfg.node, request_timeout=min(cfg.sink.request_timeout, 10.0))
        try:
            n = sink.probe()
            sec = cfg.sink.kafka.security
            how = f", {sec.describe()}" if sec and sec.protocol != "PLAINTEXT" else ""
            print(f"sink      ok     {cfg.sink.kafka.text} ({n} partitions{how})")
        except SinkError as e:
            ok = False
            print(f"sink      error  {e}")
        finally:
            sink.close()
    else:
        print(
            f"sink      ok     none: the spool {cfg.spool.dir} is the sink (load it with: cmdare-collector spool DIR)"
        )
    if cfg.prometheus.listen:
        import socket as _socket

        p = cfg.prometheus
        try:  # can the port be had? (bound and released at once)
            with _socket.create_server((p.host, p.port)):
                pass
            print(f"export    ok     prometheus: /metrics on {p.host}:{p.port}{' (TLS)' if p.tls_cert else ''}")
        except OSError as e:
            ok = False
            print(f"export    error  prometheus.listen: cannot listen on {p.host}:{p.port}: {e.strerror or e}")
    if cfg.otlp.endpoint:
        print(f"export    ok     otlp: {cfg.otlp.protocol} to {cfg.otlp.endpoint} every {cfg.otlp.interval:g}s")
    return 0 if ok else 1


def once(cfg: AgentConfig) -> int:
    from cmdare.wire.events import EventFactory

    from .runtime import Agent

    agent = Agent(cfg)
    factory = EventFactory(cfg.node, cfg.role, cfg.job, cfg.labels)
    events: list[dict[str, Any]] = []
    for r in agent.runners:
        try:
            r.source.start()
            r.started = True
        except Exception:
            pass  # reported by the tick below
    time.sleep(min(cfg.interval, 0.5))  # CPU shares need two readings
    for r in agent.runners:
        if r.started:
            r.source.settle(5.0)
    emit = lambda t, d, ts=None, job=None, id=None: events.append(factory.make(t, d, ts, job, id))  # noqa: E731
    for r in agent.runners:
        r.tick(
            emit,
            lambda name, state, dur, msg: events.append(
                factory.make(
                    "status",
                    {
                        "source": name,
                        "ok": state == "ok",
                        "state": state,
                        "duration_seconds": dur,
                        **({"message": msg} if msg else {}),
                    },
                )
            ),
        )
        r.source.close()
    json.dump(events, sys.stdout, indent=1)
    print()
    return 0


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    try:
        cfg = build_config(a)
    except ConfigError as e:
        print(f"cmdare-agent: config error: {e}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(
        level=cfg.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from cmdare.wire.kafka import client_logging

    sec = cfg.sink.kafka.security if cfg.sink.kafka else None
    client_logging(cfg.log_level == "debug", secrets=(sec.password,) if sec else ())
    if a.check:
        sys.exit(check(cfg))
    if a.once:
        sys.exit(once(cfg))
    from .runtime import Agent

    signals = Signals()  # before Agent: every thread it starts inherits the blocked signals
    agent = Agent(cfg)
    signals.start(agent)
    try:
        agent.run(duration=a.duration)
    except RuntimeError as e:  # e.g. the spool is locked by another agent
        print(f"cmdare-agent: {e}", file=sys.stderr)
        sys.exit(1)
    except PermissionError as e:
        print(
            f"cmdare-agent: spool.dir {Path(e.filename or cfg.spool.dir)}: permission denied", file=sys.stderr
        )
        sys.exit(1)
    except OSError as e:  # e.g. prometheus.listen's port is taken
        print(f"cmdare-agent: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        signals.done.set()
    sys.exit(0)


STOP_DEADLINE = 4.5  # seconds from SIGTERM to the process's end, whatever a source does (systemd: 5 s)


class Signals:
    """SIGTERM and SIGINT taken by a thread of their own (``sigwait``; blocked in every
    other thread), so a stop is seen even while the sampling loop is stuck in a call that
    never returns (a driver's ioctl, a file system that does not answer): the agent is
    told to stop, and if it has not ended ``STOP_DEADLINE`` seconds later the process
    exits without it (what was spooled stays on disk for the next start)."""

    SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})

    def __init__(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        self.done = threading.Event()

    def start(self, agent: Any) -> None:
        for sig in self.SIGNALS:  # a thread started before the mask (none is, today) would run this instead
            signal.signal(sig, lambda signum, _frame: agent.stop(signal.Signals(signum).name))
        threading.Thread(target=self._wait, args=(agent,), name="cmdare-signals", daemon=True).start()

    def _wait(self, agent: Any) -> None:
        sig = signal.sigwait(self.SIGNALS)
        t0 = time.monotonic()
        agent.stop(signal.Signals(sig).name)
        if self.done.wait(STOP_DEADLINE):
            return
        log.error("stopping: the sampling loop has not returned %.1f s after %s (a source is stuck); exiting "
                  "without it (spooled events are kept)", time.monotonic() - t0, signal.Signals(sig).name)
        for h in logging.getLogger().handlers:
            h.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
