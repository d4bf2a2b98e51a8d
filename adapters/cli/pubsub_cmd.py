"""`apexps topic|publish|subscribe`: the apex=pubsub service from the command line.

Every subcommand attaches to the broker as `--as ENDPOINT` on `--server HOST[:PORT]`. Exit codes
(see adapters/cli/main.py): 0 done, 1 the service said no (the reply code and its meaning are
printed), 2 bad usage, 3 the broker is unreachable or went away, 130 interrupted.

`subscribe` has two modes. Plain (the default) prints whatever the service forwards. Robust
(`--link` or `--state`) runs a `RobustSubscriber`: one link, in order, each message once, holes
filled, reconnecting forever, positions kept in the state file. Robust mode is not the default
even though the broker stamps every delivery: it costs a capability query the service must
answer, and a run without `--state` on a link used before asks for that link's history again
(the stub cannot tell "new to me" from "lost"); naming the link or the state file is the
user's way of saying that this is what they want.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import structlog

from adapters.apex.pubsub_codec import message_schema_element, selector_schema_elements
from adapters.apex.robust_stamp import Stamp
from adapters.cli import loop as event_loop
from adapters.cli.client_cmd import FOREVER, _common, add_reconnect_option, content_fields
from adapters.cli.security import client_security
from adapters.client.content import check_expires, message_content
from adapters.client.publisher import (
    DEFAULT_WINDOW,
    PublisherStats,
    ReliablePublisher,
)
from adapters.client.pubsub_client import Delivered, Ended, PubsubClient
from adapters.client.reconnect import (
    ConnectionEvent,
    Disconnected,
    Reconnected,
    ReconnectingApexClient,
    ReconnectPolicy,
)
from adapters.client.robust_client import Message, RobustSubscriber
from broker.pubsub.ingest import MAX_REVISION
from broker.selectors import SelectorClass
from common.errors import ConfigError, ParameterSyntaxError

__all__ = ["register"]

log = structlog.get_logger(__name__)

#: `apexps publish` rides out a broker restart: it re-dials every few seconds, for half an hour.
PUBLISH_RECONNECT = ReconnectPolicy(max_attempts=360, wait=0.25, wait_max=5.0)
#: A progress line on stderr this often (seconds), once a run lasts that long.
PROGRESS_EVERY_S = 2.0
#: Bytes read from the input at a time (off the event loop, so acks keep flowing meanwhile).
READ_CHUNK = 64 * 1024
#: What `--type` offers: XEP-0040's publish types (snapshot is a subscriber's request).
PUBLISH_TYPES = ("update", "correction", "image", "drop", "add")


async def _connect(args: argparse.Namespace) -> PubsubClient:
    host, port = args.server
    policy = FOREVER if getattr(args, "reconnect", False) else None
    return await PubsubClient.connect(host, port, args.endpoint, reconnect=policy,
                                      **client_security(args))


async def _topic(args: argparse.Namespace) -> int:
    schemas = _schemas(args) if args.action == "create" else {}  # bad files: before connecting
    client = await _connect(args)
    try:
        if args.action == "create":
            await client.create_topic(args.name, description=args.description, **schemas)
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


def _schemas(args: argparse.Namespace) -> dict[str, Any]:
    """createtopic's schema elements from `--schema FILE.xsd|NAME` and `--selector-schema`.

    `--schema` is a file when one exists by that name (or the name ends in .xsd or holds a
    slash); otherwise it names the topic whose message schema the new topic takes."""
    out: dict[str, Any] = {}
    given = args.schema
    if given is not None:
        path = Path(given)
        if path.is_file() or given.endswith(".xsd") or "/" in given:
            out["message_schema"] = message_schema_element(_read_file(path))
        else:
            out["message_schema"] = message_schema_element(named=given)
    if args.selector_schema is not None:
        out["selector_schemas"] = selector_schema_elements(_read_file(Path(args.selector_schema)))
    return out


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read_all(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    with open(path, "rb") as f:
        return f.read()


async def _lines(stream: IO[bytes]) -> AsyncIterator[bytes]:
    """The input's lines without their line end. A daemon thread reads: a pipe that is slow to
    fill must not stall the event loop, which meanwhile takes acks and reconnects, and Ctrl-C
    must not wait for a read of a terminal to return (the default executor would). It stays at
    most a few chunks ahead of the publisher."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue(maxsize=4)

    def read() -> None:
        try:
            while chunk := stream.read1(READ_CHUNK):  # type: ignore[attr-defined]
                asyncio.run_coroutine_threadsafe(chunks.put(chunk), loop).result()
        except OSError as exc:
            log.error("reading the input failed", error=str(exc))
        finally:  # the end (b""), also after an error; nothing to tell if the loop is gone
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(chunks.put(b""), loop)

    threading.Thread(target=read, name="apexps-publish-input", daemon=True).start()
    rest = b""
    while chunk := await chunks.get():
        *lines, rest = (rest + chunk).split(b"\n")
        for line in lines:
            yield line.removesuffix(b"\r")
    if rest:
        yield rest.removesuffix(b"\r")


class _Progress:
    """Progress of a long `apexps publish` on stderr, and what happens to the connection."""

    def __init__(self, topic: str, stats: PublisherStats) -> None:
        self.topic, self.stats = topic, stats
        self.started = time.monotonic()
        self.read = 0

    def connection(self, event: ConnectionEvent) -> None:
        if isinstance(event, Disconnected):
            _say(f"connection to the broker lost; reconnecting (acknowledged so far:"
                 f" {self.stats.acked})")
        elif isinstance(event, Reconnected):
            _say(f"reconnected after {event.attempts} attempt(s); sending again what is not"
                 " yet acknowledged")

    async def run(self, publisher: ReliablePublisher) -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            s = self.stats
            rate = s.acked / max(time.monotonic() - self.started, 1e-9)
            _say(f"{s.acked} published to {self.topic} ({rate:,.0f}/s), read {self.read},"
                 f" unacknowledged {publisher.unacknowledged}, resent {s.resent},"
                 f" reconnects {s.disconnects}")


def _say(text: str) -> None:
    print(f"apexps: {text}", file=sys.stderr, flush=True)


_DEFAULT_TYPE = "application/octet-stream"


def _envelope(args: argparse.Namespace) -> Callable[[bytes], bytes] | None:
    """With --revision or --expires, each body goes inside `ps:message-content` carrying them
    (and --message-id): the draft's headers travel in the content (§5.2)."""
    if args.revision is None and args.expires is None:
        return None
    return functools.partial(message_content, message_id=args.message_id,
                             revision=args.revision, expires=args.expires)


async def _publish(args: argparse.Namespace) -> int:
    body = None if args.lines else _read_all(args.file)
    host, port = args.server
    client = await PubsubClient.connect(host, port, args.endpoint, reconnect=PUBLISH_RECONNECT,
                                        **client_security(args))
    meta: dict[str, Any] = {"publish_type": args.type, "message_id": args.message_id,
                            "token": args.token}
    wrap = _envelope(args)
    content_type = args.content_type
    if wrap is not None and content_type == _DEFAULT_TYPE:
        content_type = "application/xml"  # the envelope is XML whatever the body is
    stats = PublisherStats()
    reporter: asyncio.Task[None] | None = None
    try:
        publisher = await ReliablePublisher.start(client, window=args.window)
        stats = publisher.stats
        progress = _Progress(args.topic, stats)
        assert isinstance(client.client, ReconnectingApexClient)
        client.client.add_listener(progress.connection)
        if body is not None:
            await publisher.send(args.topic, body if wrap is None else wrap(body), content_type,
                                 **meta)
        else:
            reporter = asyncio.create_task(progress.run(publisher))
            stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
            with stream:
                async for line in _lines(stream):
                    if stats.errors:
                        break  # the service said no: stop here (flush reports it)
                    progress.read += 1
                    await publisher.send(args.topic, line if wrap is None else wrap(line),
                                         content_type, **meta)
        await publisher.flush()
    finally:
        if reporter is not None:
            reporter.cancel()
        # counted only once the broker said ok (durable)
        print(f"published {stats.acked} message{'s' if stats.acked != 1 else ''} to"
              f" {args.topic}", file=sys.stderr)
        await client.close()
    return 0


def stamp_fields(stamp: Stamp) -> dict[str, Any]:
    """A JSON line's view of a data stamp: where the message stands on its link and which
    message of which source it is (docs/robust-binding.md §2)."""
    record: dict[str, Any] = {
        "link": stamp.link, "epoch": stamp.epoch, "linkseq": stamp.link_seq,
        "source": stamp.source, "sourceseq": stamp.source_seq,
        "type": None if stamp.publish_type is None else str(stamp.publish_type),
    }
    for key, value in (("messageid", stamp.message_id), ("token", stamp.token),
                       ("time", stamp.time)):
        if value is not None:
            record[key] = value
    if stamp.snapshot:
        record["snapshot"] = True  # an item's image or delta sent as state (§9)
    return record


def _satisfied(ids: Mapping[str, list[str]], topic: str,
               in_re: tuple[str, ...] | None) -> dict[str, Any]:
    """The JSON line's "subscriptions": the ids the delivery satisfied — its InRe, or without
    one our one subscription to the topic (the broker leaves InRe out only then)."""
    chosen = list(in_re) if in_re else ids.get(topic, [])[:1]
    return {"subscriptions": chosen} if chosen else {}


def _as_json(event: Delivered, ids: Mapping[str, list[str]]) -> str:
    record: dict[str, Any] = {"topic": event.topic, "originator": event.originator,
                              **(stamp_fields(event.stamp) if event.stamp else {}),
                              **_satisfied(ids, event.topic, event.in_re),
                              "content_type": event.content_type,
                              **content_fields(event.content)}
    return json.dumps(record, ensure_ascii=False)


def _message_json(message: Message, ids: Mapping[str, list[str]]) -> str:
    record: dict[str, Any] = {"topic": message.topic, **stamp_fields(message.stamp),
                              **_satisfied(ids, message.topic, message.stamp.in_re),
                              "content_type": message.content_type,
                              **content_fields(message.content)}
    return json.dumps(record, ensure_ascii=False)


def _subscribed(topic: str, duration: int, sub_id: str | None, args: argparse.Namespace, *,
                ids: dict[str, list[str]], link: str | None = None) -> None:
    """Say, once, which subscription was made (stderr: stdout holds only deliveries)."""
    if sub_id is not None:
        ids.setdefault(topic, []).append(sub_id)
    what = "" if args.selector is None else f" selecting {args.selector_class} {args.selector!r}"
    where = "" if link is None else f" on link {link}"
    print(f"apexps: subscribed to {topic} for {duration}s{where} (subscription id"
          f" {sub_id}){what}", file=sys.stderr, flush=True)


async def _subscribe(args: argparse.Namespace) -> int:
    if args.link is not None or args.state is not None or args.snapshot:
        return await _subscribe_robust(args)
    client = await _connect(args)
    try:
        ids: dict[str, list[str]] = {}
        for topic in args.topic:
            sub_id = await client.subscribe(topic, args.duration, cached=args.cached,
                                            selector=args.selector,
                                            selector_class=args.selector_class)
            _subscribed(topic, args.duration, sub_id, args, ids=ids)
        active, seen = set(args.topic), 0
        async for event in client.events():
            if isinstance(event, Ended):
                if _ended(event, ids, active):
                    break
                continue
            if not isinstance(event, Delivered):
                continue
            print(_as_json(event, ids), flush=True)
            seen += 1
            if args.count and seen >= args.count:
                break
    finally:
        await client.close()
    return 0


async def _subscribe_robust(args: argparse.Namespace) -> int:
    if args.state is not None:
        where = os.path.dirname(os.path.abspath(args.state))
        if not os.path.isdir(where):
            print(f"apexps subscribe: --state {args.state}: no directory {where}",
                  file=sys.stderr)
            return 2
    host, port = args.server
    client = await PubsubClient.connect(host, port, args.endpoint, reconnect=FOREVER,
                                        **client_security(args))
    try:
        robust = await RobustSubscriber.open(client, args.link, state=args.state)
        loop = asyncio.get_running_loop()
        # SIGTERM stops as cleanly as the end of --count: the positions of what was printed
        # are saved (Ctrl-C does the same through the cancelled task's finally)
        loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(robust.close()))
        ids: dict[str, list[str]] = {}
        watcher = asyncio.create_task(_until_ended(client, robust, set(args.topic), ids))
        try:
            for topic in args.topic:
                sub_id = await robust.subscribe(topic, args.duration, snapshot=args.snapshot,
                                                cached=args.cached,
                                                selector=args.selector,
                                                selector_class=args.selector_class)
                _subscribed(topic, args.duration, sub_id, args, ids=ids, link=robust.link)
            seen = 0
            async for message in robust.messages():
                print(_message_json(message, ids), flush=True)
                seen += 1
                if args.count and seen >= args.count:
                    break
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await robust.close()
            log.info("robust subscriber stopped", link=robust.link, resumes=robust.resumes,
                     refilled=robust.refilled, **asdict(robust.counters))
    finally:
        await client.close()
    return 0


def _ended(event: Ended, ids: dict[str, list[str]], active: set[str]) -> bool:
    """Note a subscription the service ended; True once none of ours is left."""
    topic = event.topic
    if topic is None or topic not in active:
        return False
    left = [i for i in ids.get(topic, []) if event.subscription_id not in (None, i)]
    ids[topic] = left
    if not left:
        active.discard(topic)
    which = "" if event.subscription_id is None else f" (subscription id {event.subscription_id})"
    print(f"apexps: subscription to {topic} ended{which}", file=sys.stderr, flush=True)
    return not active


async def _until_ended(client: PubsubClient, robust: RobustSubscriber, active: set[str],
                       ids: dict[str, list[str]]) -> None:
    """Close `robust` once the service has ended every subscription (expiry, topic deleted)."""
    async for event in client.events():
        if isinstance(event, Ended) and _ended(event, ids, active):
            await robust.close()
            return


async def _cancel(args: argparse.Namespace) -> int:
    client = await _connect(args)
    try:
        # 568 (nothing matched) and the rest: the CLI's one error line and exit code
        await client.cancel(args.topic, subscription_id=args.id)
    finally:
        await client.close()
    what = (f"subscription {args.id}" if args.id else
            f"every subscription to {args.topic}" if args.topic else "every subscription")
    print(f"apexps: cancelled {what}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    topic = sub.add_parser("topic", help="create, delete or list the broker's topics",
                           description="Manage topics of the apex=pubsub service.")
    # One sub-command per action, each with its own positional: with `action` and an optional
    # `name` side by side, argparse could not take options between the two.
    actions = topic.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, text in (("create", "create topic NAME"), ("delete", "delete topic NAME"),
                         ("list", "list the topics")):
        each = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        if action != "list":
            each.add_argument("name", metavar="NAME", help="the topic")
        if action == "create":
            each.add_argument(
                "--schema", metavar="FILE.xsd|NAME",
                help="the message schema every publication must satisfy (561 otherwise): an"
                     " XML Schema file, or the name of a topic whose message schema to take")
            each.add_argument(
                "--selector-schema", metavar="FILE",
                help="what subscribers may select on: a <selector-schema class='JMS'> file"
                     " (several inside <selector-schemas>); without it, the message schema")
            each.add_argument("--description", help="what the topic carries, in a sentence")
        _common(each)
        each.set_defaults(func=_run_topic)

    pub = sub.add_parser(
        "publish", help="publish FILE (or stdin) to a topic, each message exactly once",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Publish one message (the whole input) or, with --lines, one message\n"
                    "per input line.\n\n"
                    "Each message is counted as published only once the broker answered ok,\n"
                    "which it does once the message is durable in Kafka. Messages are numbered\n"
                    "(publisher seqs) after where this endpoint's publishing stands, so the\n"
                    "broker keeps each one exactly once: if the connection is lost or the\n"
                    "broker restarts, apexps reconnects (every few seconds, for up to half an\n"
                    "hour) and sends again whatever is not yet acknowledged.",
        epilog="Run one publisher per endpoint at a time: two numbering the same endpoint's\n"
               "messages would take each other's for copies (use another endpoint, e.g.\n"
               "fred/appl=feed2@example.com, for a second one).\n\n"
               "examples:\n"
               "  apexps publish --topic equity.quote --as fred@example.com quote.xml\n"
               "  tail -f ticks.log | apexps publish --topic ticks --lines --as feed@example.com\n"
               "  apexps publish --topic equity.quote --type image --message-id IBM \\\n"
               "      --as fred@example.com --content-type application/xml ibm.xml")
    pub.add_argument("--topic", required=True, help="the topic to publish to")
    pub.add_argument("--lines", action="store_true",
                     help="one message per input line (without its line end); progress every"
                          f" {PROGRESS_EVERY_S:g} s on stderr")
    pub.add_argument("--content-type", default=_DEFAULT_TYPE, metavar="TYPE",
                     help="media type of each message (default: %(default)s)")
    pub.add_argument("--type", default="update", choices=PUBLISH_TYPES,
                     help="the publish type of every message (XEP-0040; default: %(default)s)")
    pub.add_argument("--message-id", metavar="ID",
                     help="the data item the messages act on, with the topic (e.g. IBM)")
    pub.add_argument("--revision", type=_revision, metavar="R",
                     help="revision-id header (0..2147483647): replaces earlier revisions of"
                          " the same --message-id (draft §5.2.1); wraps each message in"
                          " ps:message-content")
    pub.add_argument("--expires", type=_expires, metavar="DATE|0|*",
                     help="expiration-date header: an ISO 8601 date-time, 0 (deliver to"
                          " current subscribers only, never cache) or * (never expires);"
                          " wraps each message in ps:message-content")
    pub.add_argument("--token", metavar="TOKEN",
                     help="the in-band permission token every message carries")
    pub.add_argument("--window", type=_positive, default=DEFAULT_WINDOW, metavar="N",
                     help="messages kept unacknowledged at most, to send again after a"
                          " reconnect (default: %(default)s)")
    pub.add_argument("file", nargs="?", default="-", metavar="FILE|-",
                     help="what to publish (default: stdin)")
    _common(pub)
    pub.set_defaults(func=lambda args: event_loop.run(_publish(args)))

    subs = sub.add_parser(
        "subscribe", help="subscribe to topics and print each delivery as a JSON line",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_SUBSCRIBE_HELP)
    subs.add_argument("--topic", required=True, action="append",
                      help="a topic (repeat for several)")
    subs.add_argument("--duration", type=int, default=3600, metavar="SECONDS",
                      help="seconds the subscription lasts (default: %(default)s)")
    subs.add_argument("--count", type=int, default=0, metavar="N",
                      help="exit after this many messages (default: run until ended)")
    subs.add_argument("--selector", metavar="EXPR",
                      help="only the messages this selector matches (draft-content §5.6),"
                           " e.g. \"symbol IN ('XMPL', 'TEST') AND net-change-pct > 5.0\"")
    subs.add_argument("--cached", action="store_true",
                      help="first the topic's cached messages (per message-id its latest"
                           " unexpired revision, through --selector), then live ones"
                           " (draft-content §5.8)")
    subs.add_argument("--class", dest="selector_class", default="JMS",
                      choices=[c.value for c in SelectorClass],
                      help="the selector's class (default: %(default)s)")
    robust = subs.add_argument_group(
        "robust delivery", "any of these turns it on; it implies --reconnect")
    robust.add_argument("--link", metavar="ID",
                        help="the link to receive on: a named stream the broker keeps for you"
                             " (default with --state: the link the file names, else your"
                             " endpoint)")
    robust.add_argument("--snapshot", action="store_true",
                        help="first the current image and deltas of every data item of the"
                             " topics (lines with \"snapshot\": true), then live messages"
                             " (docs/robust-binding.md §9)")
    robust.add_argument("--state", metavar="FILE",
                        help="keep the position (link seq, source seqs) in FILE, rewritten"
                             " atomically; a new run resumes right after the last message"
                             " the previous one printed")
    add_reconnect_option(subs)
    _common(subs)
    subs.set_defaults(func=lambda args: event_loop.run(_subscribe(args)))

    cancel = sub.add_parser(
        "cancel", help="cancel subscriptions: one by id, all to a topic, or all",
        description="Cancel your subscriptions (draft-content §5.8.2): the one --id names,"
                    " every one to --topic, or with --all every one you have. Exits 1 with"
                    " code 568 when nothing matched.")
    which = cancel.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", metavar="N", help="the subscription id subscribe printed")
    which.add_argument("--topic", help="every subscription of yours to this topic")
    which.add_argument("--all", action="store_true", help="every subscription of yours")
    _common(cancel)
    cancel.set_defaults(func=lambda args: event_loop.run(_cancel(args)))


_SUBSCRIBE_HELP = """\
Subscribe to topics and print one JSON line per message on stdout: topic, the
sequence stamp (link, epoch, linkseq, source, sourceseq, type, and messageid,
token, time when present), the ids of the subscriptions it satisfied
("subscriptions"), content_type, and content (content_base64 if it is not
UTF-8). Each subscription's id is said once on stderr. With --selector only the
messages it matches come (JMS or --class RFC-2254). Runs until Ctrl-C, --count,
or every subscription ended.

Robust delivery (--link or --state): the messages of one link, in link order,
each exactly once. Holes are noticed (also by heartbeats on a quiet link) and
filled by gap requests; after a lost connection or a broker restart it
reconnects and asks for what it missed. With --state the position survives
this command too: run it again with the same file and it goes on where the last
run stopped, without loss or repeats. Notices (delayed, repaired, reset, lost,
silent link) go to the log on stderr, never to stdout. Without --state, a run
on a link used before asks for that link's history again.

examples:
  apexps subscribe --as jade@example.com --topic equity.quote
  apexps subscribe --as jade@example.com --topic equity.quote.service \\
      --selector "symbol IN ('XMPL', 'TEST') AND net-change-pct > 5.0"
  apexps subscribe --as jade@example.com --topic equity.quote \\
      --link desk-1 --state desk-1.json
"""


def _revision(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_REVISION:
        raise argparse.ArgumentTypeError(f"a revision is 0..{MAX_REVISION}, not {text!r}")
    return int(text)


def _expires(text: str) -> str:
    try:
        return check_expires(text)
    except ParameterSyntaxError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {value}")
    return value


def _run_topic(args: argparse.Namespace) -> int:
    return event_loop.run(_topic(args))
