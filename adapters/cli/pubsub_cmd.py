"""`apexps topic|publish|subscribe`: the apex=pubsub service from the command line.

Every subcommand attaches to the broker as `--as ENDPOINT` on `--server HOST[:PORT]`. Exit codes
(see adapters/cli/main.py): 0 done, 1 the service said no (the reply code and its meaning are
printed), 2 bad usage, 3 the broker is unreachable or went away, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import structlog

from adapters.apex.pubsub_client import Delivered, Ended, PubsubClient
from adapters.cli.client_cmd import FOREVER, _common, add_reconnect_option, content_fields
from adapters.cli.security import client_security

__all__ = ["register"]

log = structlog.get_logger(__name__)


async def _connect(args: argparse.Namespace) -> PubsubClient:
    host, port = args.server
    policy = FOREVER if getattr(args, "reconnect", False) else None
    return await PubsubClient.connect(host, port, args.endpoint, reconnect=policy,
                                      **client_security(args))


async def _topic(args: argparse.Namespace) -> int:
    client = await _connect(args)
    try:
        if args.action == "create":
            await client.create_topic(args.name)
            print(f"created {args.name}")
        elif args.action == "delete":
            await client.delete_topic(args.name)
            print(f"deleted {args.name}")
        else:
            for name in await client.list_topics():
                print(name)
    finally:
        await client.close()
    return 0


def _read_all(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    with open(path, "rb") as f:
        return f.read()


async def _publish(args: argparse.Namespace) -> int:
    client = await _connect(args)
    sent = 0
    try:
        if not args.lines:
            await client.publish(args.topic, _read_all(args.file), args.content_type)
            sent = 1
        else:
            stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
            with stream:
                for line in stream:
                    body = line.rstrip(b"\r\n")
                    await client.publish(args.topic, body, args.content_type)
                    sent += 1  # counted only once the broker said ok (durable)
                    if sent % 1000 == 0:
                        log.info("publishing", topic=args.topic, sent=sent)
    finally:
        print(f"published {sent} message{'s' if sent != 1 else ''} to {args.topic}",
              file=sys.stderr)
        await client.close()
    return 0


def _as_json(event: Delivered) -> str:
    record: dict[str, Any] = {"topic": event.topic, "originator": event.originator,
                              "content_type": event.content_type,
                              **content_fields(event.content)}
    return json.dumps(record, ensure_ascii=False)


async def _subscribe(args: argparse.Namespace) -> int:
    client = await _connect(args)
    try:
        for topic in args.topic:
            await client.subscribe(topic, args.duration)
        print(f"apexps: subscribed to {', '.join(args.topic)} for {args.duration}s",
              file=sys.stderr, flush=True)
        active, seen = set(args.topic), 0
        async for event in client.events():
            if isinstance(event, Ended):
                active.discard(event.topic)
                print(f"apexps: subscription to {event.topic} ended", file=sys.stderr, flush=True)
                if not active:
                    break
                continue
            if not isinstance(event, Delivered):
                continue
            print(_as_json(event), flush=True)
            seen += 1
            if args.count and seen >= args.count:
                break
    finally:
        await client.close()
    return 0


def register(sub: Any) -> None:
    topic = sub.add_parser("topic", help="create, delete or list the broker's topics",
                           description="Manage topics of the apex=pubsub service.")
    topic.add_argument("action", choices=["create", "delete", "list"])
    topic.add_argument("name", nargs="?", help="the topic (for create and delete)")
    _common(topic)
    topic.set_defaults(func=_run_topic)

    pub = sub.add_parser(
        "publish", help="publish FILE (or stdin) to a topic",
        description="Publish one message (the whole input) or, with --lines, one message per"
                    " input line; each is counted as sent only once the broker answered ok,"
                    " which it does once the message is durable in Kafka.")
    pub.add_argument("--topic", required=True)
    pub.add_argument("--lines", action="store_true", help="one message per input line")
    pub.add_argument("--content-type", default="application/octet-stream",
                     help="media type of each message (default: %(default)s)")
    pub.add_argument("file", nargs="?", default="-", metavar="FILE|-",
                     help="what to publish (default: stdin)")
    _common(pub)
    pub.set_defaults(func=lambda args: asyncio.run(_publish(args)))

    subs = sub.add_parser(
        "subscribe", help="subscribe to topics and print each delivery as a JSON line",
        description="Subscribe and print one JSON line per delivered message (topic,"
                    " originator, content); runs until Ctrl-C or every subscription ended.")
    subs.add_argument("--topic", required=True, action="append",
                      help="a topic (repeat for several)")
    subs.add_argument("--duration", type=int, default=3600,
                      help="seconds the subscription lasts (default: %(default)s)")
    subs.add_argument("--count", type=int, default=0,
                      help="exit after this many messages (default: run until ended)")
    add_reconnect_option(subs)
    _common(subs)
    subs.set_defaults(func=lambda args: asyncio.run(_subscribe(args)))


def _run_topic(args: argparse.Namespace) -> int:
    if args.action != "list" and not args.name:
        print(f"apexps topic {args.action}: give the topic NAME", file=sys.stderr)
        return 2
    return asyncio.run(_topic(args))
