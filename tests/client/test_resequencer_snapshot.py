"""The subscriber stub and snapshot copies (docs/robust-binding.md §9): state, not the stream —
delivered in link order whatever their source seqs, without moving the per-source positions or
the frontier's journal time."""

from __future__ import annotations

from adapters.apex.robust_codec import LinkReply, SourcePosition
from adapters.apex.robust_stamp import Stamp, StampKind
from adapters.client.resequencer import Deliver, RequestGap, RequestRepair, Resequencer
from broker.records import PublishType

L = "desk-1"
A, B = "a@example.com", "b@example.com"


def data(seq: int, sseq: int, source: str = A, *, snapshot: bool = False,
         time: int | None = None, refill: bool = False) -> Stamp:
    return Stamp(L, seq, StampKind.DATA, 0, source, sseq,
                 PublishType.IMAGE if snapshot else PublishType.UPDATE, "equity.quote",
                 message_id="IBM", time=time, refill=refill, snapshot=snapshot)


def fresh() -> Resequencer:
    stub = Resequencer(L, 16, 1.0)
    assert stub.receive(Stamp(L, 0, StampKind.RESET, 0, time=500), b"", 0.0) == []
    return stub


def delivered(actions: list[object]) -> list[tuple[str | None, int | None, bool]]:
    return [(a.stamp.source, a.stamp.source_seq, a.stamp.snapshot) for a in actions
            if isinstance(a, Deliver)]


def test_snapshot_copies_skip_the_duplicate_check_and_leave_positions_alone() -> None:
    """After live A 1..5, a snapshot holding A 3 and A 5 is delivered all the same; a snapshot
    copy of A 9 does not move A's position, so live A 6 still follows; nor does the old
    journal time of a snapshot copy become the frontier's."""
    stub = fresh()
    out = []
    for n in range(1, 6):
        out += stub.receive(data(n, n, time=1_000 + n), b"", 0.1)
    out += stub.receive(data(6, 3, snapshot=True, time=10), b"s3", 0.2)
    out += stub.receive(data(7, 5, snapshot=True, time=20), b"s5", 0.2)
    out += stub.receive(data(8, 9, snapshot=True, time=30), b"s9", 0.2)
    out += stub.receive(data(9, 6, time=1_006), b"", 0.3)
    assert delivered(out) == [(A, n, False) for n in range(1, 6)] + [
        (A, 3, True), (A, 5, True), (A, 9, True), (A, 6, False)]
    pos = stub.positions()
    assert pos.sources == {A: 6} and pos.time == 1_006 and pos.link_seq == 9
    assert stub.counters.duplicates == 0 and stub.counters.delivered == 9


def test_snapshot_copies_keep_link_order_through_a_hole() -> None:
    """A lost snapshot copy is a hole like any other: what follows waits, the refill (still
    marked snapshot) is delivered in its place, and a link seq seen twice is still dropped."""
    stub = fresh()
    assert stub.receive(data(1, 7, B, snapshot=True), b"", 0.0) != []
    (gap,) = stub.receive(data(3, 8, snapshot=True), b"", 0.1)
    assert gap == RequestGap(1, L, 0, 2, 2)
    assert stub.receive(data(4, 1), b"", 0.2) == []
    out = stub.receive(data(2, 2, snapshot=True, refill=True), b"", 0.3)
    assert delivered(out) == [(A, 2, True), (A, 8, True), (A, 1, False)]
    assert stub.receive(data(2, 2, snapshot=True, refill=True), b"", 0.4) == []
    assert stub.on_reply(LinkReply(250, L, 1), 0.5) == [] and stub.idle
    assert stub.positions().sources == {A: 1}


def test_a_repair_after_a_snapshot_names_only_what_the_stream_delivered() -> None:
    """Snapshot copies are not in a repair's source positions, and their old times do not
    pull its `since` back (a stub that saw only snapshot copies asks from the first other
    stamp's time, here the reset that lost its context)."""
    stub = fresh()
    stub.receive(data(1, 40, snapshot=True, time=5), b"", 0.0)
    stub.receive(data(2, 2, B, time=900), b"", 0.1)
    out = stub.receive(Stamp(L, 0, StampKind.RESET, 1, time=2_000), b"", 0.2)
    (rep,) = [a for a in out if isinstance(a, RequestRepair)]
    assert rep.sources == (SourcePosition(B, 2),) and rep.since == 0  # 900 - 1000 margin
    lone = Resequencer(L, 16, 1.0)
    lone.receive(data(1, 40, snapshot=True, time=5), b"", 0.0)
    lone.receive(data(2, 41, snapshot=True, time=6), b"", 0.0)
    (rep,) = [a for a in lone.receive(Stamp(L, 0, StampKind.RESET, 1, time=9_000), b"", 0.1)
              if isinstance(a, RequestRepair)]
    assert rep.sources == () and rep.since == 8_000
