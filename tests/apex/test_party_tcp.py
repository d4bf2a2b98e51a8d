"""RFC 3342's dataHopping, dataTiming and hold4Endpoint over real TCP: relays linked with
connect_peer, applications that answer late (SlowApp), and held data durable in real Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager

import pytest
from lxml import etree

from adapters.apex.codec import Data, Option, TargetHop
from adapters.apex.endpoint import Endpoint
from adapters.apex.options import DataTiming, data_timing, find_option, hop_limit
from adapters.apex.relay import Relay
from adapters.apex.server import ApexServer
from adapters.client.client import ApexClient
from broker.core import BrokerCore
from broker.holds import HoldLimits, KafkaHolds
from broker.kafka_io import KafkaConfig
from common.errors import NotTaken, TransactionFailed

from .slow_app import SlowApp

FRED, BARNEY = Endpoint.parse("fred@a.example"), Endpoint.parse("barney@a.example")
WILMA, BETTY = Endpoint.parse("wilma@a.example"), Endpoint.parse("betty@b.example")
TIMEOUT = 20.0


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 90))


def _opt(name: str, content: str = "", trans_id: int | None = 86) -> Option:
    return Option(name, trans_id, target_hop=TargetHop.ALL, must_understand=True,
                  content=content)


def _status(data: Data) -> tuple[str, str, list[tuple[str, str]]]:
    """(report originator, transID, [(destination, code)]) of a statusResponse."""
    root = etree.fromstring(data.content)
    return (str(data.originator), root.get("transID"),
            [(d.get("identity"), d[0].get("code")) for d in root])


@asynccontextmanager
async def _client(port: int, endpoint: Endpoint) -> AsyncIterator[ApexClient]:
    client = await ApexClient.connect("127.0.0.1", port, timeout=TIMEOUT)
    try:
        await client.attach(endpoint)
        yield client
    finally:
        await client.close()


async def _next(client: ApexClient) -> Data:
    return await asyncio.wait_for(anext(client.receive()), TIMEOUT)


@asynccontextmanager
async def _linked() -> AsyncIterator[tuple[ApexServer, ApexServer]]:
    """a.example linked to b.example (each accepts the other)."""
    async with ApexServer(Relay("b.example", may_bind=lambda _r, d: d == "a.example")) as b, \
            ApexServer(Relay("a.example", may_bind=lambda _r, d: d == "b.example")) as a:
        await a.connect_peer("b.example", "127.0.0.1", b.port).wait_up()
        yield a, b


class _Bouncer:
    """A service that forwards every data it gets to its twin on the other relay, options
    preserved (a misconfigured pair of forwarders), and keeps the reports it is sent."""

    def __init__(self, me: str, twin: str) -> None:
        self.me, self.twin = Endpoint.parse(me), Endpoint.parse(twin)
        self.forwarded: list[int | None] = []
        self.reports: list[Data] = []
        self.reported = asyncio.Event()

    def on_data(self, data: Data, recipient: Endpoint) -> Iterable[Data]:
        if data.originator.address == "apex=report":
            self.reports.append(data)
            self.reported.set()
            return []
        self.forwarded.append(hop_limit(data.options))
        return [Data(self.me, (self.twin,), data.content, data.content_type,
                     options=data.options)]


def test_data_hopping_stops_a_forwarding_loop_between_two_relays() -> None:
    """Two services bounce data between a.example and b.example forever, except that
    dataHopping noMoreThan=5 lets it cross four times: the fifth crossing is refused at
    a.example, which reports 550 (for the twin, transID 86) to the forwarding service."""
    async def scenario() -> None:
        async with _linked() as (a, b):
            at_a = _Bouncer("apex=loop@a.example", "apex=loop@b.example")
            at_b = _Bouncer("apex=loop@b.example", "apex=loop@a.example")
            a.relay.register_service("apex=loop", at_a)
            b.relay.register_service("apex=loop", at_b)
            async with _client(a.port, FRED) as fred:
                await fred.send(FRED, ["apex=loop@a.example"], b"round and round", options=(
                    _opt("dataHopping", "<dataHopping noMoreThan='5' reportErrors='true' />"),))
                await asyncio.wait_for(at_a.reported.wait(), TIMEOUT)
            assert at_a.forwarded == [5, 3, 1] and at_b.forwarded == [4, 2]
            (report,) = at_a.reports
            assert _status(report) == ("apex=report@a.example", "86",
                                       [("apex=loop@b.example", "550")])
            assert at_b.reports == []
    _run(scenario)


def test_data_hopping_across_a_link() -> None:
    """betty@b.example gets noMoreThan one less than fred sent; with 1 left fred's send fails
    with 550 and a report from a.example's report service follows."""
    async def scenario() -> None:
        async with _linked() as (a, b), _client(a.port, FRED) as fred, \
                _client(b.port, BETTY) as betty:
            await fred.send(FRED, [BETTY], b"hop", options=(
                _opt("dataHopping", "<dataHopping noMoreThan='3' />"),))
            assert hop_limit((await _next(betty)).options) == 2
            with pytest.raises(NotTaken):
                await fred.send(FRED, [BETTY], b"no hop", options=(
                    _opt("dataHopping", "<dataHopping noMoreThan='1' reportErrors='true' />"),))
            assert _status(await _next(fred)) == ("apex=report@a.example", "86",
                                                  [("betty@b.example", "550")])
    _run(scenario)


def test_data_timing_is_adjusted_across_a_link() -> None:
    """noLaterThan reaches the next relay's recipient no larger than it was sent."""
    async def scenario() -> None:
        async with _linked() as (a, b), _client(a.port, FRED) as fred, \
                _client(b.port, BETTY) as betty:
            await fred.send(FRED, [BETTY], b"t", options=(
                _opt("dataTiming", "<dataTiming noLaterThan='60000' />"),))
            option = find_option((await _next(betty)).options, "dataTiming")
            assert option is not None and 0 < data_timing(option).no_later_than <= 60000
    _run(scenario)


def test_no_ok_within_no_later_than_is_a_timing_error_report() -> None:
    """barney does not answer within 200 ms: fred gets the 550 report; barney's late ok
    changes nothing."""
    async def scenario() -> None:
        async with ApexServer(Relay("a.example")) as a, _client(a.port, FRED) as fred:
            barney = await SlowApp.attach(a.port, BARNEY)
            await fred.send(FRED, [BARNEY], b"hurry", options=(
                _opt("dataTiming", "<dataTiming noLaterThan='200' reportErrors='true' "
                                   "returnTrip='5000' />"),))
            msg, _ = await barney.next()
            assert _status(await _next(fred)) == ("apex=report@a.example", "86",
                                                  [("barney@a.example", "550")])
            barney.ok(msg)
            await fred.send(FRED, [FRED], b"marker")  # anything after the ok comes after it
            assert (await _next(fred)).content == b"marker"
            await barney.drop()
    _run(scenario)


def test_report_after_then_ok_gives_transient_then_final_hop_report() -> None:
    """No ok within reportAfter: a 350 report; the ok then brings the final-hop report (250)
    whose own dataTiming has noLaterThan = the original returnTrip."""
    async def scenario() -> None:
        async with ApexServer(Relay("a.example")) as a, _client(a.port, FRED) as fred:
            barney = await SlowApp.attach(a.port, BARNEY)
            await fred.send(FRED, [BARNEY], b"slowly", options=(
                _opt("dataTiming", "<dataTiming noLaterThan='20000' returnTrip='7000' "
                                   "reportAfter='100' />"),))
            msg, _ = await barney.next()
            assert _status(await _next(fred))[2] == [("barney@a.example", "350")]
            barney.ok(msg)
            final = await _next(fred)
            assert _status(final) == ("apex=report@a.example", "86",
                                      [("barney@a.example", "250")])
            (option,) = final.options
            assert option.name == "dataTiming" and option.must_understand
            assert data_timing(option) == DataTiming(no_later_than=7000)
            assert "reportAfter" not in option.content and "returnTrip" not in option.content
            await barney.drop()
    _run(scenario)


@asynccontextmanager
async def _kafka_relay(config: KafkaConfig, limits: HoldLimits | None = None,
                       ) -> AsyncIterator[ApexServer]:
    """An ApexServer whose hold4Endpoint data lives in Kafka, closed in the broker's order."""
    core = BrokerCore(config)
    await asyncio.to_thread(core.open)
    holds = KafkaHolds(core.holds, limits)
    server = ApexServer(Relay("a.example", holds=holds))
    await server.start()
    try:
        yield server
    finally:
        await server.close()
        await asyncio.to_thread(holds.close)
        await asyncio.to_thread(core.close)


HOLD = _opt("hold4Endpoint", trans_id=None)


def test_hold_delivers_after_a_late_attach_and_discards_after_no_later_than(
        kafka_config: KafkaConfig) -> None:
    """barney attaches after fred sent: he gets the data, with less time left. wilma's data
    (noLaterThan 300 ms) is discarded at its deadline with the timing error report to fred;
    when she attaches later the first data she gets is one sent after."""
    async def scenario() -> None:
        async with _kafka_relay(kafka_config) as a, _client(a.port, FRED) as fred:
            await fred.send(FRED, [BARNEY], b"for barney", options=(
                HOLD, _opt("dataTiming", "<dataTiming noLaterThan='60000' />")))
            await fred.send(FRED, [WILMA], b"for wilma", options=(
                HOLD, _opt("dataTiming", "<dataTiming noLaterThan='300' reportErrors='true' />",
                           trans_id=87)))
            async with _client(a.port, BARNEY) as barney:
                got = await _next(barney)
                assert got.content == b"for barney"
                option = find_option(got.options, "dataTiming")
                assert option is not None and data_timing(option).no_later_than < 60000
            assert _status(await _next(fred)) == ("apex=report@a.example", "87",
                                                  [("wilma@a.example", "550")])
            async with _client(a.port, WILMA) as wilma:
                await fred.send(FRED, [WILMA], b"after")
                assert (await _next(wilma)).content == b"after"
    _run(scenario)


def test_held_data_survives_a_broker_restart(kafka_config: KafkaConfig) -> None:
    """Held, everything closed, core and server reopened: barney attaches and receives it."""
    async def scenario() -> None:
        async with _kafka_relay(kafka_config) as a, _client(a.port, FRED) as fred:
            await fred.send(FRED, [BARNEY], b"across a restart", options=(HOLD,))
        async with _kafka_relay(kafka_config) as a, _client(a.port, BARNEY) as barney:
            assert (await _next(barney)).content == b"across a restart"
    _run(scenario)


@pytest.mark.parametrize("refuse", [False, True])
def test_unanswered_held_data_is_held_again(kafka_config: KafkaConfig, refuse: bool) -> None:
    """barney takes the held data but hangs up without ok (or answers error first): it is
    held again, and his next attachment (overriding the old one, in case the relay has not
    noticed yet) gets it."""
    async def scenario() -> None:
        async with _kafka_relay(kafka_config) as a, _client(a.port, FRED) as fred:
            await fred.send(FRED, [BARNEY], b"again", options=(HOLD,))
            crashing = await SlowApp.attach(a.port, BARNEY)
            msg, data = await crashing.next()
            assert data.content == b"again"
            if refuse:
                crashing.error(msg)
            await crashing.drop()
            # Whether the relay noticed the hang-up before or after this attach, the data
            # comes: on attach if it is waiting again, on requeue if barney is attached anew.
            barney = await ApexClient.connect("127.0.0.1", a.port, timeout=TIMEOUT)
            await barney.attach(BARNEY, options=[Option("attachOverride")])
            assert (await _next(barney)).content == b"again"
            await barney.close()
    _run(scenario)


def test_hold_cap_per_originator_is_554(kafka_config: KafkaConfig) -> None:
    """With a cap of one held data per originator, fred's second is refused with 554."""
    async def scenario() -> None:
        async with _kafka_relay(kafka_config, HoldLimits(max_per_originator=1)) as a, \
                _client(a.port, FRED) as fred:
            await fred.send(FRED, [BARNEY], b"one", options=(HOLD,))
            with pytest.raises(TransactionFailed):
                await fred.send(FRED, [WILMA], b"two", options=(HOLD,))
    _run(scenario)
