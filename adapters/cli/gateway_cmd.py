"""`apexps gateway`: the web gateway (adapters/gateway, docs/gateway.md) in front of a broker."""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
from pathlib import Path
from typing import Any

import structlog

from adapters.cli import heap
from adapters.cli import loop as event_loop
from adapters.cli.client_cmd import DEFAULT_APEX_PORT
from adapters.cli.security import load_users
from common.errors import ConfigError

__all__ = ["DEFAULT_GATEWAY_PORT", "add_gateway_options", "build_gateway", "load_tokens",
           "register"]

log = structlog.get_logger(__name__)

DEFAULT_GATEWAY_PORT = 8080


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def load_tokens(path: str) -> dict[str, str]:
    """A bearer tokens file: one `TOKEN USER` per line; blank lines and `#` lines ignored."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read tokens file {path}: {exc}") from None
    tokens: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[0]) < 16:
            raise ConfigError(f"{path}:{number}: expected 'TOKEN USER' with a token of at"
                              " least 16 characters")
        tokens[parts[0]] = parts[1]
    return tokens


def add_gateway_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `apexps gateway` and `apexps up --gateway`."""
    group = p.add_argument_group("web gateway (docs/gateway.md)")
    group.add_argument("--gateway-tokens", metavar="FILE",
                       help="bearer tokens file: 'TOKEN USER' per line")
    group.add_argument("--gateway-anonymous", default="web", metavar="USER",
                       help="the user of requests when neither --users nor --gateway-tokens"
                            " is given (default: %(default)s)")
    group.add_argument("--gateway-tls-cert", metavar="FILE",
                       help="PEM certificate chain: serve HTTPS")
    group.add_argument("--gateway-tls-key", metavar="FILE",
                       help="PEM private key of --gateway-tls-cert")
    group.add_argument("--gateway-max-connections", type=int, default=4096, metavar="N",
                       help="open HTTP connections at most (default: %(default)s)")
    group.add_argument("--gateway-replay", type=int, default=1024, metavar="N",
                       help="deliveries kept per subscription for reconnecting streams"
                            " (default: %(default)s; older ones come by gap fill)")


def build_gateway(args: argparse.Namespace, broker: tuple[str, int], listen: tuple[str, int],
                  domain: str, **client: Any) -> Any:
    """A `Gateway` from the options; `client`: broker_tls and broker_sasl."""
    from adapters.gateway import Auth, Gateway, GatewayLimits

    users = load_users(args.users) if getattr(args, "users", None) else None
    tokens = load_tokens(args.gateway_tokens) if args.gateway_tokens else None
    tls = None
    if args.gateway_tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            tls.load_cert_chain(args.gateway_tls_cert, args.gateway_tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the gateway's certificate/key: {exc}") from None
    limits = GatewayLimits(max_connections=args.gateway_max_connections,
                           replay=args.gateway_replay)
    return Gateway(*broker, domain=domain, host=listen[0], port=listen[1],
                   auth=Auth(users, tokens, args.gateway_anonymous), tls=tls, limits=limits,
                   **client)


async def _run(args: argparse.Namespace) -> int:
    broker_tls = None
    if args.broker_tls or args.ca:
        try:
            broker_tls = ssl.create_default_context(cafile=args.ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load CA certificates from {args.ca}: {exc}") from None
    if args.broker_sasl and not args.users:
        raise ConfigError("--broker-sasl needs --users (the passwords come from Basic auth)")
    gateway = build_gateway(args, args.broker, args.listen, args.domain,
                            broker_tls=broker_tls, broker_sasl=args.broker_sasl)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await gateway.start()
    heap.settle()  # as the broker does: a full collection stalls every stream (heap.py)
    try:
        print(f"gateway: {gateway.url}/", flush=True)
        await stop.wait()
    finally:
        await gateway.close()
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "gateway", help="serve HTTP, Server-Sent Events and WebSocket clients of a broker",
        description="Run the web gateway: POST /subscriptions, GET /subscriptions/ID/events "
                    "(SSE, ids are link seqs; Last-Event-ID resumes), DELETE, /ws, /topics and "
                    "a live console at /. See docs/gateway.md.")
    p.add_argument("--listen", type=_address, default=("127.0.0.1", DEFAULT_GATEWAY_PORT),
                   metavar="HOST:PORT",
                   help=f"where to serve HTTP (default: 127.0.0.1:{DEFAULT_GATEWAY_PORT})")
    p.add_argument("--broker", type=_address, default=("127.0.0.1", DEFAULT_APEX_PORT),
                   metavar="HOST:PORT",
                   help=f"the broker's APEX address (default: 127.0.0.1:{DEFAULT_APEX_PORT})")
    p.add_argument("--domain", default="example.com",
                   help="the broker's APEX domain (default: %(default)s)")
    p.add_argument("--users", metavar="FILE",
                   help="users file (`apexps users add`): HTTP Basic against it")
    p.add_argument("--broker-sasl", action="store_true",
                   help="authenticate each subscription's session to the broker as its HTTP"
                        " user (SCRAM-SHA-256, with the Basic password)")
    p.add_argument("--broker-tls", action="store_true", help="TLS to the broker")
    p.add_argument("--ca", metavar="FILE", help="CA certificates for --broker-tls")
    add_gateway_options(p)
    p.set_defaults(func=lambda args: event_loop.run(_run(args)))
