"""What a `PubsubClient` hands its application: deliveries, link events, ended subscriptions,
and the inbox `events()` reads them from (kept apart from the client's requests and routing)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from adapters.apex.robust_codec import LinkReply, RobustDocument
from adapters.apex.robust_stamp import Stamp

__all__ = ["Delivered", "Ended", "Inbox", "LinkEvent", "LinkListener", "LinkTraffic"]


@dataclass(frozen=True, slots=True)
class Delivered:
    """A message forwarded to us for `topic`."""

    topic: str
    originator: str
    content: bytes
    content_type: str
    #: the `apexps.seq` stamp (link, link seq, source, source seq …), if the broker sent one
    stamp: Stamp | None = None
    #: the ids of our subscriptions the message satisfied (its InRe, draft-content §5.10.1);
    #: None: the broker named none (our one subscription to the topic takes every message)
    in_re: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """A heartbeat, reset or withheld seq on one of our links (only with
    `link_events=True`)."""

    stamp: Stamp
    document: RobustDocument


@dataclass(frozen=True, slots=True)
class Ended:
    """The service cancelled our subscription to `topic` (expiry or topic deletion): the one
    `subscription_id` names, or (None) all of ours to the topic."""

    topic: str | None
    subscriber: str
    subscription_id: str | None = None


#: What `listen_link` hands its listener; None: nothing more will come (the connection is gone
#: and no reconnection will follow).
LinkTraffic = Delivered | LinkEvent | LinkReply | None
LinkListener = Callable[[LinkTraffic], None]


class Inbox:
    """What `events()` yields, in order: asyncio.Queue's `put_nowait`, and a wait for the next,
    for less (a subscriber puts every delivery through it, and the queue's bookkeeping for
    `join()` and a coroutine per item showed among the subscriber's largest costs under
    cProfile)."""

    __slots__ = ("_waiters", "items")

    def __init__(self) -> None:
        self.items: deque[Delivered | Ended | LinkEvent | None] = deque()
        self._waiters: list[asyncio.Future[None]] = []

    def put_nowait(self, item: Delivered | Ended | LinkEvent | None) -> None:
        self.items.append(item)
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait(self) -> None:
        """Until something is put (at once if something is there)."""
        if self.items:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:  # cancelled: no longer waiting
            if waiter in self._waiters:
                self._waiters.remove(waiter)
