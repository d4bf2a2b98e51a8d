"""The values of resource event notification (draft-wang-p2psip-event-notification §4): resources,
events, states, reasons, the Expires policy, and which events one journaled message causes.

A resource is a data item: topic plus message-id (broker/robust/items.py). Its events are the
draft's EventId (§4.1.1): created 1, modified 2, deleted 3, and application codes from 0x8000.
Codes 4..0x7fff are reserved for "other documents" by the draft; apexps understands none of
them, so a watch naming one is refused (571), as is anything above 32 bits.

Which events a message causes (`events_of`) is read off the item transition the message makes,
which the item store's own reducer decides (so the events can never disagree with the state a
snapshot serves): no state before and state after is *created*; state before and a different
state after is *modified* (an update, correction, delta on an image, a new image or a higher
revision); state before and none after is *deleted* (a drop, or a dropping revision). A message
that changes nothing (a lower revision, an expiration of `0`, a snapshot) causes nothing, not
even its application event: an application code says what a change *means*, and there was no
change. The application code travels with the publication as the `event` attribute of the
`apexps.publish` option, journaled in the record's options under `APP_EVENT_OPTION`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum

from broker.records import JournalEntry, SubscriptionState
from common.errors import EventNotUnderstood, ExpiresTooBrief, InvalidParameter

__all__ = [
    "APP_EVENT_OPTION",
    "APP_SPECIFIC_START",
    "MAX_EVENT",
    "PERMANENT",
    "Event",
    "ExpiresPolicy",
    "Reason",
    "Resource",
    "State",
    "app_event",
    "check_events",
    "events_of",
]

#: The journal option a publication's application event code travels in (decimal).
APP_EVENT_OPTION = "apexps.event"
#: §4.1.1 evAppSpecificStart: application events are this and above.
APP_SPECIFIC_START = 0x8000
#: The draft's EventId is a Uint32.
MAX_EVENT = 0xFFFF_FFFF
#: §3.2.1: Expires 0xffffffff is a permanent subscription.
PERMANENT = 0xFFFF_FFFF

#: The draft's subscription states (§4.2.1); apexps's records already name them.
State = SubscriptionState


class Event(IntEnum):
    """§4.1.1 EventId, the three the draft defines."""

    CREATED = 1
    MODIFIED = 2
    DELETED = 3


class Reason(StrEnum):
    """§4.2.1 ReasonCode: why a subscription is not active (RFC 3265's reasons, which the draft
    cites)."""

    #: its Expires ran out
    TIMEOUT = "timeout"
    #: cancelled (Expires 0), or ended by the notifier for a reason the others do not name
    DEACTIVATED = "deactivated"
    #: a pending subscription that was refused
    REJECTED = "rejected"
    #: the resource is gone (a permanent subscription's deleted item, a deleted topic)
    NORESOURCE = "noresource"
    #: the notifier gave up on it (the subscriber is unreachable, its link is gone)
    GIVEUP = "giveup"


@dataclass(frozen=True, slots=True, order=True)
class Resource:
    """A data item: a topic and a message-id. Written `TOPIC/MESSAGE-ID` (a topic name never
    holds '/', broker/names.py; a message-id may)."""

    topic: str
    message_id: str

    @classmethod
    def parse(cls, text: str) -> Resource:
        topic, slash, mid = text.partition("/")
        if not slash or not topic or not mid:
            raise InvalidParameter(f"{text[:80]!r} is not a resource: write TOPIC/MESSAGE-ID")
        return cls(topic, mid)

    def __str__(self) -> str:
        return f"{self.topic}/{self.message_id}"


def check_events(events: frozenset[int] | set[int]) -> frozenset[int]:
    """The events, if apexps understands every one (the draft's three and application codes);
    571 for any other, and 571 for none at all (§3.2.2: at least one)."""
    if not events:
        raise EventNotUnderstood("a watch names at least one event (draft §3.2.2)")
    for code in events:
        if not (code in Event._value2member_map_ or APP_SPECIFIC_START <= code <= MAX_EVENT):
            raise EventNotUnderstood(
                f"event {code} is not understood: use 1 created, 2 modified, 3 deleted or an"
                f" application code {APP_SPECIFIC_START}..{MAX_EVENT}")
    return frozenset(events)


@dataclass(frozen=True, slots=True)
class ExpiresPolicy:
    """The notifier's bounds on Expires, in seconds (§3.2.1, §3.3.1 c). `permanent`: whether
    0xffffffff is honoured; if not, it is granted as `max_s`."""

    min_s: int = 1
    max_s: int = 86_400
    permanent: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_s <= self.max_s < PERMANENT:
            raise ValueError(f"expires bounds {self.min_s}..{self.max_s} are not 1 ≤ min ≤ max")

    def grant(self, asked: int) -> int:
        """What to grant for a positive `asked`: never longer than asked (§3.2.6), at most
        `max_s` unless permanent; 572 with `min-expires` below the minimum."""
        if asked == PERMANENT:
            return PERMANENT if self.permanent else self.max_s
        if asked < self.min_s:
            raise ExpiresTooBrief(f"expires {asked} is below the minimum {self.min_s}",
                                  min_expires=self.min_s)
        return min(asked, self.max_s)


def app_event(entry: JournalEntry) -> int | None:
    """The application event code the publication carried, if any (the ingest checked it)."""
    text = entry.options.get(APP_EVENT_OPTION)
    return int(text) if text is not None and text.isdigit() else None


def events_of(entry: JournalEntry, existed: bool, exists: bool, changed: bool) -> frozenset[int]:
    """The events `entry` causes on its resource, given whether the resource had state before
    it, has state after it, and whether its state changed (see the module docstring)."""
    if not changed:
        return frozenset()
    if not existed and not exists:
        return frozenset()
    base = Event.CREATED if not existed else Event.DELETED if not exists else Event.MODIFIED
    code = app_event(entry)
    return frozenset({int(base)} if code is None else {int(base), code})
