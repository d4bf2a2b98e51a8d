"""ApexServer and ApexClient over real loopback TCP, including hostile peers."""

from __future__ import annotations

import asyncio

import pytest

from adapters.apex.codec import Data
from adapters.apex.endpoint import Endpoint
from adapters.apex.relay import Relay
from adapters.apex.server import APEX_WINDOW, ApexServer
from adapters.beep import (
    BeepConfig,
    BeepConnection,
    ChannelStarted,
    ErrorReplyReceived,
    Event,
    GreetingReceived,
    Role,
)
from adapters.client.client import ApexClient
from common.errors import AccessDenied, NotTaken


async def _exchange() -> tuple[bytes, str]:
    async with ApexServer(Relay("example.com")) as server:
        fred = await ApexClient.connect("127.0.0.1", server.port)
        barney = await ApexClient.connect("127.0.0.1", server.port)
        await fred.attach("fred@example.com")
        await barney.attach("barney@example.com")
        await fred.send("fred@example.com", ["barney@example.com"], b"\x00yabba dabba doo")
        got = await asyncio.wait_for(anext(barney.receive()), 10)
        with pytest.raises(NotTaken):
            await fred.send("fred@example.com", ["wilma@example.com"], b"x")
        with pytest.raises(AccessDenied):
            await fred.send("barney@example.com", ["fred@example.com"], b"x")
        await fred.close()
        await barney.close()
        return got.content, str(got.originator)


def test_two_clients_exchange_data() -> None:
    """fred's data reaches barney; error replies raise the matching ApexpsError."""
    assert asyncio.run(_exchange()) == (b"\x00yabba dabba doo", "fred@example.com")


async def _raw_session(port: int) -> tuple[BeepConnection, asyncio.StreamReader,
                                           asyncio.StreamWriter, int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = BeepConnection(Role.INITIATOR)
    conn.send_greeting()
    await _until(conn, reader, writer, GreetingReceived)
    channel = conn.start_channel(["http://iana.org/beep/APEX"])
    await _until(conn, reader, writer, ChannelStarted)
    return conn, reader, writer, channel


async def _until(conn: BeepConnection, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, kind: type[Event]) -> Event:
    writer.write(conn.data_to_send())
    while True:
        data = await asyncio.wait_for(reader.read(65536), 10)
        for event in conn.receive_data(data):
            if isinstance(event, kind):
                return event
        writer.write(conn.data_to_send())
        if not data:
            raise AssertionError(f"connection ended before {kind.__name__}")


HOSTILE = [
    (b"<data content='cid:1@x'><originator identity='fred@example.com'>", 500),
    (b"<?xml version='1.0'?><!DOCTYPE lolz [<!ENTITY lol 'lol'><!ENTITY lol2"
     b" '&lol;&lol;&lol;'>]><ok>&lol2;</ok>", 500),
    (b"<!DOCTYPE attach SYSTEM 'http://example.com/x.dtd'><ok />", 500),
    (b"<attach endpoint='fred@example.com' />", 501),
]


async def _hostile() -> list[int]:
    codes: list[int] = []
    async with ApexServer(Relay("example.com")) as server:
        conn, reader, writer, channel = await _raw_session(server.port)
        for body, _ in HOSTILE:
            conn.send_msg(channel, body, "application/beep+xml")
            err = await _until(conn, reader, writer, ErrorReplyReceived)
            assert isinstance(err, ErrorReplyReceived)
            codes.append(int(err.body.split(b"code='")[1][:3]))
        # A frame on a channel never started: RFC 3080 §2.2.1.1, the session is terminated.
        writer.write(b"MSG 9 0 . 0 5\r\nhello\r\nEND\r\n")
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        # Never greeting: closed after the greeting timeout.
        server.greeting_timeout = 0.2
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert (await asyncio.wait_for(idle_reader.read(), 10)).startswith(b"RPY 0 0")
        idle_writer.close()
        # And the server still serves everyone else.
        assert await _exchange_on(server.port) == b"still here"
    return codes


async def _exchange_on(port: int) -> bytes:
    fred = await ApexClient.connect("127.0.0.1", port)
    await fred.attach("fred@example.com")
    await fred.send("fred@example.com", ["fred@example.com"], b"still here")
    got = await asyncio.wait_for(anext(fred.receive()), 10)
    await fred.close()
    return got.content


def test_hostile_input_gets_rfc_replies_and_server_keeps_serving() -> None:
    """Malformed XML/billion laughs/DOCTYPE get 500, invalid 501; bad frames end only that peer."""
    assert asyncio.run(_hostile()) == [code for _, code in HOSTILE]



def test_close_waits_for_its_sessions() -> None:
    """`close()` returns only once every accepted connection's task has ended, so nothing of
    the server is left for asyncio.run to cancel."""
    async def body() -> None:
        server = ApexServer(Relay("example.com"))
        await server.start()
        client = await ApexClient.connect("127.0.0.1", server.port)
        assert len(server._serving) == 1
        await server.close()
        assert server._serving == set()
        await client.close()
    asyncio.run(asyncio.wait_for(body(), 30))


async def _burst(count: int) -> list[bytes]:
    async with ApexServer(Relay("example.com")) as server:
        barney = await ApexClient.connect("127.0.0.1", server.port)
        await barney.attach("barney@example.com")
        fred = Endpoint.parse("fred@example.com")
        barney_at = Endpoint.parse("barney@example.com")
        for k in range(count):  # one event-loop turn: one write, read by barney in few reads
            server.send(Data(fred, (barney_at,), f"m{k}".encode()))
        inbox = barney.receive()
        got = [(await asyncio.wait_for(anext(inbox), 10)).content for _ in range(count)]
        await barney.send("barney@example.com", ["barney@example.com"], b"still here")
        got.append((await asyncio.wait_for(anext(inbox), 10)).content)
        await barney.close()
        return got


def test_a_client_takes_a_burst_of_many_more_data_than_the_pending_msg_limit() -> None:
    """A relay may send data faster than one read's worth of answers go back (a gap fill, a
    busy fan-out): hundreds of MSGs complete in one read. The client answers each as it is
    parsed, so they are never pending at once in the BEEP sense; its session survives."""
    got = asyncio.run(_burst(300))
    assert got == [f"m{k}".encode() for k in range(300)] + [b"still here"]


async def _burst_past_a_small_limit() -> tuple[int, list[dict[str, object]]]:
    failures: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: failures.append(context))
    async with ApexServer(Relay("example.com")) as server:
        small = BeepConfig(window_size=APEX_WINDOW, max_pending_messages=8)
        barney = await ApexClient.connect("127.0.0.1", server.port, config=small)
        await barney.attach("barney@example.com")
        fred = Endpoint.parse("fred@example.com")
        barney_at = Endpoint.parse("barney@example.com")
        for k in range(50):
            server.send(Data(fred, (barney_at,), f"m{k}".encode()))
        got = [data async for data in barney.receive()]
        await asyncio.wait_for(barney._wire.closed, 10)
        await barney.close()
        return len(got), failures


def test_a_violation_in_the_read_that_completed_msgs_ends_the_session_cleanly() -> None:
    """Past its own pending-MSG limit the client ends the session; the MSGs completed in the
    same read before the violation cannot be answered any more, and that does not crash its
    reading (nothing reaches the loop's exception handler): receive() just ends."""
    count, failures = asyncio.run(_burst_past_a_small_limit())
    assert count <= 8 and failures == []


def test_each_operation_is_logged_with_its_peer_and_channel() -> None:
    """The log line of every operation names the connection and channel it came on, also
    when several arrive in one read (pipelined) and after another event on the session."""
    from structlog.contextvars import merge_contextvars
    from structlog.testing import capture_logs

    async def run() -> tuple[int, list[dict[str, object]]]:
        with capture_logs(processors=[merge_contextvars]) as logs:
            async with ApexServer(Relay("example.com")) as server:
                fred = await ApexClient.connect("127.0.0.1", server.port)
                barney = await ApexClient.connect("127.0.0.1", server.port)
                await fred.attach("fred@example.com")
                await barney.attach("barney@example.com")
                # two sessions' reads interleave: each must log with its own binding
                await asyncio.gather(*(c.send(f"{n}@example.com", [f"{n}@example.com"],
                                              b"%d" % i)
                                       for i in range(8)
                                       for c, n in ((fred, "fred"), (barney, "barney"))))
                channel = fred._channel
                assert barney._channel == channel  # each session's first channel
                await fred.close()
                await barney.close()
        return channel, logs

    channel, logs = asyncio.run(run())
    ops = [e for e in logs if e["event"] == "apex operation"]
    assert sorted(str(e["operation"]) for e in ops) == ["attach"] * 2 + ["data"] * 16
    assert all(e.get("channel") == channel and "peer" in e for e in ops)
    assert len({e["peer"] for e in ops}) == 2
    # data accepted is traffic (debug); the session's own operations are events (info)
    assert {e["log_level"] for e in ops if e["operation"] == "data"} == {"debug"}
    assert {e["log_level"] for e in ops if e["operation"] == "attach"} == {"info"}
    # nothing is left bound once the reads are handled: the close is logged without a channel
    closed = [e for e in logs if e["event"] == "connection closed"]
    assert closed and all("channel" not in e for e in closed)
