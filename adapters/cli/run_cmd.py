"""`apexps up` (local Kafka + broker, foreground) and `apexps broker` (against any Kafka)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import structlog

from adapters import speedups
from adapters.cli import heap
from adapters.cli import loop as event_loop
from adapters.cli.client_cmd import DEFAULT_APEX_PORT
from adapters.cli.gateway_cmd import add_gateway_options
from adapters.cli.paths import default_data_dir
from adapters.cli.security import add_server_options, server_security
from broker.events import ExpiresPolicy, ImplicitPolicy, WatchTable
from broker.kafka_io import KafkaConfig
from broker.robust.config import RobustConfig
from common.errors import ConfigError

log = structlog.get_logger(__name__)


def report_accelerators() -> str:
    """How many of the compiled twins (setup.py) this process runs with, as "N/M". A build that
    went on without a C compiler runs the pure-Python twins, correct but slower, and would
    otherwise say so nowhere: warn, with the fix."""
    active = speedups.active()
    missing = sorted(name for name, on in active.items() if not on)
    if missing and os.environ.get("APEXPS_PURE_PYTHON", "") in ("", "0"):
        log.warning("compiled accelerators missing: their pure-Python twins run instead, slower",
                    missing=missing, fix="apt-get install gcc python3-dev, then bash ops/bootstrap")
    elif missing:
        log.info("compiled accelerators switched off by APEXPS_PURE_PYTHON", missing=missing)
    return f"{len(active) - len(missing)}/{len(active)}"


def _config(args: argparse.Namespace, bootstrap: str) -> KafkaConfig:
    return KafkaConfig(bootstrap=bootstrap, namespace=args.namespace,
                       journal_partitions=args.journal_partitions)


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def _topic_at(text: str) -> tuple[str, str]:
    topic, at, domain = text.rpartition("@")
    if not at or not topic or not domain:
        raise argparse.ArgumentTypeError(f"expected TOPIC@DOMAIN, got {text!r}")
    return topic, domain.lower()


def _peer(text: str) -> tuple[str, str, int]:
    domain, sep, address = text.partition("=")
    if not sep or not domain:
        raise argparse.ArgumentTypeError(f"expected DOMAIN=HOST:PORT, got {text!r}")
    host, port = _listen_address(address)
    return domain.lower(), host, port


async def _serve_async(args: argparse.Namespace, config: KafkaConfig,
                       **security: Any) -> int:
    """Start the broker, serve APEX until SIGINT/SIGTERM, then stop everything in order."""
    from adapters.app import BrokerApp

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    host, port = args.listen
    app = BrokerApp(config, domain=args.domain, host=host, port=port, access_file=args.access,
                    peers=args.peer, accept_peers=args.accept_peer,
                    redistribute=args.redistribute, security=security,
                    robust=RobustConfig(heartbeat_ms=args.heartbeat_ms),
                    events=_watch_table(args))
    await app.start()
    gateway = None
    if args.gateway is not None:
        from adapters.cli.gateway_cmd import build_gateway

        # The gateway's feeds are this broker's clients on loopback; with --users, HTTP Basic
        # users are checked against the same file and their sessions authenticate as them.
        gateway = build_gateway(args, (app.host, app.port), (host, args.gateway), app.domain,
                                broker_sasl=bool(args.users), broker_tls=None)
        await gateway.start()
    heap.settle()
    try:
        print(f"apex: {app.host}:{app.port} (domain {app.domain})", flush=True)
        if gateway is not None:
            print(f"gateway: {gateway.url}/", flush=True)
        assert app.report is not None
        log.info("broker ready; Ctrl-C stops it", bootstrap=config.bootstrap,
                 listen=f"{app.host}:{app.port}", domain=app.domain,
                 journal_sources=app.report.journal.sources, topics=app.report.topics,
                 subscriptions=app.report.subscriptions, compiled=report_accelerators())
        await stop.wait()
    finally:
        log.info("broker stopping")
        if gateway is not None:
            await gateway.close()
        await app.close()
        log.info("broker stopped")
    return 0


def _serve(args: argparse.Namespace, bootstrap: str) -> int:
    for peer_domain, _, _ in args.peer:
        if peer_domain == args.domain.lower():
            raise ConfigError(f"--peer {peer_domain}=…: that is this relay's own --domain")
    security = server_security(args)  # before Kafka: a bad certificate fails fast
    return event_loop.run(_serve_async(args, _config(args, bootstrap), **security))


def _up(args: argparse.Namespace) -> int:
    from adapters.local.kafka import LocalKafka

    kafka = LocalKafka(Path(args.data_dir) / "kafka")
    already, running = kafka.status()
    state = kafka.start()
    print(f"kafka: {state.bootstrap}", flush=True)
    try:
        return _serve(args, state.bootstrap)
    finally:
        # Stop only the Kafka we started; one that was already running belongs to someone else.
        if not (already and running):
            kafka.stop()


def _expires_range(text: str) -> tuple[int, int]:
    low, colon, high = text.partition(":")
    if not colon or not low.isdigit() or not high.isdigit() or not 1 <= int(low) <= int(high):
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX seconds with 1 ≤ MIN ≤ MAX")
    return int(low), int(high)


def _watch_table(args: argparse.Namespace) -> WatchTable:
    """The resource watches' policies (docs/event-binding.md §4, §6) from the options."""
    low, high = args.watch_expires
    return WatchTable(policy=ExpiresPolicy(low, high, permanent=not args.no_permanent_watch),
                      implicit_policy=ImplicitPolicy(topics=frozenset(args.implicit_watch),
                                                     max_implicit=args.max_implicit_watches),
                      pending_on_access=args.pending_watches,
                      approve_topics=frozenset(args.approve_watches))


def _broker(args: argparse.Namespace) -> int:
    return _serve(args, args.bootstrap)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", type=_listen_address, default=("127.0.0.1", DEFAULT_APEX_PORT),
                   metavar="HOST:PORT",
                   help=f"where to serve APEX over BEEP (default: 127.0.0.1:{DEFAULT_APEX_PORT}; "
                        "RFC 3340's apex-edge port 912 needs root)")
    p.add_argument("--domain", default="example.com",
                   help="the APEX domain this relay serves (default: %(default)s)")
    p.add_argument("--peer", type=_peer, action="append", default=[],
                   metavar="DOMAIN=HOST:PORT",
                   help="keep a relay-relay link to DOMAIN's relay at HOST:PORT: bind to it as "
                        "--domain and send DOMAIN's data over it; retried with backoff while "
                        "down (repeatable; RFC 3340 §4.4.2)")
    p.add_argument("--accept-peer", action="append", default=[], metavar="DOMAIN",
                   help="let a relay bind to us for DOMAIN (its data must originate in "
                        "DOMAIN); nobody may by default (repeatable; RFC 3340 §4.5.2)")
    p.add_argument("--redistribute", action="append", default=[], type=_topic_at,
                   metavar="TOPIC@DOMAIN",
                   help="redistribute DOMAIN's TOPIC here: subscribe to it there as"
                        " apex=pubsub/TOPIC@--domain and forward its data to our own"
                        " subscribers of TOPIC (needs a --peer link to DOMAIN; repeatable)")
    p.add_argument("--namespace", default="apexps", metavar="NS",
                   help="prefix of the Kafka topics apexps owns (default: %(default)s)")
    p.add_argument("--journal-partitions", type=int, default=3, metavar="N",
                   help="partitions of a new journal topic (default: %(default)s)")
    p.add_argument("--heartbeat-ms", type=_positive, default=RobustConfig().heartbeat_ms,
                   metavar="MS",
                   help="heartbeat on a subscriber link idle this long (default: %(default)s)")
    p.add_argument("--access", metavar="FILE", default=None,
                   help="access entries to load at start (XML, see `apexps access --help`);"
                        " without it every endpoint of --domain may do everything")
    add_server_options(p)
    watches = p.add_argument_group("resource watches", "docs/event-binding.md")
    watches.add_argument("--watch-expires", type=_expires_range, default=(1, 86_400),
                         metavar="MIN:MAX",
                         help="the Expires a watch may be granted: below MIN is refused"
                              " with min-expires (572), above MAX is shortened (default:"
                              " 1:86400)")
    watches.add_argument("--no-permanent-watch", action="store_true",
                         help="grant a permanent watch (Expires 0xffffffff) as MAX instead")
    watches.add_argument("--implicit-watch", action="append", default=[], metavar="TOPIC",
                         help="publishing a data item of TOPIC watches it for others' changes"
                              " (implicit subscription; repeatable)")
    watches.add_argument("--pending-watches", action="store_true",
                         help="a watch the access entries do not allow yet waits (pending)"
                              " instead of being refused, and starts when they do")
    watches.add_argument("--approve-watches", action="append", default=[], metavar="TOPIC",
                         help="every watch on TOPIC waits (pending) until an administrator"
                              " approves or rejects it with `apexps watch-decide`"
                              " (repeatable)")
    watches.add_argument("--max-implicit-watches", type=_positive, default=64, metavar="N",
                         help="implicit watches one endpoint may hold (default: %(default)s)")
    p.add_argument("--gateway", type=int, default=None, metavar="PORT",
                   help="also serve the web gateway (docs/gateway.md) on this port of the"
                        " --listen host")
    add_gateway_options(p)


def register(sub: Any) -> None:
    up = sub.add_parser(
        "up", help="start a local Kafka and the broker in the foreground (Ctrl-C stops both)",
        description="Provision (first run: fetch jars from Maven Central) and start a local "
                    "single-node Kafka, then run the broker on it until Ctrl-C.",
    )
    up.add_argument("--data-dir", default=str(default_data_dir()), metavar="DIR",
                    help="where Kafka and the broker keep their state (default: %(default)s)")
    _common(up)
    up.set_defaults(func=_up)
    br = sub.add_parser(
        "broker", help="run the broker against an existing Kafka",
        description="Run the broker against any Kafka cluster, local or remote.",
    )
    br.add_argument("--bootstrap", required=True, metavar="HOST:PORT[,HOST:PORT…]",
                    help="Kafka bootstrap servers")
    _common(br)
    br.set_defaults(func=_broker)
