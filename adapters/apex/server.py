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

Session release (RFC 3080 §2.4, RFC 3081 §2): once we answer the peer's `<close number='0'>`
with `ok` the session is dropped at once, so the transport closes as soon as the ok is written:
the peer that sends the ok "immediately issues the TCP CLOSE call".

The events of one read are handled after the BEEP core has decoded all of it, so a MSG may come
before a poorly-formed frame that has already ended the session (RFC 3080 §2.2.1.1: terminated
without a reply). The MSG is handled as it would have been had the bytes come in two reads; its
reply is dropped quietly (`_reply`), and the violation is the one line the log gets for it.

The rest lives in modules of its own, each holding one concern's state and reporting back:
`_server_session` (the transport's protocol object), `_peer_links` (relay-relay links, RFC
3340 §4.4.2: `connect_peer`), `_security` (the TLS and SASL tuning glue, RFC 3080 §3-4) and
`_watches` (RFC 3342's timers for replies to watched deliveries and for held data). What they
need of the session loop is public here: `new_session`, `flush`, `drop`, `await_greeting`,
`received`, `send`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import ssl
from collections import deque
from collections.abc import Callable, Mapping, Sequence

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
    MessageRefused,
    Profile,
    ProtocolViolation,
    ReplyReceived,
    Role,
    SessionClosed,
    Verifier,
)
from adapters.beep import Event as BeepEvent
from common.errors import ApexpsError, ReplyCode

from ._peer_links import DEFAULT_PEER_BACKOFF, DEFAULT_PEER_BACKOFF_MAX, PeerLink, PeerLinks
from ._receipts import Receipts
from ._security import SessionSecurity
from ._server_session import AwaitedReply
from ._server_session import ServerSession as _Session
from ._watches import Watches
from .codec import (
    APEX_PROFILE,
    BEEP_XML,
    Data,
    Error,
    Ok,
    Operation,
    decode,
    encode,
    encode_xml,
)
from .endpoint import Endpoint
from .relay import ChannelRef, Delivery, Outcome, Relay

__all__ = [
    "DEFAULT_GREETING_TIMEOUT",
    "DEFAULT_MAX_OUTBOUND",
    "DEFAULT_PEER_BACKOFF",
    "DEFAULT_PEER_BACKOFF_MAX",
    "READ_SIZE",
    "SERVER_MAX_PENDING",
    "ApexServer",
    "PeerLink",
]

log = structlog.get_logger(__name__)

#: The receive window each APEX channel advertises (RFC 3081 §3.1: 4096 until the first SEQ).
#: We consume what arrives at once (it is parsed as it comes), so the window buffers nothing;
#: at 4096 a subscriber could have only about five 512-octet deliveries in flight, and the
#: fan-out stalled on SEQ round trips (measured: ~600 deliveries/s to 10 subscribers). A
#: publication of 512 octets is a MSG of about 1,200 (MIME and XML around it): 1 MiB lets a
#: publisher's 256 in flight (and a burst of deliveries as large) go out without a SEQ wait.
APEX_WINDOW = 1024 * 1024
#: MSGs one APEX channel may have pending (received, not yet answered) before we end the
#: session (BEEP's default is 64). A publication is answered once it is durable, so a client
#: that pipelines has its whole window pending: the client library's default is 288
#: (adapters/client/client.py MAX_IN_FLIGHT); this leaves other clients room above it.
SERVER_MAX_PENDING = 1024
#: `encode(Ok())`'s body, which answers nearly every data.
_PLAIN_OK = encode(Ok())[1]

#: Seconds a new connection has to send its BEEP greeting before we hang up.
DEFAULT_GREETING_TIMEOUT = 10.0
#: Unsent octets one connection may pile up (two BEEP maximum messages) before it is dropped.
DEFAULT_MAX_OUTBOUND = 8 * 1024 * 1024
#: The most one read hands over: asyncio's and uvloop's transports read at most 256 KiB at a
#: time (the BEEP decoder bounds what it keeps of that).
READ_SIZE = 256 * 1024


class ApexServer:
    """Serve `relay` over BEEP on `host:port` (port 0: any free port; see `.port`)."""

    def __init__(self, relay: Relay, host: str = "127.0.0.1", port: int = 0, *,
                 config: BeepConfig | None = None,
                 greeting_timeout: float = DEFAULT_GREETING_TIMEOUT,
                 max_outbound: int = DEFAULT_MAX_OUTBOUND,
                 tls: ssl.SSLContext | None = None, require_tls: bool = False,
                 sasl: Verifier | None = None, require_auth: bool = False,
                 answered: Callable[[object], None] | None = None) -> None:
        """`answered(tag)`: told when a recipient answers `ok` to data `send` tagged for it."""
        self.relay, self.host, self.port = relay, host, port
        self.config = config or BeepConfig(window_size=APEX_WINDOW,
                                           max_pending_messages=SERVER_MAX_PENDING)
        self.greeting_timeout, self.max_outbound = greeting_timeout, max_outbound
        self._sessions: dict[int, _Session] = {}
        self._numbers = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._links = PeerLinks(self)
        self._security = SessionSecurity(self, tls, require_tls, sasl, require_auth)
        #: the TLS context and what every session offers and demands (`TuningPolicy`)
        self.tls, self.tuning = tls, self._security.policy
        self._watches = Watches(relay, self.send, self._deliver)
        self._receipts = Receipts(answered) if answered is not None else None
        #: each accepted connection's `ended`, until its transport is gone
        self._serving: set[asyncio.Future[None]] = set()
        #: sessions with deliveries queued but not yet written (see `_deliver`)
        self._unflushed: dict[int, _Session] = {}
        self._flush_soon = False
        #: (session number, channel) -> its session, for channels with replies now due
        self._due: dict[tuple[int, int], _Session] = {}

    async def start(self) -> None:
        self._server = await asyncio.get_running_loop().create_server(
            self._accepted, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("apex server listening", host=self.host, port=self.port)
        self._watches.arm_holds()  # held data from before a restart has deadlines too

    async def close(self) -> None:
        self._watches.closing()  # sessions still winding down must not set new hold timers
        await self._links.stop()
        self._watches.stop()
        if self._server is not None:
            self._server.close()
            for session in list(self._sessions.values()):
                session.context.run(self.drop, session)
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

    def new_session(self, role: Role, link: PeerLink | None = None) -> _Session:
        """A session of ours, accepted (`Role.LISTENER`) or dialled for `link`."""
        return _Session(self, next(self._numbers),
                        BeepConnection(role, self.config, [APEX_PROFILE]), link)

    def _accepted(self) -> _Session:
        session = self.new_session(Role.LISTENER)
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
            log.info("connection opened")
            self._security.greet(session)
        else:
            log.info("peer link connected")
            session.conn.send_greeting()
        self.flush(session)
        self.await_greeting(session)

    def received(self, session: _Session, data: bytes) -> None:
        """One read (`b""`: end-of-file): handle the events it completes, write what they
        queued, and end the session or hand it to TLS when they say so."""
        if session.dropped:
            return
        if session.early is not None:  # the TLS handshake is under way
            session.early.append(data)
            return
        if self._events(session, data) or not data or not self._security.secure(session):
            self.drop(session)
            return
        self.flush(session)

    def lost(self, session: _Session, exc: Exception | None) -> None:
        if exc is not None and session.lost_reason is None:
            session.lost_reason = type(exc).__name__
            log.info("connection lost", reason=session.lost_reason)
        self.drop(session)

    def drop(self, session: _Session) -> None:
        """Let go of the session: close its transport (after what it holds is written), and
        forget its channels, watches and pending replies. Once; later calls do nothing."""
        if session.dropped:
            return
        session.dropped = True
        self.flush(session)
        session.transport.close()
        if session.greeting_timer is not None:
            session.greeting_timer.cancel()
        if session.handshake is not None:
            session.handshake.cancel()
        session.waiting.clear()  # their services finish; nobody is left to answer
        for channel in session.channels:
            self.relay.channel_closed(ChannelRef(session.number, channel))
        self._watches.session_ended(session.number)
        if self._receipts is not None:
            self._receipts.session_ended(session.number)
        del self._sessions[session.number]
        self._security.forget(session)
        if session.link is None:
            structlog.contextvars.unbind_contextvars("channel")
            session.bound_channel = None
            log.info("connection closed", peer=session.peer)

    def await_greeting(self, session: _Session) -> None:
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
            self.drop(session)

    def _events(self, session: _Session, data: bytes) -> bool:
        """Handle the events `data` completes; True once the session is over."""
        for event in self._security.tuned(session, data):
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
            self.flush(session)
            return True
        if isinstance(event, ProtocolViolation):
            log.warning("protocol violation", code=event.code, text=event.text,
                        violation_channel=event.channel, terminate=event.terminate)
            if event.terminate:
                return True
        elif isinstance(event, MessageRefused):
            # Answered already (ERR 554) by the BEEP layer; the session and channel go on.
            log.warning("message refused", code=event.code, refused_channel=event.channel,
                        msgno=event.msgno, size=event.size, limit=event.limit)
        elif isinstance(event, GreetingReceived) and session.link is not None:
            self._links.greeted(session, event)
        elif isinstance(event, ChannelStarted | ChannelStartRefused) and session.link:
            self._links.started(session, event)
        elif isinstance(event, ChannelStartRequested):
            self._start(session, event)
        elif isinstance(event, CloseRequested):
            return self._close(session, event)
        elif isinstance(event, ErrorReplyReceived):
            log.info("delivery refused", channel=event.channel,
                     body=event.body[:200].decode("utf-8", "replace"))
            self._watches.replied(session.number, event)
            if self._receipts is not None:
                self._receipts.replied(session.number, event.channel, event.msgno, ok=False)
        elif isinstance(event, ReplyReceived):
            self._watches.replied(session.number, event)
            if self._receipts is not None:
                self._receipts.replied(session.number, event.channel, event.msgno, ok=True)
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
        """`awaited`'s services are done. If it heads its channel's queue, the channel has
        replies due: they are sent by `_send_due`, once per channel for all that settled in
        this pass (a journal batch settles its publications together, adapters/apex/
        ticket.py), in the order of the MSGs (ours may wait for earlier ones; later ones may
        wait for ours). Callbacks, not a task per MSG: a publication's task, gather and log
        binding cost more than the rest of its reply, and a chain of tasks would put each reply
        in an event-loop turn, and a write, of its own."""
        if session.dropped:
            return
        awaited.outcome = outcome
        channel = awaited.event.channel
        queue = session.waiting.get(channel)
        if not queue or queue[0] is not awaited:
            return  # an earlier MSG's reply is still out: its settling sends ours
        if not self._due:
            asyncio.get_running_loop().call_soon(self._send_due)
        self._due[(session.number, channel)] = session

    def _send_due(self) -> None:
        """Send the replies now due on each channel `_settled` marked, with one log binding
        per channel (binding it per reply was 5% of a publication's broker time, W1 py-spy);
        the channel's queue keeps the MSGs' order while they wait."""
        due, self._due = self._due, {}
        for (_, channel), session in due.items():
            if session.dropped:
                continue
            queue = session.waiting.get(channel)
            if not queue:
                continue
            with structlog.contextvars.bound_contextvars(peer=session.peer, channel=channel):
                self._drain(session, channel, queue, log.bind())
            # The replies of one journal batch leave in one write, not one each (a loopback
            # write that wakes its reader cost 15 µs of CPU against 2 back to back, measured).
            self._flush_later(session)

    def _drain(self, session: _Session, channel: int, queue: deque[AwaitedReply],
               logger: structlog.typing.FilteringBoundLogger) -> None:
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
                self._complete(session, done.event, done.operation, final, logger)
            except ApexpsError as exc:  # the session ended while the service worked
                log.info("reply dropped", error=str(exc))
            except Exception:  # a bug: the replies behind this one must still go
                log.exception("reply failed")
        if not queue:
            del session.waiting[channel]

    def _complete(self, session: _Session, event: MessageReceived, operation: Operation,
                  outcome: Outcome,
                  logger: structlog.typing.FilteringBoundLogger | None = None) -> None:
        # `log.bind()`: the configured logger itself. `log.info` on the module's lazy proxy
        # looks it up through `__getattr__` every time, which on this once-per-operation line
        # cost a few percent of the operation. Data accepted is traffic, not an event of the
        # session: at a thousand publications a second a line each would drown what an
        # operator looks for, so it goes at debug; refusals and everything else at info.
        # `_drain` binds once for a batch's replies.
        code = outcome.reply.code if isinstance(outcome.reply, Error) else 250
        logger = log.bind() if logger is None else logger
        emit = logger.debug if type(operation) is Data and code == 250 else logger.info
        emit("apex operation", operation=type(operation).__name__.lower(), reply=code,
             deliveries=len(outcome.deliveries))
        self._reply(session, event, outcome.reply)
        self._deliver(outcome.deliveries)
        self._watches.arm_holds()

    def send(self, data: Data, tags: Mapping[Endpoint, object] | None = None) -> None:
        """Route data a service sends on its own (fan-out, notices) to whoever can take it.
        `tags`: per recipient, what `answered` is told once that recipient answers `ok`."""
        self._deliver(tuple(self.relay.route(data)), tags)
        self._watches.arm_holds()

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

    def _deliver(self, deliveries: Sequence[Delivery],
                 tags: Mapping[Endpoint, object] | None = None) -> None:
        for delivery in deliveries:
            target = self._sessions.get(delivery.target.session)
            if target is None or delivery.target.channel not in target.channels:
                self._watches.undelivered(delivery)
                continue
            content_type, body = encode(delivery.operation)
            try:
                msgno = target.conn.send_msg(delivery.target.channel, body, content_type)
            except ApexpsError as exc:  # e.g. the session is closing
                log.info("delivery dropped", error=str(exc))
                self._watches.undelivered(delivery)
                continue
            if delivery.watch is not None:
                self._watches.watch((target.number, delivery.target.channel, msgno), delivery.watch)
            if tags and self._receipts is not None and isinstance(delivery.operation, Data):
                mine = [tags[r] for r in delivery.operation.recipients if r in tags]
                if mine:
                    self._receipts.sent(target.number, delivery.target.channel, msgno, mine)
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
            self.flush(session)

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

    def flush(self, session: _Session) -> None:
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

    # --- relay-relay links (RFC 3340 §4.4.2, §4.5.2; see `_peer_links`) --------------------

    def connect_peer(self, domain: str, host: str, port: int, *,
                     backoff: float = DEFAULT_PEER_BACKOFF,
                     backoff_max: float = DEFAULT_PEER_BACKOFF_MAX) -> PeerLink:
        """Keep a link to the relay serving `domain` at `host:port` until `close()`: bind to it
        as our domain and route `domain`'s data over it. Returns at once; see `PeerLink`."""
        return self._links.connect(domain, host, port, backoff=backoff, backoff_max=backoff_max)
