"""Upstreams: the gateway's BEEP sessions to the broker, each with one robust link, and the
gap fill that fetches a feed's older deliveries again.

Theory of operation
-------------------
An upstream is one `PubsubClient` (a BEEP session attached as a subaddress of the HTTP user's
endpoint, `USER/gw-TOKEN@DOMAIN`, RFC 3340 §4.5.1) and one `RobustSubscriber` on the link named
after that endpoint. The broker's access control judges the user; the robust client makes the
link one contiguous stream of deliveries, each once, across lost connections and broker
restarts.

Resource watches share: `UserSession` is the one upstream of each authenticated user (created
with that user's first watch, closed after the last), and every watch of the user is made on its
link. The broker gives the subscriber one notify subscription per link (docs/event-binding.md
§4), so all the user's Notifies arrive on that link, each naming its watch id, which the gateway
chose (the feed id). `UserSession.deliver` decodes each Notify once and hands it to the feed of
that id, in the read loop (`RobustSubscriber.deliver_to`: no queue, no task per feed). A Notify
whose id the session does not hold (a watch just cancelled: its final Notify) is dropped. The
table is the session's own: a Notify on user B's link can reach only B's feeds, and the broker
puts on B's link only Notifies of B's watches.

Why share: a session per watch cost the gateway a connection, a robust subscriber with its tick
task, a pump task and a queue per watch, and the broker a session, a link and a link-log stream
per watch. At 1,000 watches the gateway woke 1,000 tick tasks a second, as often as Notifies
came. Topic subscriptions keep an upstream each (`Upstream` alone): each is its own
subscription with its own selector and duration on its own link, and sharing them would mean
telling apart the deliveries of overlapping subscriptions (`in_re`), which the broker does not
always name.

Gap fill (`Upstream.refetch`). A feed remembers where its deliveries sat on the link (epoch,
seq). On a shared link they are not consecutive, so the feed asks for the link ranges that
cover them, at most the service's max gap seqs each, and keeps only the seqs it asked for
(`wanted`): the others are the user's other watches' Notifies. Refilled copies arrive as link
traffic like any other, so the upstream stands in front of the robust subscriber's listener and
takes the refilled items of the range being fetched; everything else passes through. The stub
never asks for a seq it has delivered, and a feed asks only for seqs it has, so the two never
want the same item. One fetch at a time per upstream (a lock): the taken range is unambiguous.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from adapters.apex.events_codec import NotifyDoc, decode_events
from adapters.client.pubsub_client import Delivered, LinkTraffic, PubsubClient
from adapters.client.reconnect import ConnectionEvent, Reconnected, ReconnectingApexClient
from adapters.client.robust_client import Message, RobustSubscriber
from broker.names import NOTIFY_TOPIC
from common.errors import ApexpsError

if TYPE_CHECKING:
    from ._feeds import Feed

__all__ = ["Credentials", "Upstream", "UserSession", "notify_of"]

log = structlog.get_logger(__name__)

#: The broker's own duration for a notify subscription (it ends with the watches' link).
MAX_DURATION = 2_147_483_647


@dataclass(frozen=True, slots=True)
class Credentials:
    """Who the HTTP request is: the user, and the password when the broker should see it too
    (SASL as that user; None: an unauthenticated session)."""

    user: str
    password: str | None = None


class Upstream:
    """One session and its robust link, and the gap fill on it; see the module docstring."""

    def __init__(self, client: PubsubClient, robust: RobustSubscriber) -> None:
        self.client, self.robust = client, robust
        #: the link range being fetched now (epoch, first, last seq), and what came of it
        self._taking: tuple[int | None, int, int] | None = None
        self._taken: list[Message] = []
        self._lock = asyncio.Lock()

    @property
    def link(self) -> str:
        return self.robust.link

    def start(self) -> None:
        """Stand in front of the robust subscriber's listener (call once it listens)."""
        passing = self.client.link_listener(self.link)
        assert passing is not None, "the robust subscriber listens on its link"

        def traffic(item: LinkTraffic) -> None:
            taking = self._taking
            if (taking is not None and isinstance(item, Delivered) and item.stamp is not None
                    and item.stamp.refill and item.stamp.epoch == taking[0]
                    and taking[1] <= item.stamp.link_seq <= taking[2]):
                self._taken.append(Message(item.stamp, item.content, item.content_type))
                return
            passing(item)

        self.client.listen_link(self.link, traffic)

    async def refetch(self, epoch: int | None, first: int, last: int,
                      wanted: Callable[[int], bool]) -> list[Message]:
        """Link seqs first..last of `epoch` again (gap fill, at most the service's max gap a
        request), those `wanted` says are asked for, in link order."""
        async with self._lock:
            most = max(1, (await self.client.capabilities()).max_gap)
            out: list[Message] = []
            start = first
            while start <= last:
                end = min(last, start + most - 1)
                self._taking, self._taken = (epoch, start, end), []
                try:
                    await self.client.gap(self.link, start, end, epoch)
                finally:
                    got, self._taking, self._taken = self._taken, None, []
                out += [m for m in got if wanted(m.stamp.link_seq)]
                start = end + 1
            return out

    async def close(self) -> None:
        await self.robust.close()
        await self.client.close()


class UserSession(Upstream):
    """The one upstream of a user's resource watches: Notifies demultiplexed by watch id to
    the feeds it holds; see the module docstring."""

    def __init__(self, key: Credentials, client: PubsubClient,
                 robust: RobustSubscriber) -> None:
        super().__init__(client, robust)
        self.key = key
        #: the user's feeds on this session, by watch id (= feed id)
        self.feeds: dict[str, Feed] = {}
        #: feeds and subscribes in progress that hold the session open
        self.holds = 0
        self.closing = False
        #: the connection is gone for good: no new watch may come here (the feeds on it end)
        self.gone = False
        #: told when the connection is gone for good
        self.on_gone: Callable[[UserSession], None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: Notifies dropped for a watch id the session does not hold
        self.strays = 0

    def start(self) -> None:
        self.robust.deliver_to(self.deliver)
        super().start()
        self._tasks = [
            asyncio.create_task(self._follow(), name=f"gateway-session-{self.link}"),
            asyncio.create_task(self._drain(), name=f"gateway-session-events-{self.link}")]
        if isinstance(self.client.client, ReconnectingApexClient):
            self.client.client.add_listener(self._reconnected)

    def _reconnected(self, event: ConnectionEvent) -> None:
        """A restarted broker keeps the notify subscription (it is journaled) but not the
        packing, which lives in its memory: ask again."""
        if isinstance(event, Reconnected) and not self.closing:
            task = asyncio.create_task(self.batch_notifies())
            self._tasks.append(task)
            task.add_done_callback(self._tasks.remove)

    async def batch_notifies(self) -> None:
        """Make the link's notify subscription ourselves, before the first watch, asking for
        live items packed (robust-binding §5.4): at hundreds of Notifies a second the broker
        then sends a few data frames where it sent one per Notify, and the gateway decodes a
        few envelopes. The broker's first watch finds it (it is the subscription it would
        make: `WKT=Notify`, this link, the selector `link = 'LINK'`) and makes none. Refused
        (an access policy without `pubsub:subscribe` on `WKT=Notify`), the broker makes its
        own at the first watch, unpacked: slower, not wrong."""
        try:
            await self.client.subscribe(NOTIFY_TOPIC, MAX_DURATION, link=self.link,
                                        selector="link = '" + self.link.replace("'", "''")
                                        + "'")
        except (ApexpsError, OSError, TimeoutError) as exc:
            log.info("gateway session without packed Notifies", link=self.link,
                     error=str(exc))

    def deliver(self, message: Message) -> None:
        notify = notify_of(message)
        feed = None if notify is None else self.feeds.get(notify.watch_id)
        if feed is None:
            self.strays += 1
            return
        feed.deliver(message, notify)

    async def _follow(self) -> None:
        """The robust subscriber's notices; when its connection is gone for good, every feed
        of the session ends (their streams close, as a feed's pump does)."""
        try:
            async for _ in self.robust.events():
                pass
        except ApexpsError as exc:
            log.error("gateway session ended", link=self.link, error=str(exc))
            self.gone = True
            if self.on_gone is not None:
                self.on_gone(self)
            for feed in list(self.feeds.values()):
                feed.end_streams("feed ended")

    async def _drain(self) -> None:
        """The client's other events (subscription ends): a watch ends by its terminated
        Notify, so they are read only so that they do not pile up."""
        with contextlib.suppress(ApexpsError):
            async for _ in self.client.events():
                pass

    async def close(self) -> None:
        self.closing = True
        self.feeds.clear()
        if isinstance(self.client.client, ReconnectingApexClient):
            self.client.client.remove_listener(self._reconnected)
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await super().close()


def notify_of(message: Message) -> NotifyDoc | None:
    """The Notify a delivery holds (None for anything else on the link)."""
    if message.stamp.topic != NOTIFY_TOPIC:
        return None
    try:
        doc = decode_events(message.content)
    except ApexpsError:
        return None
    return doc if isinstance(doc, NotifyDoc) else None
