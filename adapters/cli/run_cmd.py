"""`apexps up` (local Kafka + broker, foreground) and `apexps broker` (against any Kafka)."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import Any

import structlog

from adapters.cli.client_cmd import DEFAULT_APEX_PORT
from adapters.cli.paths import default_data_dir
from broker.core import BrokerCore
from broker.errors import ConfigError
from broker.holds import KafkaHolds
from broker.kafka_io import KafkaConfig

log = structlog.get_logger(__name__)


def _config(args: argparse.Namespace, bootstrap: str) -> KafkaConfig:
    return KafkaConfig(bootstrap=bootstrap, namespace=args.namespace,
                       journal_partitions=args.journal_partitions)


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def _peer(text: str) -> tuple[str, str, int]:
    domain, sep, address = text.partition("=")
    if not sep or not domain:
        raise argparse.ArgumentTypeError(f"expected DOMAIN=HOST:PORT, got {text!r}")
    host, port = _listen_address(address)
    return domain.lower(), host, port


async def _serve_async(config: KafkaConfig, listen: tuple[str, int], domain: str, *,
                       peers: list[tuple[str, str, int]] | None = None,
                       accept_peers: list[str] | None = None) -> int:
    """Open the core, serve APEX until SIGINT/SIGTERM, then close both in order."""
    from adapters.apex import Relay
    from adapters.apex.server import ApexServer

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    core = BrokerCore(config)
    report = await asyncio.to_thread(core.open)  # blocking Kafka reads
    accepted = frozenset(d.lower() for d in accept_peers or ())
    holds = KafkaHolds(core.holds)  # hold4Endpoint data, durable in the core's Kafka
    relay = Relay(domain=domain, may_bind=lambda _ref, peer: peer in accepted, holds=holds)
    server = ApexServer(relay, host=listen[0], port=listen[1])
    try:
        await server.start()
        for peer_domain, host, port in peers or ():
            server.connect_peer(peer_domain, host, port)
        print(f"apex: {server.host}:{server.port} (domain {domain})", flush=True)
        log.info("broker ready; Ctrl-C stops it", bootstrap=config.bootstrap,
                 listen=f"{server.host}:{server.port}", domain=domain,
                 journal_sources=report.journal.sources, topics=report.topics)
        await stop.wait()
    finally:
        log.info("broker stopping")
        await server.close()
        await asyncio.to_thread(holds.close)
        await asyncio.to_thread(core.close)
        log.info("broker stopped")
    return 0


def _serve(args: argparse.Namespace, bootstrap: str) -> int:
    for peer_domain, _, _ in args.peer:
        if peer_domain == args.domain.lower():
            raise ConfigError(f"--peer {peer_domain}=…: that is this relay's own --domain")
    return asyncio.run(_serve_async(_config(args, bootstrap), args.listen, args.domain,
                                    peers=args.peer, accept_peers=args.accept_peer))


def _up(args: argparse.Namespace) -> int:
    from ops.kafka_local import LocalKafka

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
    p.add_argument("--namespace", default="apexps",
                   help="prefix of the Kafka topics apexps owns (default: %(default)s)")
    p.add_argument("--journal-partitions", type=int, default=3,
                   help="partitions of a new journal topic (default: %(default)s)")


def register(sub: Any) -> None:
    up = sub.add_parser(
        "up", help="start a local Kafka and the broker in the foreground (Ctrl-C stops both)",
        description="Provision (first run: fetch jars from Maven Central) and start a local "
                    "single-node Kafka, then run the broker on it until Ctrl-C.",
    )
    up.add_argument("--data-dir", default=str(default_data_dir()),
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
