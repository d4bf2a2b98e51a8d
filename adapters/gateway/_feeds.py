"""Feeds: the gateway's subscriptions, each fanned out to the HTTP streams that read it.

Theory of operation
-------------------
A feed is one subscription made through the gateway. Its deliveries come from an upstream
(`_upstream.py`): a BEEP session to the broker attached as the HTTP user (`USER/gw-TOKEN@DOMAIN`)
with one robust link. A topic subscription has an upstream of its own, and a pump task that reads
its robust subscriber. A resource watch shares its user's one `UserSession` with the user's other
watches: the session hands the feed the Notifies that name its id (`Feed.deliver`). Either way the
feed sees its deliveries in link order, each once, across lost connections and broker restarts,
each with its link seq.

`deliver` renders a delivery's SSE event once, keeps it in a bounded `ReplayBuffer`, and offers
it to every open stream. A stream is a bounded queue: one that is full (its client does not read)
is closed rather than allowed to grow, and its browser comes back with `Last-Event-ID`.

Event ids. A stream's event ids are the feed's own delivery numbers, 1, 2, 3, … in the order
the upstream handed the deliveries over, not link seqs: a link's seqs start again in a new epoch
(a reset: a failed record, or a broker killed with -9, robust-binding §2.5), while the robust
subscriber carries its stream across the reset (source repair, duplicates dropped), and on a
shared link a watch's deliveries are not consecutive anyway. So a browser's Last-Event-ID means
the same thing before and after a broker crash, and the stream goes on with nothing missed and
nothing twice. Each event's JSON still names its link seq and epoch.

A stream that opens after delivery N is owed every delivery after N. The buffer holds the
latest ones; for older ones the feed asks the broker again (gap fill) on its upstream:
`LinkPositions` (`_positions.py`) remembers where its deliveries sat on the link and makes the
gap requests, and `Upstream.refetch` keeps only the feed's own seqs of what comes back.
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
from adapters.apex.events_codec import NotifyDoc, WatchReply
from adapters.client.pubsub_client import Ended, PubsubClient
from adapters.client.robust_client import Message, RobustSubscriber
from broker.events import State
from common.errors import ApexpsError, ReplyCode, ServiceNotAvailable

from ._api import (
    DEFAULT_REPLAY,
    HttpError,
    ReplayBuffer,
    SubscribeRequest,
    http_status,
    sse_end,
    sse_event,
)
from ._positions import LinkPositions
from ._upstream import Credentials, Upstream, UserSession, notify_of

__all__ = ["CONTROL", "DEFAULT_STREAM_QUEUE", "Connector", "Credentials", "Feed", "Feeds",
           "Stream"]

log = structlog.get_logger(__name__)

#: Events a stream may have waiting for its client beyond a full replay: a client this far
#: behind is not reading, and its stream is closed (it reconnects with Last-Event-ID).
DEFAULT_STREAM_QUEUE = 256
#: The "seq" of an event that is not a delivery (a reset): written whatever was sent before.
CONTROL = -1
#: Subscriptions the gateway holds at once.
DEFAULT_MAX_FEEDS = 2000
#: Opens a BEEP session to the broker attached as the endpoint, for that user's credentials.
Connector = Callable[[Endpoint, Credentials], Awaitable[PubsubClient]]


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
    upstream: Upstream
    buffer: ReplayBuffer
    stream_limit: int
    #: the id the broker gave the subscription (content-based §5.8; None from a broker
    #: without ids)
    apex_id: str | None = None
    streams: set[Stream] = field(default_factory=set)
    #: the user's shared session, for a resource watch (None: the upstream is the feed's own)
    session: UserSession | None = None
    #: lets go of the upstream when the feed closes (default: closes it)
    release: Callable[[], Awaitable[None]] | None = None
    _pump: asyncio.Task[None] | None = None
    _watch: asyncio.Task[None] | None = None
    #: told when the broker ends the subscription by itself (expiry, topic deleted)
    on_end: Callable[[Feed], None] | None = None
    #: deliveries the feed had from the broker again (gap fill) for reconnecting streams
    refilled: int = 0
    #: a resource feed: the broker's answer to its watch (the granted Expires)
    watch: WatchReply | None = None
    #: delivery numbers (the SSE event ids), and where recent deliveries sit on the link
    positions: LinkPositions = field(default_factory=LinkPositions)
    #: the broker ended the subscription, or the feed was closed
    ended: bool = False

    @property
    def client(self) -> PubsubClient:
        return self.upstream.client

    @property
    def robust(self) -> RobustSubscriber:
        return self.upstream.robust

    @property
    def link(self) -> str:
        return self.upstream.link

    def start(self) -> None:
        """A feed with an upstream of its own: take it over and read it (a shared session's
        feed needs nothing started: the session calls `deliver`)."""
        if self.session is not None:
            return
        self.upstream.start()
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
        self.ended = True
        log.info("gateway subscription ended by the broker", subscription=self.id,
                 user=self.user, topic=self.request.topic, reason=why)
        end = sse_end(why)
        for stream in self.streams:
            stream.offer(CONTROL, end)
            stream.close("ended")
        self.streams.clear()
        if self.on_end is not None:
            self.on_end(self)

    def end_streams(self, why: str) -> None:
        for stream in self.streams:
            stream.close(why)
        self.streams.clear()

    def render(self, message: Message, ident: int, notify: NotifyDoc | None = None) -> bytes:
        """Delivery number `ident` as its SSE event; `notify`: its Notify, when the caller
        decoded it already (decoding is most of a Notify's cost here: do it once)."""
        stamp = message.stamp
        if self.request.resource is not None:
            notify = notify or notify_of(message)
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

    def deliver(self, message: Message, notify: NotifyDoc | None = None) -> None:
        """The feed's next delivery (in link order, each once): numbered, rendered once, kept,
        offered to every stream; a terminated Notify then ends the feed."""
        if self.ended:
            return
        seq = self.positions.number(message.stamp.epoch, message.stamp.link_seq)
        event = self.render(message, seq, notify)
        self.buffer.add(seq, event)
        for stream in list(self.streams):
            if not stream.offer(seq, event):
                self.streams.discard(stream)
                log.warning("gateway stream closed: slow reader", subscription=self.id,
                            user=self.user, seq=seq)
        if notify is not None and notify.state is State.TERMINATED:
            self._ended_by_broker(str(notify.reason))

    async def _run(self) -> None:
        try:
            async for message in self.robust.messages():
                self.deliver(message)
        except ApexpsError as exc:
            log.error("gateway feed ended", subscription=self.id, error=str(exc))
        self.end_streams("feed ended")

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
        if self.ended:  # what it held, and no more
            stream.close("ended")
        else:
            self.streams.add(stream)
        return stream, owed.gap

    async def refill(self, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """Deliveries lo..hi again from the broker (gap fill of their link seqs), as events,
        in order."""
        most = max(1, (await self.client.capabilities()).max_gap)
        out: list[tuple[int, bytes]] = []
        for chunk in self.positions.chunks(lo, hi, most):
            got = await self.upstream.refetch(chunk.epoch, chunk.first, chunk.last,
                                              chunk.wants)
            for m in got:
                ident = chunk.ident(m.stamp.link_seq)
                assert ident is not None  # refetch kept only these
                out.append((ident, self.render(m, ident)))
            self.refilled += len(got)
        out.sort(key=lambda item: item[0])
        return out

    def close_stream(self, stream: Stream) -> None:
        self.streams.discard(stream)
        stream.close("closed")

    async def close(self, *, cancel: bool) -> None:
        self.ended = True
        self.end_streams("cancelled")
        if self.session is not None and self.session.feeds.get(self.id) is self:
            del self.session.feeds[self.id]  # its final Notify is nobody's now
        if cancel:
            with contextlib.suppress(ApexpsError, OSError, TimeoutError):
                if self.request.resource is not None:
                    await self.client.watch(self.request.resource, self.request.events, 0,
                                            watch_id=self.id, link=self.link)
                elif self.apex_id is not None:
                    await self.client.cancel(subscription_id=self.apex_id)
                else:
                    await self.client.cancel(self.request.topic)
        for task in (self._pump, self._watch):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await (self.release or self.upstream.close)()


class Feeds:
    """Every feed of the gateway, by id, and the users' shared sessions; `connect` reaches
    the broker."""

    def __init__(self, connect: Connector, domain: str, *, replay: int = DEFAULT_REPLAY,
                 stream_limit: int = DEFAULT_STREAM_QUEUE,
                 max_feeds: int = DEFAULT_MAX_FEEDS) -> None:
        self.connect, self.domain = connect, domain
        self.replay, self.stream_limit, self.max_feeds = replay, stream_limit, max_feeds
        self.feeds: dict[str, Feed] = {}
        #: each user's session for resource watches (by credentials: a session authenticates
        #: with the password it was opened with), opening or open
        self.sessions: dict[Credentials, asyncio.Future[UserSession]] = {}
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
        try:
            if request.resource is not None:
                feed = await self._watch(who, request, ident)
            else:
                feed = await self._subscribe(who, request, ident)
        except ApexpsError as exc:
            raise _refusal(exc) from None
        except OSError as exc:
            raise HttpError(503, f"the broker is unreachable ({type(exc).__name__})") from None
        finally:
            self._pending -= 1
        feed.on_end = self._ended
        feed.start()
        self.feeds[ident] = feed
        if feed.ended:
            # A watch's Notifies reach the feed from the moment the watch is sent, so its
            # terminated one (the resource deleted in between) may have come already.
            self._ended(feed)
        log.info("gateway subscribed", subscription=ident, user=who.user, topic=request.topic,
                 link=feed.link)
        return feed

    async def _subscribe(self, who: Credentials, request: SubscribeRequest,
                         ident: str) -> Feed:
        """A topic subscription, on an upstream of its own."""
        client: PubsubClient | None = None
        robust: RobustSubscriber | None = None
        try:
            client = await self.connect(self.endpoint(who.user, ident), who)
            robust = await RobustSubscriber.open(client)
            apex_id = await client.subscribe(
                request.topic, request.duration, link=robust.link, cached=request.cached,
                selector=request.selector, selector_class=request.selector_class.value)
        except BaseException:
            # Refused, unreachable, or the HTTP client went away (aiohttp cancels the
            # handler): nothing of the attempt stays open here. A subscription the broker
            # made before a cancel ends with its duration.
            if robust is not None:
                await robust.close()
            if client is not None:
                await client.close()
            raise
        return Feed(ident, who.user, request, Upstream(client, robust),
                    ReplayBuffer(self.replay), self.stream_limit, apex_id)

    async def _watch(self, who: Credentials, request: SubscribeRequest, ident: str) -> Feed:
        """A resource watch, on its user's shared session. The feed is in the session's table
        before the watch is sent: the current-state Notify follows the answer at once, and
        may be read in the same breath."""
        assert request.resource is not None
        session = await self._session(who)
        feed = Feed(ident, who.user, request, session, ReplayBuffer(self.replay),
                    self.stream_limit, session=session,
                    release=lambda: self._release(session))
        session.feeds[ident] = feed
        try:
            feed.watch = await session.client.watch(request.resource, request.events,
                                                    request.expires, watch_id=ident,
                                                    link=session.link)
        except BaseException:
            # A watch the broker made before a cancel ends with its Expires; its Notifies
            # are strays here.
            session.feeds.pop(ident, None)
            await self._release(session)
            raise
        return feed

    async def _session(self, who: Credentials) -> UserSession:
        """The user's session, opened if need be, with one more hold on it."""
        while True:
            opening = self.sessions.get(who)
            if opening is None:
                opening = asyncio.ensure_future(self._open_session(who))
                self.sessions[who] = opening
            try:
                session = await asyncio.shield(opening)
            except asyncio.CancelledError:
                # The HTTP client went away; the session opens anyway and must not stay
                # open with nobody holding it.
                opening.add_done_callback(self._unheld)
                raise
            except BaseException:
                if self.sessions.get(who) is opening:
                    del self.sessions[who]
                raise
            if not (session.closing or session.gone):
                session.holds += 1
                return session
            if self.sessions.get(who) is opening:
                del self.sessions[who]

    async def _open_session(self, who: Credentials) -> UserSession:
        client = await self.connect(self.endpoint(who.user, secrets.token_hex(8)), who)
        try:
            robust = await RobustSubscriber.open(client)
        except BaseException:
            await client.close()
            raise
        session = UserSession(who, client, robust)
        session.on_gone = self._forget
        session.start()
        await session.batch_notifies()
        log.info("gateway session", user=who.user, link=session.link)
        return session

    def _unheld(self, opening: asyncio.Future[UserSession]) -> None:
        if opening.cancelled() or opening.exception() is not None:
            return
        session = opening.result()
        if session.holds == 0 and not session.closing:
            self._drop(session)

    async def _release(self, session: UserSession) -> None:
        """One hold less; the last one closes the session."""
        session.holds -= 1
        if session.holds == 0 and not session.closing:
            await self._drop(session)

    def _forget(self, session: UserSession) -> None:
        """The session is no longer the user's: the next watch opens another."""
        opening = self.sessions.get(session.key)
        if opening is not None and opening.done() and not opening.cancelled() \
                and opening.exception() is None and opening.result() is session:
            del self.sessions[session.key]

    def _drop(self, session: UserSession) -> asyncio.Task[None]:
        session.closing = True
        self._forget(session)
        task = asyncio.create_task(session.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        log.info("gateway session closed", user=session.key.user, link=session.link)
        return task

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
        for opening in list(self.sessions.values()):
            with contextlib.suppress(BaseException):
                session = await opening
                if not session.closing:
                    self._drop(session)
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

