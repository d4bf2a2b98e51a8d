"""ApexServer's transport side (`ServerSession`, an asyncio.Protocol) over real loopback TCP, on
both event loops the commands may run: backpressure against a peer that does not read, the
drop of one whose backlog passes `max_outbound`, TLS on the same transport."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any, TypeVar

import pytest
import trustme

from adapters.apex import Data, Endpoint, Relay
from adapters.apex._server_session import ServerSession
from adapters.apex.codec import Attach, decode, encode
from adapters.apex.server import ApexServer
from adapters.beep import (
    BeepConfig,
    BeepConnection,
    ChannelStarted,
    Event,
    GreetingReceived,
    MessageReceived,
    ReplyReceived,
    Role,
)
from adapters.cli import loop as event_loop
from adapters.client.client import ApexClient
from common.errors import InvalidParameter, NotTaken, ParameterSyntaxError

T = TypeVar("T")
FRED = Endpoint.parse("fred@example.com")
#: what fred sends himself per data: big, so a few fill the transport's buffers
PAYLOAD = b"x" * 32 * 1024


@pytest.fixture(params=["asyncio", "uvloop"], name="loop")
def _loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The event loop `event_loop.run` uses: each test runs on both."""
    monkeypatch.setenv(event_loop.ENV, request.param)
    return str(request.param)


def run(main: Coroutine[Any, Any, T]) -> T:
    return event_loop.run(asyncio.wait_for(main, 60))


class _RawPeer:
    """A BEEP initiator on a socket with a small receive buffer, reading only when told."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 conn: BeepConnection) -> None:
        self.reader, self.writer, self.conn = reader, writer, conn
        self.channel = 0

    @classmethod
    async def connect(cls, port: int, window: int) -> _RawPeer:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        peer = cls(reader, writer, BeepConnection(Role.INITIATOR, BeepConfig(window_size=window)))
        peer.conn.send_greeting()
        await peer.until(GreetingReceived)
        peer.channel = peer.conn.start_channel(["http://iana.org/beep/APEX"])
        await peer.until(ChannelStarted)
        return peer

    def send(self, body: tuple[str, bytes]) -> None:
        self.conn.send_msg(self.channel, body[1], body[0])
        self.writer.write(self.conn.data_to_send())

    async def events(self) -> list[Event]:
        data = await asyncio.wait_for(self.reader.read(65536), 10)
        assert data, "the server hung up"
        events = self.conn.receive_data(data)
        self.writer.write(self.conn.data_to_send())  # SEQs, and our answers to deliveries
        return events

    async def until(self, kind: type[Event]) -> Event:
        self.writer.write(self.conn.data_to_send())
        while True:
            for event in await self.events():
                if isinstance(event, kind):
                    return event


def _only_session(server: ApexServer) -> ServerSession:
    (session,) = server._sessions.values()
    return session


@pytest.fixture(name="pauses")
def _pauses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[asyncio.Event]]:
    """[paused, resumed]: set when a ServerSession's transport asks it to stop / resume
    writing (its write buffer passed the high-water mark / drained below the low one)."""
    events: list[asyncio.Event] = []
    pause, resume = ServerSession.pause_writing, ServerSession.resume_writing

    def paused(self: ServerSession) -> None:
        pause(self)
        events[0].set()

    def resumed(self: ServerSession) -> None:
        resume(self)
        events[1].set()
    monkeypatch.setattr(ServerSession, "pause_writing", paused)
    monkeypatch.setattr(ServerSession, "resume_writing", resumed)
    yield events


async def _backpressure(pauses: list[asyncio.Event]) -> tuple[bool, bool, int, int]:
    pauses[:] = [asyncio.Event(), asyncio.Event()]
    async with ApexServer(Relay("example.com")) as server:
        # fred's window lets the server send him everything; it is the transport that fills
        peer = await _RawPeer.connect(server.port, window=4 * 1024 * 1024)
        session = _only_session(server)
        # small kernel buffers on the server's side too, or they would swallow it all
        session.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        peer.send(encode(Attach(FRED, 1)))
        assert isinstance(await peer.until(ReplyReceived), ReplyReceived)
        sent = 7  # each comes back as a delivery: 224 KiB, within the server's 256 KiB window
        for _ in range(sent):
            peer.send(encode(Data(FRED, (FRED,), PAYLOAD)))
        await asyncio.wait_for(pauses[0].wait(), 10)
        reading_while_full = session.transport.is_reading()
        replies = deliveries = 0
        while replies < sent or deliveries < sent:
            for event in await peer.events():
                if isinstance(event, ReplyReceived):
                    replies += 1
                elif isinstance(event, MessageReceived):
                    delivery = decode(event.content_type, event.body)
                    assert isinstance(delivery, Data) and delivery.content == PAYLOAD
                    deliveries += 1
        await asyncio.wait_for(pauses[1].wait(), 10)
        reading_again = session.transport.is_reading()
        peer.writer.close()
    return reading_while_full, reading_again, replies, deliveries


def test_a_peer_that_does_not_read_is_not_read_either(
        loop: str, pauses: list[asyncio.Event]) -> None:
    """While the server's output to a peer is above the transport's high-water mark it stops
    reading that peer (as `await drain()` after each read did); once the peer reads, every
    reply and delivery arrives and reading resumes."""
    assert run(_backpressure(pauses)) == (False, True, 7, 7)


async def _barney_floods_fred(server: ApexServer, sends: int) -> tuple[int, bool]:
    """barney sends fred (attached, and not taking what he is sent) up to `sends` data until
    the server has dropped fred; (data delivered, whether barney is still served)."""
    barney = await ApexClient.connect("127.0.0.1", server.port)
    await barney.attach("barney@example.com")
    delivered = 0
    with pytest.raises(NotTaken):  # fred is gone: nobody is attached as fred any more
        for _ in range(sends):
            await barney.send("barney@example.com", ["fred@example.com"], PAYLOAD)
            delivered += 1
    await barney.send("barney@example.com", ["barney@example.com"], b"still here")
    got = await asyncio.wait_for(anext(barney.receive()), 10)
    await barney.close()
    return delivered, got.content == b"still here"


async def _flood(barney_sends: int) -> tuple[int, bool]:
    async with ApexServer(Relay("example.com"), max_outbound=256 * 1024) as server:
        fred = await _RawPeer.connect(server.port, window=64 * 1024 * 1024)
        fred.send(encode(Attach(FRED, 1)))
        await fred.until(ReplyReceived)
        (fred_session,) = server._sessions.values()
        delivered, served = await _barney_floods_fred(server, barney_sends)
        fred.writer.close()
        return delivered, fred_session.dropped and served


def test_a_peer_whose_backlog_passes_max_outbound_is_dropped(loop: str) -> None:
    """Data for a peer that never reads piles up in its transport only to `max_outbound`: then
    the peer is dropped (its attachment with it) and everyone else is still served."""
    delivered, ok = run(_flood(1000))
    assert ok
    assert 8 <= delivered < 1000  # 256 KiB of 32 KiB data, plus what the kernel buffers took


async def _withheld_window(barney_sends: int) -> tuple[int, bool, int]:
    async with ApexServer(Relay("example.com"), max_outbound=256 * 1024) as server:
        fred = await _RawPeer.connect(server.port, window=4096)
        fred.send(encode(Attach(FRED, 1)))
        await fred.until(ReplyReceived)
        (fred_session,) = server._sessions.values()

        async def swallow() -> None:  # fred reads all, and never opens his window with SEQ
            while await fred.reader.read(65536):
                pass
        swallowing = asyncio.create_task(swallow())
        delivered, served = await _barney_floods_fred(server, barney_sends)
        await asyncio.wait_for(swallowing, 10)  # the server hung up on fred
        return delivered, fred_session.dropped and served, \
            fred_session.transport.get_write_buffer_size()


def test_a_peer_that_withholds_its_window_is_dropped_at_max_outbound(loop: str) -> None:
    """A peer that reads everything but never sends SEQ keeps the server's BEEP queue for it
    growing instead of its transport buffer: that counts toward `max_outbound` too, so the
    server holds at most that much for it, drops it, and serves everyone else."""
    delivered, ok, unsent = run(_withheld_window(1000))
    assert ok
    assert unsent == 0  # fred read everything: it was the BEEP backlog that grew
    assert 0 < delivered <= 256 * 1024 // len(PAYLOAD) + 1


@pytest.fixture(scope="module", name="ca")
def _ca() -> trustme.CA:
    return trustme.CA()


def _contexts(ca: trustme.CA) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


async def _over_tls(ca: trustme.CA, contents: Iterable[bytes]) -> list[bytes]:
    server_tls, client_tls = _contexts(ca)
    async with ApexServer(Relay("example.com"), tls=server_tls, require_tls=True) as server:
        fred = await ApexClient.connect("127.0.0.1", server.port, tls=client_tls)
        await fred.attach("fred@example.com")
        await asyncio.gather(*(fred.send("fred@example.com", ["fred@example.com"], content)
                               for content in contents))  # pipelined: all in flight at once
        inbox = fred.receive()
        got = [(await asyncio.wait_for(anext(inbox), 10)).content for _ in contents]
        assert _only_session(server).transport.get_extra_info("ssl_object") is not None
        await fred.close()
        return got


def test_tls_on_the_same_transport_then_pipelined_data(loop: str, ca: trustme.CA) -> None:
    """The TLS profile hands the session's transport to `loop.start_tls`; the greetings start
    over and data flows over TLS, many in flight, on both loops."""
    contents = [b"%d" % i + PAYLOAD[:1000] for i in range(50)]
    assert run(_over_tls(ca, contents)) == contents


async def _sends_by_every_spelling() -> tuple[list[tuple[str, bytes]], bool, bool]:
    async with ApexServer(Relay("example.com")) as server:
        fred = await ApexClient.connect("127.0.0.1", server.port)
        await fred.attach("fred@example.com")
        await fred.attach("fred/b@example.com")
        # the same recipients as a list, a tuple, endpoints, a generator: parsed once, the same
        for recipients in (["fred@example.com"], ("fred/b@example.com",), [FRED],
                           (r for r in ["fred@example.com", "fred/b@example.com"])):
            await fred.send(FRED, recipients, b"1")
        inbox = fred.receive()
        got = [(str((d := await asyncio.wait_for(anext(inbox), 10)).recipients[0]), d.content)
               for _ in range(5)]
        with pytest.raises(ParameterSyntaxError):
            await fred.send("fred@example.com", [], b"to nobody")
        with pytest.raises(InvalidParameter):
            await fred.send("fred@example.com", ["not an endpoint"], b"x")
        still = (await asyncio.wait_for(fred.send(FRED, ["fred@example.com"], b"2"), 10)) is None
        await fred.close()
        return got, still, (await fred._wire.closed) is None


def test_recipients_in_any_spelling_reach_them(loop: str) -> None:
    """A client's send takes recipients as strings or endpoints in any iterable (it remembers
    lists it parsed); none, or one that is no endpoint, is refused before anything is sent."""
    got, still, closed = run(_sends_by_every_spelling())
    assert sorted(got) == sorted([("fred@example.com", b"1"), ("fred/b@example.com", b"1"),
                                  ("fred@example.com", b"1"), ("fred@example.com", b"1"),
                                  ("fred/b@example.com", b"1")])
    assert still and closed
