"""ApexClient's reply deadline: a relay that takes a request and never answers it makes the
request fail with TimeoutError after the client's timeout, each request on its own deadline,
and a relay that answers late does not upset the requests after it."""

from __future__ import annotations

import asyncio
import time

import pytest

from adapters.apex.codec import APEX_PROFILE, BEEP_XML, encode
from adapters.apex.codec import Ok as OkReply
from adapters.beep import BeepConnection, ChannelStartRequested, MessageReceived, Role
from adapters.client.client import ApexClient


class _SilentRelay:
    """A real BEEP listener on loopback that starts APEX channels and answers only the MSGs
    whose body it was told to answer (`answer`), when told to."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[MessageReceived] = asyncio.Queue()
        self._sessions: list[tuple[BeepConnection, asyncio.StreamWriter]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = BeepConnection(Role.LISTENER, profiles=[APEX_PROFILE])
        self._sessions.append((conn, writer))
        conn.send_greeting()
        writer.write(conn.data_to_send())
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, ChannelStartRequested):
                    conn.accept_start(event.channel, APEX_PROFILE)
                elif isinstance(event, MessageReceived):
                    self.received.put_nowait(event)
            writer.write(conn.data_to_send())

    def answer(self, event: MessageReceived) -> None:
        conn, writer = self._sessions[-1]
        conn.send_rpy(event.channel, event.msgno, encode(OkReply())[1], BEEP_XML)
        writer.write(conn.data_to_send())


async def _setup(timeout: float) -> tuple[_SilentRelay, asyncio.Server, ApexClient]:
    relay = _SilentRelay()
    server = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await ApexClient.connect("127.0.0.1", port, timeout=timeout)
    return relay, server, client


def test_each_unanswered_request_times_out_on_its_own_deadline() -> None:
    async def run() -> list[float]:
        relay, server, client = await _setup(timeout=0.4)
        began = time.monotonic()
        first = asyncio.create_task(client.send("a@x.example", ["b@x.example"], b"1"))
        await relay.received.get()
        await asyncio.sleep(0.2)  # a second request, sent while the first is still waiting
        second = asyncio.create_task(client.send("a@x.example", ["b@x.example"], b"2"))
        await relay.received.get()
        ended = []
        for task in (first, second):
            with pytest.raises(TimeoutError, match=r"no reply from the relay within 0\.4 s"):
                await task
            ended.append(time.monotonic() - began)
        await client.close()
        server.close()
        return ended

    first, second = asyncio.run(run())
    assert 0.4 <= first < second  # the second's deadline counts from when it was sent
    assert second >= 0.6


def test_an_answered_request_does_not_time_out_and_later_ones_still_do() -> None:
    async def run() -> None:
        relay, server, client = await _setup(timeout=0.4)
        first = asyncio.create_task(client.send("a@x.example", ["b@x.example"], b"1"))
        relay.answer(await relay.received.get())
        await first  # answered: no TimeoutError, now or when its deadline passes
        await asyncio.sleep(0.5)
        second = asyncio.create_task(client.send("a@x.example", ["b@x.example"], b"2"))
        await relay.received.get()
        with pytest.raises(TimeoutError):
            await second
        await client.close()
        server.close()

    asyncio.run(run())
