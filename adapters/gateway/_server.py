"""aiohttp's server with the gateway's connection limits: header refusals as 431 and a cap on
open connections.

aiohttp parses HTTP (no hand-written parsing here) and answers every parse error 400. An
oversized header line or too many header lines deserve RFC 6585's 431 so a client knows what
to shorten; `_Handler.handle_error` says so. `_Server` closes a connection beyond
`max_connections` as soon as it is made (one log line), so many idle sockets cost a bounded
amount of memory and the gateway keeps serving the others; aiohttp's keep-alive timeout closes
idle ones as they age.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

__all__ = ["GatewayRunner"]

log = structlog.get_logger("adapters.gateway")


class _Handler(RequestHandler):
    _refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._manager
        if isinstance(server, _Server) and isinstance(transport, asyncio.Transport) \
                and len(server.connections) >= server.max_connections:
            # Refused before aiohttp starts anything for it: no task, no parser, no count.
            self._refused = True
            log.warning("gateway refused a connection: too many open",
                        limit=server.max_connections)
            transport.abort()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._refused:
            super().connection_lost(exc)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status == 400 and (isinstance(exc, LineTooLong) or (
                isinstance(exc, BadHttpMessage) and "too many headers" in str(exc).lower())):
            status = 431
            message = "Request Header Fields Too Large"
        if not isinstance(exc, HttpProcessingError):  # not the client's: aiohttp's own report
            return super().handle_error(request, status, exc, message)
        # The client's malformed request: one line, not aiohttp's traceback of the parser.
        log.warning("gateway refused a request it could not parse", status=status,
                    error=type(exc).__name__, detail=str(exc.message)[:200])
        response = web.Response(status=status, text=message or exc.message,
                                content_type="text/plain")
        response.force_close()
        return response


class _Server(web.Server):
    def __init__(self, handler: Any, *, request_factory: Any, handler_cancellation: bool,
                 max_connections: int, **kwargs: Any) -> None:
        super().__init__(handler, request_factory=request_factory,
                         handler_cancellation=handler_cancellation, **kwargs)
        self.max_connections = max_connections
        self._handler_kwargs = kwargs

    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=asyncio.get_running_loop(), **self._handler_kwargs)


class GatewayRunner(web.AppRunner):
    """`web.AppRunner` serving through `_Server`; `handler_args` are aiohttp's parser limits
    (max_line_size, max_field_size, max_headers) and keepalive_timeout."""

    def __init__(self, app: web.Application, *, max_connections: int,
                 shutdown_timeout: float, **handler_args: Any) -> None:
        super().__init__(app, shutdown_timeout=shutdown_timeout, **handler_args)
        self._max_connections = max_connections
        self._handler_args = handler_args

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        # Cancel a handler whose client went away: an SSE loop ends at once, not at its
        # next heartbeat write.
        return _Server(made.request_handler, request_factory=made.request_factory,
                       max_connections=self._max_connections, handler_cancellation=True,
                       **self._handler_args)
