"""`ServerSession`: one BEEP session of `ApexServer`, as the `asyncio.Protocol` of its transport.

Theory of operation
-------------------
The transport calls `data_received` with each read and the bytes go straight into the sans-I/O
`BeepConnection` (through the server's `received`): no `StreamReader` buffers them and no task
wakes up to fetch them, which on a busy relay was a good part of the cost of a small operation.

Every callback runs in the session's own `contextvars.Context`, entered with `Context.run`. The
server binds `peer` there once, and the `channel` of the latest MSGs stays bound between reads
(`bound_channel` says which), so a pipelining peer costs one binding, not one per read, and no
binding leaks into another session's log lines.

Backpressure is the transport's: when its write buffer passes the high-water mark it calls
`pause_writing`, and we stop reading until it drains (`resume_writing`) -- what `await
writer.drain()` after each read did. A peer that sends but never reads thus fills its own socket
buffers, not our memory (the server drops one whose backlog passes `max_outbound` anyway).

While the transport is handed to TLS (`early` is a list) reads are kept, in order, and fed once
the server has accounted for the handshake: asyncio's TLS transport may deliver the peer's first
secured bytes before `loop.start_tls` returns to us.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from typing import TYPE_CHECKING, Protocol, cast

from adapters.beep import BeepConnection, MessageReceived

from .codec import Operation
from .relay import ChannelRef, Outcome

if TYPE_CHECKING:
    from ._peer_links import PeerLink

__all__ = ["AwaitedReply", "ServerSession", "SessionHandler"]


class SessionHandler(Protocol):
    """What a `ServerSession` reports to (the `ApexServer`)."""

    def opened(self, session: ServerSession) -> None: ...
    def received(self, session: ServerSession, data: bytes) -> None: ...
    def lost(self, session: ServerSession, exc: Exception | None) -> None: ...


class AwaitedReply:
    """A MSG whose reply waits: for its services (`outcome` None until they settle), or for
    the MSGs before it on its channel."""

    __slots__ = ("event", "operation", "outcome")

    def __init__(self, event: MessageReceived, operation: Operation,
                 outcome: Outcome | BaseException | None = None) -> None:
        self.event, self.operation, self.outcome = event, operation, outcome


class ServerSession(asyncio.Protocol):
    """One connection of the server: accepted (`link` None) or opened to a peer relay."""

    __slots__ = ("bound_channel", "bound_ref", "channels", "conn", "context", "dropped",
                 "early", "ended", "greeting_timer", "handler", "handshake", "link",
                 "lost_reason", "number", "peer", "transport", "waiting")

    transport: asyncio.Transport

    def __init__(self, handler: SessionHandler, number: int, conn: BeepConnection,
                 link: PeerLink | None = None) -> None:
        self.handler, self.number, self.conn, self.link = handler, number, conn, link
        #: "host:port" of the other end, once connected
        self.peer = ""
        #: the log context of everything this session does (see the module docstring)
        self.context = contextvars.copy_context()
        self.bound_channel: int | None = None
        #: `ChannelRef(number, bound_channel)`, made once per binding, not per MSG
        self.bound_ref = ChannelRef(number, 0)
        #: APEX channels open on the session
        self.channels: set[int] = set()
        #: per channel, the MSGs whose replies wait for a service or for an earlier one, in
        #: the order they came: BEEP wants a channel's replies in the order of its MSGs
        #: (RFC 3080 §2.6.1)
        self.waiting: dict[int, deque[AwaitedReply]] = {}
        #: done once the transport is gone
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: the server has let go of the session (`ApexServer._drop`); reads are ignored
        self.dropped = False
        #: reads that came during the TLS handshake (None when there is none)
        self.early: list[bytes] | None = None
        self.greeting_timer: asyncio.TimerHandle | None = None
        #: the TLS handshake under way (the server keeps it from being collected)
        self.handshake: asyncio.Task[None] | None = None
        #: why the transport failed, for the log and a peer link's `last_error`
        self.lost_reason: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without deriving from it
        self.transport = cast(asyncio.Transport, transport)
        self.context.run(self.handler.opened, self)

    def data_received(self, data: bytes) -> None:
        self.context.run(self.handler.received, self, data)

    def eof_received(self) -> bool | None:
        self.context.run(self.handler.received, self, b"")
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.context.run(self.handler.lost, self, exc)
        if not self.ended.done():
            self.ended.set_result(None)

    def pause_writing(self) -> None:
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()
