"""Two `apexps broker` processes of different domains, linked with --peer / --accept-peer:
data crosses from one domain's client to the other's (RFC 3340 relay-relay mode)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from adapters.apex.endpoint import Endpoint
from adapters.client.client import ApexClient
from tests.integration.broker_process import start_broker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

FRED, BARNEY = Endpoint.parse("fred@a.example"), Endpoint.parse("barney@b.example")


async def _scenario(bootstrap: str) -> tuple[bytes, bytes]:
    b, b_port = await start_broker(bootstrap, "--domain", "b.example", "--accept-peer", "a.example")
    a, a_port = await start_broker(bootstrap, "--domain", "a.example",
                              "--peer", f"b.example=127.0.0.1:{b_port}")
    try:
        assert a.stderr is not None
        while b'"peer link up"' not in await asyncio.wait_for(a.stderr.readline(), 60):
            pass
        fred = await ApexClient.connect("127.0.0.1", a_port)
        barney = await ApexClient.connect("127.0.0.1", b_port)
        await fred.attach(FRED)
        await barney.attach(BARNEY)
        await fred.send(FRED, [BARNEY], b"across")
        got = await anext(barney.receive())
        await barney.send(BARNEY, [FRED], b"and back")
        back = await anext(fred.receive())
        await fred.close()
        await barney.close()
        return got.content, back.content
    finally:
        for proc in (a, b):
            proc.send_signal(signal.SIGINT)
        for proc in (a, b):
            await asyncio.wait_for(proc.communicate(), 60)


def test_two_broker_processes_relay_between_domains(kafka_bootstrap: str) -> None:
    """`broker --peer b.example=…` links to `broker --accept-peer a.example`; fred@a.example
    and barney@b.example exchange data through the link in both directions."""
    assert asyncio.run(_scenario(kafka_bootstrap)) == (b"across", b"and back")
