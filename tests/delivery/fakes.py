"""In-memory doubles of the delivery core's ports (broker/delivery/ports.py).

`FakeLinkLog` assigns seqs as `broker.robust.links.LinkLog.append_many` does (a RESET before a
new or broken link's first item, the next ordinal per link, link seqs wrapping to 1 at
2**bits - 1; `bits` may be tiny here so that wrapping is reachable) and holds every append
until the test settles it, record by record durable or failed. `FakeRoutes` is the routing
state; `FakeCatchUp` holds catch-up reads until the test answers them; `Deferred` is the
thread hop, run when the test says.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from broker.delivery import Action, CatchUpDone, RepairAnswer, Send
from broker.kafka_io import Position
from broker.records import JournalEntry, PublishType, RecordKind
from broker.robust.link_records import LinkHead, LinkItem, LinkKind, LinkRecord
from broker.robust.links import LinkBatchCallback
from common.errors import ApexpsError, JournalUnavailable


def entry(topic: str, source: str, seq: int, position: Position, *,
          token: str | None = None, at: int = 1_000) -> JournalEntry:
    """A DATA journal entry as the follower hands it over."""
    return JournalEntry(position, RecordKind.DATA, topic, source, seq, None, None,
                        PublishType.UPDATE, None, None, None, None, None, token,
                        "text/plain", f"{source}#{seq}".encode(), {}, {}, at)


@dataclass
class _Head:
    ordinal: int
    epoch: int
    epoch_start: int
    owner: str | None


@dataclass
class Append:
    """One `append_many` the fake holds: its records and its callback."""

    records: list[LinkRecord]
    callback: LinkBatchCallback
    settled: bool = False


class FakeLinkLog:
    """See the module docstring."""

    def __init__(self, bits: int = 32) -> None:
        self.bits = bits
        self._heads: dict[str, _Head] = {}
        self._broken: set[str] = set()
        self.appends: list[Append] = []
        #: (link, ordinal) -> the record, once durable
        self.durable: dict[tuple[str, int], LinkRecord] = {}
        self.failed: set[tuple[str, int]] = set()
        #: every record that failed
        self.failed_records: list[LinkRecord] = []
        self._last: dict[str, LinkRecord] = {}

    def _seq(self, ordinal: int, start: int) -> int:
        return (ordinal - start - 1) % ((1 << self.bits) - 1) + 1

    def _reset(self, out: list[LinkRecord], link: str, owner: str | None) -> None:
        head = self._heads.get(link)
        if head is None:
            new = _Head(0, 0, 0, owner)
        else:
            new = _Head(head.ordinal + 1, head.epoch + 1, head.ordinal + 1, owner or head.owner)
        self._heads[link] = new
        out.append(LinkRecord(link, new.ordinal, new.epoch, new.ordinal, self.bits, 0,
                              LinkKind.RESET, None, None, None, owner, 1, 0))

    def append_many(self, items: Sequence[LinkItem], callback: LinkBatchCallback,
                    ) -> list[LinkRecord]:
        out: list[LinkRecord] = []
        for item in items:
            if item.kind is LinkKind.RESET:
                self._broken.discard(item.link)
                self._reset(out, item.link, item.owner)
                continue
            if item.link not in self._heads or item.link in self._broken:
                self._broken.discard(item.link)
                self._reset(out, item.link, None)
            head = self._heads[item.link]
            head.ordinal += 1
            out.append(LinkRecord(item.link, head.ordinal, head.epoch, head.epoch_start,
                                  self.bits, self._seq(head.ordinal, head.epoch_start),
                                  item.kind, item.position, item.source, item.source_seq, None,
                                  1, 0, item.snapshot))
        self.appends.append(Append(out, callback))
        return out

    def claim(self, link: str, owner: str) -> LinkRecord:
        """A new link's first reset, durable at once (as `LinkLog.claim` returns it)."""
        records: list[LinkRecord] = []
        self._reset(records, link, owner)
        self._book(records[0])
        return records[0]

    def unsettled(self) -> list[Append]:
        return [a for a in self.appends if not a.settled]

    def settle(self, append: Append, fail: frozenset[int] = frozenset()) -> None:
        """Settle `append`: the records at the indices in `fail` failed, the rest durable."""
        append.settled = True
        outcomes: list[LinkRecord | JournalUnavailable] = []
        for i, record in enumerate(append.records):
            if i in fail:
                self.failed.add((record.link, record.ordinal))
                self.failed_records.append(record)
                self._broken.add(record.link)
                outcomes.append(JournalUnavailable("the fake kafka failed it"))
            else:
                self._book(record)
                outcomes.append(record)
        append.callback(outcomes)

    def _book(self, record: LinkRecord) -> None:
        self.durable[(record.link, record.ordinal)] = record
        last = self._last.get(record.link)
        if last is None or record.ordinal > last.ordinal:
            self._last[record.link] = record

    def last(self, link: str) -> LinkHead | None:
        r = self._last.get(link)
        if r is None:
            return None
        return LinkHead(link, r.epoch, r.link_seq, r.ordinal, r.epoch_start, r.bits, None)


def _every(_entry: JournalEntry) -> bool:
    return True


@dataclass
class FakeRoutes:
    """topic -> {subscriber: link}; `denied`: (subscriber, token) pairs not entitled;
    `selects`: (topic, subscriber) -> which entries its subscription selects (default: all)."""

    subs: dict[str, dict[str, str]] = field(default_factory=dict)
    denied: set[tuple[str, str]] = field(default_factory=set)
    selects: dict[tuple[str, str], Callable[[JournalEntry], bool]] = field(default_factory=dict)

    def subscribe(self, who: str, topic: str, link: str,
                  select: Callable[[JournalEntry], bool] | None = None) -> None:
        self.subs.setdefault(topic, {})[who] = link
        if select is not None:
            self.selects[(topic, who)] = select

    def recipient_links_now(self, topic: str) -> Sequence[tuple[str, str]]:
        return tuple(self.subs.get(topic, {}).items())

    def recipient_links_for(self, entry: JournalEntry) -> Sequence[tuple[str, str]]:
        return tuple((who, link) for who, link in self.subs.get(entry.topic, {}).items()
                     if self.selects.get((entry.topic, who), _every)(entry))

    def wants(self, link: str, entry: JournalEntry) -> bool:
        return any(lk == link for _, lk in self.recipient_links_for(entry))

    def entitled(self, entry: JournalEntry, subscriber: str, *, live: bool = False) -> bool:
        token = entry.permission_token
        return token is None or (subscriber, token) not in self.denied

    def link_topics(self, link: str) -> Mapping[str, str]:
        return {topic: who for topic, by in self.subs.items() for who, lk in by.items()
                if lk == link}

    def links_of_subscribers(self) -> Mapping[str, str]:
        return {lk: who for by in self.subs.values() for who, lk in by.items()}


@dataclass
class Read:
    """One catch-up read the fake holds until the test answers it."""

    sources: tuple[tuple[str, int], ...]
    topics: dict[str, str]
    until: dict[int, int] | None
    done: CatchUpDone
    answered: bool = False


class FakeCatchUp:
    def __init__(self) -> None:
        self.reads: list[Read] = []

    def read(self, sources: Sequence[tuple[str, int]], since: int | None,
             topics: Mapping[str, str], until: Mapping[int, int] | None,
             done: CatchUpDone) -> None:
        self.reads.append(Read(tuple(sources), dict(topics),
                               None if until is None else dict(until), done))

    def pending(self) -> list[Read]:
        return [r for r in self.reads if not r.answered]

    def answer(self, read: Read, result: list[JournalEntry] | ApexpsError) -> None:
        read.answered = True
        read.done(result)


class Deferred:
    """The core's `defer`: calls queued in order, run when the test says."""

    def __init__(self) -> None:
        self.calls: deque[Callable[[], None]] = deque()

    def __call__(self, call: Callable[[], None]) -> None:
        self.calls.append(call)

    def run_one(self) -> bool:
        if not self.calls:
            return False
        self.calls.popleft()()
        return True

    def run_all(self) -> None:
        while self.run_one():
            pass


class Wire:
    """What the core emitted, in order."""

    def __init__(self) -> None:
        self.actions: list[Action] = []

    def __call__(self, action: Action) -> None:
        self.actions.append(action)

    def sent(self) -> list[tuple[str, LinkRecord, JournalEntry | None]]:
        return [(o.who, o.record, o.entry) for a in self.actions if isinstance(a, Send)
                for o in a.items]

    def on(self, link: str) -> list[LinkRecord]:
        return [r for _, r, _ in self.sent() if r.link == link]

    def answers(self) -> list[RepairAnswer]:
        return [a for a in self.actions if isinstance(a, RepairAnswer)]
