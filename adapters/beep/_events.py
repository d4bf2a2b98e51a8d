"""Events: what `BeepConnection.receive_data()` reports. Frozen, every field documented.

Everything in __all__ gets re-exported by the package; `message_event()` is the connection's.
Events describe what the *peer* did (or what happened to the session); the application's own
commands produce bytes, not events.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import RemoteProtocolError
from ._frames import FrameType
from ._management import Profile
from ._mime import decode_fields

__all__ = [
    "AnswerReceived",
    "AnswersComplete",
    "ChannelClosed",
    "ChannelStartRefused",
    "ChannelStartRequested",
    "ChannelStarted",
    "CloseRefused",
    "CloseRequested",
    "ErrorReplyReceived",
    "Event",
    "GreetingReceived",
    "GreetingRefused",
    "MessageReceived",
    "MessageRefused",
    "ProtocolViolation",
    "ReplyReceived",
    "SaslAuthenticated",
    "SaslFailed",
    "SessionClosed",
    "TlsProceed",
    "TlsRefused",
    "TlsRequested",
]


class Event:
    """Base class of every event."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class GreetingReceived(Event):
    """The peer's greeting (RFC 3080 §2.3.1.1)."""

    #: URIs of the profiles the peer can serve.
    profiles: tuple[str, ...]
    #: Feature tokens of the channel management profile the peer supports.
    features: tuple[str, ...] = ()
    #: Language tags the peer prefers for diagnostics, most desirable first.
    localize: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GreetingRefused(Event):
    """The listener is unavailable and sent an `error` instead of a greeting (RFC 3080 §2.4).

    The session is over: both peers terminate it.
    """

    #: Reply code, typically 421.
    code: int
    #: Diagnostic text, possibly empty.
    text: str


@dataclass(frozen=True, slots=True)
class ChannelStartRequested(Event):
    """The peer asks to start `channel`; answer with `accept_start()` or `reject_start()`.

    Requests the connection can judge alone (wrong parity, number in use, no acceptable profile,
    too many channels) are refused automatically and never reported.
    """

    #: The channel number the peer proposes.
    channel: int
    #: The proposed profiles, in the peer's order of preference, with initialization content.
    profiles: tuple[Profile, ...]
    #: The `serverName` attribute, if any (RFC 3080 §2.3.1.2).
    server_name: str | None


@dataclass(frozen=True, slots=True)
class ChannelStarted(Event):
    """The peer accepted our `start_channel()`; the channel is open."""

    #: The channel number.
    channel: int
    #: The profile the peer chose, with its initialization content (piggybacked reply), if any.
    profile: Profile


@dataclass(frozen=True, slots=True)
class ChannelStartRefused(Event):
    """The peer declined our `start_channel()` with an `error` element."""

    #: The channel number we proposed (free again).
    channel: int
    #: Reply code (e.g. 550: no requested profile is acceptable).
    code: int
    #: Diagnostic text, possibly empty.
    text: str


@dataclass(frozen=True, slots=True)
class MessageReceived(Event):
    """A complete MSG (all its frames joined); reply with `send_rpy/err/ans/nul`."""

    #: Channel number.
    channel: int
    #: Message number, to quote in the reply.
    msgno: int
    #: The Content-Type header (default application/octet-stream).
    content_type: str
    #: The entity body, headers removed.
    body: bytes
    #: The Content-Transfer-Encoding (default binary); not applied to `body`.
    transfer_encoding: str = "binary"


@dataclass(frozen=True, slots=True)
class MessageRefused(Event):
    """The peer's MSG outgrew `BeepConfig.max_message_size`. Its frames were accounted for as
    any others and their payload dropped as they came; the connection has answered it with an
    ERR carrying RFC 3080's `error` element itself. The application never sees the message and
    owes it no reply: log it (one line) and carry on -- the session is unharmed."""

    #: Channel number.
    channel: int
    #: The refused MSG's message number.
    msgno: int
    #: The reply code sent: 554, "transaction failed (e.g., policy violation)" (RFC 3080 §8).
    code: int
    #: The diagnostic sent in the `error` element.
    text: str
    #: Octets the whole message carried.
    size: int
    #: The limit it broke (`max_message_size`).
    limit: int


@dataclass(frozen=True, slots=True)
class ReplyReceived(Event):
    """A complete positive reply (RPY) to our MSG `msgno`."""

    #: Channel number.
    channel: int
    #: The number of our MSG this answers.
    msgno: int
    #: The Content-Type header.
    content_type: str
    #: The entity body.
    body: bytes


@dataclass(frozen=True, slots=True)
class ErrorReplyReceived(Event):
    """A complete negative reply (ERR) to our MSG `msgno`."""

    #: Channel number.
    channel: int
    #: The number of our MSG this answers.
    msgno: int
    #: The Content-Type header.
    content_type: str
    #: The entity body.
    body: bytes


@dataclass(frozen=True, slots=True)
class AnswerReceived(Event):
    """One complete ANS message of a one-to-many reply to our MSG `msgno`."""

    #: Channel number.
    channel: int
    #: The number of our MSG this answers.
    msgno: int
    #: The answer number (unique among the answers in progress for `msgno`).
    ansno: int
    #: The Content-Type header.
    content_type: str
    #: The entity body.
    body: bytes


@dataclass(frozen=True, slots=True)
class AnswersComplete(Event):
    """The NUL that ends the one-to-many reply to our MSG `msgno`."""

    #: Channel number.
    channel: int
    #: The number of our MSG whose reply is complete.
    msgno: int


@dataclass(frozen=True, slots=True)
class CloseRequested(Event):
    """The peer asks to close `channel` (0: release the session); `accept_close()` or
    `decline_close()`."""

    #: Channel number; 0 means the whole session (RFC 3080 §2.4).
    channel: int
    #: Reply code the peer gave (200 for a normal close).
    code: int
    #: Diagnostic text, possibly empty.
    text: str


@dataclass(frozen=True, slots=True)
class CloseRefused(Event):
    """The peer declined our `close_channel()` / `close_session()`; the channel stays open."""

    #: Channel number; 0 for the session.
    channel: int
    #: Reply code (e.g. 550, "still working").
    code: int
    #: Diagnostic text, possibly empty.
    text: str


@dataclass(frozen=True, slots=True)
class ChannelClosed(Event):
    """The peer accepted our close of `channel` with `ok`; the number may be reused."""

    #: Channel number.
    channel: int


@dataclass(frozen=True, slots=True)
class SessionClosed(Event):
    """The session is over: released with `ok` (clean) or the transport ended (not clean).

    RFC 3081 §2.2: on receiving the `ok` to a session close the peer "immediately issues the
    TCP CLOSE call" -- so should the application.
    """

    #: True if the session was released by a close/ok exchange.
    clean: bool


@dataclass(frozen=True, slots=True)
class ProtocolViolation(Event):
    """The peer broke the protocol. If `terminate`, the session is dead: close the transport
    after sending whatever `data_to_send()` still holds (nothing is added for the violation,
    RFC 3080 §2.2.1.1). Otherwise the violation was answered (an `error` reply on channel zero)
    or is the application's to answer (a poorly-formed MSG on its channel)."""

    #: The RFC 3080 §8 reply code describing the failure.
    code: int
    #: What was wrong, for a diagnostic log entry.
    text: str
    #: Whether the session has been terminated.
    terminate: bool
    #: The channel concerned, if known.
    channel: int | None = None
    #: The message number concerned, if known.
    msgno: int | None = None


@dataclass(frozen=True, slots=True)
class TlsRequested(Event):
    """Listener: the peer sent the TLS profile's `ready` (RFC 3080 §3.1.3.1).

    Answer with `Tuning.accept_tls(channel)` once every earlier reply is written; if it returns
    True, write `data_to_send()`, call `Tuning.begin_tls()`, run the TLS handshake as the server
    and call `Tuning.tls_established()` (or `tls_failed()`).
    """

    #: The TLS channel (the `ready` rode in its `start`, or in a MSG on it).
    channel: int
    #: The earliest TLS version the peer accepts ("1" unless it said otherwise).
    version: str


@dataclass(frozen=True, slots=True)
class TlsProceed(Event):
    """Initiator: the listener answered our `ready` with `proceed`. Every channel is implicitly
    closed: write `data_to_send()`, call `Tuning.begin_tls()`, run the TLS handshake as the
    client and call `Tuning.tls_established()` (or `tls_failed()`)."""

    #: The TLS channel.
    channel: int


@dataclass(frozen=True, slots=True)
class TlsRefused(Event):
    """Initiator: the listener declined transport security; the session goes on in plain."""

    #: The TLS channel (possibly never created).
    channel: int
    #: Reply code of the `error` (550: not offered or not now, 501: bad `ready`, ...).
    code: int
    #: Diagnostic text, possibly empty.
    text: str


@dataclass(frozen=True, slots=True)
class SaslAuthenticated(Event):
    """A SASL exchange succeeded: `identity` is fixed for the rest of the session (RFC 3080
    §4). The listener learns who the peer is; the initiator, that it was accepted."""

    #: The SASL channel.
    channel: int
    #: The authorization identity (the user name; "anonymous" for ANONYMOUS).
    identity: str
    #: The SASL mechanism, e.g. "SCRAM-SHA-256".
    mechanism: str


@dataclass(frozen=True, slots=True)
class SaslFailed(Event):
    """A SASL exchange failed or was aborted; the session stays unauthenticated and may try
    again (within the listener's limit)."""

    #: The SASL channel.
    channel: int
    #: Reply code (535: bad credentials, 537: not authorized as that identity, 538: needs TLS,
    #: 451: aborted, 501: malformed response, ...).
    code: int
    #: Diagnostic text, possibly empty.
    text: str
    #: The SASL mechanism.
    mechanism: str
    #: The user name the peer claimed, if it got that far (for the log line).
    user: str | None = None


_MSG, _RPY, _ERR, _NUL = FrameType.MSG, FrameType.RPY, FrameType.ERR, FrameType.NUL

# The two events of every exchange are put together from their slots: a frozen dataclass's
# __init__ goes through object.__setattr__ once per field, which costs twice as much. The result
# is the same object (there is no __post_init__ to skip; checked below) and stays frozen.
_new = object.__new__
_set_mr_channel, _set_mr_msgno, _set_mr_type, _set_mr_body, _set_mr_encoding = (
    MessageReceived.__dict__[name].__set__
    for name in ("channel", "msgno", "content_type", "body", "transfer_encoding"))
_set_rr_channel, _set_rr_msgno, _set_rr_type, _set_rr_body = (
    ReplyReceived.__dict__[name].__set__ for name in ("channel", "msgno", "content_type", "body"))
assert not hasattr(MessageReceived, "__post_init__")
assert not hasattr(ReplyReceived, "__post_init__")


def _message_received(channel: int, msgno: int, content_type: str, body: bytes,
                      transfer_encoding: str) -> MessageReceived:
    event: MessageReceived = _new(MessageReceived)
    _set_mr_channel(event, channel)
    _set_mr_msgno(event, msgno)
    _set_mr_type(event, content_type)
    _set_mr_body(event, body)
    _set_mr_encoding(event, transfer_encoding)
    return event


def _reply_received(channel: int, msgno: int, content_type: str, body: bytes) -> ReplyReceived:
    event: ReplyReceived = _new(ReplyReceived)
    _set_rr_channel(event, channel)
    _set_rr_msgno(event, msgno)
    _set_rr_type(event, content_type)
    _set_rr_body(event, body)
    return event


def message_event(number: int, ftype: FrameType, msgno: int, payload: bytes,
                  ansno: int | None = None) -> Event:
    """The event for a whole message received on profile channel `number` (a channel's
    `Completed`, or a frame its fast path took whole), by type: the commonest first."""
    if ftype is not _NUL:
        try:
            content_type, transfer_encoding, body, _ = decode_fields(payload)
        except RemoteProtocolError as exc:
            # RFC 3080 §2.2.2.1: the profile answers a poorly-formed MSG; a poorly-formed reply
            # on a channel other than zero obliges the application to close that channel.
            what = "MSG: answer it with ERR" if ftype is _MSG else \
                "reply: close the channel (RFC 3080 §2.2.2.1)"
            return ProtocolViolation(int(exc.code), f"{exc.message} in a {what}", False,
                                     number, msgno)
        if ftype is _MSG:
            return _message_received(number, msgno, content_type, body, transfer_encoding)
        if ftype is _RPY:
            return _reply_received(number, msgno, content_type, body)
        if ftype is _ERR:
            return ErrorReplyReceived(number, msgno, content_type, body)
        assert ansno is not None
        return AnswerReceived(number, msgno, ansno, content_type, body)
    return AnswersComplete(number, msgno)

