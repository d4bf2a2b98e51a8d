"""The delivery core under random interleavings of everything that can happen to it: entries
journaled and handed over later, appends settling in any order or failing, catch-up reads
answered or refused, repairs asked again and again, snapshots, time passing. After every step
the design's invariants 3-5 hold for what was sent (tests/delivery/rig.py) and the fan-out
mark passes nothing unsettled; whenever everything has settled, every link whose current epoch
began cleanly (its first reset, or a repair's) carries exactly what it should: each entitled
message of its topics (after the repair's positions), once, in per-source order. Seqs are 3
bits wide so that links wrap."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.delivery import RepairJob
from broker.delivery import core as core_module
from broker.records import JournalEntry
from broker.robust.link_records import LinkKind
from common.errors import RebuildRefused
from tests.delivery.rig import Rig, check_all

T1, T2 = "q.one", "q.two"
SOURCES = ("s1@example.com", "s2@example.com", "s3@example.com")
#: link -> (owner, its topics)
LINKS = {
    "fred-l": ("fred@example.com", (T1,)),
    "barney-l": ("barney@example.com", (T1, T2)),
    "wilma-l": ("wilma@example.com", (T2,)),
}
BITS = 3


class DeliveryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._chunk = core_module.REPAIR_CHUNK
        core_module.REPAIR_CHUNK = 2  # catch-ups come in several deferred steps
        self.rig = Rig(bits=BITS)
        self.rig.routes.denied.add(("barney@example.com", "secret"))
        for link, (who, topics) in LINKS.items():
            for topic in topics:
                self.rig.subscribe(who, topic, link)
        self.jobs: dict[int, RepairJob] = {}
        #: journaled, not yet handed to the core by the follower
        self.unread: list[JournalEntry] = []
        #: handed over (what the item state, and so a snapshot, is made of)
        self.forwarded: list[JournalEntry] = []
        self.trans = 0

    def teardown(self) -> None:
        core_module.REPAIR_CHUNK = self._chunk

    # --- events -----------------------------------------------------------------------------

    @rule(topic=st.sampled_from((T1, T2)), source=st.sampled_from(SOURCES),
          secret=st.booleans(), count=st.integers(1, 3))
    def publish(self, topic: str, source: str, secret: bool, count: int) -> None:
        """Journaled; the follower hands it over later (`follow`)."""
        for _ in range(count):
            self.unread.append(self.rig.publish(topic, source, "secret" if secret else None))

    @precondition(lambda self: self.unread)
    @rule(data=st.data())
    def follow(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(1, len(self.unread)))
        entries, self.unread = self.unread[:count], self.unread[count:]
        self.rig.core.forward(entries)
        self.forwarded += entries

    @precondition(lambda self: self.rig.links.unsettled())
    @rule(data=st.data(), fail=st.sampled_from(("none", "all", "link")))
    def settle(self, data: st.DataObject, fail: str) -> None:
        """Kafka packs a link's records of one append together (one partition per link), so
        they fail together; with one links partition the whole append does."""
        append = data.draw(st.sampled_from(self.rig.links.unsettled()))
        records = append.records
        failed: frozenset[int] = frozenset()
        if fail == "all":
            failed = frozenset(range(len(records)))
        elif fail == "link":
            link = data.draw(st.sampled_from(sorted({r.link for r in records})))
            failed = frozenset(i for i, r in enumerate(records) if r.link == link)
        self.rig.links.settle(append, failed)

    @precondition(lambda self: self.rig.deferred.calls)
    @rule()
    def run_deferred(self) -> None:
        self.rig.deferred.run_one()

    @rule(seconds=st.floats(0, 12))
    def tick(self, seconds: float) -> None:
        self.rig.clock.now += seconds
        self.rig.core.tick()

    @rule(link=st.sampled_from(sorted(LINKS)))
    def repair(self, link: str) -> None:
        """The subscriber names every source with the last seq its link brought it."""
        last = dict.fromkeys(SOURCES, 0)
        for _, record, carried in self.rig.wire.sent():
            if record.link == link and carried is not None and not record.snapshot:
                last[carried.source] = max(last[carried.source], carried.source_seq)
        self.trans += 1
        job = RepairJob(link, self.trans, LINKS[link][0], tuple(last.items()))
        self.jobs[self.trans] = job
        self.rig.core.repair(job)

    @precondition(lambda self: self.rig.reader.pending())
    @rule(data=st.data(), refuse=st.booleans())
    def answer_read(self, data: st.DataObject, refuse: bool) -> None:
        read = data.draw(st.sampled_from(self.rig.reader.pending()))
        if refuse:
            self.rig.reader.answer(read, RebuildRefused("the fake refuses"))
        else:
            self.rig.reader.answer(read, self.rig.catch_up(read.sources, read.topics,
                                                           read.until))

    @precondition(lambda self: self.forwarded)
    @rule(link=st.sampled_from(sorted(LINKS)), last=st.integers(1, 3))
    def snapshot(self, link: str, last: int) -> None:
        who, topics = LINKS[link]
        state = [e for e in self.forwarded if e.topic in topics][-last:]
        self.rig.core.queue_snapshot(who, link, state)

    @rule()
    def quiesce(self) -> None:
        """Everything settles durable and every read is answered: each clean epoch is
        complete."""
        rig = self.rig
        rig.core.forward(self.unread)
        self.forwarded += self.unread
        self.unread = []
        while rig.reader.pending() or rig.links.unsettled() or rig.deferred.calls:
            rig.answer_reads()
            rig.settle_all()
        for link, (who, topics) in LINKS.items():
            self._complete(link, who, topics)

    def _complete(self, link: str, who: str, topics: tuple[str, ...]) -> None:
        sent = [(r, e, o) for o in self._outgoing() for r, e in ((o.record, o.entry),)
                if r.link == link]
        resets = [i for i, (r, _, _) in enumerate(sent) if r.kind is LinkKind.RESET]
        start, (reset, _, out) = resets[-1], sent[resets[-1]]
        if reset.epoch != 0 and out.repair is None:
            return  # begun by a failure: the subscriber repairs, nothing to expect yet
        if any(lk == link and ordinal > reset.ordinal for lk, ordinal in self.rig.links.failed):
            return
        after = dict.fromkeys(SOURCES, 0)
        if out.repair is not None:
            after.update(self.jobs[out.repair.trans_id].sources)
        got = [(e.source, e.source_seq) for r, e, _ in sent[start + 1:]
               if e is not None and not r.snapshot]
        want = [(e.source, e.source_seq) for e in self.rig.journal
                if e.topic in topics and self.rig.routes.entitled(e, who)
                and e.source_seq > after[e.source]]
        for source in SOURCES:
            assert [s for src, s in got if src == source] == \
                [s for src, s in want if src == source], f"{link} from {source}"

    def _outgoing(self) -> list:  # type: ignore[type-arg]
        from broker.delivery import Send
        return [o for a in self.rig.wire.actions if isinstance(a, Send) for o in a.items]

    @invariant()
    def invariants_hold(self) -> None:
        check_all(self.rig)

    @invariant()
    def mark_never_passes_what_is_unsettled(self) -> None:
        """Below the mark, every entry is settled on each link it was routed to: durable there
        (or failed, which its link's reset reports)."""
        rig = self.rig
        mark = rig.core.mark()
        settled = {(r.link, r.position) for r in rig.links.durable.values()}
        settled |= {(r.link, r.position) for r in rig.links.failed_records}
        for e in rig.journal:
            if e.position.offset >= mark.get(e.position.partition, 0):
                continue
            for who, link in rig.routes.recipient_links_for(e):
                if rig.routes.entitled(e, who):
                    assert (link, e.position) in settled, f"mark {mark} passed {e} on {link}"


DeliveryMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=60,
                                             deadline=None)
TestDeliveryMachine = DeliveryMachine.TestCase
