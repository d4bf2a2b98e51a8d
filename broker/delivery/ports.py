"""What the delivery core needs of the world, as small Protocols: the link log, the routing
state, the catch-up reader, the clocks and the thread hop.

Each has a production implementation elsewhere (`broker.robust.links.LinkLog`,
`broker.pubsub.PubsubService`, a worker-thread read of `broker.robust.repair.select_catch_up` in
the asyncio driver) and an in-memory fake in `broker.delivery.fakes` that the tests drive.

Threads. The core is single-threaded: every method runs on its owner's thread (the event loop).
Ports that answer later (an append settling on Kafka's poll thread, a catch-up read in a worker
thread) call back on any thread; the core hops every such answer over with `Defer` before it
touches its state, as `broker.publish_gate` does.

Several brokers. Everything the core keeps is per link and follows from the link log: which
links it serves is what `Routes` hands it. A later broker group hands a link to one broker at a
time (the link log's head is where the next owner continues), so the core has no notion of a
single broker: `DeliveryCore.release(link)` drops a link's state when it moves away.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from broker.records import JournalEntry
from broker.robust.link_records import LinkHead, LinkItem, LinkRecord
from broker.robust.links import LinkBatchCallback
from common.errors import ApexpsError

__all__ = ["CatchUpDone", "CatchUpReader", "Clock", "Defer", "LinkLogPort", "Routes", "WallClock"]

#: Run a call on the core's thread (for an asyncio owner: `loop.call_soon_threadsafe`).
Defer = Callable[[Callable[[], None]], object]
#: Seconds on a monotonic clock (heartbeat timing).
Clock = Callable[[], float]
#: Epoch milliseconds (the time a repair's reset says).
WallClock = Callable[[], int]
#: The answer of a catch-up read: the entries to resend, or why there are none.
CatchUpDone = Callable[[list[JournalEntry] | ApexpsError], None]


class LinkLogPort(Protocol):
    """What the core needs of `broker.robust.links.LinkLog`."""

    def append_many(self, items: Sequence[LinkItem], callback: LinkBatchCallback,
                    ) -> list[LinkRecord]:
        """Assign each item the next seq of its link, in order, and return the records at once
        (with a RESET inserted before a link's first item when the link must begin an epoch);
        `callback` hears, once, per record: durable (the record) or failed (the error)."""
        ...

    def last(self, link: str) -> LinkHead | None:
        """The link's newest durable record."""
        ...


class Routes(Protocol):
    """Who receives what: the subscriptions, their selectors and the permission-token filter
    (`broker.pubsub.PubsubService`). Every answer is about the links this broker serves."""

    def recipient_links_for(self, entry: JournalEntry) -> Sequence[tuple[str, str]]:
        """(subscriber, link) `entry` goes to now: one pair per endpoint and link, for every
        active subscription to its topic without a selector or whose selector its stored
        fields satisfy (draft §5.10: one copy, however many of the pair's it satisfies)."""
        ...

    def wants(self, link: str, entry: JournalEntry) -> bool:
        """Whether an active subscription travelling on `link` takes `entry` (its topic, and
        its selector if it has one): what a source repair's catch-up may carry."""
        ...

    def entitled(self, entry: JournalEntry, subscriber: str, *, live: bool = False) -> bool:
        """May `subscriber` see `entry` now (permission tokens, expiry, private topics)?
        `live`: asked by the live fan-out, forwarding it for the first time."""
        ...

    def link_topics(self, link: str) -> Mapping[str, str]:
        """Topic -> subscriber of each active subscription that travels on `link`."""
        ...

    def links_of_subscribers(self) -> Mapping[str, str]:
        """Every link an active subscription travels on -> its subscriber."""
        ...


class CatchUpReader(Protocol):
    """Reads a source repair's catch-up from the journal (`broker.robust.repair`)."""

    def read(self, sources: Sequence[tuple[str, int]], since: int | None,
             topics: Mapping[str, str], until: Mapping[int, int] | None,
             done: CatchUpDone) -> None:
        """Start reading; `done` later gets the entries (per source in order, each once) or
        the `ApexpsError` that refuses the repair (570 and the like). Must not block."""
        ...
