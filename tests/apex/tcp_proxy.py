"""`TcpProxy`: a loopback TCP relay between a client and a server that a test can cut, and that
records every octet in both directions (for the Wireshark capture).

`cut()` aborts the client side of every connection so far but leaves the server side open and
silent: the server keeps what it believes is a live session (a "half-dead" session, as after a
client's network dropped without a FIN reaching the server). While `refusing` is set, a new
connection is aborted at once (the network is still down), as is one whose server does not
answer. `close()` ends everything.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass(slots=True)
class Pipe:
    """One proxied connection: `chunks` lists (from_client, octets) in the order they passed."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    chunks: list[tuple[bool, bytes]] = field(default_factory=list)
    severed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class TcpProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream_port, self.host = upstream_port, host
        self.port = 0
        self.pipes: list[Pipe] = []
        self._server: asyncio.Server | None = None
        #: set whenever a new connection has been paired with the upstream
        self.connected = asyncio.Event()
        #: abort new connections instead of relaying them
        self.refusing = False

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        pipe = Pipe(writer, up_writer)
        pipe.tasks = [asyncio.create_task(self._pump(pipe, reader, up_writer, True)),
                      asyncio.create_task(self._pump(pipe, up_reader, writer, False))]
        self.pipes.append(pipe)
        self.connected.set()

    async def _pump(self, pipe: Pipe, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, from_client: bool) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if pipe.severed:
                    return
                pipe.chunks.append((from_client, data))
                writer.write(data)
                await writer.drain()
            if not pipe.severed:
                writer.close()

    def cut(self) -> None:
        """Abort every client side; the server sides stay open (see the module docstring)."""
        for pipe in self.pipes:
            pipe.severed = True
            pipe.client.transport.abort()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in self.pipes:
            for task in pipe.tasks:
                task.cancel()
            pipe.client.transport.abort()
            pipe.server.close()
        for pipe in self.pipes:
            for task in pipe.tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._server is not None:
            await self._server.wait_closed()
