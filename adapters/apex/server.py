"""`ApexServer`: the asyncio shell around `BeepConnection` (LISTENER) and the `Relay` core.

Each TCP connection is a `ServerSession`, the `asyncio.Protocol` of its transport: every read
goes straight into its `BeepConnection`, APEX MSGs become relay operations, and what the
connection queues is written at the end of the read. The relay's deliveries go out on whichever
session holds the target channel. Every operation is logged once, with `peer` and `channel`
bound through structlog's contextvars (in the session's own context, see `_server_session`).
Limits: the BEEP decoder bounds what it keeps of a read; while the transport's write buffer is
above its high-water mark the session is not read (backpressure); a connection whose unsent
output -- in the transport, or queued behind BEEP windows the peer never opens -- passes
`max_outbound` is dropped (a peer that does not take what we send must not make us buffer
without end); one that has not greeted within `greeting_timeout` seconds is closed.

Relay-relay links (RFC 3340 §4.4.2): `connect_peer(domain, host, port)` keeps a BEEP session
to another relay open, as its initiator, starting one APEX channel with a piggybacked
`<bind relay='OUR DOMAIN' />` (§4.2). Once the peer answers `ok` the channel is the relay's route
to `domain`; the session sits in the same table as accepted ones, so deliveries and MSGs from the
peer take the same paths. A lost or refused link is retried with capped exponential backoff;
while it is down there is no route, so data for that domain fails at once with 550.

Tuning (RFC 3080 §3, §4): given `tls` (a server `ssl.SSLContext`) the server offers the TLS
profile and, on `proceed`, hands the same transport to TLS with `loop.start_tls` and
greets again; given `sasl` (a `verify(user, password)` callable or a `Users` directory) it offers
SASL. `require_tls` / `require_auth` keep APEX channels shut until then, and an authenticated
session may attach only as its own identity and its subaddresses (RFC 3340 §4.5.1), enforced
through the relay's `may_attach` hook.

Replies to what we deliver (RFC 3342): a delivery the relay gave a `Watch` (dataTiming,
hold4Endpoint) is remembered by (session, channel, msgno) until the application's RPY or ERR
comes, with `loop.call_later` timers for its deadline and report time; the watch's reports go
out through `send`, held data is released on `ok` and held again on `error` or when the session
ends first. One more timer wakes the relay when held data's next deadline or report time comes
(`Relay.expire_held`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import ssl
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field

import structlog

from adapters.beep import (
    BeepConfig,
    BeepConnection,
    ChannelStarted,
    ChannelStartRefused,
    ChannelStartRequested,
    CloseRequested,
    ErrorReplyReceived,
    GreetingReceived,
    LocalProtocolError,
    MessageReceived,
    Profile,
    ProtocolViolation,
    ReplyReceived,
    Role,
    SaslAuthenticated,
    SaslFailed,
    SessionClosed,
    TlsRequested,
    Tuning,
    TuningPolicy,
    Verifier,
)
from adapters.beep import Event as BeepEvent
from broker.errors import ApexpsError, InvalidParameter, ReplyCode

from ._codec import (
    APEX_PROFILE,
    BEEP_XML,
    Bind,
    Data,
    Error,
    Ok,
    Operation,
    decode,
    encode,
    encode_xml,
)
from ._endpoint import Endpoint
from ._party import Watch
from ._relay import ChannelRef, Delivery, Outcome, Relay
from ._server_session import AwaitedReply
from ._server_session import ServerSession as _Session

__all__ = [
    "DEFAULT_GREETING_TIMEOUT",
    "DEFAULT_MAX_OUTBOUND",
    "DEFAULT_PEER_BACKOFF",
    "DEFAULT_PEER_BACKOFF_MAX",
    "READ_SIZE",
    "ApexServer",
    "PeerLink",
]

log = structlog.get_logger(__name__)

#: The receive window each APEX channel advertises (RFC 3081 §3.1: 4096 until the first SEQ).
#: We consume what arrives at once (it is parsed as it comes), so the window buffers nothing;
#: at 4096 a subscriber could have only about five 512-octet deliveries in flight, and the
#: fan-out stalled on SEQ round trips (measured: ~600 deliveries/s to 10 subscribers).
APEX_WINDOW = 256 * 1024

#: `encode(Ok())`'s body, which answers nearly every data.
_PLAIN_OK = encode(Ok())[1]

#: Seconds a new connection has to send its BEEP greeting before we hang up.
DEFAULT_GREETING_TIMEOUT = 10.0
#: Unsent octets one connection may pile up (two BEEP maximum messages) before it is dropped.
DEFAULT_MAX_OUTBOUND = 8 * 1024 * 1024
#: The most one read hands over: asyncio's and uvloop's transports read at most 256 KiB at a
#: time (the BEEP decoder bounds what it keeps of that).
READ_SIZE = 256 * 1024
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


@dataclass(slots=True)
class _Watched:
    """A delivered data whose reply we wait for (see the module docstring)."""

    key: tuple[int, int, int]
    watch: Watch
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    done: bool = False

    def finish(self) -> bool:
        """Mark it settled; False if it already was."""
        if self.done:
            return False
        self.done = True
        for timer in self.timers:
            timer.cancel()
        return True


class ApexServer:
    """Serve `relay` over BEEP on `host:port` (port 0: any free port; see `.port`)."""

    def __init__(self, relay: Relay, host: str = "127.0.0.1", port: int = 0, *,
                 config: BeepConfig | None = None,
                 greeting_timeout: float = DEFAULT_GREETING_TIMEOUT,
                 max_outbound: int = DEFAULT_MAX_OUTBOUND,
                 tls: ssl.SSLContext | None = None, require_tls: bool = False,
                 sasl: Verifier | None = None, require_auth: bool = False) -> None:
        self.relay, self.host, self.port = relay, host, port
        self.config = config or BeepConfig(window_size=APEX_WINDOW)
        self.greeting_timeout, self.max_outbound = greeting_timeout, max_outbound
        self._sessions: dict[int, _Session] = {}
        self._numbers = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._links: dict[str, PeerLink] = {}
        self._init_security(tls, require_tls, sasl, require_auth)
        #: deliveries with a Watch, by (session, channel, msgno), until their reply comes
        self._watched: dict[tuple[int, int, int], _Watched] = {}
        self._hold_timer: asyncio.TimerHandle | None = None
        self._hold_due: int | None = None
        self._closed = False
        #: each accepted connection's `ended`, until its transport is gone
        self._serving: set[asyncio.Future[None]] = set()
        #: sessions with deliveries queued but not yet written (see `_deliver`)
        self._unflushed: dict[int, _Session] = {}
        self._flush_soon = False

    async def start(self) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            self._accepted, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("apex server listening", host=self.host, port=self.port)
        self._arm_holds()  # held data from before a restart has deadlines too

    async def close(self) -> None:
        self._closed = True  # sessions still winding down must not set new hold timers
        await self._stop_links()
        self._stop_watching()
        if self._server is not None:
            self._server.close()
            for session in list(self._sessions.values()):
                session.context.run(self._drop, session)
            await self._server.wait_closed()
        # Each transport is gone once it has written what it holds; asyncio.run would
        # otherwise close the loop under it.
        if self._serving:
            await asyncio.wait(list(self._serving), timeout=self.greeting_timeout)

    async def __aenter__(self) -> ApexServer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _accepted(self) -> _Session:
        session = _Session(self, next(self._numbers),
                           BeepConnection(Role.LISTENER, self.config, [APEX_PROFILE]))
        self._serving.add(session.ended)
        session.ended.add_done_callback(self._serving.discard)
        return session

    # --- the transport's callbacks (ServerSession), each in the session's context ---------

    def opened(self, session: _Session) -> None:
        if session.link is None:
            host, port = session.transport.get_extra_info("peername")[:2]
            session.peer = f"{host}:{port}"
        else:
            session.peer = f"{session.link.host}:{session.link.port}"
        structlog.contextvars.bind_contextvars(peer=session.peer)
        self._sessions[session.number] = session
        if session.link is None:
            tuning = self._tunings[session.number] = Tuning(session.conn, self.tuning)
            log.info("connection opened")
            tuning.send_greeting()
        else:
            log.info("peer link connected")
            session.conn.send_greeting()
        self._flush(session)
        self._await_greeting(session)

    def received(self, session: _Session, data: bytes) -> None:
        """One read (`b""`: end-of-file): handle the events it completes, write what they
        queued, and end the session or hand it to TLS when they say so."""
        if session.dropped:
            return
        if session.early is not None:  # the TLS handshake is under way
            session.early.append(data)
            return
        if self._events(session, data) or not data or not self._secure(session):
            self._drop(session)
            return
        self._flush(session)

    def lost(self, session: _Session, exc: Exception | None) -> None:
        if exc is not None and session.lost_reason is None:
            session.lost_reason = type(exc).__name__
            log.info("connection lost", reason=session.lost_reason)
        self._drop(session)

    def _drop(self, session: _Session) -> None:
        """Let go of the session: close its transport (after what it holds is written), and
        forget its channels, watches and pending replies. Once; later calls do nothing."""
        if session.dropped:
            return
        session.dropped = True
        self._flush(session)
        session.transport.close()
        if session.greeting_timer is not None:
            session.greeting_timer.cancel()
        if session.handshake is not None:
            session.handshake.cancel()
        session.waiting.clear()  # their services finish; nobody is left to answer
        for channel in session.channels:
            self.relay.channel_closed(ChannelRef(session.number, channel))
        self._session_unwatched(session.number)
        del self._sessions[session.number]
        self._tunings.pop(session.number, None)
        if session.link is None:
            structlog.contextvars.unbind_contextvars("channel")
            session.bound_channel = None
            log.info("connection closed", peer=session.peer)

    def _await_greeting(self, session: _Session) -> None:
        """Close the session if the peer has not greeted within `greeting_timeout`."""
        if session.greeting_timer is not None:
            session.greeting_timer.cancel()
        session.greeting_timer = asyncio.get_running_loop().call_later(
            self.greeting_timeout, self._greeting_due, session, context=session.context)

    def _greeting_due(self, session: _Session) -> None:
        session.greeting_timer = None
        if session.conn.peer_greeting is None and not session.dropped:
            session.lost_reason = "TimeoutError"
            log.info("connection lost", reason=session.lost_reason)
            self._drop(session)

    def _events(self, session: _Session, data: bytes) -> bool:
        """Handle the events `data` completes; True once the session is over."""
        for event in self._tuned(session, data):
            if type(event) is MessageReceived:  # nearly every event: first, and by type
                # The channel goes into every log line of the operation. It stays bound in the
                # session's context: a pipelining peer's MSGs of one channel share one binding.
                if event.channel != session.bound_channel:
                    structlog.contextvars.bind_contextvars(channel=event.channel)
                    session.bound_channel = event.channel
                    session.bound_ref = ChannelRef(session.number, event.channel)
                self._message(session, event, session.bound_ref)
                continue
            if session.bound_channel is not None:
                structlog.contextvars.unbind_contextvars("channel")
                session.bound_channel = None
            if self._event(session, event):
                return True
        return False

    def _event(self, session: _Session, event: BeepEvent) -> bool:
        """Any event but a message; True once the session is over."""
        if isinstance(event, SessionClosed):
            self._flush(session)
            return True
        if isinstance(event, ProtocolViolation):
            log.warning("protocol violation", code=event.code, text=event.text,
                        violation_channel=event.channel, terminate=event.terminate)
            if event.terminate:
                return True
        elif isinstance(event, GreetingReceived) and session.link is not None:
            self._link_greeted(session, event)
        elif isinstance(event, ChannelStarted | ChannelStartRefused) and session.link:
            self._link_started(session, event)
        elif isinstance(event, ChannelStartRequested):
            self._start(session, event)
        elif isinstance(event, CloseRequested):
            return self._close(session, event)
        elif isinstance(event, ErrorReplyReceived):
            log.info("delivery refused", channel=event.channel,
                     body=event.body[:200].decode("utf-8", "replace"))
            self._replied(session, event)
        elif isinstance(event, ReplyReceived):
            self._replied(session, event)
        return False

    def _start(self, session: _Session, event: ChannelStartRequested) -> None:
        if session.conn.is_over:
            return  # ended later in the same read: no channel can open now
        with structlog.contextvars.bound_contextvars(channel=event.channel):
            offered = next(p for p in event.profiles if p.uri == APEX_PROFILE)
            if not offered.content:
                session.conn.accept_start(event.channel, APEX_PROFILE)
                session.channels.add(event.channel)
                log.info("apex channel started")
                return
            # Piggybacked attach/bind (RFC 3340 §4.2): the reply rides back in the profile.
            ref = ChannelRef(session.number, event.channel)
            try:
                operation = decode("application/beep+xml", offered.content.encode("utf-8"))
                outcome = self.relay.handle(ref, operation)
                reply, deliveries = outcome.reply, outcome.deliveries
            except ApexpsError as exc:
                reply, deliveries = Error.from_exception(exc), ()
            session.conn.accept_start(event.channel, Profile(APEX_PROFILE, encode_xml(reply)))
            session.channels.add(event.channel)
            log.info("apex channel started", piggyback=type(reply).__name__.lower())
            self._deliver(deliveries)

    def _message(self, session: _Session, event: MessageReceived, ref: ChannelRef) -> None:
        try:
            operation = decode(event.content_type, event.body)
        except ApexpsError as exc:
            log.info("apex message refused", code=int(exc.code), error=str(exc))
            self._reply(session, event, Error.from_exception(exc))
            return
        outcome = self.relay.handle(ref, operation)
        before = session.waiting.get(event.channel)
        if outcome.pending is None and before is None:
            self._complete(session, event, operation, outcome)
            return
        self._deliver(outcome.deliveries)  # what is decided already need not wait
        if before is None:
            before = session.waiting[event.channel] = deque()
        if outcome.pending is None:  # decided, but an earlier reply on the channel is not
            before.append(AwaitedReply(event, operation, Outcome(outcome.reply)))
            return
        awaited = AwaitedReply(event, operation)
        before.append(awaited)
        outcome.pending.settle_then(functools.partial(self._settled, session, awaited))

    def _settled(self, session: _Session, awaited: AwaitedReply,
                 outcome: Outcome | BaseException) -> None:
        """`awaited`'s services are done: send every reply of its channel that is now due, in
        the order of the MSGs (ours may wait for earlier ones; later ones may wait for ours).
        Callbacks, not a task per MSG: a publication's task, gather and log binding cost more
        than the rest of its reply, and a chain of tasks would put each reply in an event-loop
        turn, and a write, of its own."""
        if session.dropped:
            return
        awaited.outcome = outcome
        channel = awaited.event.channel
        queue = session.waiting.get(channel)
        if not queue or queue[0] is not awaited:
            return  # an earlier MSG's reply is still out: its settling sends ours
        with structlog.contextvars.bound_contextvars(peer=session.peer, channel=channel):
            while queue and queue[0].outcome is not None:
                done = queue.popleft()
                final = done.outcome
                if isinstance(final, BaseException):
                    log.error("service failed; answered 451", exc_info=final)
                    final = Outcome(Error(int(ReplyCode.ABORTED), "local error in processing"))
                assert final is not None
                if channel not in session.channels:
                    continue
                try:
                    self._complete(session, done.event, done.operation, final)
                except ApexpsError as exc:  # the session ended while the service worked
                    log.info("reply dropped", error=str(exc))
                except Exception:  # a bug: the replies behind this one must still go
                    log.exception("reply failed")
        if not queue:
            del session.waiting[channel]
        # The replies of one journal batch settle in the same event-loop turn: they leave in
        # one write, not one each (a loopback write that wakes its reader cost 15 µs of CPU
        # against 2 back to back, measured here).
        self._flush_later(session)

    def _complete(self, session: _Session, event: MessageReceived, operation: Operation,
                  outcome: Outcome) -> None:
        # `log.bind()`: the configured logger itself. `log.info` on the module's lazy proxy
        # looks it up through `__getattr__` every time, which on this once-per-operation line
        # cost a few percent of the operation. Data accepted is traffic, not an event of the
        # session: at a thousand publications a second a line each would drown what an
        # operator looks for, so it goes at debug; refusals and everything else at info.
        code = outcome.reply.code if isinstance(outcome.reply, Error) else 250
        logger = log.bind()
        emit = logger.debug if type(operation) is Data and code == 250 else logger.info
        emit("apex operation", operation=type(operation).__name__.lower(), reply=code,
             deliveries=len(outcome.deliveries))
        self._reply(session, event, outcome.reply)
        self._deliver(outcome.deliveries)
        self._arm_holds()

    def send(self, data: Data) -> None:
        """Route data a service sends on its own (fan-out, notices) to whoever can take it."""
        self._deliver(tuple(self.relay.route(data)))
        self._arm_holds()

    def _reply(self, session: _Session, event: MessageReceived, reply: Ok | Error) -> None:
        try:
            if type(reply) is Ok and reply.trans_id is None:  # nearly every reply: known octets
                session.conn.send_rpy(event.channel, event.msgno, _PLAIN_OK, BEEP_XML)
                return
            content_type, body = encode(reply)
            if isinstance(reply, Error):
                session.conn.send_err(event.channel, event.msgno, body, content_type)
            else:
                session.conn.send_rpy(event.channel, event.msgno, body, content_type)
        except LocalProtocolError:
            if not session.conn.is_over:
                raise  # a bug of ours, not the peer's doing
            # The read that completed this MSG also ended the session: a poorly-formed frame
            # after it (RFC 3080 §2.2.1.1, no reply) or a release. The MSG was well-formed and
            # was handled, as it would have been had the bytes arrived in two reads; only its
            # reply has nowhere to go. The session's end is logged once, not each such reply.
            log.debug("reply dropped: the session has ended", msgno=event.msgno)

    def _deliver(self, deliveries: tuple[Delivery, ...] | list[Delivery]) -> None:
        for delivery in deliveries:
            target = self._sessions.get(delivery.target.session)
            if target is None or delivery.target.channel not in target.channels:
                self._undelivered(delivery)
                continue
            content_type, body = encode(delivery.operation)
            try:
                msgno = target.conn.send_msg(delivery.target.channel, body, content_type)
            except ApexpsError as exc:  # e.g. the session is closing
                log.info("delivery dropped", error=str(exc))
                self._undelivered(delivery)
                continue
            if delivery.watch is not None:
                self._watch((target.number, delivery.target.channel, msgno), delivery.watch)
            self._flush_later(target)

    def _flush_later(self, session: _Session) -> None:
        """Write what `session` has queued at the end of this event-loop turn: one write per
        session per turn, however many deliveries and replies it got (a service fanning out a
        batch, several data for one subscriber, a publisher's replies)."""
        self._unflushed[session.number] = session
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush_unflushed)

    def _flush_unflushed(self) -> None:
        self._flush_soon = False
        sessions, self._unflushed = self._unflushed, {}
        for session in sessions.values():
            self._flush(session)

    def _close(self, session: _Session, event: CloseRequested) -> bool:
        """Accept the peer's close if we can; True once that released the session."""
        ref = ChannelRef(session.number, event.channel)
        try:
            session.conn.accept_close(event.channel)
        except ApexpsError as exc:
            if not session.conn.is_over:  # else the session ended earlier in this read
                session.conn.decline_close(event.channel, 550, str(exc))
            return False
        if event.channel:
            self.relay.channel_closed(ref)
            session.channels.discard(event.channel)
        log.info("close accepted", closed_channel=event.channel)
        # RFC 3081 §2: the peer sending the ok "immediately issues the TCP CLOSE call"; the
        # caller drops the session, whose transport closes once the ok is written.
        return not event.channel

    def _flush(self, session: _Session) -> None:
        conn, transport = session.conn, session.transport
        data = conn.data_to_send()
        if transport.is_closing():
            return
        if data:
            transport.write(data)
        # What we hold for the peer: unsent in the transport (it does not read) and queued
        # behind its BEEP windows (it reads but never opens them with SEQ).
        if transport.get_write_buffer_size() + conn.backlog > self.max_outbound:
            # explicit peer: a delivery's flush runs in the context of whoever sent it
            log.warning("peer does not take what we send; dropping it", peer=session.peer,
                        unsent=transport.get_write_buffer_size(), withheld=conn.backlog)
            transport.abort()

    # --- relay-relay links (RFC 3340 §4.4.2, §4.5.2) --------------------------------------

    def connect_peer(self, domain: str, host: str, port: int, *,
                     backoff: float = DEFAULT_PEER_BACKOFF,
                     backoff_max: float = DEFAULT_PEER_BACKOFF_MAX) -> PeerLink:
        """Keep a link to the relay serving `domain` at `host:port` until `close()`: bind to it
        as our domain and route `domain`'s data over it. Returns at once; see `PeerLink`."""
        domain = domain.lower()
        if domain in self._links:
            raise ValueError(f"already linked to {domain}")
        if domain == self.relay.domain:
            raise ValueError(f"{domain} is this relay's own domain")
        link = PeerLink(domain, host, port, backoff, backoff_max)
        link.task = asyncio.create_task(self._keep_link(link), name=f"peer-link-{domain}")
        self._links[domain] = link
        return link

    async def _stop_links(self) -> None:
        links, self._links = list(self._links.values()), {}
        for link in links:
            if link.task is not None:
                link.task.cancel()
        for link in links:
            if link.task is not None:
                with suppress(asyncio.CancelledError):
                    await link.task

    async def _keep_link(self, link: PeerLink) -> None:
        with structlog.contextvars.bound_contextvars(peer_domain=link.domain,
                                                     peer=f"{link.host}:{link.port}"):
            while True:
                await self._run_link(link)
                link.failures += 1
                delay = min(link.backoff_max, link.backoff * 2 ** (link.failures - 1))
                log.info("peer link retry", attempt=link.failures, delay=delay,
                         error=link.last_error)
                link._touch()
                await asyncio.sleep(delay)

    async def _run_link(self, link: PeerLink) -> None:
        """One connection of the link, from dialling until its transport is gone."""
        loop = asyncio.get_running_loop()

        def session_of_link() -> _Session:  # in this task's context: peer_domain is bound
            return _Session(self, next(self._numbers),
                            BeepConnection(Role.INITIATOR, self.config, [APEX_PROFILE]), link)
        try:
            _, session = await asyncio.wait_for(
                loop.create_connection(session_of_link, link.host, link.port),
                self.greeting_timeout)
        except (OSError, TimeoutError) as exc:
            link.last_error = f"connect: {type(exc).__name__}: {exc}"
            return
        # A peer that greets but never answers our start must not hold the link forever.
        watchdog = loop.call_later(2 * self.greeting_timeout,
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
            session.context.run(self._drop, session)
            if link.ref is not None:
                link.ref = None
                if link.last_error == "stopped":
                    log.info("peer link stopped")
                else:
                    log.warning("peer link down", error=link.last_error)
            link._touch()

    def _link_greeted(self, session: _Session, event: GreetingReceived) -> None:
        link = session.link
        assert link is not None
        if APEX_PROFILE not in event.profiles:
            link.last_error = "the peer does not offer APEX"
            session.transport.close()
            return
        bind = encode_xml(Bind(self.relay.domain, 1))
        session.conn.start_channel([Profile(APEX_PROFILE, bind)])

    def _link_started(self, session: _Session,
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
        self.relay.add_route(link.domain, link.ref)
        link.failures, link.last_error = 0, ""
        log.info("peer link up", channel=event.channel)
        link._touch()
    # --- tuning: TLS and SASL (RFC 3080 §3, §4) -------------------------------------------

    def _init_security(self, tls: ssl.SSLContext | None, require_tls: bool,
                       sasl: Verifier | None, require_auth: bool) -> None:
        self.tls = tls
        #: What every session offers and demands; see `adapters.beep.TuningPolicy`.
        self.tuning = TuningPolicy(tls=tls is not None, require_tls=require_tls, users=sasl,
                                   require_auth=require_auth)
        self._tunings: dict[int, Tuning] = {}
        if sasl is not None:
            # The relay's attach policy, narrowed to the session's identity (RFC 3340 §4.5.1).
            self._attach_policy = self.relay.may_attach
            self.relay.may_attach = self._may_attach

    def _may_attach(self, ref: ChannelRef, endpoint: Endpoint) -> bool:
        tuning = self._tunings.get(ref.session)
        identity = None if tuning is None or tuning.mechanism == "ANONYMOUS" \
            else tuning.identity
        if identity is None:
            return not self.tuning.require_auth and self._attach_policy(ref, endpoint)
        try:
            own = Endpoint.parse(identity if "@" in identity
                                 else f"{identity}@{self.relay.domain}")
        except InvalidParameter:
            return False  # a user name no endpoint can carry attaches as nothing
        # "fred" may attach as fred@D and, by the subaddress convention, fred/appl=wb@D.
        return endpoint.base == own.base and self._attach_policy(ref, endpoint)

    def _tuned(self, session: _Session, data: bytes) -> Iterator[BeepEvent]:
        """The session's events with the tuning ones handled. A generator, so that a TLS
        `ready` is answered only after the events before it were (RFC 3080 §3.1.3.1).
        Our own peer links (initiator sessions) are not tuned: their events pass through."""
        tuning = self._tunings.get(session.number)
        if tuning is None:
            yield from session.conn.receive_data(data)
            return
        for event in tuning.receive_data(data):
            if isinstance(event, TlsRequested):
                if tuning.accept_tls(event.channel):
                    # Every channel closes with the transport (§3.1.3.2); from here no
                    # delivery may reach this session until it has greeted again.
                    for channel in session.channels:
                        self.relay.channel_closed(ChannelRef(session.number, channel))
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

    def _secure(self, session: _Session) -> bool:
        """If `proceed` went out, hand the transport to TLS (reads wait in `early` meanwhile);
        False ends the session (the peer spoke before the handshake)."""
        tuning = self._tunings.get(session.number)
        if tuning is None or not tuning.must_begin_tls:
            return True
        self._flush(session)  # the proceed, before the handshake
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

    async def _handshake(self, session: _Session, tuning: Tuning) -> None:
        assert self.tls is not None
        try:
            transport = await asyncio.get_running_loop().start_tls(
                session.transport, session, self.tls, server_side=True,
                ssl_handshake_timeout=self.greeting_timeout)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            # RFC 3080 §3 recommends "a diagnostic entry be logged".
            log.warning("tls negotiation failed", error=str(exc) or type(exc).__name__)
            session.handshake = None
            session.context.run(self._drop, session)
            return
        assert transport is not None
        session.transport = transport
        session.handshake = None
        session.context.run(self._secured, session, tuning)

    def _secured(self, session: _Session, tuning: Tuning) -> None:
        tuning.tls_established()
        cipher = session.transport.get_extra_info("cipher")
        log.info("tls established", cipher=cipher[0] if cipher else None)
        self._flush(session)
        self._await_greeting(session)  # the greetings start over
        early, session.early = session.early or [], None
        for data in early:
            self.received(session, data)

    # --- replies to what we deliver (RFC 3342 dataTiming, hold4Endpoint) ------------------

    def _watch(self, key: tuple[int, int, int], watch: Watch) -> None:
        watched = _Watched(key, watch)
        loop = asyncio.get_running_loop()
        if watch.deadline is not None:
            watched.timers.append(loop.call_later(watch.deadline, self._timed_out, watched))
        if watch.report_after is not None:
            watched.timers.append(loop.call_later(watch.report_after, self._late, watched))
        self._watched[key] = watched

    def _replied(self, session: _Session, event: ReplyReceived | ErrorReplyReceived) -> None:
        watched = self._watched.pop((session.number, event.channel, event.msgno), None)
        if watched is None or not watched.finish():
            return
        watch, holds = watched.watch, self.relay.holds
        if isinstance(event, ErrorReplyReceived):
            if watch.hold_id is not None:
                self.relay.requeue_held(watch.hold_id, redeliver=False)
                self._arm_holds()
            return
        if watch.hold_id is not None and holds is not None:
            holds.release(watch.hold_id)
        if watch.on_ok is not None:
            self.send(watch.on_ok)

    def _timed_out(self, watched: _Watched) -> None:
        """No `ok` within noLaterThan: the delivery failed (RFC 3342 §2.1)."""
        self._watched.pop(watched.key, None)
        if not watched.finish():
            return
        watch, holds = watched.watch, self.relay.holds
        log.info("delivery timed out", hold_id=watch.hold_id)
        if watch.hold_id is not None and holds is not None:
            holds.release(watch.hold_id)
        if watch.on_timeout is not None:
            self.send(watch.on_timeout)

    def _late(self, watched: _Watched) -> None:
        """No `ok` within reportAfter: say so, keep waiting (RFC 3342 §2.2)."""
        if not watched.done and watched.watch.on_late is not None:
            self.send(watched.watch.on_late)

    def _undelivered(self, delivery: Delivery) -> None:
        watch = delivery.watch
        if watch is not None and watch.hold_id is not None:
            self.relay.requeue_held(watch.hold_id, redeliver=False)

    def _session_unwatched(self, number: int) -> None:
        """A session ended before replying: its held data waits again (or goes to a newer
        attachment); a watch with a deadline keeps its timers (no `ok` can come now, so the
        deadline will pass and report), the others are dropped."""
        for key in [k for k in self._watched if k[0] == number]:
            watched = self._watched[key]
            if watched.watch.hold_id is not None:
                del self._watched[key]
                if watched.finish():
                    self._deliver(self.relay.requeue_held(watched.watch.hold_id))
            elif watched.watch.deadline is None:
                del self._watched[key]
                watched.finish()
        self._arm_holds()

    def _stop_watching(self) -> None:
        for watched in self._watched.values():
            watched.finish()
        self._watched.clear()
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = self._hold_due = None

    def _arm_holds(self) -> None:
        """Keep one timer set for the earliest deadline or report time among held data."""
        holds = self.relay.holds
        due = None if holds is None or self._closed else holds.next_due()
        if due is None or (self._hold_due is not None and self._hold_due <= due):
            return
        if self._hold_timer is not None:
            self._hold_timer.cancel()
        delay = max(0.0, due / 1000 - self.relay.clock())
        self._hold_timer = asyncio.get_running_loop().call_later(delay, self._holds_due)
        self._hold_due = due

    def _holds_due(self) -> None:
        self._hold_timer = self._hold_due = None
        self._deliver(self.relay.expire_held())
        self._arm_holds()
