"""Relay-relay mode over real TCP: two ApexServers of different domains linked by
`connect_peer` (a piggybacked bind, RFC 3340 §4.2), and clients playing relays with `bind`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from adapters.apex.endpoint import Endpoint
from adapters.apex.relay import Relay
from adapters.apex.server import ApexServer
from adapters.client.client import ApexClient
from common.errors import AccessDenied, NotTaken, TransactionInProgress

FRED, BARNEY = Endpoint.parse("fred@a.example"), Endpoint.parse("barney@b.example")
TIMEOUT = 20.0


def _accepting(*domains: str) -> Relay:
    return Relay("b.example", may_bind=lambda _ref, domain: domain in domains)


@asynccontextmanager
async def _client(server: ApexServer, endpoint: Endpoint | None = None,
                  ) -> AsyncIterator[ApexClient]:
    client = await ApexClient.connect("127.0.0.1", server.port, timeout=TIMEOUT)
    try:
        if endpoint is not None:
            await client.attach(endpoint)
        yield client
    finally:
        await client.close()


async def _next(client: ApexClient) -> bytes:
    async for data in client.receive():
        return data.content
    raise AssertionError("connection ended before data arrived")


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_data_crosses_the_link_both_ways() -> None:
    """fred@a.example reaches barney@b.example through a's link, and barney's answer comes
    back over the same link (b routes a.example to the bound channel)."""
    async def scenario() -> None:
        async with ApexServer(_accepting("a.example")) as b, ApexServer(Relay("a.example")) as a:
            link = a.connect_peer("b.example", "127.0.0.1", b.port)
            await link.wait_up()
            assert b.relay.routes().keys() == {"a.example"}
            async with _client(a, FRED) as fred, _client(b, BARNEY) as barney:
                await fred.send(FRED, [BARNEY], b"yabba")
                assert await _next(barney) == b"yabba"
                await barney.send(BARNEY, [FRED], b"dabba")
                assert await _next(fred) == b"dabba"
    _run(scenario)


def test_bind_not_accepted_is_537_and_the_link_stays_down() -> None:
    """A relay not listed by the policy gets 537, both as a client bind and as a link; data
    for the domain then fails with 550."""
    async def scenario() -> None:
        async with ApexServer(_accepting()) as b, ApexServer(Relay("a.example")) as a:
            async with _client(b) as relay_like:
                with pytest.raises(AccessDenied):
                    await relay_like.bind("a.example")
            link = a.connect_peer("b.example", "127.0.0.1", b.port, backoff=0.05)
            await link.wait_for(lambda lk: "537" in lk.last_error)
            assert not link.is_up and a.relay.routes() == {}
            async with _client(a, FRED) as fred:
                with pytest.raises(NotTaken):
                    await fred.send(FRED, [BARNEY], b"x")
    _run(scenario)


def test_duplicate_trans_id_is_555() -> None:
    """A bind reusing a transID in force on the channel (here an attach's) is 555."""
    async def scenario() -> None:
        async with ApexServer(_accepting("a.example")) as b, _client(b) as peer:
            await peer.bind("a.example", trans_id=4)
            with pytest.raises(TransactionInProgress):
                await peer.bind("a.example", trans_id=4)
            attached = await peer.attach(Endpoint.parse("wilma@b.example"))
            with pytest.raises(TransactionInProgress):
                await peer.bind("a.example", trans_id=attached)
    _run(scenario)


def test_spoofed_originator_on_a_bound_channel_is_537() -> None:
    """A bound a.example relay may send as fred@a.example, not as c.example or b.example."""
    async def scenario() -> None:
        async with ApexServer(_accepting("a.example")) as b, _client(b, BARNEY) as barney, \
                _client(b) as peer:
            await peer.bind("a.example")
            for spoof in ("mallory@c.example", "wilma@b.example"):
                with pytest.raises(AccessDenied):
                    await peer.send(spoof, [BARNEY], b"evil")
            await peer.send(FRED, [BARNEY], b"fine")
            assert await _next(barney) == b"fine"
    _run(scenario)


def test_link_loss_gives_550_until_the_link_is_back() -> None:
    """When b goes away a's route goes with it (550 at once); a reconnects with backoff to
    the relay that comes back on the same port, and data flows again."""
    async def scenario() -> None:
        a = ApexServer(Relay("a.example"))
        await a.start()
        b = ApexServer(_accepting("a.example"))
        await b.start()
        port = b.port
        try:
            link = a.connect_peer("b.example", "127.0.0.1", port, backoff=0.02, backoff_max=0.2)
            await link.wait_up()
            async with _client(a, FRED) as fred:
                await b.close()
                await link.wait_down()
                with pytest.raises(NotTaken):
                    await fred.send(FRED, [BARNEY], b"lost")
                await link.wait_for(lambda lk: lk.failures >= 2)  # retrying meanwhile
                b = ApexServer(_accepting("a.example"), port=port)
                await b.start()
                await link.wait_up()
                async with _client(b, BARNEY) as barney:
                    await fred.send(FRED, [BARNEY], b"back")
                    assert await _next(barney) == b"back"
        finally:
            await a.close()
            await b.close()
    _run(scenario)


def test_close_stops_the_links() -> None:
    """After close() no link task is left running and no route remains."""
    async def scenario() -> None:
        async with ApexServer(_accepting("a.example")) as b:
            a = ApexServer(Relay("a.example"))
            await a.start()
            link = a.connect_peer("b.example", "127.0.0.1", b.port)
            await link.wait_up()
            await a.close()
            assert link.task is not None and link.task.done()
            assert not link.is_up and a.relay.routes() == {}
    _run(scenario)
