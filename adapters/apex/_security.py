"""Tuning glue (RFC 3080 §3, §4): TLS and SASL for the server's accepted sessions.

Theory of operation
-------------------
The tuning conversations themselves are sans-I/O (`adapters.beep.Tuning`, one per accepted
session, composed over its `BeepConnection`); what is left for the asyncio shell is here.

Given `tls` (a server `ssl.SSLContext`) the server offers the TLS profile and, once `proceed` has
gone out, hands the same transport to TLS with `loop.start_tls` and greets again. Reads that
arrive meanwhile wait in the session's `early` list and are fed, in order, once the handshake is
accounted for (`secure`, `_secured`): asyncio's TLS transport may hand over the peer's first
secured bytes before `start_tls` returns. Every channel closes with the old transport (§3.1.3.2),
so the relay forgets them before the `proceed` is written.

Given `sasl` (a `verify(user, password)` callable or a `Users` directory) the server offers SASL.
`require_tls` / `require_auth` keep APEX channels shut until then (the `TuningPolicy` decides),
and an authenticated session may attach only as its own identity and its subaddresses (RFC 3340
§4.5.1): the relay's `may_attach` hook is narrowed here to the session's identity.

Our own peer links (initiator sessions) are not tuned: their events pass through `tuned`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from typing import TYPE_CHECKING

import structlog

from adapters.beep import Event as BeepEvent
from adapters.beep import (
    SaslAuthenticated,
    SaslFailed,
    TlsRequested,
    Tuning,
    TuningPolicy,
    Verifier,
)
from common.errors import InvalidParameter

from .endpoint import Endpoint
from .relay import ChannelRef

if TYPE_CHECKING:
    from ._server_session import ServerSession
    from .server import ApexServer

__all__ = ["SessionSecurity"]

# The server's log: these lines were its own before the tuning glue moved here.
log = structlog.get_logger("adapters.apex.server")


class SessionSecurity:
    """TLS and SASL for `server`'s accepted sessions (see the module docstring)."""

    def __init__(self, server: ApexServer, tls: ssl.SSLContext | None, require_tls: bool,
                 sasl: Verifier | None, require_auth: bool) -> None:
        self._server = server
        self.tls = tls
        #: What every session offers and demands; see `adapters.beep.TuningPolicy`.
        self.policy = TuningPolicy(tls=tls is not None, require_tls=require_tls, users=sasl,
                                   require_auth=require_auth)
        #: each accepted session's tuning, by session number, until it is dropped
        self.tunings: dict[int, Tuning] = {}
        if sasl is not None:
            # The relay's attach policy, narrowed to the session's identity (RFC 3340 §4.5.1).
            relay = server.relay
            self._attach_policy = relay.may_attach
            relay.may_attach = self._may_attach

    def greet(self, session: ServerSession) -> None:
        """An accepted session: send the greeting that offers what the policy allows."""
        tuning = self.tunings[session.number] = Tuning(session.conn, self.policy)
        tuning.send_greeting()

    def forget(self, session: ServerSession) -> None:
        self.tunings.pop(session.number, None)

    def _may_attach(self, ref: ChannelRef, endpoint: Endpoint) -> bool:
        tuning = self.tunings.get(ref.session)
        identity = None if tuning is None or tuning.mechanism == "ANONYMOUS" \
            else tuning.identity
        if identity is None:
            return not self.policy.require_auth and self._attach_policy(ref, endpoint)
        try:
            own = Endpoint.parse(identity if "@" in identity
                                 else f"{identity}@{self._server.relay.domain}")
        except InvalidParameter:
            return False  # a user name no endpoint can carry attaches as nothing
        # "fred" may attach as fred@D and, by the subaddress convention, fred/appl=wb@D.
        return endpoint.base == own.base and self._attach_policy(ref, endpoint)

    def tuned(self, session: ServerSession, data: bytes) -> Iterator[BeepEvent]:
        """The session's events with the tuning ones handled. A generator, so that a TLS
        `ready` is answered only after the events before it were (RFC 3080 §3.1.3.1).
        Our own peer links (initiator sessions) are not tuned: their events pass through."""
        tuning = self.tunings.get(session.number)
        if tuning is None:
            yield from session.conn.receive_data(data)
            return
        for event in tuning.receive_data(data):
            if isinstance(event, TlsRequested):
                if tuning.accept_tls(event.channel):
                    # Every channel closes with the transport (§3.1.3.2); from here no
                    # delivery may reach this session until it has greeted again.
                    for channel in session.channels:
                        self._server.relay.channel_closed(ChannelRef(session.number, channel))
                    session.channels.clear()
                    log.info("tls proceeding")
                else:
                    log.info("tls declined: replies pending")
            elif isinstance(event, SaslAuthenticated):
                log.info("authenticated", identity=event.identity, mechanism=event.mechanism)
            elif isinstance(event, SaslFailed):
                log.warning("authentication failed", code=event.code, user=event.user,
                            mechanism=event.mechanism, text=event.text)
            else:
                yield event

    def secure(self, session: ServerSession) -> bool:
        """If `proceed` went out, hand the transport to TLS (reads wait in `early` meanwhile);
        False ends the session (the peer spoke before the handshake)."""
        tuning = self.tunings.get(session.number)
        if tuning is None or not tuning.must_begin_tls:
            return True
        self._server.flush(session)  # the proceed, before the handshake
        if tuning.begin_tls():
            log.warning("tls refused: the peer spoke before the handshake")
            return False
        if session.greeting_timer is not None:  # the handshake has its own timeout
            session.greeting_timer.cancel()
        # The peer's ClientHello must not be read as plain text: `start_tls` resumes reading
        # once its TLS protocol has the transport.
        session.transport.pause_reading()
        session.early = []
        session.handshake = asyncio.create_task(self._handshake(session, tuning))
        return True

    async def _handshake(self, session: ServerSession, tuning: Tuning) -> None:
        assert self.tls is not None
        try:
            transport = await asyncio.get_running_loop().start_tls(
                session.transport, session, self.tls, server_side=True,
                ssl_handshake_timeout=self._server.greeting_timeout)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            # RFC 3080 §3 recommends "a diagnostic entry be logged".
            log.warning("tls negotiation failed", error=str(exc) or type(exc).__name__)
            session.handshake = None
            session.context.run(self._server.drop, session)
            return
        assert transport is not None
        session.transport = transport
        session.handshake = None
        session.context.run(self._secured, session, tuning)

    def _secured(self, session: ServerSession, tuning: Tuning) -> None:
        tuning.tls_established()
        cipher = session.transport.get_extra_info("cipher")
        log.info("tls established", cipher=cipher[0] if cipher else None)
        self._server.flush(session)
        self._server.await_greeting(session)  # the greetings start over
        early, session.early = session.early or [], None
        for data in early:
            self._server.received(session, data)
