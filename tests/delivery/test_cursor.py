"""Forwarding on acknowledgement (broker/delivery/cursor.py): a journal with two partitions that
this broker and other writers append to (DATA, and GAP records that forward nothing), our
acknowledgements arriving late, out of order across batches and twice, and the follower reading
the journal back in random steps. After every step: per partition, every offset was forwarded
at most once and in rising order, only DATA from the follower's start on, as the journal holds
it; an acknowledged entry whose offsets below are all ours and acknowledged has gone without
waiting for the follower; once everything is read and acknowledged, every DATA entry from the
start on has gone."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.delivery.cursor import ForwardCursor
from broker.kafka_io import Position
from broker.records import JournalEntry, RecordKind
from tests.delivery.fakes import entry

PARTS = (0, 1)


def _gap(position: Position) -> JournalEntry:
    e = entry("q.t", "journal", 1, position)
    return JournalEntry(**{**{f: getattr(e, f) for f in e.__dataclass_fields__},
                           "kind": RecordKind.GAP})


class CursorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.forwarded: list[JournalEntry] = []
        self.cursor = ForwardCursor(self.forwarded.extend)
        #: partition -> its records: (entry, ours)
        self.journal: dict[int, list[tuple[JournalEntry, bool]]] = {p: [] for p in PARTS}
        self.start: dict[int, int] | None = None
        #: acknowledged by Kafka, not yet handed to the cursor (our DATA records)
        self.unacked: list[JournalEntry] = []
        self.acked: set[Position] = set()
        #: partition -> the follower's next offset
        self.read: dict[int, int] = {}

    @rule(part=st.sampled_from(PARTS), ours=st.booleans(), gap=st.booleans(),
          count=st.integers(1, 4))
    def write(self, part: int, ours: bool, gap: bool, count: int) -> None:
        """Records land in the journal: ours (acknowledged later) or another writer's."""
        for _ in range(count):
            records = self.journal[part]
            pos = Position(part, len(records))
            e = _gap(pos) if gap else entry("q.t", "me" if ours else "other", pos.offset + 1,
                                            pos)
            records.append((e, ours))
            if ours and not gap and self.start is not None:
                self.unacked.append(e)

    @precondition(lambda self: self.start is None)
    @rule()
    def begin(self) -> None:
        """The follower starts at the journal's end: what came before is not forwarded."""
        self.start = {p: len(self.journal[p]) for p in PARTS}
        self.read = dict(self.start)
        self.cursor.start(self.start)

    @precondition(lambda self: self.unacked)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        """One append batch's acknowledgements: any of them, in any order."""
        picked = data.draw(st.lists(st.sampled_from(self.unacked), min_size=1, max_size=4,
                                    unique_by=lambda e: e.position))
        for e in picked:
            self.unacked.remove(e)
            self.acked.add(e.position)
        self.cursor.acked(data.draw(st.permutations(picked)))

    @precondition(lambda self: self.acked)
    @rule(data=st.data())
    def ack_again(self, data: st.DataObject) -> None:
        """A duplicate acknowledgement changes nothing."""
        pos = data.draw(st.sampled_from(sorted(self.acked)))
        self.cursor.acked([self.journal[pos.partition][pos.offset][0]])

    @precondition(lambda self: self.start is not None)
    @rule(part=st.sampled_from(PARTS), count=st.integers(0, 5))
    def follow(self, part: int, count: int) -> None:
        """The follower reads the next records of a partition (possibly none)."""
        lo = self.read[part]
        hi = min(len(self.journal[part]), lo + count)
        entries = [e for e, _ in self.journal[part][lo:hi] if e.kind is RecordKind.DATA]
        self.read[part] = hi
        self.cursor.followed(entries, {part: hi} if hi > lo else {})

    @rule()
    def quiesce(self) -> None:
        if self.start is None:
            return
        for e in list(self.unacked):
            self.unacked.remove(e)
            self.acked.add(e.position)
            self.cursor.acked([e])
        for part in PARTS:
            self.follow(part, len(self.journal[part]))
        assert self.cursor.waiting() == 0
        want = [e.position for p in PARTS for e, _ in self.journal[p][self.start[p]:]
                if e.kind is RecordKind.DATA]
        assert sorted(e.position for e in self.forwarded) == want

    @invariant()
    def once_in_order_only_data_from_the_start(self) -> None:
        last: dict[int, int] = {}
        for e in self.forwarded:
            part, offset = e.position
            assert self.start is not None
            assert offset >= self.start[part], f"{e.position} precedes the start"
            assert offset > last.get(part, -1), f"{e.position} after offset {last.get(part)}"
            last[part] = offset
            held, _ = self.journal[part][offset]
            assert held.kind is RecordKind.DATA and held == e

    @invariant()
    def acknowledged_runs_go_without_the_follower(self) -> None:
        """From the follower's position, every acked DATA record of ours with only acked
        records of ours before it has been forwarded, whatever the follower did."""
        if self.start is None:
            return
        done = {e.position for e in self.forwarded}
        for part in PARTS:
            for e, ours in self.journal[part][self.read[part]:]:
                if not ours or e.kind is not RecordKind.DATA or e.position not in self.acked:
                    break
                assert e.position in done, f"{e.position} acked yet not forwarded"


CursorMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50,
                                           deadline=None)
TestCursorMachine = CursorMachine.TestCase


def test_an_entry_acked_before_the_start_waits_for_it() -> None:
    out: list[JournalEntry] = []
    cursor = ForwardCursor(out.extend)
    e = entry("q.t", "me", 1, Position(0, 5))
    cursor.acked([e])
    assert out == []
    cursor.start({0: 5})
    assert out == [e]
