"""Services that answer later (the pubsub service waits for Kafka): the relay's `Pending`, and the
server keeping each channel's replies in MSG order while they wait."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from adapters.apex.codec import Attach, Data, Error, Ok, Option
from adapters.apex.endpoint import Endpoint
from adapters.apex.relay import STATUS_REQUEST, ChannelRef, Outcome, Relay
from adapters.apex.server import ApexServer
from adapters.client.client import ApexClient
from common.errors import ApexpsError, NotTaken

FRED = Endpoint.parse("fred@example.com")
SVC = Endpoint.parse("apex=echo@example.com")
A = ChannelRef(1, 1)


class _Later:
    """A service whose every call waits on a future the test resolves."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, asyncio.Future[Iterable[Data]]]] = []
        self.arrived = asyncio.Event()

    def on_data(self, data: Data, recipient: Endpoint) -> asyncio.Future[Iterable[Data]]:
        future: asyncio.Future[Iterable[Data]] = asyncio.get_running_loop().create_future()
        self.calls.append((data.content, future))
        self.arrived.set()
        return future


async def _relay_pending() -> tuple[Outcome, Outcome, Outcome]:
    relay = Relay("example.com")
    service = _Later()
    relay.register_service("apex=echo", service)
    assert relay.handle(A, Attach(FRED, 1)).reply == Ok()
    outcome = relay.handle(A, Data(FRED, (SVC,), b"one"))
    assert outcome.pending is not None and service.calls[0][0] == b"one"
    service.calls[0][1].set_result([Data(SVC, (FRED,), b"answer")])
    settled = await outcome.pending.settle()
    failing = relay.handle(A, Data(FRED, (SVC,), b"two"))
    assert failing.pending is not None
    service.calls[1][1].set_exception(NotTaken("no such topic"))
    refused = await failing.pending.settle()
    reported = relay.handle(A, Data(FRED, (SVC,), b"three",
                                   options=(Option(STATUS_REQUEST, 7),)))
    assert reported.pending is not None
    service.calls[2][1].set_exception(NotTaken("no such topic"))
    report = await reported.pending.settle()
    return settled, refused, report


def test_pending_settles_into_the_final_reply() -> None:
    """Answer routed once the awaitable resolves; an ApexpsError from it is the reply's code;
    with statusRequest the failure is reported per recipient instead."""
    settled, refused, report = asyncio.run(_relay_pending())
    assert settled.reply == Ok()
    assert [d.operation.content for d in settled.deliveries  # type: ignore[union-attr]
            ] == [b"answer"]
    assert refused.reply == Error(550, "no such topic")
    assert report.reply == Ok()
    (delivery,) = report.deliveries
    assert isinstance(delivery.operation, Data)
    assert b"code='550'" in delivery.operation.content


async def _pipelined() -> tuple[list[str], list[bytes]]:
    service = _Later()
    relay = Relay("example.com")
    relay.register_service("apex=echo", service)
    async with ApexServer(relay) as server:
        client = await ApexClient.connect("127.0.0.1", server.port)
        await client.attach(FRED)
        sends = [asyncio.create_task(client.send(FRED, [SVC], f"m{i}".encode()))
                 for i in range(3)]
        while len(service.calls) < 3:
            service.arrived.clear()
            await asyncio.wait_for(service.arrived.wait(), 10)
        order = [content for content, _ in service.calls]
        # Resolve newest first, and fail the middle one: replies must still come in MSG order.
        service.calls[2][1].set_result([])
        service.calls[1][1].set_exception(NotTaken("middle refused"))
        service.calls[0][1].set_result([])
        outcomes: list[str] = []
        for task in sends:
            try:
                await task
                outcomes.append("ok")
            except ApexpsError as exc:
                outcomes.append(str(int(exc.code)))
        await client.close()
        return outcomes, order


def test_server_replies_in_msg_order_while_services_wait() -> None:
    """Three pipelined MSGs whose services finish in reverse: each gets its own reply, in order,
    and the service saw them in the order they were sent."""
    outcomes, order = asyncio.run(_pipelined())
    assert order == [b"m0", b"m1", b"m2"]
    assert outcomes == ["ok", "550", "ok"]


class _Now:
    """A service that answers at once (no awaitable)."""

    def on_data(self, data: Data, recipient: Endpoint) -> Iterable[Data]:
        return ()


NOW = Endpoint.parse("apex=now@example.com")


async def _failing_then_decided() -> list[str]:
    service = _Later()
    relay = Relay("example.com")
    relay.register_service("apex=echo", service)
    relay.register_service("apex=now", _Now())
    async with ApexServer(relay) as server:
        client = await ApexClient.connect("127.0.0.1", server.port)
        await client.attach(FRED)
        first = asyncio.create_task(client.send(FRED, [SVC], b"m0"))
        await asyncio.wait_for(service.arrived.wait(), 10)
        service.arrived.clear()
        # decided at once, but behind m0 on the channel; then one more that waits
        second = asyncio.create_task(client.send(FRED, [NOW], b"m1"))
        third = asyncio.create_task(client.send(FRED, [SVC], b"m2"))
        await asyncio.wait_for(service.arrived.wait(), 10)
        assert not first.done() and not second.done()
        service.calls[1][1].set_result([])
        service.calls[0][1].set_exception(RuntimeError("a bug in the service"))
        outcomes: list[str] = []
        for task in (first, second, third):
            try:
                await task
                outcomes.append("ok")
            except ApexpsError as exc:
                outcomes.append(str(int(exc.code)))
        # the session goes on serving
        follow = asyncio.create_task(client.send(FRED, [NOW], b"m3"))
        await follow
        outcomes.append("ok")
        await client.close()
        return outcomes


def test_a_service_that_fails_unexpectedly_is_answered_451_and_the_channel_goes_on() -> None:
    """A bug in a service (not an ApexpsError) answers its MSG 451, local error; the replies
    behind it, one decided at once and one that waited, still come, in MSG order."""
    assert asyncio.run(_failing_then_decided()) == ["451", "ok", "ok", "ok"]
