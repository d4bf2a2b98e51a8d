"""Data held for endpoints that are not attached (RFC 3342 §3, hold4Endpoint), durable in Kafka.

Theory of operation
-------------------
The relay hands over a `HeldData`: the encoded APEX data operation as opaque bytes (this package
never imports the wire), who it is for, who sent it, and its deadlines. `HoldBook` is the
in-memory bookkeeping, pure and synchronous: which held data wait for which endpoint, which are
out for delivery (taken, awaiting the recipient's `ok`), what each originator has outstanding
(the administrative cap RFC 3342 §7 asks for: holding is a denial-of-service lever), and which
deadline comes next. `KafkaHolds` keeps a book in step with a compacted Kafka topic through the
shared `Registry`: a hold is a record keyed by its id, a release a tombstone, so a restarted
broker reloads exactly what is still held.

Life of a held data:

    hold ──▶ waiting ──take──▶ out ──release (recipient said ok, or expired)──▶ gone
                ▲                │
                └───requeue──────┘ (recipient refused, or its session ended first)

`expired(now)` moves waiting data whose deadline passed to `out` and returns it: the caller
reports and releases. Data out for delivery is the delivery's business (the shell watches for
the reply, with the deadline it was given). `late(now)` returns waiting data whose `report_at`
passed, once each (a restart may report it once more).

Writes run on one thread of their own, so Kafka sees a hold before its release even when the
recipient attaches in the very moment it is being written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from broker.records import to_ms
from broker.registry import Registry
from common.errors import ApexpsError, JournalUnavailable, TransactionFailed

__all__ = [
    "DEFAULT_MAX_HELD_BYTES",
    "DEFAULT_MAX_HELD_PER_ORIGINATOR",
    "HeldData",
    "HoldBook",
    "HoldLimits",
    "KafkaHolds",
]

log = structlog.get_logger(__name__)

#: Held data one originator may have outstanding: enough for a mailbox's worth of messages to
#: an absent peer, not enough for one sender to fill the broker's memory.
DEFAULT_MAX_HELD_PER_ORIGINATOR = 1000
#: Octets of held data one originator may have outstanding (four maximum-size messages).
DEFAULT_MAX_HELD_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HeldData:
    """One data operation held for `recipient` (see avro/held_data.v1.avsc for each field)."""

    hold_id: str
    recipient: str
    recipient_base: str
    originator: str
    content_type: str
    data: bytes
    held_at: int
    deadline: int | None = None
    report_at: int | None = None

    @property
    def key(self) -> str:
        return self.hold_id

    @property
    def size(self) -> int:
        return len(self.data)

    def to_avro(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}

    @classmethod
    def from_avro(cls, rec: Mapping[str, Any]) -> HeldData:
        return cls(**{**rec, "held_at": to_ms(rec["held_at"]), "deadline": to_ms(rec["deadline"]),
                      "report_at": to_ms(rec["report_at"])})


@dataclass(frozen=True, slots=True)
class HoldLimits:
    """The administrative cap: per originator, how many held data and how many octets may be
    outstanding (held or out for delivery). Over it, the recipient fails with 554."""

    max_per_originator: int = DEFAULT_MAX_HELD_PER_ORIGINATOR
    max_bytes_per_originator: int = DEFAULT_MAX_HELD_BYTES


class HoldBook:
    """The in-memory state of held data (see the module docstring); no I/O."""

    def __init__(self, limits: HoldLimits | None = None, items: Iterable[HeldData] = ()) -> None:
        self.limits = limits or HoldLimits()
        self._items: dict[str, HeldData] = {}
        self._out: set[str] = set()
        self._reported: set[str] = set()
        self._usage: dict[str, tuple[int, int]] = {}
        #: bumped by every change; `next_due` answers from its last scan while it stands still
        #: (the server asks after every data operation, and most change nothing here)
        self._changes = 0
        self._due: tuple[int, int | None] = (-1, None)
        for item in items:
            self._add(item)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, hold_id: object) -> bool:
        return hold_id in self._items

    def usage(self, originator: str) -> tuple[int, int]:
        """(held data, octets) `originator` has outstanding."""
        return self._usage.get(originator, (0, 0))

    def _add(self, item: HeldData) -> None:
        count, octets = self.usage(item.originator)
        self._changes += 1
        self._items[item.hold_id] = item
        self._usage[item.originator] = (count + 1, octets + item.size)

    def reserve(self, item: HeldData) -> None:
        """Book `item`, or raise `TransactionFailed` (554) if its originator is over the cap."""
        if item.hold_id in self._items:
            raise TransactionFailed(f"hold {item.hold_id} exists already")
        count, octets = self.usage(item.originator)
        if count + 1 > self.limits.max_per_originator:
            raise TransactionFailed(f"{item.originator} has {count} held data outstanding, the"
                                    f" most this relay holds for one originator")
        if octets + item.size > self.limits.max_bytes_per_originator:
            raise TransactionFailed(f"{item.originator} would have more than"
                                    f" {self.limits.max_bytes_per_originator} octets held")
        self._add(item)

    def forget(self, hold_id: str) -> HeldData | None:
        """Drop a held data from the book (delivered, expired or never written)."""
        item = self._items.pop(hold_id, None)
        self._changes += 1
        self._out.discard(hold_id)
        self._reported.discard(hold_id)
        if item is not None:
            count, octets = self.usage(item.originator)
            if count <= 1:
                self._usage.pop(item.originator, None)
            else:
                self._usage[item.originator] = (count - 1, octets - item.size)
        return item

    def _waiting(self) -> Iterable[HeldData]:
        return (i for i in self._items.values() if i.hold_id not in self._out)

    def take(self, endpoint: str, *, base: bool) -> list[HeldData]:
        """Waiting data for an application attaching as `endpoint`, oldest first, now out for
        delivery. With `base` (the endpoint has no subaddress) its subaddresses' data too."""
        found = [i for i in self._waiting()
                 if i.recipient == endpoint or (base and i.recipient_base == endpoint)]
        found.sort(key=lambda i: i.held_at)
        self._changes += 1
        self._out.update(i.hold_id for i in found)
        return found

    def requeue(self, hold_id: str) -> HeldData | None:
        """Data out for delivery that was not accepted waits again; returns it, if booked."""
        self._changes += 1
        self._out.discard(hold_id)
        return self._items.get(hold_id)

    def expired(self, now_ms: int) -> list[HeldData]:
        """Waiting data whose deadline is at or before `now_ms`, now out (to be released)."""
        found = [i for i in self._waiting() if i.deadline is not None and i.deadline <= now_ms]
        self._changes += 1
        self._out.update(i.hold_id for i in found)
        return found

    def late(self, now_ms: int) -> list[HeldData]:
        """Waiting data whose `report_at` passed and that was not reported yet; each once."""
        found = [i for i in self._waiting() if i.hold_id not in self._reported
                 and i.report_at is not None and i.report_at <= now_ms]
        self._changes += 1
        self._reported.update(i.hold_id for i in found)
        return found

    def next_due(self) -> int | None:
        """The earliest deadline or report time among waiting data, if any (epoch ms)."""
        if self._due[0] != self._changes:
            times = [t for i in self._waiting() for t in (
                i.deadline, None if i.hold_id in self._reported else i.report_at)
                if t is not None]
            self._due = (self._changes, min(times, default=None))
        return self._due[1]


class KafkaHolds:
    """A `HoldBook` kept durable in the `holds` compacted topic (`BrokerCore.holds`).

    `hold` and `release` return futures that are already running: the write happens whether or
    not anybody awaits it, and a failure is logged either way.
    """

    def __init__(self, registry: Registry[HeldData], limits: HoldLimits | None = None) -> None:
        self._registry = registry
        self.book = HoldBook(limits, registry)
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="holds")

    def _write(self, call: Callable[[], object], what: str,
               on_error: Callable[[], None] | None = None) -> Awaitable[None]:
        def run() -> None:
            try:
                call()
            except ApexpsError:
                raise
            except Exception as exc:  # the Kafka client's own errors: say "try later"
                raise JournalUnavailable(f"could not {what}: {exc}") from exc

        future = asyncio.get_running_loop().run_in_executor(self._writer, run)

        def done(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.warning("held data write failed", what=what, error=str(f.exception()))
                if on_error is not None:
                    on_error()
        future.add_done_callback(done)
        return future

    def hold(self, item: HeldData) -> Awaitable[None]:
        """Book `item` now (554 at once if over the cap), write it, resolve when durable."""
        self.book.reserve(item)
        def undo() -> None:
            self.book.forget(item.hold_id)
        return self._write(lambda: self._registry.put(item), f"hold {item.hold_id}", undo)

    def take(self, endpoint: str, *, base: bool) -> list[HeldData]:
        return self.book.take(endpoint, base=base)

    def release(self, hold_id: str) -> Awaitable[None]:
        """Forget a held data now; write its tombstone."""
        self.book.forget(hold_id)
        return self._write(lambda: self._registry.delete(hold_id), f"release {hold_id}")

    def requeue(self, hold_id: str) -> HeldData | None:
        return self.book.requeue(hold_id)

    def expired(self, now_ms: int) -> list[HeldData]:
        return self.book.expired(now_ms)

    def late(self, now_ms: int) -> list[HeldData]:
        return self.book.late(now_ms)

    def next_due(self) -> int | None:
        return self.book.next_due()

    def close(self) -> None:
        """Wait for the writes in flight (before the producer closes)."""
        self._writer.shutdown(wait=True)
