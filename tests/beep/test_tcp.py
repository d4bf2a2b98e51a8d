"""Interop over a real loopback TCP connection: a 30-line asyncio shell around each side."""

from __future__ import annotations

import asyncio

from adapters.beep import (
    BeepConnection,
    ChannelStarted,
    ChannelStartRequested,
    CloseRequested,
    Event,
    GreetingReceived,
    MessageReceived,
    ReplyReceived,
    Role,
    SessionClosed,
)

from .helpers import ECHO


async def _pump(conn: BeepConnection, reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> list[Event]:
    """Flush our bytes, then read until at least one event arrives."""
    writer.write(conn.data_to_send())
    await writer.drain()
    while True:
        data = await reader.read(65536)
        events = conn.receive_data(data)
        writer.write(conn.data_to_send())
        await writer.drain()
        if events or not data:
            return events


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    conn = BeepConnection(Role.LISTENER, profiles=[ECHO])
    conn.send_greeting()
    while True:
        for event in await _pump(conn, reader, writer):
            if isinstance(event, ChannelStartRequested):
                conn.accept_start(event.channel, ECHO)
            elif isinstance(event, MessageReceived):
                conn.send_rpy(event.channel, event.msgno, event.body[::-1])
            elif isinstance(event, CloseRequested):
                conn.accept_close(event.channel)
                writer.write(conn.data_to_send())
                await writer.drain()
                writer.close()  # RFC 3081 §2.2: the peer sending ok closes at once
                return


async def _client(port: int) -> list[Event]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = BeepConnection(Role.INITIATOR)
    conn.send_greeting()
    seen = await _pump(conn, reader, writer)
    channel = conn.start_channel([ECHO])
    seen += await _pump(conn, reader, writer)
    conn.send_msg(channel, b"x" * 20_000 + b"!")
    while not any(isinstance(e, ReplyReceived) for e in seen):
        seen += await _pump(conn, reader, writer)
    conn.close_session()
    seen += await _pump(conn, reader, writer)
    writer.close()
    return seen


async def _run() -> list[Event]:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        return await asyncio.wait_for(_client(port), 20)


def test_echo_over_loopback_tcp() -> None:
    """Greeting, start, a 20 kB MSG/RPY across several SEQs, and release, over real TCP."""
    events = asyncio.run(_run())
    kinds = [type(e) for e in events]
    assert kinds == [GreetingReceived, ChannelStarted, ReplyReceived, SessionClosed]
    reply = events[2]
    assert isinstance(reply, ReplyReceived) and reply.body == b"!" + b"x" * 20_000
    assert events[3] == SessionClosed(clean=True)
