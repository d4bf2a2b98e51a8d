"""A batch of service answers settled in one pass (adapters/apex/ticket.py): the ticket itself,
the relay's `Pending` answering in the same pass, and the server writing the batch's replies
in one write, in MSG order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

from adapters.apex.codec import Attach, Data, Error, Ok
from adapters.apex.endpoint import Endpoint
from adapters.apex.relay import ChannelRef, Outcome, Relay
from adapters.apex.server import ApexServer
from adapters.apex.ticket import Ticket, TicketResult
from adapters.client.client import ApexClient
from common.errors import ApexpsError, NotTaken

FRED = Endpoint.parse("fred@example.com")
SVC = Endpoint.parse("apex=batch@example.com")
A = ChannelRef(1, 1)


def test_a_ticket_calls_back_in_order_once_and_a_failing_callback_spares_the_rest() -> None:
    ticket = Ticket()
    seen: list[tuple[str, TicketResult]] = []

    def broken(_: TicketResult) -> None:
        raise RuntimeError("a bug in one reply")

    ticket.then(lambda r: seen.append(("first", r)))
    ticket.then(broken)
    ticket.then(lambda r: seen.append(("second", r)))
    assert seen == []
    answer = [Data(SVC, (FRED,), b"a")]
    ticket.settle(answer)
    assert seen == [("first", answer), ("second", answer)]
    ticket.settle(NotTaken("too late"))  # settled once: ignored
    ticket.then(lambda r: seen.append(("after", r)))  # at once, with the first result
    assert seen[-1] == ("after", answer)


def test_awaiting_a_ticket_gives_its_result_or_raises_its_error() -> None:
    async def run() -> tuple[Iterable[Data], ApexpsError]:
        good, bad = Ticket(), Ticket()
        asyncio.get_running_loop().call_soon(good.settle, ())
        asyncio.get_running_loop().call_soon(bad.settle, NotTaken("no such topic"))
        result = await good
        with pytest.raises(NotTaken) as caught:
            await bad
        return result, caught.value

    result, error = asyncio.run(run())
    assert list(result) == [] and int(error.code) == 550


class _Batching:
    """A service answering every data with a ticket, settled when the test says."""

    def __init__(self) -> None:
        self.tickets: list[tuple[bytes, Ticket]] = []
        self.arrived = asyncio.Event()

    def on_data(self, data: Data, recipient: Endpoint) -> Ticket:
        ticket = Ticket()
        self.tickets.append((data.content, ticket))
        self.arrived.set()
        return ticket


def test_pending_answers_in_the_pass_that_settles_the_ticket() -> None:
    """No loop turn between the batch's settling and the relay's final outcome: that is what
    lets the server gather the batch's replies (the mutation: a ticket made a future)."""
    async def run() -> list[Outcome | BaseException]:
        relay = Relay("example.com")
        service = _Batching()
        relay.register_service("apex=batch", service)
        assert relay.handle(A, Attach(FRED, 1)).reply == Ok()
        done: list[Outcome | BaseException] = []
        for content in (b"one", b"two"):
            outcome = relay.handle(A, Data(FRED, (SVC,), content))
            assert outcome.pending is not None
            outcome.pending.settle_then(done.append)
        service.tickets[0][1].settle([Data(SVC, (FRED,), b"answer")])
        service.tickets[1][1].settle(NotTaken("no such topic"))
        return list(done)  # read before this coroutine yields to the loop

    first, second = asyncio.run(run())
    assert isinstance(first, Outcome) and first.reply == Ok()
    assert [d.operation.content for d in first.deliveries] == [b"answer"]  # type: ignore[union-attr]
    assert isinstance(second, Outcome) and second.reply == Error(550, "no such topic")


class _CountingTransport:
    """The session's transport, counting the writes that carry a reply on channel 1."""

    def __init__(self, inner: Any, writes: list[bytes]) -> None:
        self._inner, self._writes = inner, writes

    def write(self, data: bytes) -> None:
        if b"RPY 1 " in data or b"ERR 1 " in data:
            self._writes.append(bytes(data))
        self._inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _CountingServer(ApexServer):
    def __init__(self, relay: Relay) -> None:
        super().__init__(relay)
        self.writes: list[bytes] = []

    def opened(self, session: Any) -> None:
        session.transport = _CountingTransport(session.transport, self.writes)
        super().opened(session)


async def _one_batch(n: int) -> tuple[list[str], list[bytes]]:
    service = _Batching()
    relay = Relay("example.com")
    relay.register_service("apex=batch", service)
    async with _CountingServer(relay) as server:
        client = await ApexClient.connect("127.0.0.1", server.port)
        await client.attach(FRED)
        sends = [asyncio.create_task(client.send(FRED, [SVC], f"m{i}".encode()))
                 for i in range(n)]
        while len(service.tickets) < n:
            service.arrived.clear()
            await asyncio.wait_for(service.arrived.wait(), 10)
        server.writes.clear()  # the attach's reply
        # One pass settles the batch, the middle one refused: n replies, in MSG order.
        for i, (_, ticket) in enumerate(service.tickets):
            ticket.settle(NotTaken("refused") if i == 1 else ())
        outcomes: list[str] = []
        for task in sends:
            try:
                await task
                outcomes.append("ok")
            except ApexpsError as exc:
                outcomes.append(str(int(exc.code)))
        await client.close()
        return outcomes, server.writes


def test_a_batch_settled_in_one_pass_is_answered_in_one_write_in_msg_order() -> None:
    outcomes, writes = asyncio.run(_one_batch(5))
    assert outcomes == ["ok", "550", "ok", "ok", "ok"]
    assert len(writes) == 1, [w[:40] for w in writes]
    assert writes[0].count(b"RPY ") == 4 and writes[0].count(b"ERR ") == 1
