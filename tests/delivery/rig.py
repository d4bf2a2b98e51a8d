"""A delivery core on fakes, and the invariants every test of it checks (DESIGN invariants 3-5)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from broker.delivery import DeliveryCore, RepairReset, Send
from broker.kafka_io import Position
from broker.records import JournalEntry
from broker.robust.link_records import LinkKind, LinkRecord
from tests.delivery.fakes import Deferred, FakeCatchUp, FakeLinkLog, FakeRoutes, Wire, entry

HEARTBEAT_S = 5.0
PARTITIONS = 2


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    """The core, its fakes, and a journal the test publishes to."""

    bits: int = 32
    links: FakeLinkLog = field(init=False)
    routes: FakeRoutes = field(default_factory=FakeRoutes)
    reader: FakeCatchUp = field(default_factory=FakeCatchUp)
    deferred: Deferred = field(default_factory=Deferred)
    wire: Wire = field(default_factory=Wire)
    clock: Clock = field(default_factory=Clock)
    journal: list[JournalEntry] = field(default_factory=list)
    core: DeliveryCore = field(init=False)
    _offsets: dict[int, itertools.count[int]] = field(default_factory=dict)
    _seqs: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.links = FakeLinkLog(self.bits)
        self.core = DeliveryCore(self.links, self.routes, self.reader, self.wire,
                                 heartbeat_s=HEARTBEAT_S, defer=self.deferred, clock=self.clock,
                                 wall=lambda: 1_000)
        self.core.follow(dict.fromkeys(range(PARTITIONS), 0))

    def subscribe(self, who: str, topic: str, link: str) -> None:
        """As the service does: claim the link (its first reset is sent), then route to it."""
        if self.links.last(link) is None:
            self.core.claimed(who, self.links.claim(link, who))
        self.routes.subscribe(who, topic, link)

    def publish(self, topic: str, source: str, token: str | None = None) -> JournalEntry:
        """Journal the source's next message (a source lives in one partition)."""
        part = sum(source.encode()) % PARTITIONS
        seq = self._seqs[source] = self._seqs.get(source, 0) + 1
        offset = next(self._offsets.setdefault(part, itertools.count()))
        e = entry(topic, source, seq, Position(part, offset), token=token)
        self.journal.append(e)
        return e

    def settle_all(self) -> None:
        """Every append durable and every deferred call run, until nothing is left."""
        while True:
            pending = self.links.unsettled()
            if not pending and not self.deferred.calls:
                return
            for append in pending:
                self.links.settle(append)
            self.deferred.run_all()

    def catch_up(self, sources: tuple[tuple[str, int], ...], topics: dict[str, str],
                 until: dict[int, int] | None) -> list[JournalEntry]:
        """What `broker.robust.repair.select_catch_up` selects from the journal."""
        after = dict(sources)
        out: list[JournalEntry] = []
        for source, _ in sources:
            for e in self.journal:
                if e.source == source and e.source_seq > after[source] and e.topic in topics \
                        and (until is None or e.position.offset < until[e.position.partition]) \
                        and self.routes.entitled(e, topics[e.topic]):
                    out.append(e)
        return out

    def answer_reads(self) -> None:
        for read in self.reader.pending():
            self.reader.answer(read, self.catch_up(read.sources, read.topics, read.until))

    def data_on(self, link: str) -> list[tuple[int, int, str, int]]:
        """(epoch, link seq, source, source seq) of every data item sent on `link`."""
        return [(r.epoch, r.link_seq, e.source, e.source_seq)
                for _, r, e in self.wire.sent() if r.link == link and e is not None]


def check_link_order(rig: Rig) -> None:
    """Invariant 3 on what was sent: per link, a reset is seq 0 and begins the next epoch; within
    an epoch seqs rise by one, wrapping from 2**bits - 1 to 1; a seq is skipped only where its
    record failed to become durable (the link then resets), and an epoch is entered without
    its reset only where that reset failed (the subscriber learns it from the stamp's epoch)."""
    maximum = (1 << rig.bits) - 1
    last: dict[str, LinkRecord] = {}
    for _, record, _ in rig.wire.sent():
        prev = last.get(record.link)
        if prev is None:
            assert record.kind is LinkKind.RESET, f"{record} before its link's first reset"
        else:
            assert record.ordinal > prev.ordinal, f"{record} after {prev}"
            for skipped in range(prev.ordinal + 1, record.ordinal):
                assert (record.link, skipped) in rig.links.failed, \
                    f"link {record.link} skipped ordinal {skipped}, which did not fail"
        if record.kind is LinkKind.RESET:
            assert record.link_seq == 0
            assert prev is None or record.epoch > prev.epoch
            assert record.epoch_start == record.ordinal
        else:
            assert prev is not None
            if record.epoch != prev.epoch:  # only if the reset that began it failed
                assert record.epoch > prev.epoch, f"{record} after {prev}"
                assert (record.link, record.epoch_start) in rig.links.failed, \
                    f"{record} after {prev}: epoch {record.epoch} began without its reset"
            expected = (record.ordinal - record.epoch_start - 1) % maximum + 1
            assert record.link_seq == expected
            assert 0 < record.link_seq <= maximum
        last[record.link] = record


def check_refillable(rig: Rig) -> None:
    """Invariant 4 with the link log off the critical path (core.py, "Ordering"): every record
    sent is durable in the link log as sent, still settling, or failed; after a failed one its
    link's next append begins a new epoch, so no seq is ever sent twice; a data record names
    the journal entry it carried."""
    unsettled = {(r.link, r.ordinal) for a in rig.links.unsettled() for r in a.records}
    sent: set[tuple[str, int]] = set()
    for _, record, carried in rig.wire.sent():
        key = (record.link, record.ordinal)
        assert key not in sent, f"{record} sent twice"
        sent.add(key)
        assert key in unsettled or key in rig.links.failed \
            or rig.links.durable.get(key) == record, f"{record} neither durable nor settling"
        if record.kind is LinkKind.DATA:
            assert carried is not None
            assert (record.position, record.source, record.source_seq) == \
                (carried.position, carried.source, carried.source_seq)


def check_per_source_order(rig: Rig) -> None:
    """Invariant 5's order half: within an epoch of a link, each source's live and catch-up
    messages come once each, in rising source seq (snapshot copies are state, not stream)."""
    seen: dict[tuple[str, int, str], int] = {}
    for _, record, carried in rig.wire.sent():
        if record.kind is not LinkKind.DATA or record.snapshot or carried is None:
            continue
        key = (record.link, record.epoch, carried.source)
        assert carried.source_seq > seen.get(key, 0), \
            f"{carried.source}#{carried.source_seq} on {record.link} epoch {record.epoch}" \
            f" after #{seen.get(key)}"
        seen[key] = carried.source_seq


def check_all(rig: Rig) -> None:
    check_link_order(rig)
    check_refillable(rig)
    check_per_source_order(rig)


def repair_resets(rig: Rig) -> Iterable[tuple[LinkRecord, RepairReset]]:
    for action in rig.wire.actions:
        if isinstance(action, Send):
            for o in action.items:
                if o.repair is not None:
                    yield o.record, o.repair
