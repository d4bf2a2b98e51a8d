"""Relay-relay links (RFC 3340 §4.4.2, §4.5.2): `PeerLinks` keeps the server's outbound links.

Theory of operation
-------------------
`connect(domain, host, port)` keeps a BEEP session to another relay open, as its initiator,
starting one APEX channel with a piggybacked `<bind relay='OUR DOMAIN' />` (RFC 3340 §4.2). Once
the peer answers `ok` the channel is the relay's route to `domain`; the session is an ordinary
`ServerSession` of the server (its handler is the server, not this module), so deliveries and
MSGs from the peer take the same paths as an accepted session's. This module only sees the two
events that make a link (`greeted`, `started`) and the end of its transport.

A lost or refused link is retried with capped exponential backoff, in one task per link that
owns the link's whole life; while it is down there is no route, so data for that domain fails
at once with 550. A peer that greets but never answers our start is hung up on after twice the
greeting timeout, so it cannot hold the link forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from adapters.beep import ChannelStarted, ChannelStartRefused, GreetingReceived, Profile, Role
from common.errors import ApexpsError

from .codec import APEX_PROFILE, BEEP_XML, Bind, Error, Ok, Operation, decode, encode_xml
from .relay import ChannelRef

if TYPE_CHECKING:
    from ._server_session import ServerSession
    from .server import ApexServer

__all__ = ["DEFAULT_PEER_BACKOFF", "DEFAULT_PEER_BACKOFF_MAX", "PeerLink", "PeerLinks"]

# The server's log: these lines were its own before the links moved here.
log = structlog.get_logger("adapters.apex.server")

#: Seconds before the first retry of a lost peer link; each failure doubles it ...
DEFAULT_PEER_BACKOFF = 0.5
#: ... up to this, so a relay that is down for hours costs one connection attempt a minute.
DEFAULT_PEER_BACKOFF_MAX = 60.0


@dataclass(slots=True)
class PeerLink:
    """The outbound link to the relay of `domain` that `ApexServer.connect_peer` keeps.

    `ref` is the bound channel while the link is up (None while down); `failures` counts the
    attempts since it was last up, `last_error` says what the last one met."""

    domain: str
    host: str
    port: int
    backoff: float = DEFAULT_PEER_BACKOFF
    backoff_max: float = DEFAULT_PEER_BACKOFF_MAX
    ref: ChannelRef | None = None
    failures: int = 0
    last_error: str = ""
    task: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def is_up(self) -> bool:
        return self.ref is not None

    def _touch(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, condition: Callable[[PeerLink], bool]) -> None:
        """Return once `condition(link)` holds (checked on every change of the link)."""
        while not condition(self):
            await self._changed.wait()

    async def wait_up(self) -> None:
        await self.wait_for(lambda link: link.is_up)

    async def wait_down(self) -> None:
        await self.wait_for(lambda link: not link.is_up)


class PeerLinks:
    """The outbound links of `server`, by domain (see the module docstring)."""

    def __init__(self, server: ApexServer) -> None:
        self._server = server
        self._links: dict[str, PeerLink] = {}

    def connect(self, domain: str, host: str, port: int, *,
                backoff: float = DEFAULT_PEER_BACKOFF,
                backoff_max: float = DEFAULT_PEER_BACKOFF_MAX) -> PeerLink:
        """Keep a link to the relay serving `domain` at `host:port` until `stop()`: bind to it
        as our domain and route `domain`'s data over it. Returns at once; see `PeerLink`."""
        domain = domain.lower()
        if domain in self._links:
            raise ValueError(f"already linked to {domain}")
        if domain == self._server.relay.domain:
            raise ValueError(f"{domain} is this relay's own domain")
        link = PeerLink(domain, host, port, backoff, backoff_max)
        link.task = asyncio.create_task(self._keep(link), name=f"peer-link-{domain}")
        self._links[domain] = link
        return link

    async def stop(self) -> None:
        links, self._links = list(self._links.values()), {}
        for link in links:
            if link.task is not None:
                link.task.cancel()
        for link in links:
            if link.task is not None:
                with suppress(asyncio.CancelledError):
                    await link.task

    async def _keep(self, link: PeerLink) -> None:
        with structlog.contextvars.bound_contextvars(peer_domain=link.domain,
                                                     peer=f"{link.host}:{link.port}"):
            while True:
                await self._run(link)
                link.failures += 1
                delay = min(link.backoff_max, link.backoff * 2 ** (link.failures - 1))
                log.info("peer link retry", attempt=link.failures, delay=delay,
                         error=link.last_error)
                link._touch()
                await asyncio.sleep(delay)

    async def _run(self, link: PeerLink) -> None:
        """One connection of the link, from dialling until its transport is gone."""
        loop = asyncio.get_running_loop()

        def session_of_link() -> ServerSession:  # in this task's context: peer_domain is bound
            return self._server.new_session(Role.INITIATOR, link)
        try:
            async with asyncio.timeout(self._server.greeting_timeout):
                _, session = await loop.create_connection(session_of_link, link.host,
                                                          link.port)
        except (OSError, TimeoutError) as exc:
            link.last_error = f"connect: {type(exc).__name__}: {exc}"
            return
        # A peer that greets but never answers our start must not hold the link forever.
        watchdog = loop.call_later(2 * self._server.greeting_timeout,
                                   lambda: None if link.is_up else session.transport.close())
        try:
            await asyncio.wait([session.ended])  # never cancels `ended` when we are
            if session.lost_reason is not None:
                link.last_error = f"lost: {session.lost_reason}"
            else:
                link.last_error = link.last_error or "the peer ended the session"
        except asyncio.CancelledError:
            link.last_error = "stopped"
            raise
        finally:
            watchdog.cancel()
            session.context.run(self._server.drop, session)
            if link.ref is not None:
                link.ref = None
                if link.last_error == "stopped":
                    log.info("peer link stopped")
                else:
                    log.warning("peer link down", error=link.last_error)
            link._touch()

    def greeted(self, session: ServerSession, event: GreetingReceived) -> None:
        link = session.link
        assert link is not None
        if APEX_PROFILE not in event.profiles:
            link.last_error = "the peer does not offer APEX"
            session.transport.close()
            return
        bind = encode_xml(Bind(self._server.relay.domain, 1))
        session.conn.start_channel([Profile(APEX_PROFILE, bind)])

    def started(self, session: ServerSession,
                      event: ChannelStarted | ChannelStartRefused) -> None:
        link = session.link
        assert link is not None
        reply: Operation
        if isinstance(event, ChannelStartRefused):
            reply = Error(event.code, event.text)
        elif not event.profile.content:
            reply = Error(550, "the peer did not answer the piggybacked bind")
        else:
            try:
                reply = decode(BEEP_XML, event.profile.content.encode("utf-8"))
            except ApexpsError as exc:
                reply = Error.from_exception(exc)
        if not isinstance(reply, Ok):
            code, text = (reply.code, reply.text) if isinstance(reply, Error) else (550, "")
            link.last_error = f"bind refused: {code} {text}".strip()
            log.warning("peer link refused", code=code, text=text)
            session.transport.close()
            return
        assert isinstance(event, ChannelStarted)
        session.channels.add(event.channel)
        link.ref = ChannelRef(session.number, event.channel)
        self._server.relay.add_route(link.domain, link.ref)
        link.failures, link.last_error = 0, ""
        log.info("peer link up", channel=event.channel)
        link._touch()
