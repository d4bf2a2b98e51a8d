"""`Gateway`: the web gateway put together -- `Feeds` on the broker, the aiohttp application,
and aiohttp's server with the gateway's limits -- started and stopped as one.

Why aiohttp (and not starlette on uvicorn): one well-kept asyncio package that is the HTTP
server, the WebSocket server and the HTTP client the tests and the benchmark use, with the
parser limits (header line and field sizes, header count, body size) as plain arguments and a
C parser underneath; it runs on the event loop the broker's client library already runs on
(uvloop included) with no ASGI layer between a delivery and its socket. starlette would need
uvicorn (h11 or httptools) for the server, httpx for tests and a separate WebSocket library.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import structlog
from aiohttp import web

from adapters.apex.endpoint import Endpoint
from adapters.client.pubsub_client import PubsubClient
from adapters.client.reconnect import ReconnectPolicy

from ._api import DEFAULT_REPLAY
from ._app import DEFAULT_HEARTBEAT, DEFAULT_MAX_STREAMS, Auth, build_app, open_streams
from ._feeds import DEFAULT_MAX_FEEDS, DEFAULT_STREAM_QUEUE, Credentials, Feeds
from ._server import GatewayRunner

__all__ = ["Gateway", "GatewayLimits"]

log = structlog.get_logger("adapters.gateway")


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """What one gateway holds at most; every limit answers a client that would take more.

    Attributes:
        max_body: request body octets (413 beyond).
        max_header: octets of one header line or field (431 beyond).
        max_headers: header lines per request (431 beyond).
        max_connections: open TCP connections; more are closed at once.
        keepalive: seconds an idle keep-alive connection stays open.
        max_streams: SSE and WebSocket streams open at once (503 beyond).
        max_feeds: subscriptions held at once (503 beyond).
        replay: deliveries each subscription keeps for reconnecting streams.
        stream_queue: events a stream may have waiting beyond its replay before it is closed.
        heartbeat: seconds of silence before an SSE comment line (and WebSocket ping).
    """

    max_body: int = 64 * 1024
    max_header: int = 8190
    max_headers: int = 64
    max_connections: int = 4096
    keepalive: float = 75.0
    max_streams: int = DEFAULT_MAX_STREAMS
    max_feeds: int = DEFAULT_MAX_FEEDS
    replay: int = DEFAULT_REPLAY
    stream_queue: int = DEFAULT_STREAM_QUEUE
    heartbeat: float = DEFAULT_HEARTBEAT


class Gateway:
    """HTTP on `host:port` (0: any free port, see `.port`) for the broker at
    `broker_host:broker_port` serving `domain`.

    `tls`: serve HTTPS with this server context; `broker_tls`: TLS to the broker with this
    client context; `broker_sasl`: authenticate each feed's BEEP session to the broker as its
    HTTP user with `mechanism` (users who gave a password, Basic; the broker reads the same
    users file), else the sessions are unauthenticated;
    `reconnect`: the feeds' policy when the broker goes away.
    """

    def __init__(self, broker_host: str, broker_port: int, *, domain: str = "example.com",
                 host: str = "127.0.0.1", port: int = 0, auth: Auth | None = None,
                 tls: ssl.SSLContext | None = None, broker_tls: ssl.SSLContext | None = None,
                 broker_sasl: bool = False, mechanism: str = "SCRAM-SHA-256",
                 limits: GatewayLimits | None = None,
                 reconnect: ReconnectPolicy | None = None) -> None:
        self.broker = (broker_host, broker_port)
        self.host, self.port, self.tls = host, port, tls
        self.broker_tls, self.broker_sasl, self.mechanism = broker_tls, broker_sasl, mechanism
        self.limits = limits or GatewayLimits()
        self.reconnect = reconnect or ReconnectPolicy(max_attempts=None)
        lim = self.limits
        self.feeds = Feeds(self._connect, domain, replay=lim.replay,
                           stream_limit=lim.stream_queue, max_feeds=lim.max_feeds)
        self.app = build_app(self.feeds, auth or Auth(), max_body=lim.max_body,
                             heartbeat=lim.heartbeat, max_streams=lim.max_streams)
        self._runner: GatewayRunner | None = None

    async def _connect(self, endpoint: Endpoint, who: Credentials) -> PubsubClient:
        sasl = (who.user, who.password) \
            if self.broker_sasl and who.password is not None else None
        return await PubsubClient.connect(
            *self.broker, endpoint, reconnect=self.reconnect, tls=self.broker_tls,
            sasl=sasl, mechanism=self.mechanism)

    async def start(self) -> None:
        lim = self.limits
        runner = GatewayRunner(self.app, max_connections=lim.max_connections,
                               max_line_size=lim.max_header, max_field_size=lim.max_header,
                               max_headers=lim.max_headers, keepalive_timeout=lim.keepalive,
                               access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self.tls)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]  # the bound port when asked for 0
        log.info("gateway ready", listen=f"{self.host}:{self.port}",
                 broker=f"{self.broker[0]}:{self.broker[1]}", tls=self.tls is not None)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def open_streams(self) -> int:
        """SSE and WebSocket streams being served now."""
        return open_streams(self.app)

    def drop_streams(self, ident: str) -> int:
        """Close every open stream of subscription `ident` (operators and tests: what a
        proxy that cuts connections does); their browsers reconnect with Last-Event-ID."""
        feed = self.feeds.feeds.get(ident)
        if feed is None:
            return 0
        streams = list(feed.streams)
        for stream in streams:
            feed.close_stream(stream)
        return len(streams)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.feeds.close()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
