"""The gateway's aiohttp application: routes, authentication and the SSE and WebSocket loops.

Theory of operation
-------------------
Thin on purpose: each handler authenticates (`Auth`), hands the request body to `_api` for
validation, asks `Feeds` for the subscription operation, and writes what comes back. A refusal
is an `HttpError` that the error middleware turns into a JSON body with one log line; aiohttp's
own refusals (unknown route 404, body over the limit 413) go through the same middleware.

An SSE response is a loop over one `Stream` of a feed: first what the stream is owed after its
`Last-Event-ID` (gap fill from the broker, then the replay buffer), then live events, with a
comment line every `heartbeat` seconds of silence. It never writes an id at or below one it
wrote: ids are the feed's delivery numbers, which rise, so nothing goes out twice where the
refill and the buffer meet. A stream closed under it (slow reader, cancel, the `drop_streams`
test hook) ends the response; the browser's EventSource reconnects by itself with the last id
it saw.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any

import structlog
from aiohttp import WSMsgType, web

from adapters.beep import Users
from common.errors import ApexpsError

from ._api import (
    Cancel,
    HttpError,
    parse_last_event_id,
    parse_subscribe,
    parse_ws,
    sse_comment,
)
from ._feeds import CONTROL, Credentials, Feed, Feeds, Stream

__all__ = ["Auth", "build_app", "open_streams"]

log = structlog.get_logger("adapters.gateway")

#: Seconds of silence on a stream before a comment line keeps it alive.
DEFAULT_HEARTBEAT = 15.0
#: Event streams (SSE and WebSocket) open at once; more are refused with 503.
DEFAULT_MAX_STREAMS = 2000

_FEEDS = web.AppKey("feeds", Feeds)
_LIMITS: web.AppKey[dict[str, float]] = web.AppKey("limits")
_OPEN: web.AppKey[set[asyncio.Task[Any]]] = web.AppKey("open")


class Auth:
    """Who a request is. `users`: the users file the broker's SASL reads (HTTP Basic; the
    password then also authenticates the feed's BEEP session as that user); `tokens`: bearer
    token -> user name (the broker session is then unauthenticated); neither: everyone is
    `anonymous`. EventSource cannot set headers, so `?access_token=` counts as a bearer token.
    """

    def __init__(self, users: Users | None = None, tokens: Mapping[str, str] | None = None,
                 anonymous: str = "web") -> None:
        self.users, self.tokens, self.anonymous = users, dict(tokens or {}), anonymous

    @property
    def required(self) -> bool:
        return self.users is not None or bool(self.tokens)

    def __call__(self, request: web.Request) -> Credentials:
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        token = request.query.get("access_token")
        if scheme.lower() == "bearer":
            token = value.strip()
        if token is not None and self.tokens:
            for known, user in self.tokens.items():
                if secrets.compare_digest(known.encode(), token.encode()):
                    return Credentials(user)
            raise HttpError(401, "unknown bearer token")
        if scheme.lower() == "basic" and self.users is not None:
            try:
                user, _, password = base64.b64decode(value, validate=True).decode() \
                    .partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise HttpError(401, "malformed Basic credentials") from None
            if self.users.verify(user, password):
                return Credentials(user, password)
            raise HttpError(401, "bad user name or password")
        if self.required:
            raise HttpError(401, "authentication required (Basic or Bearer)")
        return Credentials(self.anonymous)


_AUTH = web.AppKey("auth", Auth)


def _json(status: int, body: Mapping[str, Any]) -> web.Response:
    return web.json_response(body, status=status)


@web.middleware
async def _errors(request: web.Request,
                  handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    try:
        return await handler(request)
    except HttpError as exc:
        refusal = exc
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        refusal = HttpError(exc.status, exc.reason)
    log.warning("gateway refused", method=request.method, path=request.path,
                status=refusal.status, error=refusal.message, field=refusal.field)
    response = _json(refusal.status, refusal.body())
    if refusal.status == 401:
        response.headers["WWW-Authenticate"] = 'Basic realm="apexps", charset="UTF-8"'
    return response


async def _body(request: web.Request) -> object:
    raw = await request.read()  # over client_max_size: 413, by aiohttp
    try:
        return json.loads(raw)
    except ValueError:
        raise HttpError(400, "the body is not JSON") from None


def _feed_view(request: web.Request, feed: Feed) -> dict[str, Any]:
    view = {"id": feed.id, "topic": feed.request.topic, "link": feed.link,
            "events": str(request.url.with_path(f"/subscriptions/{feed.id}/events")
                          .with_query(None)),
            "duration": feed.request.duration, "selector": feed.request.selector,
            "subscription_id": feed.apex_id}
    if feed.watch is not None:  # a resource watch: what the broker granted
        view.update(resource=feed.request.resource, expires=feed.watch.expires,
                    watch_events=sorted(feed.watch.events))
        del view["duration"], view["selector"], view["subscription_id"]
    return view


async def _subscribe(request: web.Request) -> web.Response:
    who = request.app[_AUTH](request)
    sub = parse_subscribe(await _body(request))
    feed = await request.app[_FEEDS].subscribe(who, sub)
    return _json(201, _feed_view(request, feed))


async def _cancel(request: web.Request) -> web.Response:
    who = request.app[_AUTH](request)
    await request.app[_FEEDS].cancel(request.match_info["id"], who.user)
    return web.Response(status=204)


async def _topics(request: web.Request) -> web.Response:
    who = request.app[_AUTH](request)
    feeds = request.app[_FEEDS]
    try:
        # a session of its own per request: two at once must not attach one endpoint twice
        client = await feeds.connect(feeds.endpoint(who.user, f"t{secrets.token_hex(4)}"), who)
    except ApexpsError as exc:
        raise HttpError(503, f"the broker is unavailable: {exc}") from None
    except OSError as exc:
        raise HttpError(503, f"the broker is unreachable ({type(exc).__name__})") from None
    try:
        names = await client.list_topics()
    except ApexpsError as exc:
        from ._api import http_status
        raise http_status(exc) from None
    finally:
        await client.close()
    return _json(200, {"topics": sorted(names)})


def _admit(request: web.Request) -> None:
    limits, open_ = request.app[_LIMITS], request.app[_OPEN]
    if len(open_) >= limits["max_streams"]:
        raise HttpError(503, f"{int(limits['max_streams'])} event streams are open already")


def _aborter(request: web.Request) -> Callable[[], None]:
    def abort() -> None:
        if request.transport is not None:
            request.transport.abort()  # close() would wait to flush to a client not reading
    return abort


async def _events(request: web.Request) -> web.StreamResponse:
    who = request.app[_AUTH](request)
    feed = request.app[_FEEDS].get(request.match_info["id"], who.user)
    after = parse_last_event_id(request.headers.get("Last-Event-ID",
                                                    request.query.get("last-event-id")))
    _admit(request)
    heartbeat = request.app[_LIMITS]["heartbeat"]
    task = asyncio.current_task()
    assert task is not None
    request.app[_OPEN].add(task)
    stream, gap = feed.open_stream(after)
    stream.on_overflow = _aborter(request)
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no"})
    sent = after or 0
    try:
        await response.prepare(request)
        await response.write(b"retry: 1000\n\n")
        if gap is not None:
            for seq, event in await feed.refill(*gap):
                if seq > sent:
                    await response.write(event)
                    sent = seq
        while True:
            try:
                async with asyncio.timeout(heartbeat):
                    item = await stream.get()
            except TimeoutError:
                await response.write(sse_comment("heartbeat"))
                continue
            if item is None:
                break
            seq, event = item
            if seq == CONTROL:
                await response.write(event)
            elif seq > sent:
                await response.write(event)
                sent = seq
    except (ConnectionResetError, asyncio.CancelledError):
        pass  # the client went away
    except ApexpsError as exc:
        log.warning("gateway stream ended: refill refused", subscription=feed.id,
                    error=str(exc))
    finally:
        feed.close_stream(stream)
        request.app[_OPEN].discard(task)
    return response


async def _websocket(request: web.Request) -> web.WebSocketResponse:
    """Both directions on one socket: `{"op":"subscribe",…}` answers `{"subscribed":…}` and
    starts its deliveries as `{"delivery":…}` (a resource watch's Notifies as
    `{"notify":…}`); `{"op":"cancel","id":…}` answers
    `{"cancelled":id}`; a refusal is `{"error":…, "field":…}` and changes nothing."""
    who = request.app[_AUTH](request)
    _admit(request)
    task = asyncio.current_task()
    assert task is not None
    request.app[_OPEN].add(task)
    feeds = request.app[_FEEDS]
    ws = web.WebSocketResponse(heartbeat=request.app[_LIMITS]["heartbeat"],
                               max_msg_size=int(request.app[_LIMITS]["max_body"]))
    await ws.prepare(request)
    pumps: dict[str, asyncio.Task[None]] = {}

    async def pump(feed: Feed, stream: Stream) -> None:
        while (item := await stream.get()) is not None:
            seq, event = item
            data = event.decode().split("data: ", 1)[1].strip()
            if seq == CONTROL:  # a reset or the end: {"control": {"reset"|"end": …}}
                await ws.send_str(f'{{"control":{data},"id":"{feed.id}"}}')
            elif event.startswith(b"event: notify\n"):  # a resource watch's Notify
                await ws.send_str(f'{{"notify":{data},"seq":{seq}}}')
            else:
                await ws.send_str(f'{{"delivery":{data},"seq":{seq}}}')
        if stream.closed == "slow reader":
            await ws.close(code=1013, message=b"slow reader")

    try:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            try:
                op = parse_ws(msg.data)
                if isinstance(op, Cancel):
                    pump_task = pumps.pop(op.id, None)
                    await feeds.cancel(op.id, who.user)
                    if pump_task is not None:
                        pump_task.cancel()
                    await ws.send_json({"cancelled": op.id})
                else:
                    feed = await feeds.subscribe(who, op)
                    stream, _ = feed.open_stream(None)
                    stream.on_overflow = _aborter(request)
                    await ws.send_json({"subscribed": _feed_view(request, feed)})
                    pumps[feed.id] = asyncio.create_task(pump(feed, stream))
            except HttpError as exc:
                log.warning("gateway refused", method="WS", path=request.path,
                            status=exc.status, error=exc.message, field=exc.field)
                await ws.send_json({**exc.body(), "status": exc.status})
    finally:
        for ident, pump_task in pumps.items():
            pump_task.cancel()
            with contextlib.suppress(HttpError):
                await feeds.cancel(ident, who.user)
        request.app[_OPEN].discard(task)
    return ws


def open_streams(app: web.Application) -> int:
    """Event streams (SSE and WebSocket) whose handlers are running now."""
    return len(app[_OPEN])


async def _console(_: web.Request) -> web.Response:
    page = resources.files("adapters.gateway").joinpath("console.html").read_text("utf-8")
    return web.Response(text=page, content_type="text/html")


def build_app(feeds: Feeds, auth: Auth, *, max_body: int = 64 * 1024,
              heartbeat: float = DEFAULT_HEARTBEAT,
              max_streams: int = DEFAULT_MAX_STREAMS) -> web.Application:
    """The application; `max_body`: the largest request body (413 beyond)."""
    app = web.Application(middlewares=[_errors], client_max_size=max_body)
    app[_FEEDS], app[_AUTH] = feeds, auth
    app[_LIMITS] = {"heartbeat": heartbeat, "max_streams": max_streams,
                    "max_body": max_body}
    open_: set[asyncio.Task[Any]] = set()
    app[_OPEN] = open_
    app.router.add_get("/", _console)
    app.router.add_get("/topics", _topics)
    app.router.add_post("/subscriptions", _subscribe)
    app.router.add_delete("/subscriptions/{id}", _cancel)
    app.router.add_get("/subscriptions/{id}/events", _events)
    app.router.add_get("/ws", _websocket)

    async def closing(_: web.Application) -> None:
        for task in list(open_):
            task.cancel()
        await feeds.close()

    app.on_shutdown.append(closing)
    return app
