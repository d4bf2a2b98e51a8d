"""The transport side of `ApexClient`: the `asyncio.Protocol` its bytes arrive through, and the
first-come-first-served limit on its requests in flight.

`ClientWire` hands each read to a callback at once (no `StreamReader` buffering it, no task
waking up to fetch it) and turns the transport's flow control into an awaitable: senders wait
on `writable()` while the write buffer is above its high-water mark, as they waited on
`StreamWriter.drain()`.

`Slots` is `asyncio.Semaphore` cut down to what the client needs, because it runs twice per
request: a free slot is taken without creating a coroutine or scanning the waiters, and a
released one goes straight to the longest waiter (FIFO, which `Publisher` relies on: its sends
must reach the wire in the order they were made).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import cast

__all__ = ["ClientWire", "Slots"]


class ClientWire(asyncio.Protocol):
    """Calls `received(data)` per read (`b""` at end-of-file) and `lost(exc)` once."""

    __slots__ = ("_lost", "_received", "_resumed", "closed", "transport")

    transport: asyncio.Transport

    def __init__(self, received: Callable[[bytes], None],
                 lost: Callable[[Exception | None], None]) -> None:
        self._received, self._lost = received, lost
        #: done once the transport is gone
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: while the transport asked us to stop writing: done when it may go on
        self._resumed: asyncio.Future[None] | None = None

    @property
    def paused(self) -> bool:
        return self._resumed is not None

    async def writable(self) -> None:
        """Return once the transport takes writes again (at once unless it is paused)."""
        if self._resumed is not None:
            await asyncio.shield(self._resumed)  # one waiter's cancellation is not everyone's

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without deriving from it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._received(data)

    def eof_received(self) -> bool | None:
        self._received(b"")
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.resume_writing()  # nobody waits on a transport that is gone
        if not self.closed.done():
            self.closed.set_result(None)
        self._lost(exc)

    def pause_writing(self) -> None:
        if self._resumed is None:
            self._resumed = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        resumed, self._resumed = self._resumed, None
        if resumed is not None and not resumed.done():
            resumed.set_result(None)


class Slots:
    """At most `count` holders at once, served first come first served."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def take(self) -> None:
        """Return holding a slot; give it back with `give_back()`."""
        waiters = self._waiters
        while waiters and waiters[0].done():  # cancelled waiters at the head hold nothing
            waiters.popleft()
        if self._free and not waiters:
            self._free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give_back()  # handed over just as we were cancelled: pass it on
            raise

    def give_back(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes to it directly
                return
        self._free += 1
