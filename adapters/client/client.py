"""`ApexClient`: an application attached to an APEX relay (endpoint-relay mode, RFC 3340 §2.1).

The asyncio shell around an INITIATOR `BeepConnection`: each read the transport delivers (through
`ClientWire`, its `asyncio.Protocol`) is turned into events at once, which resolve the future of
each MSG we sent when its RPY/ERR arrives, and each `data` the relay delivers is answered with
`ok` after being queued for `receive()`.

`connect(..., tls=context)` asks for the TLS tuning profile first (RFC 3080 §3.1) and, on
`proceed`, upgrades the same transport with `loop.start_tls` before greeting again;
`sasl=(user, password)` then authenticates with SCRAM-SHA-256 or PLAIN (§4.1) before the APEX
channel starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable

import structlog

from adapters.apex.codec import (
    APEX_PROFILE,
    Attach,
    Bind,
    Data,
    Error,
    Ok,
    Operation,
    Option,
    Terminate,
    decode,
    encode,
    plain_data,
)
from adapters.apex.endpoint import Endpoint
from adapters.apex.server import APEX_WINDOW, READ_SIZE
from adapters.beep import (
    SASL_PROFILE_PREFIX,
    TLS_PROFILE,
    BeepConfig,
    BeepConnection,
    ChannelStarted,
    ChannelStartRefused,
    ErrorReplyReceived,
    Event,
    GreetingReceived,
    LocalProtocolError,
    MessageReceived,
    MessageRefused,
    PlainClient,
    ProtocolViolation,
    ReplyReceived,
    Role,
    SaslAuthenticated,
    SaslFailed,
    ScramClient,
    SessionClosed,
    TlsProceed,
    TlsRefused,
    Tuning,
)
from common.errors import (
    ApexpsError,
    EncryptionRequired,
    MechanismInsufficient,
    NotTaken,
    ParameterSyntaxError,
    ServiceNotAvailable,
)

from ._outlet import DataOutlet
from ._transport import ClientWire, Slots

__all__ = ["DEFAULT_TIMEOUT", "MAX_IN_FLIGHT", "ApexClient"]

log = structlog.get_logger(__name__)

#: Requests one client keeps unanswered at most, by default (`connect(max_in_flight=...)`):
#: a publisher's window of 256 (publisher.DEFAULT_MAX_IN_FLIGHT, the benchmark's) and room for
#: 32 other requests of the same application beside it, so its sends never queue here. It was
#: 32 while relays cut a channel off past BEEP's default of 64 MSGs pending; an APEX relay now
#: takes `SERVER_MAX_PENDING` (adapters/apex/server.py), and a client must stay below that.
MAX_IN_FLIGHT = 256 + 32
#: MSGs the relay may have sent us that we have not answered yet. We answer each data as soon
#: as its frame is parsed, but every MSG that one read completes is parsed before the first
#: answer goes out: a relay's burst (a gap fill, a busy fan-out) completes hundreds in a read,
#: and the BEEP default (64, meant for peers whose answers take a while) ended the session on
#: it. An empty MSG frame is 20 octets, so one read (READ_SIZE at most) completes fewer than this.
CLIENT_MAX_PENDING = READ_SIZE // 16
#: Seconds to wait for the relay's greeting, channel start and each reply.
DEFAULT_TIMEOUT = 30.0
#: Recipient lists one client remembers parsed (a publisher has one, a chat client a few);
#: past this many the memory starts over.
_RECIPIENT_LISTS = 64


class ApexClient:
    """Use `await ApexClient.connect(host, port)`; then `attach`, `send`, `receive`, `close`."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, config: BeepConfig | None = None,
                 *, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        """Prefer `connect`: this makes a client whose transport `connect` then opens."""
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.timeout = timeout
        self._conn = BeepConnection(
            Role.INITIATOR, config or BeepConfig(window_size=APEX_WINDOW,
                                                 max_pending_messages=CLIENT_MAX_PENDING),
            profiles=[])
        self._pending: dict[int, asyncio.Future[Operation]] = {}
        #: (loop time its reply is due by, msgno) of each request, in sending order: one timer
        #: (`_sweep`) watches the oldest rather than one timer per request, which cost a
        #: round trip as much as its BEEP framing
        self._deadlines: deque[tuple[float, int]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        #: a `_flush` is scheduled for the end of this event-loop turn
        self._flush_due = False
        #: requests awaiting their reply at once: pipelining helps, but a relay cuts off a
        #: channel with more MSGs pending than its limit (`SERVER_MAX_PENDING`)
        self.max_in_flight = max_in_flight
        self._in_flight = Slots(max_in_flight)
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._outlet = DataOutlet()
        self._channel = 0
        self._trans_ids = iter(range(1, 2**31))
        self._tuning = Tuning(self._conn)
        self._tls: tuple[ssl.SSLContext, str] | None = None
        self._tls_error: BaseException | None = None
        #: called with each `terminate` the relay sends us (e.g. 556: our endpoint was attached
        #: elsewhere with attachOverride), after it has been answered
        self.on_terminate: Callable[[Terminate], None] | None = None
        self._wire = ClientWire(self._received, self._lost)
        #: the session is over (the transport failed or we gave it up): no more requests
        self._over = False
        #: reads that came during the TLS handshake (None when there is none)
        self._early: list[bytes] | None = None
        self._handshake_task: asyncio.Task[None] | None = None
        #: recipient lists sent to lately, as given and as endpoints (`_parse_recipients`)
        self._recipients: dict[tuple[Endpoint | str, ...], tuple[Endpoint, ...]] = {}

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = DEFAULT_TIMEOUT, *,
                      tls: ssl.SSLContext | None = None,
                      sasl: tuple[str, str] | None = None, mechanism: str = "PLAIN",
                      server_hostname: str | None = None,
                      config: BeepConfig | None = None,
                      max_in_flight: int = MAX_IN_FLIGHT) -> ApexClient:
        """Open the transport, exchange greetings and start an APEX channel.

        Args:
            config: BEEP limits and the receive window (default: `APEX_WINDOW`).
            max_in_flight: requests on the wire awaiting their reply at once; more wait
                (first come, first served). Stay below the relay's limit of MSGs pending on a
                channel (an apexps relay: `SERVER_MAX_PENDING`), or it ends the session.
            tls: negotiate TLS first with this client context (it decides which certificates
                are trusted); `server_hostname` (default `host`) is the name checked.
            sasl: authenticate as (user, password) with `mechanism`: "SCRAM-SHA-256" (never
                sends the password) or "PLAIN" (needs `tls`; relays offer it only under TLS).
        """
        client = cls(timeout, config, max_in_flight=max_in_flight)
        async with asyncio.timeout(timeout):
            await asyncio.get_running_loop().create_connection(lambda: client._wire, host, port)
        try:  # whatever fails (or is cancelled) from here on, the connection must not linger
            client._conn.send_greeting()
            client._flush()
            greeting = await client._expect(GreetingReceived)
            if tls is not None:
                greeting = await client._secure(greeting, tls, server_hostname or host)
            if sasl is not None:
                await client._authenticate(greeting, *sasl, mechanism)
            client._channel = client._conn.start_channel([APEX_PROFILE])
            client._flush()
            started = await client._expect(ChannelStarted, ChannelStartRefused)
            if isinstance(started, ChannelStartRefused):
                raise ApexpsError.for_code(started.code, started.text)
        except BaseException:
            await client._abort()
            raise
        return client

    async def _expect(self, *kinds: type[Event]) -> Event:
        while True:
            async with asyncio.timeout(self.timeout):
                event = await self._events.get()
            if isinstance(event, kinds):
                return event
            if isinstance(event, SessionClosed | ProtocolViolation):
                raise ServiceNotAvailable(f"the relay ended the session ({event})")

    def _flush(self) -> None:
        self._flush_due = False
        data = self._conn.data_to_send()
        if data:
            transport = self._wire.transport
            if not transport.is_closing():  # a scheduled flush may come after close
                transport.write(data)

    def _flush_soon(self) -> None:
        """Write what is queued at the end of this event-loop turn: requests sent together
        (a publisher that does not wait for each reply) leave in one write, not one each."""
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _received(self, data: bytes) -> None:
        """One read (`b""`: end-of-file): dispatch its events, write what they queued."""
        if self._over:
            return
        if self._early is not None:  # the TLS handshake is under way
            self._early.append(data)
            return
        events = self._tuning.receive_data(data)
        for event in events:
            self._dispatch(event)
        self._flush()
        if not data or any(isinstance(e, ProtocolViolation) and e.terminate for e in events):
            self._end()  # the session is dead, so is its transport (§2.2.1.1)
        elif self._tuning.must_begin_tls:
            self._upgrade()

    def _lost(self, exc: Exception | None) -> None:
        self._end()

    def _end(self) -> None:
        """The session is over: close the transport, fail what waits for the relay. Once."""
        if self._over:
            return
        self._over = True
        self._wire.transport.close()
        self._stop_sweeping()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ServiceNotAvailable("connection to the relay lost"))
        self._outlet.put(None)
        self._events.put_nowait(SessionClosed(clean=False))

    def _dispatch(self, event: Event) -> None:
        if type(event) is ReplyReceived or isinstance(event, ReplyReceived | ErrorReplyReceived):
            future = self._pending.pop(event.msgno, None)
            deadlines = self._deadlines
            while deadlines and deadlines[0][1] not in self._pending:
                deadlines.popleft()  # answered: replies come in the order of the requests
            if future is not None and not future.done():
                try:
                    future.set_result(decode(event.content_type, event.body))
                except ApexpsError as exc:
                    future.set_exception(exc)
        elif isinstance(event, MessageReceived):
            self._incoming(event)
        elif isinstance(event, MessageRefused):
            # The relay sent more than our BeepConfig takes; the BEEP layer answered it (554).
            log.warning("message refused", code=event.code, refused_channel=event.channel,
                        msgno=event.msgno, size=event.size, limit=event.limit)
        else:
            self._events.put_nowait(event)

    def _incoming(self, event: MessageReceived) -> None:
        try:
            operation = decode(event.content_type, event.body)
        except ApexpsError as exc:
            reply: Ok | Error = Error.from_exception(exc)
        else:
            reply = Ok()
            if isinstance(operation, Data):
                self._outlet.put(operation)
            elif not isinstance(operation, Terminate):  # a terminate just ends an attachment
                reply = Error(550, "applications accept only data and terminate")
        content_type, body = encode(reply)
        try:
            if isinstance(reply, Error):
                self._conn.send_err(event.channel, event.msgno, body, content_type)
            else:
                self._conn.send_rpy(event.channel, event.msgno, body, content_type)
        except LocalProtocolError:
            # The read that completed this MSG also ended the session (a violation further
            # on): there is no one left to answer, and the rest of the read is still handled.
            return
        if isinstance(operation, Terminate) and self.on_terminate is not None:
            self.on_terminate(operation)

    async def _request(self, operation: Operation) -> None:
        await self._in_flight.take()
        try:
            reply = await self._exchange(operation)
        finally:
            self._in_flight.give_back()
        if isinstance(reply, Error):
            raise reply.exception()
        if not isinstance(reply, Ok):
            raise NotTaken(f"the relay answered with <{type(reply).__name__.lower()}>")

    async def _exchange(self, operation: Operation) -> Operation:
        if self._over:  # nobody would ever resolve the reply's future
            raise ServiceNotAvailable("connection to the relay lost")
        content_type, body = encode(operation)
        msgno = self._conn.send_msg(self._channel, body, content_type)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Operation] = loop.create_future()
        self._pending[msgno] = future
        self._deadlines.append((loop.time() + self.timeout, msgno))
        if self._sweeper is None:
            self._sweeper = loop.call_later(self.timeout, self._sweep)
        self._flush_soon()
        if self._wire.paused:
            await self._wire.writable()
        return await future

    def _stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def _sweep(self) -> None:
        """Fail the requests whose reply is overdue; wake again when the next one is due."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now, deadlines = loop.time(), self._deadlines
        while deadlines and deadlines[0][0] <= now:
            future = self._pending.get(deadlines.popleft()[1])
            if future is not None and not future.done():
                future.set_exception(TimeoutError(
                    f"no reply from the relay within {self.timeout:g} s"))
        if deadlines:
            self._sweeper = loop.call_later(deadlines[0][0] - now, self._sweep)

    async def attach(self, endpoint: Endpoint | str, *, options: Iterable[Option] = (),
                     trans_id: int | None = None) -> int:
        """Attach as `endpoint` (with `options`, e.g. RFC 3342's attachOverride); return the
        transaction-identifier (for `terminate`). `trans_id` defaults to the next unused one
        (a reconnecting client passes the one it used before, so callers' handles stay valid).
        """
        trans_id = next(self._trans_ids) if trans_id is None else trans_id
        target = Endpoint.parse(endpoint) if isinstance(endpoint, str) else endpoint
        await self._request(Attach(target, trans_id, tuple(options)))
        return trans_id

    async def bind(self, domain: str, trans_id: int | None = None) -> int:
        """Bind as the relay of `domain` (RFC 3340 §4.4.2); return the transaction-identifier.

        For tools and tests that play a relay: apexps relays link with
        `ApexServer.connect_peer`. `trans_id` defaults to the next unused one."""
        chosen = next(self._trans_ids) if trans_id is None else trans_id
        await self._request(Bind(domain, chosen))
        return chosen

    async def terminate(self, trans_id: int = 0) -> None:
        """Release one attachment (0: all of them)."""
        await self._request(Terminate(trans_id))

    async def send(self, originator: Endpoint | str, recipients: Iterable[Endpoint | str],
                   content: bytes, content_type: str = "application/octet-stream", *,
                   options: Iterable[Option] = ()) -> None:
        """Send data (with per-data `options`, e.g. RFC 3342's dataTiming); raise the
        `ApexpsError` of the relay's error reply, if any."""
        sender = Endpoint.parse(originator) if isinstance(originator, str) else originator
        to = self._parse_recipients(recipients)
        if options:
            data = Data(sender, to, content, content_type, tuple(options))
        elif to:
            data = plain_data(sender, to, content, content_type)
        else:
            raise ParameterSyntaxError("a data element needs one or more recipients")
        await self._request(data)

    def _parse_recipients(self, recipients: Iterable[Endpoint | str]) -> tuple[Endpoint, ...]:
        """The recipients as endpoints. The same few lists are sent to again and again: the
        tuple is remembered, which also lets `encode` find the parties' XML by identity."""
        key = recipients if type(recipients) is tuple else tuple(recipients)
        parsed = self._recipients.get(key)
        if parsed is None:
            parsed = tuple(Endpoint.parse(r) if isinstance(r, str) else r for r in key)
            if len(self._recipients) >= _RECIPIENT_LISTS:
                self._recipients.clear()
            self._recipients[key] = parsed
        return parsed

    def deliver_to(self, callback: Callable[[Data | None], None]) -> None:
        """From now on hand each data the relay delivers to `callback`, in the read loop, and
        None once the connection has ended, instead of queueing them for `receive()` (which
        then waits for nothing). What is queued already goes to it first. For a consumer that
        routes each data at once (`PubsubClient`): it saves a task switch per data. The
        callback must not block."""
        self._outlet.deliver_to(callback)

    def receive(self) -> AsyncIterator[Data]:
        """The data the relay delivers to us, until the connection ends."""
        return self._outlet.receive()

    async def close(self) -> None:
        """Release the session (best effort) and close the transport."""
        with contextlib.suppress(ApexpsError, ConnectionError, TimeoutError):
            # `number='0'` spelled out: beepcore-java refuses the implied form with 501.
            self._conn.close_session(explicit_number=True)
            self._flush()
            async with asyncio.timeout(self.timeout):
                await self._expect(SessionClosed)
        await self._abort()

    async def _abort(self) -> None:
        """Drop the connection, whatever state it is in; return once the transport is gone
        (or, if it cannot write what it holds within `timeout`, cut off)."""
        self._end()
        if self._handshake_task is not None:
            self._handshake_task.cancel()
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.shield(self._wire.closed)
        except TimeoutError:
            self._wire.transport.abort()

    # --- tuning: TLS and SASL (RFC 3080 §3, §4) -------------------------------------------

    async def _secure(self, greeting: Event, context: ssl.SSLContext,
                      server_hostname: str) -> Event:
        assert isinstance(greeting, GreetingReceived)
        if TLS_PROFILE not in greeting.profiles:
            raise NotTaken("the relay does not offer TLS (its greeting lacks"
                           f" {TLS_PROFILE})")
        self._tls = (context, server_hostname)
        self._tuning.start_tls()
        self._flush()
        answer = await self._expect(TlsProceed, TlsRefused)
        if isinstance(answer, TlsRefused):
            raise ApexpsError.for_code(answer.code, f"TLS refused: {answer.text}")
        try:
            return await self._expect(GreetingReceived)  # the read loop did the handshake
        except ServiceNotAvailable:
            if self._tls_error is None:
                raise
            raise ServiceNotAvailable(
                f"TLS handshake with {server_hostname} failed: {self._tls_error}") from None

    def _upgrade(self) -> None:
        """After `proceed`: hand the transport to TLS (reads wait in `_early` meanwhile) and
        greet again once the handshake is done."""
        if self._tuning.begin_tls():
            self._tls_error = NotTaken("the relay spoke before the TLS handshake")
            self._end()
            return
        # Nothing may be read as plain text from here on: `start_tls` resumes reading once
        # its TLS protocol has the transport.
        self._wire.transport.pause_reading()
        self._early = []
        self._handshake_task = asyncio.create_task(self._handshake())

    async def _handshake(self) -> None:
        assert self._tls is not None
        context, hostname = self._tls
        try:
            transport = await asyncio.get_running_loop().start_tls(
                self._wire.transport, self._wire, context, server_hostname=hostname,
                ssl_handshake_timeout=self.timeout)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            self._tls_error = exc
            self._end()
            return
        assert transport is not None
        self._wire.transport = transport
        self._tuning.tls_established()
        self._flush()
        early, self._early = self._early or [], None
        for data in early:
            self._received(data)

    async def _authenticate(self, greeting: Event, user: str, password: str,
                            mechanism: str) -> None:
        assert isinstance(greeting, GreetingReceived)
        offered = [p.removeprefix(SASL_PROFILE_PREFIX) for p in greeting.profiles
                   if p.startswith(SASL_PROFILE_PREFIX)]
        if mechanism not in offered:
            if mechanism == "PLAIN" and not self._tuning.secured:
                raise EncryptionRequired("relays offer SASL PLAIN only over TLS: connect with"
                                         " tls=..., or use mechanism='SCRAM-SHA-256'")
            raise MechanismInsufficient(f"the relay does not offer SASL {mechanism}"
                                        f" (it offers: {', '.join(offered) or 'none'})")
        if mechanism == "PLAIN":
            client: ScramClient | PlainClient = PlainClient(user, password)
        elif mechanism == "SCRAM-SHA-256":
            client = ScramClient(user, password)
        else:
            raise MechanismInsufficient(f"this client speaks PLAIN and SCRAM-SHA-256, not"
                                        f" {mechanism}")
        self._tuning.authenticate(client)
        self._flush()
        outcome = await self._expect(SaslAuthenticated, SaslFailed)
        if isinstance(outcome, SaslFailed):
            raise ApexpsError.for_code(outcome.code, outcome.text)

