"""`apexps watch TOPIC/MESSAGE-ID`: watch a resource and print each Notify as a JSON line
(docs/event-binding.md).

The command sends one `watch` (the event draft's Subscribe) and prints the grant on stderr, then
one JSON line on stdout per Notify about that watch: its state, reason, the events that caused
it (by name where the draft names them, else the number), the seconds left, whether it carries
the resource's current state, the link seq it came on, and the versions (content as text when it
is UTF-8, else base64). It exits 0 after a terminated Notify (the watch ended: expired, cancelled
elsewhere, its resource gone), after `--count` Notifies, or on Ctrl-C, which cancels the watch
first. `--refresh` refreshes a timed watch when 4/5 of its grant has passed (§3.2.4), so it runs
until its resource goes; without it the watch lasts what was granted.

`apexps watch-decide TOPIC/MESSAGE-ID --subscriber E --id W --approve|--reject` is the other
side: an administrator of the topic (who holds `pubsub:deletetopic` on it) starts or refuses a
watch the broker holds pending for approval (`--approve-watches TOPIC`). It prints one JSON line
and exits 0; a refusal exits 1 with the broker's code (537 not an administrator of the topic,
or the access entries do not allow the subscriber yet; 550 no such pending watch).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
from typing import Any

from adapters.apex.endpoint import Endpoint
from adapters.apex.events_codec import (
    NotifyDoc,
    Version,
    WatchReply,
    decode_events,
)
from adapters.cli import loop as event_loop
from adapters.cli.client_cmd import _common
from adapters.cli.security import client_security
from adapters.client.pubsub_client import Delivered, PubsubClient
from broker.events import PERMANENT, Event, Resource, State, check_events
from broker.names import NOTIFY_TOPIC
from common.errors import ApexpsError, InvalidParameter

__all__ = ["register"]

_NAMES = {e.name.lower(): int(e) for e in Event}
_CODES = {v: k for k, v in _NAMES.items()}


def parse_events(text: str) -> frozenset[int]:
    """`created,modified,deleted` and/or numbers (application codes ≥ 32768)."""
    out = set()
    for word in (w.strip().lower() for w in text.split(",")):
        if word in _NAMES:
            out.add(_NAMES[word])
        elif word.isdigit():
            out.add(int(word))
        else:
            raise argparse.ArgumentTypeError(
                f"{word!r} is not an event: use created, modified, deleted or a number")
    try:
        return check_events(out)
    except ApexpsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _resource(text: str) -> Resource:
    try:
        return Resource.parse(text)
    except InvalidParameter as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _expires(text: str) -> int:
    if text in ("permanent", "forever"):
        return PERMANENT
    if not text.isdigit() or int(text) > PERMANENT:
        raise argparse.ArgumentTypeError(f"{text!r} is not seconds (or 'permanent')")
    return int(text)


def _version(v: Version) -> dict[str, Any]:
    record: dict[str, Any] = {"source": v.source, "sourceseq": v.source_seq,
                              "type": str(v.publish_type), "content_type": v.content_type}
    try:
        record["content"] = v.content.decode("utf-8")
    except UnicodeDecodeError:
        record["content_base64"] = base64.b64encode(v.content).decode()
    return record


def notify_json(doc: NotifyDoc, delivered: Delivered) -> str:
    """One Notify as the JSON line `apexps watch` prints."""
    record: dict[str, Any] = {
        "resource": str(doc.resource), "id": doc.watch_id, "state": str(doc.state),
        "reason": None if doc.reason is None else str(doc.reason),
        "events": [_CODES.get(e, e) for e in sorted(doc.events)],
        "expires": doc.expires, "current": doc.current,
    }
    if delivered.stamp is not None:
        record["link"], record["linkseq"] = delivered.stamp.link, delivered.stamp.link_seq
    record["versions"] = [_version(v) for v in doc.versions]
    return json.dumps(record, ensure_ascii=False)


async def _refresher(client: PubsubClient, args: argparse.Namespace, granted: int) -> None:
    """Refresh at 4/5 of each grant. A refresh the broker could not take now (421, or no
    answer in time) is tried again at once-a-second pace while the grant lasts, saying so on
    stderr; one it refuses ends the refreshing, and the watch then ends with its timeout
    Notify, the CLI's last line. (Before, a failed refresh ended the task silently.)"""
    loop = asyncio.get_running_loop()
    while granted != PERMANENT:
        due = loop.time() + granted
        await asyncio.sleep(granted * 0.8)
        while True:
            try:
                reply = await client.watch(args.resource, args.events, args.expires,
                                           watch_id=args.id, link=args.link)
            except (ApexpsError, TimeoutError) as exc:
                retry = not isinstance(exc, ApexpsError) or exc.retriable
                print(f"apexps: refreshing {args.resource} failed ({exc}); "
                      + ("trying again" if retry else "the watch ends when its grant does"),
                      file=sys.stderr, flush=True)
                if not retry or loop.time() >= due:
                    return
                await asyncio.sleep(min(1.0, max(0.0, due - loop.time()) / 2))
                continue
            granted = reply.expires or granted
            break


def _said(reply: WatchReply) -> None:
    left = "permanent" if reply.expires == PERMANENT else f"{reply.expires}s"
    print(f"apexps: watching {reply.resource} as {reply.watch_id} for {left}",
          file=sys.stderr, flush=True)


async def _watch(args: argparse.Namespace) -> int:
    host, port = args.server
    client = await PubsubClient.connect(host, port, args.endpoint, **client_security(args))
    refresh: asyncio.Task[None] | None = None
    ended = False
    try:
        events = client.events()
        reply = await client.watch(args.resource, args.events, args.expires,
                                   watch_id=args.id, link=args.link)
        _said(reply)
        if args.refresh and reply.expires:
            refresh = asyncio.create_task(_refresher(client, args, reply.expires))
        seen = 0
        async for event in events:
            if not isinstance(event, Delivered) or event.topic != NOTIFY_TOPIC:
                continue
            try:
                doc = decode_events(event.content)
            except ApexpsError:
                continue
            if not isinstance(doc, NotifyDoc) or (doc.resource, doc.watch_id) != (
                    args.resource, args.id):
                continue
            print(notify_json(doc, event), flush=True)
            seen += 1
            if doc.state is State.TERMINATED:
                ended = True
                break
            if args.count and seen >= args.count:
                break
    finally:
        if refresh is not None:
            refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresh
        if not ended and not args.keep:
            with contextlib.suppress(ApexpsError, OSError, TimeoutError):
                await client.watch(args.resource, args.events, 0, watch_id=args.id,
                                   link=args.link)
        await client.close()
    return 0


async def _decide(args: argparse.Namespace) -> int:
    host, port = args.server
    client = await PubsubClient.connect(host, port, args.endpoint, **client_security(args))
    try:
        await client.decide(args.resource, args.subscriber, args.id,
                            approve=args.verdict == "approve")
    finally:
        await client.close()
    print(json.dumps({"resource": str(args.resource), "subscriber": str(args.subscriber),
                      "id": args.id, "verdict": args.verdict, "result": "ok"}), flush=True)
    return 0


def _endpoint(text: str) -> Endpoint:
    try:
        return Endpoint.parse(text)
    except ApexpsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_DECIDE_HELP = """\
Approve or reject a watch the broker holds pending for an administrator (a topic the broker
runs with --approve-watches). Approving starts it: the watcher gets the active Notify with the
item's current state; rejecting ends it: the watcher gets the terminated Notify, reason
rejected. Needs pubsub:deletetopic on the topic. Prints one JSON line:
  {"resource": "equity.quote/IBM", "subscriber": "jade@example.com", "id": "1",
   "verdict": "approve", "result": "ok"}
Pending watches show in WKT=Subscriptions (state pending) with their subscriber and id.

examples:
  apexps watch-decide equity.quote/IBM --as admin@example.com \\
      --subscriber jade@example.com --id 1 --approve
"""


_HELP = """\
Watch a data item (TOPIC/MESSAGE-ID) for events and print each Notify as a JSON line:
  {"resource": "equity.quote/IBM", "id": "1", "state": "active", "reason": null,
   "events": ["modified"], "expires": 3412, "current": false, "link": "...", "linkseq": 7,
   "versions": [{"source": "...", "sourceseq": 12, "type": "update", "content": "..."}]}
The first line (current: true) is the item's state when the watch was granted.

examples:
  apexps watch equity.quote/IBM --as jade@example.com --events modified --expires 600
  apexps watch equity.quote/IBM --as jade@example.com --events created,deleted,32769 \\
      --expires permanent
"""


def register(sub: Any) -> None:
    watch = sub.add_parser(
        "watch", help="watch a data item for events and print each Notify as a JSON line",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=_HELP)
    watch.add_argument("resource", type=_resource, metavar="TOPIC/MESSAGE-ID")
    watch.add_argument("--events", type=parse_events, required=True, metavar="LIST",
                       help="comma list of created, modified, deleted and application codes"
                            " (32768 and above)")
    watch.add_argument("--expires", type=_expires, default=3600, metavar="SECONDS",
                       help="how long the watch lasts, or 'permanent' (default: %(default)s;"
                            " the broker may shorten it)")
    watch.add_argument("--id", default="1", metavar="ID",
                       help="the watch's id: watching again with it refreshes (default: 1)")
    watch.add_argument("--link", metavar="ID",
                       help="the link the Notifies travel on (default: your endpoint)")
    watch.add_argument("--count", type=int, default=0, metavar="N",
                       help="exit after this many Notifies (default: until the watch ends)")
    watch.add_argument("--refresh", action="store_true",
                       help="refresh the watch before it expires")
    watch.add_argument("--keep", action="store_true",
                       help="on exit, leave the watch in place (default: cancel it)")
    _common(watch)
    watch.set_defaults(func=lambda args: event_loop.run(_watch(args)))

    decide = sub.add_parser(
        "watch-decide", help="approve or reject a watch waiting for an administrator",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=_DECIDE_HELP)
    decide.add_argument("resource", type=_resource, metavar="TOPIC/MESSAGE-ID")
    decide.add_argument("--subscriber", type=_endpoint, required=True, metavar="ENDPOINT",
                        help="whose watch it is")
    decide.add_argument("--id", required=True, metavar="ID", help="the watch's id")
    verdict = decide.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--approve", dest="verdict", action="store_const", const="approve",
                         help="start the watch")
    verdict.add_argument("--reject", dest="verdict", action="store_const", const="reject",
                         help="end the watch, reason rejected")
    _common(decide)
    decide.set_defaults(func=lambda args: event_loop.run(_decide(args)))
