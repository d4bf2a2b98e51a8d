"""What the delivery core asks its owner to do, and the requests it is handed.

The core never renders: an `Outgoing` names the subscriber, the link record (assigned) and the
journal entry it carries; the APEX driver turns a `Send` into stamps, data and `<batch>`
documents. Every action the core emits goes through one `Emit` callable, in the order it must
happen on the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.records import JournalEntry
from broker.robust.link_records import LinkRecord
from common.errors import ApexpsError

__all__ = ["Action", "Durable", "Emit", "Outgoing", "RepairAnswer", "RepairJob", "RepairReset",
           "Send"]


@dataclass(frozen=True, slots=True)
class RepairReset:
    """What the reset that begins a repair epoch says beyond its record: the request's transID
    and a time at or before every journal time the epoch carries (robust-binding §2)."""

    trans_id: int
    time: int


class Outgoing(NamedTuple):
    """One link record for its subscriber (a NamedTuple: one per delivery)."""

    who: str
    record: LinkRecord
    #: DATA: the message it carries; None for a heartbeat or a reset
    entry: JournalEntry | None
    #: the reset that begins a source repair's epoch answers this request
    repair: RepairReset | None = None


@dataclass(frozen=True, slots=True)
class Send:
    """Send these, in this order: every record here is assigned and queued for the link log,
    not necessarily durable yet (`Durable` says when; core.py, "Ordering")."""

    items: Sequence[Outgoing]
    #: link -> the most items one `<batch>` may hold, for the links whose items go packed
    #: (robust-binding §5.4: a catch-up that asked for batches, or a subscriber that did)
    packed: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Durable:
    """These records, sent before, are now durable in the link log (what `sent_through`
    waiters and the like await)."""

    records: Sequence[LinkRecord]


@dataclass(frozen=True, slots=True)
class RepairJob:
    """A source repair request (robust-binding §5.2), as the core sees it."""

    link: str
    trans_id: int
    #: the requester (the link's owner)
    who: str
    #: (source, last source seq the subscriber has), in the order named
    sources: tuple[tuple[str, int], ...]
    #: for sources it does not name: every message accepted at or after this time (ms)
    since: int | None = None
    #: pack the catch-up up to this many items per `<batch>`
    batch: int | None = None
    #: when it was taken up (the owner's clock), for its log line
    began: float = 0.0


@dataclass(frozen=True, slots=True)
class RepairAnswer:
    """The end of a repair: answer the requester. On success `epoch` and `link_seq` are those
    of the last item the repair put on the link (its reset if the catch-up was empty)."""

    job: RepairJob
    error: ApexpsError | None = None
    epoch: int | None = None
    link_seq: int | None = None
    #: how many messages the catch-up resent and how many live ones it held meanwhile
    resent: int = 0
    held: int = 0


Action = Send | Durable | RepairAnswer
#: Where the core's actions go, in order.
Emit = Callable[[Action], None]
