"""`Tuning`: the TLS and SASL tuning profiles (RFC 3080 §3, §4) over a `BeepConnection`.

Theory of operation
-------------------
`Tuning` composes a connection the way wsproto's handshake composes h11: the shell feeds bytes to
`Tuning.receive_data()` (or the connection's events to `process()`), and gets back the
connection's events minus everything about tuning channels, plus a few tuning events
(`TlsRequested`, `TlsProceed`, `TlsRefused`, `SaslAuthenticated`, `SaslFailed`). Channel starts
for the tuning profiles, the `ready`/`proceed` and `blob` exchanges, and closes of tuning channels
are answered here, through the connection's ordinary commands. Nothing here does I/O: the TLS
handshake itself is the shell's (see `TlsRequested` and `TlsProceed` for its three calls).

The listener judges every start against its `TuningPolicy` (`_judge`) -- the TLS profile, a SASL
mechanism, or an application profile gated by `require_tls` / `require_auth` -- and its greeting
changes with the state: only TLS before TLS when TLS is required; PLAIN only after TLS, since it
sends the password in the clear. The initiator drives `start_tls()` and `authenticate()`.

Replies, by RFC 3080's book: a request the listener will not serve at all is refused at channel
creation with an `error` (550 not offered or not now, 538 PLAIN without TLS, 530 an application
profile before authentication, 454 too many failures); an encapsulated operation that fails once
the channel exists is answered inside the `profile` or with ERR, as §3.1.1 and §4.1.1 show (501
for a malformed element, 535 for refused credentials, 537 for a foreign authorization identity,
451 for a client abort). A malformed `blob` changes nothing -- the exchange may go on -- while a
well-formed one the mechanism rejects ends the exchange, as SASL has it.

Why one module of this length: the TLS and SASL profiles share the tuning-channel
bookkeeping (one tuning at a time, the channel-zero restarts after it); their XML is in
`_tuning_xml.py`, their states in `_tuning_state.py`, SASL mechanisms in `_sasl.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass

from common.errors import ApexpsError, ConfigError, ReplyCode

from ._config import Role
from ._connection import BeepConnection
from ._errors import LocalProtocolError, RemoteProtocolError
from ._events import (
    ChannelClosed,
    ChannelStarted,
    ChannelStartRefused,
    ChannelStartRequested,
    CloseRequested,
    ErrorReplyReceived,
    Event,
    MessageReceived,
    ProtocolViolation,
    ReplyReceived,
    SaslAuthenticated,
    SaslFailed,
    TlsProceed,
    TlsRefused,
    TlsRequested,
)
from ._management import Error, Profile
from ._mime import BEEP_XML, media_type
from ._sasl import (
    AnonymousServer,
    Challenge,
    ClientMechanism,
    PlainServer,
    ServerMechanism,
)
from ._scram import ScramServer, ScramUsers, Verifier, new_nonce, password_verifier
from ._tuning_state import (
    AUTH_TRANSITIONS,
    TLS_TRANSITIONS,
    AuthInput,
    AuthState,
    Machine,
    TlsInput,
    TlsState,
)
from ._tuning_xml import (
    SASL_PROFILE_PREFIX,
    TLS_PROFILE,
    Blob,
    BlobStatus,
    Proceed,
    Ready,
    TuningMessage,
    parse_tuning,
    profile_xml,
    serialize_tuning,
)

__all__ = ["DEFAULT_MAX_AUTH_FAILURES", "MECHANISMS", "Tuning", "TuningPolicy"]

#: Failed SASL exchanges one session may make before further attempts get 454: enough for a
#: typo, too few for guessing passwords (a guesser must reconnect, and shows up in the log).
DEFAULT_MAX_AUTH_FAILURES = 3
#: The SASL mechanisms implemented here.
MECHANISMS = ("SCRAM-SHA-256", "PLAIN", "ANONYMOUS")
_PLAIN = "PLAIN"
_ANONYMOUS = "ANONYMOUS"


@dataclass(frozen=True, slots=True)
class TuningPolicy:
    """What a listener offers and demands.

    Attributes:
        tls: offer the TLS profile (the shell has a server certificate).
        require_tls: offer nothing but TLS until TLS is in effect.
        users: the credentials: `verify(user, password) -> bool` (PLAIN only) or a `ScramUsers`
            directory (SCRAM-SHA-256 and PLAIN).
        mechanisms: SASL mechanisms to offer; None means every one `users` can serve. PLAIN is
            offered only once TLS is in effect.
        require_auth: refuse application profiles (530) until a SASL exchange succeeded.
        max_auth_failures: failed exchanges per session before further attempts get 454.
        nonce: SCRAM server nonces (injectable for tests).
    """

    tls: bool = False
    require_tls: bool = False
    users: Verifier | None = None
    mechanisms: tuple[str, ...] | None = None
    require_auth: bool = False
    max_auth_failures: int = DEFAULT_MAX_AUTH_FAILURES
    nonce: Callable[[], str] = new_nonce

    def __post_init__(self) -> None:
        if self.require_tls and not self.tls:
            raise ConfigError("require_tls needs TLS (a server certificate)")
        for name in self.offered:
            if name not in MECHANISMS:
                raise ConfigError(f"SASL mechanism {name!r} is not implemented")
            if name == "SCRAM-SHA-256" and not isinstance(self.users, ScramUsers):
                raise ConfigError("SCRAM-SHA-256 needs a ScramUsers directory")
            if name == _PLAIN and self.users is None:
                raise ConfigError("PLAIN needs a password verifier")
        if self.require_auth and not set(self.offered) - {_ANONYMOUS}:
            raise ConfigError("require_auth needs a SASL mechanism that names a user")
        if self.max_auth_failures < 1:
            raise ConfigError("max_auth_failures must be positive")

    @property
    def offered(self) -> tuple[str, ...]:
        if self.mechanisms is not None:
            return self.mechanisms
        if self.users is None:
            return ()
        return ("SCRAM-SHA-256", _PLAIN) if isinstance(self.users, ScramUsers) else (_PLAIN,)

    def server_mechanism(self, name: str) -> ServerMechanism:
        if name == _ANONYMOUS:
            return AnonymousServer()
        assert self.users is not None  # __post_init__
        if name == _PLAIN:
            return PlainServer(password_verifier(self.users))
        assert isinstance(self.users, ScramUsers)
        return ScramServer(self.users.scram_credentials, self.nonce)


@dataclass(frozen=True, slots=True)
class _Serving:
    """The listener's exchange in progress."""

    channel: int
    mechanism: ServerMechanism


@dataclass(frozen=True, slots=True)
class _Asking:
    """The initiator's exchange in progress."""

    channel: int
    mechanism: ClientMechanism


def _mechanism_of(uri: str) -> str | None:
    return uri[len(SASL_PROFILE_PREFIX):] if uri.startswith(SASL_PROFILE_PREFIX) else None


def _is_tuning(uri: str) -> bool:
    return uri == TLS_PROFILE or uri.startswith(SASL_PROFILE_PREFIX)


def _xml(message: TuningMessage) -> str:
    return serialize_tuning(message).decode("utf-8")


def _error(exc: ApexpsError) -> Error:
    return Error(int(exc.code), str(exc)[:300].replace("\x00", ""))


class Tuning:
    """The tuning profiles of one session, over `conn` (either role).

    Args:
        conn: the session. Its `profiles` are the application profiles; a listener's become
            those plus the tuning profiles the policy may accept.
        policy: what a listener offers and demands (an initiator ignores it).
    """

    def __init__(self, conn: BeepConnection, policy: TuningPolicy | None = None) -> None:
        self.conn = conn
        self.policy = policy or TuningPolicy()
        self._app = tuple(p for p in conn.profiles if not _is_tuning(p))
        self._tls = Machine(TLS_TRANSITIONS, TlsState.PLAIN)
        self._auth = Machine(AUTH_TRANSITIONS, AuthState.NONE)
        #: Open (or, for the initiator, starting) tuning channels and their profile URIs.
        self._channels: dict[int, str] = {}
        #: Listener: the `ready` awaiting `accept_tls()`: (channel, msgno; None if piggybacked).
        self._ready: tuple[int, int | None] | None = None
        self._exchange: _Serving | _Asking | None = None
        #: The authenticated identity, once a SASL exchange succeeded.
        self.identity: str | None = None
        #: The SASL mechanism that authenticated `identity`.
        self.mechanism: str | None = None
        #: Failed SASL exchanges so far.
        self.failures = 0
        if self.listening and self._app:
            accepted = [SASL_PROFILE_PREFIX + m for m in self.policy.offered]
            self.conn.profiles = (*self._app, *accepted,
                                  *((TLS_PROFILE,) if self.policy.tls else ()))

    # --- observation ----------------------------------------------------------------------

    @property
    def listening(self) -> bool:
        return self.conn.role is Role.LISTENER

    @property
    def tls_state(self) -> TlsState:
        return self._tls.state

    @property
    def auth_state(self) -> AuthState:
        return self._auth.state

    @property
    def secured(self) -> bool:
        return self._tls.state is TlsState.SECURED

    @property
    def must_begin_tls(self) -> bool:
        """`proceed` is out (or in): the shell must write what is queued and `begin_tls()`."""
        return self._tls.state is TlsState.PROCEEDING

    def advertised(self) -> tuple[str, ...]:
        """The profiles a listener's greeting lists now (RFC 3080 §3: greetings may differ
        with privacy)."""
        secured = self.secured
        if self.policy.require_tls and not secured:
            return (TLS_PROFILE,)
        sasl = tuple(SASL_PROFILE_PREFIX + m for m in self.policy.offered
                     if secured or m != _PLAIN)
        tls = (TLS_PROFILE,) if self.policy.tls and not secured else ()
        return (*sasl, *self._app, *tls)

    # --- bytes and events -----------------------------------------------------------------

    def send_greeting(self) -> None:
        """Send our greeting: the listener's lists what it offers now."""
        if self.listening:
            self.conn.send_greeting(self.advertised())
        else:
            self.conn.send_greeting()

    def receive_data(self, data: bytes) -> list[Event]:
        """`conn.receive_data(data)`, with tuning handled; see the module docstring."""
        return self.process(self.conn.receive_data(data))

    def process(self, events: Iterable[Event]) -> list[Event]:
        """Handle the tuning part of the connection's `events`; return the rest, in order,
        with the tuning events among them."""
        out: list[Event] = []
        tuning_channels = self._channels
        for event in events:
            kind = type(event)
            if (kind is MessageReceived or kind is ReplyReceived) and self._ready is None \
                    and event.channel not in tuning_channels:  # type: ignore[attr-defined]
                out.append(event)  # `_on` would pass it on as it is: nearly every event
                continue
            if self._ready is not None:
                # §3.1.3.1: the sender of "ready" "must not send any further traffic on the
                # underlying transport service until a corresponding reply ... is received".
                out.append(ProtocolViolation(
                    int(ReplyCode.SYNTAX_ERROR), "traffic after <ready> before our reply"
                    " (RFC 3080 §3.1.3.1)", True, self._ready[0]))
                return out
            out += self._on(event)
        return out

    def _on(self, event: Event) -> list[Event]:
        if isinstance(event, ChannelStartRequested):
            return self._on_start(event)
        channel = getattr(event, "channel", None)
        if channel is None or channel not in self._channels:
            return [event]
        uri = self._channels[channel]
        if isinstance(event, MessageReceived):
            return self._on_msg(uri, event)
        if isinstance(event, ChannelStarted | ChannelStartRefused | ReplyReceived
                      | ErrorReplyReceived):
            return self._on_answer(uri, event)
        if isinstance(event, CloseRequested):
            return self._on_close(event)
        if isinstance(event, ChannelClosed):
            self._forget(channel)
            return []
        if isinstance(event, ProtocolViolation) and not event.terminate \
                and event.msgno is not None and self.listening:
            # A poorly-formed MSG on a tuning channel is ours to answer (RFC 3080 §2.2.2.1).
            self._send_err(channel, event.msgno, Error(event.code, event.text[:200]))
        return [event]

    # --- listener: channel creation -------------------------------------------------------

    def _judge(self, uri: str) -> tuple[int, str] | None:
        """Why a start of `uri` is refused now, or None if it may go ahead."""
        auth, tls = self._auth.state, self._tls.state
        if uri == TLS_PROFILE:
            if not self.policy.tls:
                return 550, "TLS is not offered"
            if tls is TlsState.SECURED:
                return 550, "TLS is already in effect"
            if auth is AuthState.AUTHENTICATED:
                return 550, "TLS may not begin after SASL succeeded (RFC 3080 §4.1)"
            if auth is AuthState.IN_PROGRESS:
                return 550, "finish or abort the authentication exchange first"
            if tls is not TlsState.PLAIN:
                return 550, "a TLS request is already pending"
            return None
        mechanism = _mechanism_of(uri)
        if mechanism is not None:
            if mechanism not in self.policy.offered:
                return 550, f"SASL mechanism {mechanism[:40]} is not offered"
            if auth is AuthState.AUTHENTICATED:
                return 550, (f"already authenticated as {self.identity}; RFC 3080 §4 allows no"
                             " further attempts")
            if auth is AuthState.IN_PROGRESS:
                return 550, "an authentication exchange is already in progress"
            if self.failures >= self.policy.max_auth_failures:
                return 454, "too many failed authentication attempts; reconnect to try again"
            if mechanism == _PLAIN and tls is not TlsState.SECURED:
                return 538, "PLAIN sends the password in the clear: start TLS first"
            return None
        if self.policy.require_tls and tls is not TlsState.SECURED:
            return 550, f"this listener requires transport security: start {TLS_PROFILE} first"
        if self.policy.require_auth and (auth is not AuthState.AUTHENTICATED
                                         or self.mechanism == _ANONYMOUS):
            return 530, "authentication required: authenticate with SASL first (RFC 3080 §4)"
        return None

    def _on_start(self, event: ChannelStartRequested) -> list[Event]:
        if not self.listening:
            return [event]
        verdicts = [(p, self._judge(p.uri)) for p in event.profiles]
        chosen = next((p for p, why in verdicts if why is None), None)
        if chosen is None:
            code, text = verdicts[0][1] or (550, "")
            self.conn.reject_start(event.channel, code, text)
            return []
        if not _is_tuning(chosen.uri):
            return [ChannelStartRequested(
                event.channel, tuple(p for p, why in verdicts
                                     if why is None and not _is_tuning(p.uri)),
                event.server_name)]
        try:
            xml = profile_xml(chosen)
            message = parse_tuning(xml) if xml.strip() else None
            self._check_request(chosen.uri, message)
        except RemoteProtocolError as exc:
            # §3.1.1: "it is possible for the channel to be created, but for the encapsulated
            # operation to fail": a positive reply carrying the error.
            self._open(event.channel, Profile(chosen.uri, _xml(Error(int(exc.code),
                                                                     exc.message))))
            return [ProtocolViolation(int(exc.code), exc.message, False, event.channel)]
        if chosen.uri == TLS_PROFILE:
            if message is None:
                self._open(event.channel, Profile(TLS_PROFILE))  # the ready comes in a MSG
                return []
            assert isinstance(message, Ready)
            self._tls.process(TlsInput.READY)
            self._ready = (event.channel, None)
            return [TlsRequested(event.channel, message.version)]
        assert message is None or isinstance(message, Blob)
        if message is not None and message.status is BlobStatus.ABORT:
            self._open(event.channel, Profile(chosen.uri, _xml(Error(451, "aborted"))))
            return []
        name = _mechanism_of(chosen.uri)
        assert name is not None
        self._auth.process(AuthInput.START)
        self._exchange = _Serving(event.channel, self.policy.server_mechanism(name))
        reply, events = self._server_step(None if message is None else message.data)
        self._open(event.channel, Profile(chosen.uri, _xml(reply)))
        return events

    @staticmethod
    def _check_request(uri: str, message: TuningMessage | None) -> None:
        if message is None:
            return
        if uri == TLS_PROFILE and not isinstance(message, Ready):
            raise RemoteProtocolError("the TLS profile expects <ready>",
                                      code=ReplyCode.PARAMETER_SYNTAX_ERROR, terminate=False)
        if uri != TLS_PROFILE and not isinstance(message, Blob):
            raise RemoteProtocolError("a SASL profile expects <blob>",
                                      code=ReplyCode.PARAMETER_SYNTAX_ERROR, terminate=False)
        if isinstance(message, Blob) and message.status is BlobStatus.COMPLETE:
            raise RemoteProtocolError("only the server sends status='complete' (RFC 3080"
                                      " §4.1.3)", code=ReplyCode.PARAMETER_SYNTAX_ERROR,
                                      terminate=False)

    def _open(self, channel: int, profile: Profile) -> None:
        self.conn.accept_start(channel, profile)
        self._channels[channel] = profile.uri

    def _server_step(self, response: bytes | None) -> tuple[TuningMessage, list[Event]]:
        exchange = self._exchange
        assert isinstance(exchange, _Serving)
        mechanism = exchange.mechanism
        try:
            outcome = mechanism.step(response)
        except ApexpsError as exc:
            self._auth.process(AuthInput.FAIL)
            self._exchange = None
            self.failures += 1
            return _error(exc), [SaslFailed(exchange.channel, int(exc.code), str(exc),
                                            mechanism.name, mechanism.user)]
        if isinstance(outcome, Challenge):
            return Blob(outcome.data), []
        self._auth.process(AuthInput.SUCCEED)
        self._exchange = None
        self.identity, self.mechanism = outcome.identity, mechanism.name
        return Blob(outcome.data, BlobStatus.COMPLETE), [
            SaslAuthenticated(exchange.channel, outcome.identity, mechanism.name)]

    # --- listener: messages on tuning channels --------------------------------------------

    def _on_msg(self, uri: str, event: MessageReceived) -> list[Event]:
        channel, msgno = event.channel, event.msgno
        if not self.listening:
            self._send_err(channel, msgno, Error(550, "the initiator answers no tuning MSGs"))
            return []
        try:
            if media_type(event.content_type) != BEEP_XML:
                raise RemoteProtocolError(f"tuning messages are {BEEP_XML}", terminate=False)
            message = parse_tuning(event.body)
            self._check_request(uri, message)
        except RemoteProtocolError as exc:
            self._send_err(channel, msgno, Error(int(exc.code), exc.message))
            return [ProtocolViolation(int(exc.code), exc.message, False, channel, msgno)]
        if isinstance(message, Ready):
            refusal = self._judge(TLS_PROFILE)
            if refusal is not None:
                self._send_err(channel, msgno, Error(*refusal))
                return []
            self._tls.process(TlsInput.READY)
            self._ready = (channel, msgno)
            return [TlsRequested(channel, message.version)]
        assert isinstance(message, Blob)
        exchange = self._exchange
        if not isinstance(exchange, _Serving) or exchange.channel != channel:
            self._send_err(channel, msgno, Error(550, "no authentication exchange is in progress"
                                                      " on this channel; start a new one"))
            return []
        if message.status is BlobStatus.ABORT:
            self._auth.process(AuthInput.FAIL)
            self._exchange = None
            self._send_err(channel, msgno, Error(451, "authentication aborted"))
            return [SaslFailed(channel, 451, "aborted by the client", exchange.mechanism.name,
                               exchange.mechanism.user)]
        reply, events = self._server_step(message.data)
        if isinstance(reply, Error):
            self._send_err(channel, msgno, reply)
        else:
            self.conn.send_rpy(channel, msgno, serialize_tuning(reply), BEEP_XML)
        return events

    def _send_err(self, channel: int, msgno: int, error: Error) -> None:
        # Suppressed: e.g. the poorly-formed message was a reply, or the session is ending.
        with suppress(LocalProtocolError):
            self.conn.send_err(channel, msgno, serialize_tuning(error), BEEP_XML)

    def _on_close(self, event: CloseRequested) -> list[Event]:
        try:
            self.conn.accept_close(event.channel)
        except LocalProtocolError as exc:
            self.conn.decline_close(event.channel, 550, exc.message)
            return []
        self._forget(event.channel)
        return []

    def _forget(self, channel: int) -> None:
        self._channels.pop(channel, None)
        if self._exchange is not None and self._exchange.channel == channel:
            self._auth.process(AuthInput.FAIL)  # abandoned: no answer will come
            self._exchange = None

    # --- listener: TLS --------------------------------------------------------------------

    def accept_tls(self, channel: int) -> bool:
        """Answer the peer's `ready` (see `TlsRequested`); return True if `proceed` went out.

        RFC 3080 §3.1.3.1: the receiver of `ready` "must wait until any pending replies have
        been generated and sent". If some are still unanswered or held back by the peer's
        window (which the peer may not reopen now), the request is declined with 450 and the
        peer may try again later.
        """
        if self._ready is None or self._ready[0] != channel:
            raise LocalProtocolError(f"no <ready> awaits an answer on channel {channel}")
        _, msgno = self._ready
        if len(self.conn.unfinished_replies()) > 1:  # one is the ready itself
            self._ready = None
            self._tls.process(TlsInput.REFUSED)
            text = "replies to earlier messages are still pending; try again"
            if msgno is None:
                self.conn.reject_start(channel, 450, text)
            else:
                self._send_err(channel, msgno, Error(450, text))
            return False
        proceed = _xml(Proceed())
        if msgno is None:
            self._open(channel, Profile(TLS_PROFILE, proceed))
        else:
            self.conn.send_rpy(channel, msgno, proceed.encode(), BEEP_XML)
        self._ready = None
        self._tls.process(TlsInput.PROCEED)
        return True

    # --- both roles: the handshake --------------------------------------------------------

    def begin_tls(self) -> bytes:
        """The transport goes to TLS now: every channel closes (RFC 3080 §3.1.3.2). Call it
        after writing `data_to_send()`; returns the undecoded bytes that followed (there should
        be none: the peer may not speak before the handshake)."""
        if not self._tls.allows(TlsInput.RESET):
            raise LocalProtocolError(f"no proceed was exchanged (TLS is {self.tls_state.value})")
        leftover = self.conn.reset_after_tuning()  # raises, changing nothing, if output waits
        self._tls.process(TlsInput.RESET)
        self._channels.clear()
        self._exchange = None
        return leftover

    def tls_established(self) -> None:
        """The handshake succeeded: the session is secured; send our new greeting."""
        self._tls.process(TlsInput.ESTABLISHED)
        self.send_greeting()

    def tls_failed(self) -> None:
        """The handshake failed. RFC 3080 §3 lets the session go on in plain with new
        greetings (sent here) -- if the transport survived, which it seldom does."""
        self._tls.process(TlsInput.FAILED)
        self.send_greeting()

    # --- initiator ------------------------------------------------------------------------

    def start_tls(self) -> int:
        """Ask the listener for transport security; expect `TlsProceed` or `TlsRefused`.
        Until then send nothing (RFC 3080 §3.1.3.1)."""
        self._initiator_check(TLS_PROFILE)
        channel = self.conn.start_channel([Profile(TLS_PROFILE, _xml(Ready()))])
        self._tls.process(TlsInput.READY)
        self._channels[channel] = TLS_PROFILE
        return channel

    def authenticate(self, mechanism: ClientMechanism) -> int:
        """Start a SASL exchange with `mechanism`; expect `SaslAuthenticated` or `SaslFailed`."""
        uri = SASL_PROFILE_PREFIX + mechanism.name
        self._initiator_check(uri)
        initial = mechanism.initial()
        content = "" if initial is None else _xml(Blob(initial))
        channel = self.conn.start_channel([Profile(uri, content)])
        self._auth.process(AuthInput.START)
        self._channels[channel] = uri
        self._exchange = _Asking(channel, mechanism)
        return channel

    def abort_authentication(self) -> None:
        """Abandon the exchange in progress (`<blob status='abort' />`)."""
        exchange = self._exchange
        if not isinstance(exchange, _Asking):
            raise LocalProtocolError("no authentication exchange of ours is in progress")
        if exchange.channel in self.conn.channels:
            self.conn.send_msg(exchange.channel, serialize_tuning(Blob(status=BlobStatus.ABORT)),
                               BEEP_XML)
        self._auth.process(AuthInput.FAIL)
        self._exchange = None

    def _initiator_check(self, uri: str) -> None:
        if self.listening:
            raise LocalProtocolError("only the initiator starts tuning exchanges here")
        if self._auth.state is not AuthState.NONE:
            raise LocalProtocolError(f"authentication is {self._auth.state.value}")
        if uri == TLS_PROFILE and self._tls.state is not TlsState.PLAIN:
            raise LocalProtocolError(f"TLS is {self._tls.state.value}")
        if self._tls.state not in (TlsState.PLAIN, TlsState.SECURED):
            raise LocalProtocolError(f"TLS is {self._tls.state.value}")

    def _on_answer(self, uri: str, event: Event) -> list[Event]:
        assert isinstance(event, ChannelStarted | ChannelStartRefused | ReplyReceived
                          | ErrorReplyReceived)
        channel = event.channel
        if isinstance(event, ChannelStartRefused):
            self._channels.pop(channel, None)
            answer: TuningMessage | None = Error(event.code, event.text)
        else:
            try:
                if isinstance(event, ChannelStarted):
                    xml = profile_xml(event.profile)
                else:
                    xml = event.body
                answer = parse_tuning(xml) if xml.strip() else None
            except RemoteProtocolError as exc:
                answer = Error(int(exc.code), f"unreadable answer: {exc.message}")
        if uri == TLS_PROFILE:
            return self._tls_answer(channel, answer)
        return self._sasl_answer(channel, answer)

    def _tls_answer(self, channel: int, answer: TuningMessage | None) -> list[Event]:
        if self._tls.state is not TlsState.REQUESTED:
            return []  # a late answer on a channel we gave up on
        if answer is None:
            # Created without processing our piggybacked ready: ask again in a MSG.
            self.conn.send_msg(channel, serialize_tuning(Ready()), BEEP_XML)
            return []
        if isinstance(answer, Proceed):
            self._tls.process(TlsInput.PROCEED)
            # After <ready> we may send nothing more (RFC 3080 §3.1.3.1): a window update that
            # receiving the <proceed> itself queued would reach the peer's TLS handshake as
            # garbage, and the reset voids every window anyway.
            self.conn.data_to_send()
            return [TlsProceed(channel)]
        self._tls.process(TlsInput.REFUSED)
        if isinstance(answer, Error):
            return [TlsRefused(channel, answer.code, answer.text)]
        return [TlsRefused(channel, 500, "the listener answered <ready> with neither <proceed>"
                                         " nor <error>")]

    def _sasl_answer(self, channel: int, answer: TuningMessage | None) -> list[Event]:
        exchange = self._exchange
        if not isinstance(exchange, _Asking) or exchange.channel != channel:
            return []  # e.g. the ERR that answers our abort
        client = exchange.mechanism
        try:
            if answer is None:
                # The listener did not process a piggybacked response: send it in a MSG.
                initial = client.initial()
                self._send_blob(channel, Blob(b"" if initial is None else initial))
                return []
            if isinstance(answer, Error):
                return self._client_failed(channel, answer.code, answer.text)
            if not isinstance(answer, Blob) or answer.status is BlobStatus.ABORT:
                raise RemoteProtocolError("the listener answered with neither <blob> nor"
                                          " <error>", terminate=False)
            if answer.status is BlobStatus.COMPLETE:
                client.complete(answer.data)
                self._auth.process(AuthInput.SUCCEED)
                self._exchange = None
                self.identity, self.mechanism = client.identity, client.name
                return [SaslAuthenticated(channel, client.identity, client.name)]
            self._send_blob(channel, Blob(client.step(answer.data)))
            return []
        except ApexpsError as exc:
            if channel in self.conn.channels:
                self._send_blob(channel, Blob(status=BlobStatus.ABORT))
            return self._client_failed(channel, int(exc.code), str(exc))

    def _send_blob(self, channel: int, blob: Blob) -> None:
        self.conn.send_msg(channel, serialize_tuning(blob), BEEP_XML)

    def _client_failed(self, channel: int, code: int, text: str) -> list[Event]:
        exchange = self._exchange
        assert exchange is not None
        self._auth.process(AuthInput.FAIL)
        self._exchange = None
        self.failures += 1
        return [SaslFailed(channel, code, text, exchange.mechanism.name)]
