"""The subscriber stub (adapters/client/resequencer.py), scenario by scenario: ordering, holes found
by data and by heartbeats, the 16-bit wrap, timers, resets and repair, replies, positions, limits
and bad input. The random interleavings are in test_resequencer_machine.py."""

from __future__ import annotations

import pytest

from adapters.apex.batch_codec import DEFAULT_BATCH
from adapters.apex.robust_codec import GapRequest, LinkReply, SourcePosition
from adapters.apex.robust_stamp import Stamp, StampKind
from adapters.client.resequencer import (
    Action,
    Delayed,
    Deliver,
    LinkRefused,
    Lost,
    Positions,
    Repaired,
    RequestGap,
    RequestRepair,
    Resequencer,
    Reset,
    SilentLink,
)
from broker.records import PublishType
from common.errors import InvalidParameter, ParameterSyntaxError

L = "desk-1"
A, B = "a@example.com", "b@example.com"


def data(seq: int, sseq: int, source: str = A, epoch: int = 0, time: int | None = None,
         refill: bool = False) -> Stamp:
    return Stamp(L, seq, StampKind.DATA, epoch, source, sseq, PublishType.UPDATE,
                 "equity.quote", time=time, refill=refill)


def hb(seq: int, epoch: int = 0) -> Stamp:
    return Stamp(L, seq, StampKind.HEARTBEAT, epoch)


def reset(epoch: int, repair: int | None = None, time: int | None = None) -> Stamp:
    return Stamp(L, 0, StampKind.RESET, epoch, time=time, repair=repair)


def delivered(actions: list[Action]) -> list[tuple[str | None, int | None]]:
    return [(a.stamp.source, a.stamp.source_seq) for a in actions if isinstance(a, Deliver)]


def only(actions: list[Action], kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, kind)]


def fresh(**kwargs: object) -> Resequencer:
    stub = Resequencer(L, 16, 1.0, **kwargs)  # type: ignore[arg-type]
    assert stub.receive(reset(0, time=100), b"", 0.0) == []
    return stub


def test_in_order_delivery_and_duplicates() -> None:
    """Data is delivered in link order; a repeated link seq or source seq is dropped."""
    stub = fresh()
    out = stub.receive(data(1, 1), b"m1", 0.1) + stub.receive(hb(2), b"", 0.2) \
        + stub.receive(data(3, 2), b"m2", 0.3)
    assert delivered(out) == [(A, 1), (A, 2)]
    assert [a.content for a in only(out, Deliver)] == [b"m1", b"m2"]
    assert stub.receive(data(3, 2), b"m2", 0.4) == []      # same link seq again
    assert stub.receive(data(4, 2), b"m2", 0.5) == []      # a source seq already delivered
    assert stub.counters.duplicates == 2 and stub.counters.delivered == 2 and stub.idle


def test_a_hole_is_asked_for_at_once_and_refilled_in_order() -> None:
    """Seqs 2..3 lost: 4 and 5 are held, 2..3 requested; the refill delivers 2, 3, 4, 5."""
    stub = fresh()
    stub.receive(data(1, 1), b"", 0.0)
    out = stub.receive(data(4, 4), b"", 0.1)
    assert out == [RequestGap(1, L, 0, 2, 3)]
    assert stub.receive(data(5, 5), b"", 0.2) == []
    assert delivered(stub.receive(data(2, 2, refill=True), b"", 0.3)) == [(A, 2)]
    out = stub.receive(data(3, 3, refill=True), b"", 0.4)
    assert delivered(out) == [(A, 3), (A, 4), (A, 5)]
    (done,) = only(out, Repaired)
    assert (done.link_from, done.link_to, done.items) == (2, 3, 2)
    assert stub.on_reply(LinkReply(250, L, 1), 0.5) == []
    assert stub.idle and stub.counters.holes == 1 and stub.counters.repaired == 2


def test_a_heartbeat_alone_reveals_a_lost_message() -> None:
    """On a quiet link the lost message's seq shows when the next heartbeat arrives."""
    stub = fresh()
    stub.receive(data(1, 1), b"", 0.0)
    assert stub.receive(hb(3), b"", 1.0) == [RequestGap(1, L, 0, 2, 2)]
    assert delivered(stub.receive(data(2, 2, refill=True), b"", 1.1)) == [(A, 2)]
    assert stub.idle


def test_a_withheld_refill_closes_its_hole_and_delivers_nothing() -> None:
    """A seq refilled as withheld (the subscriber lost the right to it) is consumed like a
    heartbeat: the hole closes, what waited behind it is delivered, nothing is asked again."""
    stub = fresh()
    stub.receive(data(1, 1), b"", 0.0)
    assert stub.receive(data(3, 3), b"", 0.1) == [RequestGap(1, L, 0, 2, 2)]
    out = stub.receive(Stamp(L, 2, StampKind.WITHHELD, 0, refill=True), b"<withheld />", 0.2)
    assert delivered(out) == [(A, 3)] and len(only(out, Repaired)) == 1
    assert stub.on_reply(LinkReply(250, L, 1), 0.3) == []
    assert stub.idle and stub.counters.withheld == 1 and stub.counters.delivered == 2


def test_crossing_the_16_bit_wrap() -> None:
    """65534, 65535, then 2 (1 lost): the gap is 1..1, and the refill restores order."""
    stub = Resequencer(L, 16, 1.0, positions=Positions(L, 16, 0, 65533, 5, {A: 10}))
    stub.receive(data(65534, 11), b"", 0.0)
    stub.receive(data(65535, 12), b"", 0.1)
    assert stub.receive(data(2, 14), b"", 0.2) == [RequestGap(1, L, 0, 1, 1)]
    assert delivered(stub.receive(data(1, 13, refill=True), b"", 0.3)) == [(A, 13), (A, 14)]
    assert stub.positions().link_seq == 2


def test_a_gap_request_may_wrap_around() -> None:
    """A hole spanning the maximum is asked for as one wrap-around range (from > to)."""
    stub = Resequencer(L, 16, 1.0, positions=Positions(L, 16, 0, 65533, 5, {}))
    (gap,) = stub.receive(data(3, 9), b"", 0.0)
    assert isinstance(gap, RequestGap) and (gap.link_from, gap.link_to) == (65534, 2)
    assert gap.document() == GapRequest(L, 65534, gap.request_id, 2, 0, DEFAULT_BATCH)


def test_a_persistent_hole_is_delayed_asked_again_then_repaired_by_source() -> None:
    """Past the gap timeout a hole is reported Delayed (once) and asked again; after the
    attempts run out the stub repairs by source."""
    stub = fresh(max_attempts=2)
    stub.receive(data(1, 1, time=1_000), b"", 0.0)
    stub.receive(data(3, 3), b"", 0.0)
    out = stub.tick(2.5)
    assert [d.reason for d in only(out, Delayed)] == ["heartbeat", "hole"]
    assert only(out, RequestGap)[0].link_from == 2
    assert only(stub.tick(3.0), RequestGap) == []
    out = stub.tick(5.0)
    assert not [d for d in only(out, Delayed) if d.reason == "hole"]  # reported once
    (rst,) = only(out, Reset)
    (rep,) = only(out, RequestRepair)
    assert rep.sources == (SourcePosition(A, 1),) and rep.since == 0  # 1000 - the 1 s margin
    assert stub.counters.resets == 1 and stub.counters.delayed >= 1 and "hole" in rst.reason


def test_late_heartbeats_and_a_silent_link_are_reported_once() -> None:
    """Nothing heard for 2 intervals: Delayed; for 4: SilentLink; each once per silence."""
    stub = fresh()
    stub.receive(hb(1), b"", 10.0)
    assert stub.tick(11.9) == []
    assert stub.tick(12.1) == [Delayed("heartbeat", pytest.approx(2.1))]  # type: ignore[arg-type]
    assert stub.tick(13.0) == []
    assert stub.tick(14.5) == [SilentLink(pytest.approx(4.5))]  # type: ignore[arg-type]
    assert stub.tick(20.0) == []
    stub.receive(hb(2), b"", 21.0)
    assert len(only(stub.tick(23.5), Delayed)) == 1


def test_an_unasked_reset_means_repair_by_source_and_exactly_once_after() -> None:
    """A reset the stub did not ask for: Reset, a repair with the last source seq per source;
    everything until the answering reset is dropped; repeats are dropped by source seq."""
    stub = fresh()
    stub.receive(data(1, 1, A, time=5_000), b"", 0.0)
    stub.receive(data(2, 7, B, time=5_001), b"", 0.0)
    out = stub.receive(reset(1, time=6_000), b"", 1.0)
    (rst,) = only(out, Reset)
    (rep,) = only(out, RequestRepair)
    assert rst.epoch == 0 and rep.epoch == 0
    assert rep.sources == (SourcePosition(A, 1), SourcePosition(B, 7)) and rep.since == 4_001
    assert stub.receive(data(1, 2, A, epoch=1), b"", 1.1) == []  # before the answer: dropped
    assert stub.receive(reset(2, repair=rep.request_id), b"", 1.2) == []
    out = stub.receive(data(1, 7, B, epoch=2), b"", 1.3) + \
        stub.receive(data(2, 2, A, epoch=2), b"", 1.4) + \
        stub.receive(data(3, 8, B, epoch=2), b"", 1.5)
    assert delivered(out) == [(A, 2), (B, 8)]
    assert stub.counters.stale == 1 and stub.counters.duplicates == 1
    assert stub.on_reply(LinkReply(250, L, rep.request_id), 1.6) == [] and stub.idle


def test_a_slow_repair_is_asked_again_with_backoff_and_any_answer_of_the_round_counts() -> None:
    """A catch-up that takes longer than the repair timeout: the stub asks again (the same
    positions), waits twice as long before a third request, takes the reset answering the
    first request, and then follows the broker's answer to the second request too (the same
    catch-up once more) without a Reset and without delivering anything twice."""
    stub = fresh(repair_timeout=2.0)
    stub.receive(data(1, 1, A, time=5_000), b"", 0.0)
    (first,) = only(stub.receive(reset(1, time=6_000), b"", 1.0), RequestRepair)
    assert stub.tick(2.9) == []                                   # within the timeout
    (second,) = only(stub.tick(3.1), RequestRepair)
    assert (second.sources, second.since) == (first.sources, first.since)
    assert only(stub.tick(6.9), RequestRepair) == []              # the wait doubled: 4 s
    # the answer to the first request arrives: its reset, its catch-up, then live data
    assert stub.receive(reset(2, repair=first.request_id), b"", 7.0) == []
    out = stub.receive(data(1, 2, A, epoch=2), b"", 7.1) + \
        stub.receive(data(2, 3, A, epoch=2), b"", 7.2)
    assert delivered(out) == [(A, 2), (A, 3)]
    assert only(stub.tick(20.0), RequestRepair) == []             # nothing is asked any more
    # the broker then answers the second request: a new epoch with the same catch-up
    out = stub.receive(reset(3, repair=second.request_id), b"", 20.1)
    out += stub.receive(data(1, 2, A, epoch=3), b"", 20.2) + \
        stub.receive(data(2, 3, A, epoch=3), b"", 20.3) + \
        stub.receive(data(3, 4, A, epoch=3), b"", 20.4)
    assert only(out, Reset) == [] and only(out, RequestRepair) == []
    assert delivered(out) == [(A, 4)]
    assert stub.counters.resets == 1 and stub.counters.delivered == 4


def test_a_newer_epoch_without_its_reset_is_a_reset_too() -> None:
    """The reset itself was lost: a stamp of a newer epoch tells the stub the same."""
    stub = fresh()
    stub.receive(data(1, 1), b"", 0.0)
    out = stub.receive(data(1, 5, epoch=1), b"", 0.1)
    assert only(out, Reset) and only(out, RequestRepair)
    assert stub.receive(data(2, 6, epoch=0), b"", 0.2) == []  # an old epoch: stale


def test_569_to_a_gap_means_repair_by_source() -> None:
    """Link context gone: the stub drops what it held and asks by source."""
    stub = fresh()
    stub.receive(data(1, 1), b"", 0.0)
    (gap,) = stub.receive(data(3, 3), b"", 0.1)
    out = stub.on_reply(LinkReply(569, L, gap.request_id, text="gone"), 0.2)
    assert only(out, Reset) and only(out, RequestRepair)[0].sources == (SourcePosition(A, 1),)


def test_a_refused_repair_is_reported_lost_and_the_link_restarts_from_live() -> None:
    """570 to a repair: Lost (with the positions), then a repair without sources."""
    stub = fresh()
    stub.receive(data(1, 1), b"", 0.0)
    rep = only(stub.receive(reset(1), b"", 0.1), RequestRepair)[0]
    out = stub.on_reply(LinkReply(570, L, rep.request_id, text="too old"), 0.2)
    (lost,) = only(out, Lost)
    (again,) = only(out, RequestRepair)
    assert lost.sources == (SourcePosition(A, 1),) and again.sources == () and again.since is None
    assert stub.counters.lost == 1


def test_537_stops_the_asking() -> None:
    """Someone else's link: LinkRefused, and no further requests for that hole."""
    stub = fresh()
    stub.receive(data(1, 1), b"", 0.0)
    (gap,) = stub.receive(data(3, 3), b"", 0.1)
    assert stub.on_reply(LinkReply(537, L, gap.request_id, text="not yours"), 0.2) == \
        [LinkRefused(537, "not yours")]
    assert only(stub.tick(10.0), RequestGap) == []


def test_positions_survive_a_restart_and_resume_asks_for_what_was_missed() -> None:
    """Positions go to JSON and back; resume asks from the next seq (open-ended), holds what
    arrives meanwhile, and processes it in order once the refill is answered 250."""
    stub = fresh()
    stub.receive(data(1, 1, time=10), b"", 0.0)
    stub.receive(data(2, 4, B, time=11), b"", 0.0)
    saved = stub.positions().to_json()
    back = Positions.from_json(saved)
    assert back == Positions(L, 16, 0, 2, 11, {A: 1, B: 4})
    again = Resequencer(L, 16, 1.0, positions=back)
    (req,) = again.resume(5.0)
    assert isinstance(req, RequestGap) and (req.link_from, req.link_to, req.epoch) == (3, None, 0)
    assert again.receive(data(6, 3), b"", 5.1) == []       # live, held until the answer
    assert again.receive(data(3, 2, refill=True), b"", 5.2) == []
    assert again.receive(data(4, 5, B, refill=True), b"", 5.2) == []
    assert again.receive(hb(5), b"", 5.2) == []
    out = again.on_reply(LinkReply(250, L, req.request_id, link_seq=5), 5.3)
    assert delivered(out) == [(A, 2), (B, 5), (A, 3)] and again.idle


def test_live_data_that_overtook_the_resume_refill_open_no_hole() -> None:
    """Live data that arrived before the refill it follows are taken in link order once the
    resume is answered: the refill already holds the seqs between, so there is no hole, no
    second request for them and no `Repaired` (the broker would resend them all)."""
    stub = Resequencer(L, 16, 1.0, positions=Positions(L, 16, 0, 2, None, {A: 2}))
    (req,) = stub.resume(0.0)
    for stamp in (data(7, 7), data(8, 8), data(3, 3, refill=True), data(4, 4, refill=True),
                  hb(5, 0), data(6, 6, refill=True), data(7, 7, refill=True)):
        assert stub.receive(stamp, b"", 0.1) == []
    out = stub.on_reply(LinkReply(250, L, req.request_id, link_seq=7), 0.2)
    assert out == only(out, Deliver)
    assert delivered(out) == [(A, 3), (A, 4), (A, 6), (A, 7), (A, 8)]
    assert stub.counters.holes == 0 and stub.counters.duplicates == 1 and stub.idle


def test_the_reorder_buffer_is_bounded() -> None:
    """More than max_held items behind a hole: the stub repairs by source instead."""
    stub = fresh(max_held=3)
    stub.receive(data(1, 1), b"", 0.0)
    for seq in range(3, 6):
        assert not only(stub.receive(data(seq, seq), b"", 0.0), Reset)
    assert only(stub.receive(data(6, 6), b"", 0.0), Reset)


def test_a_hole_larger_than_the_maximum_gap_goes_straight_to_repair() -> None:
    """No point asking by link range for more than the broker will refill."""
    stub = fresh(max_gap=10)
    stub.receive(data(1, 1), b"", 0.0)
    out = stub.receive(data(20, 20), b"", 0.0)
    assert only(out, Reset) and only(out, RequestRepair) and not only(out, RequestGap)


def test_a_fresh_stub_that_missed_the_start_asks_for_it() -> None:
    """The link's first reset and seq 1 were lost: the stub asks for 1..1 of epoch 0."""
    stub = Resequencer(L, 16, 1.0)
    assert stub.receive(data(2, 2), b"", 0.0) == [RequestGap(1, L, 0, 1, 1)]


@pytest.mark.parametrize("stamp", [
    Stamp("other", 1, StampKind.HEARTBEAT),
    Stamp(L, 70_000, StampKind.HEARTBEAT),
])
def test_bad_stamps_raise_and_change_nothing(stamp: Stamp) -> None:
    """A stamp of another link or beyond the resolution is refused; the stub is as it was."""
    stub = fresh()
    stub.receive(data(1, 1), b"", 0.0)
    before = stub.positions()
    with pytest.raises(InvalidParameter):
        stub.receive(stamp, b"", 0.1)
    assert stub.positions() == before and stub.idle


@pytest.mark.parametrize("text", [
    "not json", "[]", '{"version": 2}', '{"version": 1}',
    '{"version": 1, "link": "desk-1", "bits": 16, "epoch": 0, "linkseq": 70000,'
    ' "time": null, "sources": {}}',
    '{"version": 1, "link": "desk-1", "bits": 16, "epoch": -1, "linkseq": 1,'
    ' "time": null, "sources": {}}',
    '{"version": 1, "link": "desk-1", "bits": 16, "epoch": 0, "linkseq": 1,'
    ' "time": null, "sources": {"a@b.c": "7"}}',
])
def test_bad_positions_are_refused(text: str) -> None:
    """Positions that are not what to_json writes are a 501."""
    with pytest.raises((ParameterSyntaxError, InvalidParameter)):
        Positions.from_json(text)


def test_positions_for_another_link_are_refused() -> None:
    """A stub does not start from another link's positions."""
    with pytest.raises(InvalidParameter):
        Resequencer(L, 16, 1.0, positions=Positions("other", 16, 0, 1, None, {}))
