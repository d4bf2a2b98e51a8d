"""How many requests a client keeps on the wire unanswered (issue 21 item 4).

A publisher is as fast as the number of publications it has in flight per journal round trip:
the client library puts 288 on the wire by default (`MAX_IN_FLIGHT`: a publisher's 256 and
room beside), `ReliablePublisher` 256, both settable; an apexps relay holds that many pending
on one channel without ending the session. Real BEEP over TCP; the relays here withhold their
`ok`s so that what is in flight stays in flight while it is counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from adapters.apex.codec import APEX_PROFILE, BEEP_XML, Data, encode
from adapters.apex.codec import Ok as OkReply
from adapters.apex.endpoint import Endpoint
from adapters.apex.relay import Relay
from adapters.apex.server import APEX_WINDOW, SERVER_MAX_PENDING, ApexServer
from adapters.beep import BeepConfig, BeepConnection, ChannelStartRequested, MessageReceived, Role
from adapters.client.client import MAX_IN_FLIGHT, ApexClient
from adapters.client.publisher import DEFAULT_MAX_IN_FLIGHT, ReliablePublisher
from adapters.client.pubsub_client import PubsubClient

SENDER, TO = "fred@example.com", ["barney@example.com"]


class _WithholdingRelay:
    """A BEEP listener on loopback that starts APEX channels, counts the MSGs it receives
    and answers none of them until told to (`answer_one`)."""

    def __init__(self) -> None:
        self.received: list[MessageReceived] = []
        self.arrived = asyncio.Event()
        self.want = 0
        self._session: tuple[BeepConnection, asyncio.StreamWriter] | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # a relay's limits, so that only the client's own limit holds the count
        conn = BeepConnection(Role.LISTENER, BeepConfig(
            window_size=APEX_WINDOW, max_pending_messages=SERVER_MAX_PENDING),
            profiles=[APEX_PROFILE])
        self._session = (conn, writer)
        conn.send_greeting()
        writer.write(conn.data_to_send())
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, ChannelStartRequested):
                    conn.accept_start(event.channel, APEX_PROFILE)
                elif isinstance(event, MessageReceived):
                    self.received.append(event)
                    if len(self.received) >= self.want:
                        self.arrived.set()
            writer.write(conn.data_to_send())

    async def until(self, count: int) -> None:
        self.want = count
        if len(self.received) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 30)

    def answer_one(self) -> None:
        assert self._session is not None
        conn, writer = self._session
        event = self.received[0]
        conn.send_rpy(event.channel, event.msgno, encode(OkReply())[1], BEEP_XML)
        writer.write(conn.data_to_send())


async def _count_in_flight(sends: int, **connect: int) -> tuple[int, int, int]:
    """(MSGs the relay holds unanswered, requests still queued in the client, MSGs after one
    answer) for `sends` sends started at once."""
    relay = _WithholdingRelay()
    server = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await ApexClient.connect("127.0.0.1", port, **connect)
    limit = client.max_in_flight
    tasks = [asyncio.create_task(client.send(SENDER, TO, b"x" * 512)) for _ in range(sends)]
    await relay.until(limit)
    # The client holds `limit` unanswered and the rest wait for a slot (no further MSG can be
    # on its way: a slot frees only with an answer).
    held, queued = len(client._pending), len(client._in_flight._waiters)
    on_wire = len(relay.received)
    relay.answer_one()
    await relay.until(limit + 1)
    after = len(relay.received)
    for task in tasks:
        task.cancel()
    await client._abort()
    server.close()
    assert held == on_wire
    return on_wire, queued, after


def test_the_client_puts_its_whole_window_on_the_wire() -> None:
    """300 sends at once: the relay holds 288 MSGs (256 of a publisher's and 32 more), 12 wait
    in the client, and one answer lets exactly one more out."""
    assert MAX_IN_FLIGHT == 288
    on_wire, queued, after = asyncio.run(_count_in_flight(300))
    assert (on_wire, queued, after) == (288, 12, 289)


def test_the_window_is_settable() -> None:
    """connect(max_in_flight=5): 5 on the wire, the rest wait."""
    assert asyncio.run(_count_in_flight(8, max_in_flight=5)) == (5, 3, 6)


def test_a_window_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ApexClient(max_in_flight=0)


class _HeldService:
    """apex=pubsub@example.com that takes every data and answers none until `release()`."""

    def __init__(self) -> None:
        self.calls = 0
        self.reached = asyncio.Event()
        self.want = 0
        self.gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_data(self, data: Data, recipient: Endpoint) -> object:
        self.calls += 1
        if self.calls >= self.want:
            self.reached.set()
        return self._answer()

    async def _answer(self) -> Iterable[Data]:
        await self.gate
        return []

    async def until(self, count: int) -> None:
        self.want = count
        if self.calls < count:
            await asyncio.wait_for(self.reached.wait(), 30)

    def release(self) -> None:
        self.gate.set_result(None)


async def _publisher_against_a_real_relay(messages: int) -> tuple[int, int, int]:
    relay = Relay("example.com")
    service = _HeldService()
    relay.register_service("apex=pubsub", service)  # type: ignore[arg-type]
    async with ApexServer(relay) as server:
        client = await PubsubClient.connect("127.0.0.1", server.port, "fred@example.com")
        publisher = ReliablePublisher(client, 1)
        for k in range(messages):
            await publisher.send("equity.quote", f"m{k}".encode())
        await service.until(DEFAULT_MAX_IN_FLIGHT)
        held = service.calls
        # the session is still up with all of them pending: the relay's limit is above
        assert not client.client._over  # type: ignore[union-attr]
        service.release()
        await asyncio.wait_for(publisher.flush(), 60)
        acked = publisher.stats.acked
        await publisher.close()
        await client.close()
        return held, acked, service.calls


def test_a_reliable_publisher_has_256_pending_at_a_real_relay() -> None:
    """ReliablePublisher with 300 queued: the relay's service holds 256 of them unanswered at
    once (the publisher's window), the session survives that, and all 300 are then acked."""
    assert DEFAULT_MAX_IN_FLIGHT == 256
    held, acked, calls = asyncio.run(_publisher_against_a_real_relay(300))
    assert (held, acked, calls) == (256, 300, 300)


def test_a_publishers_window_defaults_below_a_small_resend_window() -> None:
    """A publisher asked to keep only 10 unacknowledged puts at most 10 on the wire."""
    async def run() -> int:
        relay = Relay("example.com")
        async with ApexServer(relay) as server:
            client = await PubsubClient.connect("127.0.0.1", server.port, "fred@example.com")
            publisher = ReliablePublisher(client, 1, window=10)
            await client.close()
            return publisher.max_in_flight

    assert asyncio.run(run()) == 10
