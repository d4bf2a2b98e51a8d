"""Publisher-seq dedupe (docs/robust-binding.md §8): the ledger's verdicts, and the gate over a
journal double driven through random interleavings of sends, resends, failures, out-of-order
outcomes and broker restarts — each pubseq is journaled at most once, every copy answered `ok`
is durable, and every durable pubseq was answered `ok` to someone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.journal import Appended, BatchCallback, PublisherPosition
from broker.kafka_io import Position
from broker.publish_gate import AlreadyDurable, Outcome, PublishGate
from broker.pubseq import PubseqLedger, Verdict
from broker.records import Publication
from common.errors import InvalidParameter, JournalUnavailable

FRED = "fred@example.com"


# --- the ledger -----------------------------------------------------------------------------


class TestLedger:
    def test_new_pubseqs_are_appended_and_copies_of_durable_ones_are_not(self) -> None:
        """A pubseq above the mark is appended; once durable, a copy is a duplicate."""
        ledger: PubseqLedger[str] = PubseqLedger()
        assert ledger.admit(FRED, 1, "a") is Verdict.APPEND
        assert ledger.settle(FRED, 1, durable=True) == ([], None)
        assert ledger.admit(FRED, 1, "b") is Verdict.DUPLICATE
        assert ledger.durable(FRED) == 1

    def test_a_copy_of_one_in_flight_waits_for_its_outcome(self) -> None:
        """Copies of a pubseq in flight wait and are all released when it is durable."""
        ledger: PubseqLedger[str] = PubseqLedger()
        assert ledger.admit(FRED, 7, "orig") is Verdict.APPEND
        assert ledger.admit(FRED, 7, "copy1") is Verdict.WAIT
        assert ledger.admit(FRED, 7, "copy2") is Verdict.WAIT
        assert ledger.settle(FRED, 7, durable=True) == (["copy1", "copy2"], None)
        assert ledger.in_flight(FRED) == frozenset()

    def test_a_failed_original_hands_over_to_its_first_copy(self) -> None:
        """If the original fails, the first waiting copy is appended; the rest wait on it."""
        ledger: PubseqLedger[str] = PubseqLedger()
        ledger.admit(FRED, 3, "orig")
        ledger.admit(FRED, 3, "copy1")
        ledger.admit(FRED, 3, "copy2")
        assert ledger.settle(FRED, 3, durable=False) == ([], "copy1")
        assert ledger.in_flight(FRED) == {3}
        assert ledger.settle(FRED, 3, durable=True) == (["copy2"], None)

    def test_a_failed_pubseq_below_the_mark_is_appended_when_resent(self) -> None:
        """5 fails while 6 becomes durable: a resend of 5 is no duplicate (until durable)."""
        ledger: PubseqLedger[str] = PubseqLedger()
        ledger.admit(FRED, 5, "five")
        ledger.admit(FRED, 6, "six")
        ledger.settle(FRED, 6, durable=True)
        ledger.settle(FRED, 5, durable=False)
        assert ledger.failed(FRED) == {5}
        assert ledger.admit(FRED, 5, "again") is Verdict.APPEND
        ledger.settle(FRED, 5, durable=True)
        assert ledger.failed(FRED) == frozenset()
        assert ledger.admit(FRED, 5, "once more") is Verdict.DUPLICATE

    def test_below_the_mark_is_a_duplicate_even_if_never_seen(self) -> None:
        """The documented rule: pubseqs must rise; one below the mark is taken for a copy."""
        ledger: PubseqLedger[str] = PubseqLedger()
        ledger.admit(FRED, 10, "ten")
        ledger.settle(FRED, 10, durable=True)
        assert ledger.admit(FRED, 4, "late") is Verdict.DUPLICATE

    def test_the_seed_is_what_the_journal_recovered(self) -> None:
        """A ledger starts each source where the journal says it stands, failures included."""
        asked: list[str] = []

        def seed(source: str) -> tuple[int, frozenset[int]]:
            asked.append(source)
            return 17, frozenset({12})

        ledger: PubseqLedger[str] = PubseqLedger(seed)
        assert ledger.admit(FRED, 17, "x") is Verdict.DUPLICATE
        assert ledger.admit(FRED, 12, "y") is Verdict.APPEND
        assert ledger.admit(FRED, 18, "z") is Verdict.APPEND
        assert ledger.admit("barney@example.com", 1, "b") is Verdict.DUPLICATE
        assert asked == [FRED, "barney@example.com"]

    def test_sources_are_independent(self) -> None:
        """One source's mark says nothing about another's."""
        ledger: PubseqLedger[str] = PubseqLedger()
        ledger.admit(FRED, 9, "f")
        ledger.settle(FRED, 9, durable=True)
        assert ledger.admit("barney@example.com", 1, "b") is Verdict.APPEND


# --- a journal double -----------------------------------------------------------------------


@dataclass
class _Source:
    records: list[int] = field(default_factory=list)  # durable pubseqs, in journal order
    failed: set[int] = field(default_factory=set)

    @property
    def mark(self) -> int:
        return max(self.records, default=0)


@dataclass(eq=False)
class _Record:
    pub: Publication
    #: what Kafka did with it: True durable, False refused, None not decided yet
    fate: bool | None = None


class FakeJournal:
    """In-memory `JournalPort`: appends wait in `pending` until the test settles them, in any
    order, each record durable or failed as the test says. As Kafka keeps a producer's order
    in a partition (and a source has one), a record becomes durable only with every record of
    its source appended before it that was not refused: their outcomes may still be reported
    later. Like the real journal it remembers failed pubseqs durably (at once) and forgets them
    when a copy becomes durable."""

    def __init__(self) -> None:
        self.pending: list[tuple[list[_Record], BatchCallback]] = []
        self.flying: list[_Record] = []  # appended, outcome not reported, in append order
        self.sources: dict[str, _Source] = {}
        self.appends: list[tuple[str, int | None]] = []
        self.refuse: set[bytes] = set()  # content the journal refuses outright (invalid)

    def append_many(self, pubs: Sequence[Publication], callback: BatchCallback) -> list[int]:
        if any(p.content in self.refuse for p in pubs):
            raise InvalidParameter("refused")
        records = [_Record(p) for p in pubs]
        self.pending.append((records, callback))
        self.flying.extend(records)
        self.appends.extend((p.source, p.publisher_seq) for p in pubs)
        return []

    def publisher_position(self, source: str) -> PublisherPosition:
        st = self.sources.get(source, _Source())
        return PublisherPosition(st.mark, len(st.records), frozenset(st.failed))

    def _durable(self, record: _Record) -> None:
        for earlier in self.flying:
            if earlier is record:
                break
            if earlier.pub.source == record.pub.source and earlier.fate is None:
                self._durable(earlier)
        record.fate = True
        st = self.sources.setdefault(record.pub.source, _Source())
        if record.pub.publisher_seq is not None:
            st.records.append(record.pub.publisher_seq)
            st.failed.discard(record.pub.publisher_seq)

    def settle(self, index: int, durable: Callable[[int], bool]) -> None:
        records, callback = self.pending.pop(index)
        for i, record in enumerate(records):
            if record.fate is not None:
                continue  # durable already, with a later record of its source
            if durable(i):
                self._durable(record)
            else:
                record.fate = False
                if record.pub.publisher_seq is not None:
                    self.sources.setdefault(record.pub.source, _Source()).failed.add(
                        record.pub.publisher_seq)
        self.flying = [r for r in self.flying if all(r is not x for x in records)]
        callback([Appended(r.pub.source, 0, Position(0, 0)) if r.fate
                  else JournalUnavailable("kafka did not take it") for r in records])

    def crash(self, keep: int) -> None:
        """A kill -9: of what is in flight and undecided, the first `keep` records (append
        order) become durable and the rest is lost; nothing is reported."""
        undecided = [r for r in self.flying if r.fate is None]
        for record in undecided[:keep]:
            self._durable(record)
        self.pending.clear()
        self.flying.clear()


def _pub(pubseq: int | None, source: str = FRED, content: bytes = b"x") -> Publication:
    return Publication(topic="t", source=source, content=content, publisher_seq=pubseq)


class TestGate:
    def test_plain_publications_pass_straight_through(self) -> None:
        """Without publisher seqs the gate is one journal batch, answered as the journal says."""
        journal = FakeJournal()
        gate = PublishGate(journal)
        got: list[list[Outcome]] = []
        gate.append_many([_pub(None), _pub(None)], got.append)
        assert len(journal.pending) == 1 and not got
        journal.settle(0, lambda i: i == 0)
        assert isinstance(got[0][0], Appended) and isinstance(got[0][1], JournalUnavailable)

    def test_a_resend_after_a_lost_ok_is_answered_without_a_record(self) -> None:
        """The same pubseq twice: one append, both answered ok."""
        journal = FakeJournal()
        gate = PublishGate(journal)
        got: list[list[Outcome]] = []
        gate.append_many([_pub(1)], got.append)
        journal.settle(0, lambda _: True)
        gate.append_many([_pub(1)], got.append)
        assert journal.appends == [(FRED, 1)]
        assert isinstance(got[0][0], Appended)
        assert got[1] == [AlreadyDurable(FRED, 1)]
        assert gate.copies == 1

    def test_a_copy_in_the_same_batch_waits_for_the_original(self) -> None:
        """Original and copy in one batch: one record; the batch is answered once, both ok."""
        journal = FakeJournal()
        gate = PublishGate(journal)
        got: list[list[Outcome]] = []
        gate.append_many([_pub(1), _pub(2), _pub(1)], got.append)
        assert journal.appends == [(FRED, 1), (FRED, 2)]
        journal.settle(0, lambda _: True)
        assert got[0][2] == AlreadyDurable(FRED, 1)

    def test_a_copy_waiting_on_a_failed_original_is_appended(self) -> None:
        """The original fails: its error goes to its sender, and the copy is journaled."""
        journal = FakeJournal()
        gate = PublishGate(journal)
        first: list[list[Outcome]] = []
        second: list[list[Outcome]] = []
        gate.append_many([_pub(4)], first.append)
        gate.append_many([_pub(4)], second.append)
        journal.settle(0, lambda _: False)
        assert isinstance(first[0][0], JournalUnavailable) and not second
        assert journal.appends == [(FRED, 4), (FRED, 4)]
        journal.settle(0, lambda _: True)
        assert isinstance(second[0][0], Appended)

    def test_one_invalid_publication_does_not_sink_the_batch(self) -> None:
        """A batch the journal refuses is retried one by one; the bad one gets its error."""
        journal = FakeJournal()
        journal.refuse.add(b"bad")
        gate = PublishGate(journal)
        got: list[list[Outcome]] = []
        gate.append_many([_pub(1), _pub(2, content=b"bad"), _pub(None)], got.append)
        for _ in range(len(journal.pending)):
            journal.settle(0, lambda _: True)
        assert [type(o) for o in got[0]] == [Appended, InvalidParameter, Appended]
        # the refused pubseq is not durable: its resend is journaled
        gate.append_many([_pub(2)], got.append)
        assert journal.appends[-1] == (FRED, 2)

    def test_position_waits_for_what_is_in_flight(self) -> None:
        """pubstatus is answered once the source's publications in flight have settled."""
        journal = FakeJournal()
        gate = PublishGate(journal)
        gate.append_many([_pub(1), _pub(2)], lambda _: None)
        seen: list[PublisherPosition] = []
        gate.position(FRED, seen.append)
        gate.append_many([_pub(3)], lambda _: None)  # after the query: not waited for
        assert not seen
        journal.settle(0, lambda _: True)
        assert seen == [PublisherPosition(2, 2, frozenset())]
        gate.position("barney@example.com", seen.append)
        assert seen[-1] == PublisherPosition(0, 0, frozenset())


# --- random interleavings -------------------------------------------------------------------


@dataclass
class _Copy:
    source: str
    pubseq: int
    answer: Outcome | None = None
    lost: bool = False  # its connection died with the broker


_sources = st.sampled_from([FRED, "barney@example.com"])
_op = st.one_of(
    st.tuples(st.just("send"), st.lists(st.tuples(_sources, st.booleans(), st.integers(0, 40)),
                                        min_size=1, max_size=5)),
    st.tuples(st.just("settle"), st.integers(0, 10), st.lists(st.booleans(), min_size=1,
                                                              max_size=8)),
    st.tuples(st.just("crash"), st.integers(0, 20)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40))
def test_random_interleavings_keep_the_invariants(ops: list[tuple[object, ...]]) -> None:
    """Sends of new pubseqs (rising per source), resends of any earlier one, batches settling
    in any order with any mix of durable and failed records, and broker restarts (what was in
    flight survives as a prefix, the rest unanswered; the publisher, reconnecting, first sends
    again what it has no ok for, oldest first, as §8.1 asks): each (source, pubseq) is journaled at
    most once; a copy answered ok is durable; every durable pubseq was answered ok to one of
    its copies (unless a crash took the answer); and with everything settled, every copy not
    lost in a crash is answered."""
    journal = FakeJournal()
    gate = PublishGate(journal)
    copies: list[_Copy] = []
    sent: dict[str, list[int]] = {}

    def send(batch: list[tuple[str, bool, int]]) -> None:
        pubs: list[Publication] = []
        made: list[_Copy] = []
        for source, resend, pick in batch:
            mine = sent.setdefault(source, [])
            if resend and mine:
                pubseq = mine[pick % len(mine)]
            else:
                pubseq = (mine[-1] if mine else 0) + 1 + pick % 3  # rising, with skips
                mine.append(pubseq)
            pubs.append(_pub(pubseq, source))
            made.append(_Copy(source, pubseq))
        copies.extend(made)

        def answered(outcomes: list[Outcome]) -> None:
            for copy, outcome in zip(made, outcomes, strict=True):
                assert copy.answer is None, "answered twice"
                copy.answer = outcome

        gate.append_many(pubs, answered)

    def settle(index: int, pattern: list[bool]) -> None:
        if journal.pending:
            journal.settle(index % len(journal.pending), lambda i: pattern[i % len(pattern)])

    for op in ops:
        if op[0] == "send":
            send(op[1])  # type: ignore[arg-type]
        elif op[0] == "settle":
            settle(op[1], op[2])  # type: ignore[arg-type]
        else:
            journal.crash(op[1])  # type: ignore[arg-type]
            for copy in copies:
                if copy.answer is None:
                    copy.lost = True
            gate = PublishGate(journal)
            oked = {(c.source, c.pubseq) for c in copies
                    if isinstance(c.answer, Appended | AlreadyDurable)}
            for source, mine in sent.items():
                again = [p for p in mine if (source, p) not in oked]
                if again:
                    send([(source, True, mine.index(p)) for p in again])
    for _ in range(1000):  # settle the rest (takeovers add batches), durable at last
        if not journal.pending:
            break
        settle(0, [True])
    assert not journal.pending

    for source, st_ in journal.sources.items():
        assert len(st_.records) == len(set(st_.records)), f"{source}: a pubseq journaled twice"
    for copy in copies:
        durable = copy.pubseq in journal.sources.get(copy.source, _Source()).records
        if copy.lost:
            continue
        assert copy.answer is not None, f"{copy} never answered"
        if isinstance(copy.answer, Appended | AlreadyDurable):
            assert durable, f"{copy} answered ok but not durable"
    for source, st_ in journal.sources.items():
        for pubseq in st_.records:
            mine = [c for c in copies if (c.source, c.pubseq) == (source, pubseq)]
            assert any(c.lost or isinstance(c.answer, Appended | AlreadyDurable)
                       for c in mine), f"{source} {pubseq} durable but nobody was told"


@pytest.mark.parametrize("failures", [0, 1, 3])
def test_a_window_resent_after_a_reconnect_is_journaled_once_in_order(failures: int) -> None:
    """The reconnect scenario end to end: 1..20 sent, outcomes lost, all resent while some are
    in flight and some failed: the journal holds 1..20 once each."""
    journal = FakeJournal()
    gate = PublishGate(journal)
    gate.append_many([_pub(n) for n in range(1, 11)], lambda _: None)
    gate.append_many([_pub(n) for n in range(11, 21)], lambda _: None)
    journal.settle(0, lambda i: i >= failures)  # 1..failures fail, the rest of 1..10 durable
    answers: list[list[Outcome]] = []
    gate.append_many([_pub(n) for n in range(1, 21)], answers.append)  # the resend
    while journal.pending:
        journal.settle(0, lambda _: True)
    assert sorted(journal.sources[FRED].records) == list(range(1, 21))
    assert journal.sources[FRED].records[:10 - failures] == list(range(failures + 1, 11))
    assert all(isinstance(o, Appended | AlreadyDurable) for o in answers[0])
