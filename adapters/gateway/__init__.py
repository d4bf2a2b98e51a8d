"""The web gateway: HTTP, Server-Sent Events and WebSocket clients of an apexps broker, in the
manner of the P2PSIP draft's SubscribeGateway (§3.4). See docs/gateway.md.

- `_api`: the HTTP vocabulary, pure (validation, SSE text, replay after Last-Event-ID);
- `_feeds`: each subscription as a robust APEX subscriber fanned out to streams;
- `_app`: the aiohttp application (routes, auth, the SSE and WebSocket loops);
- `_server`: aiohttp's server with 431 and a connection cap;
- `gateway`: all of it started and stopped as one.
"""

from __future__ import annotations

from ._api import HttpError, ReplayBuffer, SubscribeRequest, parse_subscribe
from ._app import Auth
from ._feeds import Credentials, Feeds
from .gateway import Gateway, GatewayLimits

__all__ = [
    "Auth",
    "Credentials",
    "Feeds",
    "Gateway",
    "GatewayLimits",
    "HttpError",
    "ReplayBuffer",
    "SubscribeRequest",
    "parse_subscribe",
]
