"""Feeds: the gateway's subscriptions, each one APEX robust subscriber, fanned out to the HTTP
streams that read it.

Theory of operation
-------------------
A feed is one subscription made through the gateway. It gets a BEEP session of its own to the
broker, attached as a subaddress of the HTTP user's endpoint (`USER/gw-ID@DOMAIN`, RFC 3340
§4.5.1: what an authenticated user may attach as), and a `RobustSubscriber` on the link named
after that endpoint. So the broker's access control judges the user, the broker journals every
delivery on a link nobody else writes to, and a broker restart or a lost connection is the robust
client's business (re-dial, re-attach, gap fill): the feed sees one contiguous stream of
deliveries, each with its link seq, and nothing twice.

The feed's pump takes each delivery, renders its SSE event once, keeps it in a bounded
`ReplayBuffer`, and offers it to every open stream. A stream is a bounded queue: one that is
full (its client does not read) is closed rather than allowed to grow, and its browser comes
back with `Last-Event-ID`.

Event ids. A stream's event ids are the feed's own delivery numbers, 1, 2, 3, … in the order
the robust subscriber handed the deliveries over, not link seqs: a link's seqs start again
in a new epoch (a reset: a failed record, or a broker killed with -9, robust-binding §2.5),
while the robust subscriber carries its stream across the reset (source repair, duplicates
dropped). So a browser's Last-Event-ID means the same thing before and after a broker crash, and
the stream goes on with nothing missed and nothing twice. Each event's JSON still names its
link seq and epoch.

A stream that opens after delivery N is owed every delivery after N. The buffer holds the
latest ones; for older ones the feed asks the broker for their link range (gap fill) on its own
session: `_runs` remembers, for runs of deliveries whose link seqs rose by one, where they sit on
the link (epoch, first seq), so delivery numbers translate to link ranges and back. Those
refilled copies arrive as link traffic like any other, so the feed stands in front of the robust
subscriber's listener and takes the refilled items of the range it asked for; everything else
passes through. The stub never asks for a seq it has delivered, and the feed asks only for seqs
it has, so the two never want the same item.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from adapters.apex.endpoint import Endpoint
from adapters.apex.events_codec import NotifyDoc, WatchReply, decode_events
from adapters.client.pubsub_client import Delivered, Ended, LinkTraffic, PubsubClient
from adapters.client.robust_client import Message, RobustSubscriber
from broker.events import State
from broker.names import NOTIFY_TOPIC
from common.errors import ApexpsError, LinkContextGone, ReplyCode, ServiceNotAvailable

from ._api import (
    DEFAULT_REPLAY,
    HttpError,
    ReplayBuffer,
    SubscribeRequest,
    http_status,
    sse_end,
    sse_event,
)

__all__ = ["CONTROL", "DEFAULT_STREAM_QUEUE", "Connector", "Feed", "Feeds", "Stream"]

log = structlog.get_logger(__name__)

#: Events a stream may have waiting for its client beyond a full replay: a client this far
#: behind is not reading, and its stream is closed (it reconnects with Last-Event-ID).
DEFAULT_STREAM_QUEUE = 256
#: The "seq" of an event that is not a delivery (a reset): written whatever was sent before.
CONTROL = -1
#: Subscriptions the gateway holds at once (each is a BEEP session to the broker).
DEFAULT_MAX_FEEDS = 2000
#: Runs of link positions a feed remembers for refills (a run ends at each heartbeat or reset):
#: older deliveries than these are answered as a refill the broker refused.
MAX_RUNS = 4096


@dataclass(slots=True)
class _Run:
    """Deliveries first_id.. (count of them) carried link seqs first_seq.. of `epoch`."""

    first_id: int
    epoch: int | None
    first_seq: int
    count: int

#: Opens a BEEP session to the broker attached as the endpoint, for that user's credentials.
Connector = Callable[[Endpoint, "Credentials"], Awaitable[PubsubClient]]


@dataclass(frozen=True, slots=True)
class Credentials:
    """Who the HTTP request is: the user, and the password when the broker should see it too
    (SASL as that user; None: an unauthenticated session)."""

    user: str
    password: str | None = None


class Stream:
    """One reader of a feed (an SSE response or a WebSocket): a bounded queue of
    (link seq, event bytes)."""

    def __init__(self, limit: int) -> None:
        self._items: deque[tuple[int, bytes]] = deque()
        self._limit = limit
        self._ready = asyncio.Event()
        #: why the stream ended (None: open)
        self.closed: str | None = None
        #: called when the reader is too far behind: the connection must go now, since its
        #: writer may be waiting for a client that never reads (set by the HTTP handler)
        self.on_overflow: Callable[[], None] | None = None

    def offer(self, seq: int, event: bytes) -> bool:
        """Queue an event; False (and the stream closed) when the reader is too far behind."""
        if self.closed is not None:
            return False
        if len(self._items) >= self._limit:
            self.close("slow reader")
            if self.on_overflow is not None:
                self.on_overflow()
            return False
        self._items.append((seq, event))
        self._ready.set()
        return True

    def close(self, reason: str) -> None:
        if self.closed is None:
            self.closed = reason
        self._ready.set()

    async def get(self) -> tuple[int, bytes] | None:
        """The next event, or None once the stream is closed and what it queued is out."""
        while not self._items:
            if self.closed is not None:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()


@dataclass(eq=False)
class Feed:
    """One gateway subscription; see the module docstring."""

    id: str
    user: str
    request: SubscribeRequest
    client: PubsubClient
    robust: RobustSubscriber
    buffer: ReplayBuffer
    stream_limit: int
    #: the id the broker gave the subscription (content-based §5.8; None from a broker
    #: without ids)
    apex_id: str | None = None
    streams: set[Stream] = field(default_factory=set)
    #: the link range the feed is refilling now (epoch, first, last seq), and what came of it
    _refill: tuple[int | None, int, int] | None = None
    _refilled: list[Message] = field(default_factory=list)
    _refill_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _pump: asyncio.Task[None] | None = None
    _watch: asyncio.Task[None] | None = None
    #: told when the broker ends the subscription by itself (expiry, topic deleted)
    on_end: Callable[[Feed], None] | None = None
    #: deliveries the feed had from the broker again (gap fill) for reconnecting streams
    refilled: int = 0
    #: a resource feed: the broker's answer to its watch (the granted Expires)
    watch: WatchReply | None = None
    #: the number the next delivery gets (its SSE event id)
    _next_id: int = 1
    #: where recent deliveries sit on the link (see the module docstring)
    _runs: deque[_Run] = field(default_factory=lambda: deque(maxlen=MAX_RUNS))

    @property
    def link(self) -> str:
        return self.robust.link

    def start(self) -> None:
        passing = self.client.link_listener(self.link)
        assert passing is not None, "the robust subscriber listens on its link"

        def traffic(item: LinkTraffic) -> None:
            refill = self._refill
            if (refill is not None and isinstance(item, Delivered) and item.stamp is not None
                    and item.stamp.refill and item.stamp.epoch == refill[0]
                    and refill[1] <= item.stamp.link_seq <= refill[2]):
                self._refilled.append(Message(item.stamp, item.content, item.content_type))
                return
            passing(item)

        self.client.listen_link(self.link, traffic)
        self._pump = asyncio.create_task(self._run(), name=f"gateway-feed-{self.id}")
        self._watch = asyncio.create_task(self._watch_end(), name=f"gateway-end-{self.id}")

    async def _watch_end(self) -> None:
        """The service's cancel of our subscription (draft §4.4: on expiry or when the topic
        goes) ends the feed: each stream gets `sse_end`, and the gateway forgets the id."""
        try:
            async for event in self.client.events():
                if not isinstance(event, Ended) or event.topic != self.request.topic or (
                        event.subscription_id not in (None, self.apex_id)):
                    continue
                self._ended_by_broker("the broker ended the subscription")
                return
        except ApexpsError:
            return  # the connection is gone for good: the pump says so

    def _ended_by_broker(self, why: str) -> None:
        log.info("gateway subscription ended by the broker", subscription=self.id,
                 user=self.user, topic=self.request.topic, reason=why)
        end = sse_end(why)
        for stream in self.streams:
            stream.offer(CONTROL, end)
            stream.close("ended")
        self.streams.clear()
        if self.on_end is not None:
            self.on_end(self)

    def render(self, message: Message, ident: int, notify: NotifyDoc | None = None) -> bytes:
        """Delivery number `ident` as its SSE event; `notify`: its Notify, when the caller
        decoded it already (decoding is most of a Notify's cost here: do it once)."""
        stamp = message.stamp
        if self.request.resource is not None:
            notify = notify or _notify(message)
            if notify is not None:
                return sse_event(ident, _notify_view(self.id, stamp.link_seq, stamp.epoch,
                                                     notify), "notify")
        try:
            content: Any = message.content.decode()
        except UnicodeDecodeError:
            content = message.content.hex()
        return sse_event(ident, {
            "subscription": self.id, "topic": message.topic, "seq": stamp.link_seq,
            "epoch": stamp.epoch, "source": stamp.source, "source_seq": stamp.source_seq,
            "content_type": message.content_type, "content": content,
            "time": stamp.time})

    async def _run(self) -> None:
        try:
            async for message in self.robust.messages():
                seq = self._number(message.stamp.epoch, message.stamp.link_seq)
                notify = _notify(message) if self.request.resource is not None else None
                event = self.render(message, seq, notify)
                self.buffer.add(seq, event)
                for stream in list(self.streams):
                    if not stream.offer(seq, event):
                        self.streams.discard(stream)
                        log.warning("gateway stream closed: slow reader", subscription=self.id,
                                    user=self.user, seq=seq)
                if notify is not None and notify.state is State.TERMINATED:
                    self._ended_by_broker(str(notify.reason))
                    return
        except ApexpsError as exc:
            log.error("gateway feed ended", subscription=self.id, error=str(exc))
        for stream in self.streams:
            stream.close("feed ended")

    def _number(self, epoch: int | None, link_seq: int) -> int:
        """The next delivery number, noting where the delivery sits on the link."""
        ident = self._next_id
        self._next_id += 1
        last = self._runs[-1] if self._runs else None
        if (last is not None and last.epoch == epoch
                and last.first_seq + last.count == link_seq
                and last.first_id + last.count == ident):
            last.count += 1
        else:
            self._runs.append(_Run(ident, epoch, link_seq, 1))
        return ident

    def _link_ranges(self, lo: int, hi: int) -> list[tuple[int | None, int, int, int]]:
        """Deliveries lo..hi as link ranges: (epoch, first seq, last seq, first delivery);
        `LinkContextGone` for deliveries older than the runs remembered (the stream then ends
        as for a refill the broker refused)."""
        out = []
        for run in self._runs:
            a, b = max(lo, run.first_id), min(hi, run.first_id + run.count - 1)
            if a <= b:
                out.append((run.epoch, run.first_seq + a - run.first_id,
                            run.first_seq + b - run.first_id, a))
        if not out or out[0][3] != lo:
            raise LinkContextGone(f"deliveries from {lo} are older than this gateway keeps")
        return out

    def open_stream(self, after: int | None) -> tuple[Stream, tuple[int, int] | None]:
        """A new reader that saw everything up to `after`: the buffered deliveries after it
        are queued already, live ones follow; the range returned (if any) must be refilled
        first (`refill`). A watch's first stream (no `after`) gets what the buffer holds: the
        current-state Notify follows the grant at once (draft §4.2), so it is usually in before
        the client's GET, and a watch without it would start blind; a topic stream is live."""
        if after is None and self.request.resource is not None:
            after = self.buffer.evicted
        owed = self.buffer.since(after)
        stream = Stream(len(owed.items) + self.stream_limit)
        for seq, event in owed.items:
            stream.offer(seq, event)
        self.streams.add(stream)
        return stream, owed.gap

    async def refill(self, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """Deliveries lo..hi again from the broker (gap fill of their link ranges), as events,
        in order."""
        async with self._refill_lock:
            caps_max = max(1, (await self.client.capabilities()).max_gap)
            out: list[tuple[int, bytes]] = []
            for epoch, first, last, ident in self._link_ranges(lo, hi):
                start = first
                while start <= last:
                    end = min(last, start + caps_max - 1)
                    self._refill, self._refilled = (epoch, start, end), []
                    try:
                        await self.client.gap(self.link, start, end, epoch)
                    finally:
                        got, self._refill, self._refilled = self._refilled, None, []
                    out += [(ident + m.stamp.link_seq - first, self.render(
                        m, ident + m.stamp.link_seq - first)) for m in got]
                    self.refilled += len(got)
                    start = end + 1
            out.sort(key=lambda item: item[0])
            return out

    def close_stream(self, stream: Stream) -> None:
        self.streams.discard(stream)
        stream.close("closed")

    async def close(self, *, cancel: bool) -> None:
        for stream in self.streams:
            stream.close("cancelled")
        self.streams.clear()
        if cancel:
            with contextlib.suppress(ApexpsError, OSError, TimeoutError):
                if self.request.resource is not None:
                    await self.client.watch(self.request.resource, self.request.events, 0,
                                            watch_id=self.id, link=self.link)
                elif self.apex_id is not None:
                    await self.client.cancel(subscription_id=self.apex_id)
                else:
                    await self.client.cancel(self.request.topic)
        await self.robust.close()
        for task in (self._pump, self._watch):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.client.close()


class Feeds:
    """Every feed of the gateway, by id; `connect` reaches the broker."""

    def __init__(self, connect: Connector, domain: str, *, replay: int = DEFAULT_REPLAY,
                 stream_limit: int = DEFAULT_STREAM_QUEUE,
                 max_feeds: int = DEFAULT_MAX_FEEDS) -> None:
        self.connect, self.domain = connect, domain
        self.replay, self.stream_limit, self.max_feeds = replay, stream_limit, max_feeds
        self.feeds: dict[str, Feed] = {}
        self._pending = 0
        self._closing: set[asyncio.Task[None]] = set()

    def endpoint(self, user: str, ident: str | None = None) -> Endpoint:
        base = Endpoint.parse(user if "@" in user else f"{user}@{self.domain}")
        return base if ident is None else Endpoint(base.address, base.domain, f"gw-{ident}")

    async def subscribe(self, who: Credentials, request: SubscribeRequest) -> Feed:
        """Open a feed; raises `HttpError` with the broker's refusal as an HTTP status."""
        if len(self.feeds) + self._pending >= self.max_feeds:
            raise HttpError(503, f"the gateway holds {self.max_feeds} subscriptions already")
        ident = secrets.token_hex(8)
        self._pending += 1
        client: PubsubClient | None = None
        robust: RobustSubscriber | None = None
        try:
            client = await self.connect(self.endpoint(who.user, ident), who)
            robust = await RobustSubscriber.open(client)
            apex_id, watch = None, None
            if request.resource is not None:
                watch = await client.watch(request.resource, request.events, request.expires,
                                           watch_id=ident, link=robust.link)
            else:
                apex_id = await client.subscribe(
                    request.topic, request.duration, link=robust.link, cached=request.cached,
                    selector=request.selector, selector_class=request.selector_class.value)
        except BaseException as exc:
            # Refused, unreachable, or the HTTP client went away (aiohttp cancels the
            # handler): nothing of the attempt stays open here. A subscription the broker
            # made before a cancel ends with its duration.
            if robust is not None:
                await robust.close()
            if client is not None:
                await client.close()
            if isinstance(exc, ApexpsError):
                raise _refusal(exc) from None
            if isinstance(exc, OSError):
                raise HttpError(503, "the broker is unreachable"
                                     f" ({type(exc).__name__})") from None
            raise
        finally:
            self._pending -= 1
        feed = Feed(ident, who.user, request, client, robust, ReplayBuffer(self.replay),
                    self.stream_limit, apex_id)
        feed.on_end = self._ended
        feed.watch = watch
        feed.start()
        self.feeds[ident] = feed
        log.info("gateway subscribed", subscription=ident, user=who.user, topic=request.topic,
                 link=feed.link)
        return feed

    def _ended(self, feed: Feed) -> None:
        if self.feeds.get(feed.id) is feed:
            del self.feeds[feed.id]
        task = asyncio.create_task(feed.close(cancel=False))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def get(self, ident: str, user: str) -> Feed:
        feed = self.feeds.get(ident)
        if feed is None or feed.user != user:  # another user's id is as good as none
            raise HttpError(404, "no such subscription", "id")
        return feed

    async def cancel(self, ident: str, user: str) -> None:
        feed = self.get(ident, user)
        del self.feeds[ident]
        await feed.close(cancel=True)
        log.info("gateway cancelled", subscription=ident, user=user)

    async def close(self) -> None:
        feeds, self.feeds = list(self.feeds.values()), {}
        for feed in feeds:
            await feed.close(cancel=False)
        await asyncio.gather(*self._closing, return_exceptions=True)


def _refusal(exc: ApexpsError) -> HttpError:
    if isinstance(exc, ServiceNotAvailable):
        return HttpError(503, f"the broker is unavailable: {exc}")
    if exc.code == ReplyCode.PARAMETER_INVALID:
        # The pubsub draft answers a subscribe to an unknown topic 553. Every other parameter
        # of ours was checked here (`parse_subscribe`) or is ours (subscriber, link), so a 553
        # is the topic's absence: 404, as a missing topic is 550 elsewhere.
        return HttpError(404, f"{int(exc.code)} {exc}", "topic")
    return http_status(exc)


def _notify(message: Message) -> NotifyDoc | None:
    """The Notify a resource feed's delivery holds (None for anything else on the link)."""
    if message.stamp.topic != NOTIFY_TOPIC:
        return None
    try:
        doc = decode_events(message.content)
    except ApexpsError:
        return None
    return doc if isinstance(doc, NotifyDoc) else None


def _notify_view(ident: str, seq: int, epoch: int | None, doc: NotifyDoc) -> dict[str, Any]:
    """A Notify as the SSE event's JSON (docs/event-binding.md §5)."""
    versions = []
    for v in doc.versions:
        try:
            content: Any = v.content.decode()
        except UnicodeDecodeError:
            content = v.content.hex()
        versions.append({"source": v.source, "source_seq": v.source_seq,
                         "type": str(v.publish_type), "content_type": v.content_type,
                         "content": content})
    return {"subscription": ident, "seq": seq, "epoch": epoch, "resource": str(doc.resource),
            "state": str(doc.state), "reason": None if doc.reason is None else str(doc.reason),
            "events": sorted(doc.events), "expires": doc.expires, "current": doc.current,
            "versions": versions}

