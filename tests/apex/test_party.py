"""RFC 3342 in the pure relay: dataHopping and dataTiming at step 5.2 (next relay) and 5.3
(local delivery: the `Watch` the shell times), hold4Endpoint with an in-memory hold store, and
the statusResponse reports all of them send. A stepping clock makes every "processing time"
exact."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator, Iterable

from lxml import etree

from adapters.apex.codec import Attach, Data, Error, Ok, Option, TargetHop, Terminate
from adapters.apex.endpoint import Endpoint
from adapters.apex.options import DataTiming, data_timing, find_option, hop_limit, spend_hop
from adapters.apex.relay import ChannelRef, Delivery, Outcome, Relay
from broker.holds import HeldData, HoldBook, HoldLimits

FRED, BARNEY = Endpoint.parse("fred@a.example"), Endpoint.parse("barney@a.example")
WILMA, REMOTE = Endpoint.parse("wilma@a.example"), Endpoint.parse("betty@b.example")
A, B, LINK = ChannelRef(1, 1), ChannelRef(2, 1), ChannelRef(3, 1)
STEP_MS = 5


class StepClock:
    """time.time() stand-in: every call is STEP_MS later than the one before."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += STEP_MS / 1000
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms / 1000


class _Done:
    """An awaitable that is already complete (a write that took no time)."""

    def __await__(self) -> Generator[None, None, None]:
        return
        yield


class MemoryHolds:
    """A HoldStore over a HoldBook whose writes are instant (the Kafka one is tested in
    tests/broker/test_holds.py)."""

    def __init__(self, limits: HoldLimits | None = None) -> None:
        self.book = HoldBook(limits)
        self.released: list[str] = []

    def _done(self) -> Awaitable[None]:
        return _Done()

    def hold(self, item: HeldData) -> Awaitable[None]:
        self.book.reserve(item)
        return self._done()

    def take(self, endpoint: str, *, base: bool) -> list[HeldData]:
        return self.book.take(endpoint, base=base)

    def release(self, hold_id: str) -> Awaitable[None]:
        self.book.forget(hold_id)
        self.released.append(hold_id)
        return self._done()

    def requeue(self, hold_id: str) -> None:
        self.book.requeue(hold_id)

    def expired(self, now_ms: int) -> list[HeldData]:
        return self.book.expired(now_ms)

    def late(self, now_ms: int) -> list[HeldData]:
        return self.book.late(now_ms)

    def next_due(self) -> int | None:
        return self.book.next_due()


def _relay(holds: MemoryHolds | None = None) -> tuple[Relay, StepClock]:
    clock = StepClock()
    relay = Relay("a.example", clock=clock, holds=holds)
    assert relay.handle(A, Attach(FRED, 1)).reply == Ok()
    assert relay.handle(B, Attach(BARNEY, 1)).reply == Ok()
    relay.add_route("b.example", LINK)
    return relay, clock


def _code(outcome: Outcome) -> int:
    return outcome.reply.code if isinstance(outcome.reply, Error) else 250


def _opt(name: str, content: str = "", trans_id: int | None = 86) -> Option:
    return Option(name, trans_id, target_hop=TargetHop.ALL, must_understand=True,
                  content=content)


def _report(delivery: Delivery) -> tuple[str, list[tuple[str, str]]]:
    """(transID, [(destination, code)]) of a statusResponse delivery."""
    data = delivery.operation
    assert isinstance(data, Data) and data.originator == Endpoint.parse("apex=report@a.example")
    root = etree.fromstring(data.content)
    return root.get("transID"), [(d.get("identity"), d[0].get("code")) for d in root]


def _timing_of(data: Data | Terminate) -> DataTiming:
    assert isinstance(data, Data)
    option = find_option(data.options, "dataTiming")
    assert option is not None
    return data_timing(option)


class TestNextRelay:
    def test_hop_count_is_spent_before_the_next_relay(self) -> None:
        """noMoreThan 3 leaves as 2; local delivery spends nothing."""
        relay, _ = _relay()
        opts = (_opt("dataHopping", "<dataHopping noMoreThan='3' />"),)
        (out,) = relay.handle(A, Data(FRED, (REMOTE,), b"x", options=opts)).deliveries
        assert out.target == LINK and isinstance(out.operation, Data)
        assert hop_limit(out.operation.options) == 2
        (local,) = relay.handle(A, Data(FRED, (BARNEY,), b"x", options=opts)).deliveries
        assert isinstance(local.operation, Data) and hop_limit(local.operation.options) == 3

    def test_last_hop_stops_the_data_and_reports_550(self) -> None:
        """noMoreThan 1: not sent; the reply is 550 and, with reportErrors, fred gets a
        statusResponse for betty with code 550 and the option's transID."""
        relay, _ = _relay()
        opts = (_opt("dataHopping", "<dataHopping noMoreThan='1' reportErrors='true' />"),)
        outcome = relay.handle(A, Data(FRED, (REMOTE,), b"x", options=opts))
        assert isinstance(outcome.reply, Error) and outcome.reply.code == 550
        (report,) = outcome.deliveries
        assert report.target == A
        assert _report(report) == ("86", [("betty@b.example", "550")])
        quiet = (_opt("dataHopping", "<dataHopping noMoreThan='1' />"),)
        assert relay.handle(A, Data(FRED, (REMOTE,), b"x", options=quiet)).deliveries == ()

    def test_no_later_than_loses_the_processing_time(self) -> None:
        """noLaterThan and reportAfter leave less the time spent here (one clock step)."""
        relay, _ = _relay()
        opts = (_opt("dataTiming", "<dataTiming noLaterThan='1000' reportAfter='500' "
                                   "returnTrip='9' />"),)
        (out,) = relay.handle(A, Data(FRED, (REMOTE,), b"x", options=opts)).deliveries
        assert _timing_of(out.operation) == DataTiming(1000 - STEP_MS, 9, 500 - STEP_MS)

    def test_no_later_than_spent_drops_with_a_timing_error_report(self) -> None:
        """noLaterThan below the processing time: not sent, 550 report if reportErrors."""
        relay, _ = _relay()
        opts = (_opt("dataTiming", f"<dataTiming noLaterThan='{STEP_MS}' reportErrors='true' />"),)
        outcome = relay.handle(A, Data(FRED, (REMOTE,), b"x", options=opts))
        assert isinstance(outcome.reply, Error)
        assert [_report(d) for d in outcome.deliveries] == [("86", [("betty@b.example",
                                                                     "550")])]

    def test_report_after_spent_sends_350_and_the_data_goes_on(self) -> None:
        """reportAfter below the processing time becomes 0, a transient report goes out."""
        relay, _ = _relay()
        opts = (_opt("dataTiming", "<dataTiming reportAfter='1' />"),)
        outcome = relay.handle(A, Data(FRED, (REMOTE,), b"x", options=opts))
        forwarded, report = outcome.deliveries
        assert forwarded.target == LINK and _timing_of(forwarded.operation) == DataTiming()
        assert _report(report) == ("86", [("betty@b.example", "350")])


class TestLocalDelivery:
    def test_watch_carries_deadlines_and_reports(self) -> None:
        """Deadline and report time less the time spent here; the timing error (550),
        transient (350) and final-hop (250, with dataTiming noLaterThan=returnTrip) reports."""
        relay, _ = _relay()
        opts = (_opt("dataTiming", "<dataTiming noLaterThan='1000' returnTrip='2000' "
                                   "reportAfter='500' reportErrors='true' />"),)
        (delivery,) = relay.handle(A, Data(FRED, (BARNEY,), b"x", options=opts)).deliveries
        watch = delivery.watch
        assert delivery.target == B and watch is not None and watch.hold_id is None
        assert watch.deadline == (1000 - STEP_MS) / 1000
        assert watch.report_after == (500 - STEP_MS) / 1000
        assert watch.on_timeout and _report(Delivery(A, watch.on_timeout))[1] == [
            ("barney@a.example", "550")]
        assert watch.on_late and _report(Delivery(A, watch.on_late))[1] == [
            ("barney@a.example", "350")]
        assert watch.on_ok is not None
        assert _report(Delivery(A, watch.on_ok)) == ("86", [("barney@a.example", "250")])
        (back,) = watch.on_ok.options
        assert back.name == "dataTiming" and back.must_understand
        assert back.target_hop is TargetHop.ALL and back.content == \
            "<dataTiming noLaterThan='2000' />"

    def test_no_timing_no_watch(self) -> None:
        """Plain data is delivered as before, without a watch."""
        relay, _ = _relay()
        (delivery,) = relay.handle(A, Data(FRED, (BARNEY,), b"x")).deliveries
        assert delivery.watch is None

    def test_reports_are_never_about_reports(self) -> None:
        """Data from apex=report with an expired timing is dropped without a report."""
        relay, _ = _relay()
        relay.add_route("c.example", ChannelRef(4, 1))
        report = Data(Endpoint.parse("apex=report@a.example"), (REMOTE,), b"x", options=(
            _opt("dataTiming", "<dataTiming noLaterThan='1' reportErrors='true' />"),))
        assert relay.route(report, received=relay.clock()) == []


class TestHold:
    def _held(self, relay: Relay, data: Data) -> Outcome:
        outcome = relay.handle(A, data)
        assert outcome.pending is not None

        async def settle() -> Outcome:
            assert outcome.pending is not None
            return await outcome.pending.settle()
        return asyncio.run(settle())

    def test_held_until_attach_then_delivered_with_time_left(self) -> None:
        """wilma is absent: ok once held; on her attach the data comes with noLaterThan
        showing the time left and a watch that releases the hold on ok."""
        holds = MemoryHolds()
        relay, clock = _relay(holds)
        opts = (_opt("hold4Endpoint", trans_id=None),
                _opt("dataTiming", "<dataTiming noLaterThan='60000' />"))
        assert self._held(relay, Data(FRED, (WILMA,), b"later", options=opts)).reply == Ok()
        assert len(holds.book) == 1
        clock.advance(42_000)
        outcome = relay.handle(ChannelRef(9, 1), Attach(WILMA, 3))
        (delivery,) = outcome.deliveries
        assert delivery.target == ChannelRef(9, 1) and isinstance(delivery.operation, Data)
        assert delivery.operation.content == b"later"
        left = _timing_of(delivery.operation).no_later_than
        assert 60_000 - 42_000 - 4 * STEP_MS <= left < 60_000 - 42_000
        assert delivery.watch is not None and delivery.watch.hold_id in holds.book

    def test_without_hold4endpoint_absent_is_550(self) -> None:
        """The store changes nothing for data that did not ask to be held."""
        relay, _ = _relay(MemoryHolds())
        assert _code(relay.handle(A, Data(FRED, (WILMA,), b"x"))) == 550

    def test_deadline_discards_with_report(self) -> None:
        """expire_held after noLaterThan: released, 550 report to fred if reportErrors."""
        holds = MemoryHolds()
        relay, clock = _relay(holds)
        opts = (_opt("hold4Endpoint", trans_id=None), _opt(
            "dataTiming", "<dataTiming noLaterThan='1000' reportErrors='true' />"))
        self._held(relay, Data(FRED, (WILMA,), b"x", options=opts))
        assert relay.expire_held() == []
        clock.advance(1000)
        (report,) = relay.expire_held()
        assert report.target == A and _report(report) == ("86", [("wilma@a.example", "550")])
        assert len(holds.book) == 0 and holds.released
        assert relay.handle(ChannelRef(9, 1), Attach(WILMA, 3)).deliveries == ()

    def test_report_after_while_held_is_350_once(self) -> None:
        """A held data's reportAfter passing sends one transient report; it stays held."""
        holds = MemoryHolds()
        relay, clock = _relay(holds)
        opts = (_opt("hold4Endpoint", trans_id=None),
                _opt("dataTiming", "<dataTiming reportAfter='100' />"))
        self._held(relay, Data(FRED, (WILMA,), b"x", options=opts))
        clock.advance(100)
        (report,) = relay.expire_held()
        assert _report(report)[1] == [("wilma@a.example", "350")]
        assert relay.expire_held() == [] and len(holds.book) == 1

    def test_over_the_cap_is_554(self) -> None:
        """The originator's second held data is refused with 554 when the cap is one."""
        relay, _ = _relay(MemoryHolds(HoldLimits(max_per_originator=1)))
        opts = (_opt("hold4Endpoint", trans_id=None),)
        assert self._held(relay, Data(FRED, (WILMA,), b"x", options=opts)).reply == Ok()
        assert _code(relay.handle(A, Data(FRED, (WILMA,), b"y", options=opts))) == 554


class _Republisher:
    """What a pubsub-like service does: republish to a remote subscriber, spending a hop."""

    def on_data(self, data: Data, recipient: Endpoint) -> Iterable[Data]:
        onward = spend_hop(data.options)
        return [] if onward is None else [Data(recipient, (REMOTE,), data.content,
                                               options=onward)]


def test_service_forwarding_spends_its_own_hop_too() -> None:
    """A service republishing with spend_hop, then the relay's own hop: 3 arrives as 1."""
    relay, _ = _relay()
    relay.register_service("apex=pubsub", _Republisher())
    opts = (_opt("dataHopping", "<dataHopping noMoreThan='3' />"),)
    outcome = relay.handle(A, Data(FRED, (Endpoint.parse("apex=pubsub/t@a.example"),), b"x",
                                   options=opts))
    (out,) = outcome.deliveries
    assert out.target == LINK and isinstance(out.operation, Data)
    assert hop_limit(out.operation.options) == 1
