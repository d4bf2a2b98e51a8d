"""`FaultProxy`: a loopback TCP relay in front of the broker that drops its client's connection
when told to, for the chaos harness (ops/chaos_robust.py).

A drop aborts the client side at once (the application sees a reset, as when its network goes).
The broker side goes one of two ways, chosen by the proxy's seeded RNG:

* aborted too: the broker sees the reset and ends the session at once;
* left open and silent for a while, then closed: the broker keeps a session it believes is live
  (a "half-dead" session, as when no FIN or RST ever reached it) and keeps sending to it until
  the socket is finally closed, so the messages it sent meanwhile are lost on the way and must
  come back by gap fill on the client's next session.

While the broker is down a new connection fails to reach it and is aborted, as the client would
see it without a proxy. The proxy never alters or reorders octets: every fault is a lost TCP
connection, the fault the robust binding claims to mask.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

__all__ = ["FaultProxy"]

#: How long a half-dead broker side stays open, silent, before it is closed (seconds).
HALF_DEAD_S = (0.5, 4.0)


@dataclass(slots=True, eq=False)
class _Pipe:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    severed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class FaultProxy:
    def __init__(self, upstream_port: int, rng: random.Random, host: str = "127.0.0.1") -> None:
        self.upstream_port, self.host, self.rng = upstream_port, host, rng
        self.port = 0
        #: drops that cut a live connection; of those, how many left the broker side half-dead
        self.drops = 0
        self.half_dead = 0
        #: connections relayed to the broker (the first and every reconnection)
        self.connections = 0
        self._live: set[_Pipe] = set()
        self._server: asyncio.Server | None = None
        self._half: set[_Pipe] = set()

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:  # the broker is down: the client sees its connection fail
            writer.transport.abort()
            return
        self.connections += 1
        pipe = _Pipe(writer, up_writer)
        pipe.tasks = [asyncio.create_task(self._pump(pipe, reader, up_writer)),
                      asyncio.create_task(self._pump(pipe, up_reader, writer))]
        self._live.add(pipe)

    async def _pump(self, pipe: _Pipe, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if pipe.severed:
                    return  # a half-dead side: what the broker sends now goes nowhere
                writer.write(data)
                await writer.drain()
        if not pipe.severed:  # an orderly end on one side ends the other
            self._live.discard(pipe)
            writer.close()

    def drop(self) -> bool:
        """Cut the live connection(s); False if there was none (the client is reconnecting)."""
        if not self._live:
            return False
        loop = asyncio.get_running_loop()
        for pipe in self._live:
            pipe.severed = True
            pipe.client.transport.abort()
            if self.rng.random() < 0.5:
                pipe.server.transport.abort()
            else:
                self.half_dead += 1
                self._half.add(pipe)
                loop.call_later(self.rng.uniform(*HALF_DEAD_S), self._close_later, pipe)
        self._live.clear()
        self.drops += 1
        return True

    def _close_later(self, pipe: _Pipe) -> None:
        self._half.discard(pipe)
        pipe.server.transport.abort()

    async def inject(self, mean_interval_s: float, stop: asyncio.Event) -> None:
        """Drop the live connection at random intervals (exponential, `mean_interval_s` on
        average) until `stop` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.expovariate(1 / mean_interval_s))
            if not stop.is_set():
                self.drop()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in self._live | self._half:
            pipe.client.transport.abort()
            pipe.server.transport.abort()
            for task in pipe.tasks:
                task.cancel()
        self._live.clear()
        self._half.clear()
        if self._server is not None:
            await self._server.wait_closed()
