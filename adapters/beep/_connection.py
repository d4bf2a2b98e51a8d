"""`BeepConnection`: the sans-I/O facade. Bytes in, events out; commands in, bytes out.

Theory of operation
-------------------
The connection composes the layers: `FrameDecoder` (bytes -> frames), `SessionMachine` (may the
session do this now?), one `Channel` per open channel (numbering, reply rules, reassembly,
windows), `_mime` (entity headers) and `_management` (channel-zero XML). It owns the two
channel-zero conversations: requests the peer made (`start`, `close`) that the application must
answer, and requests we made that the peer will answer.

`receive_data(bytes)` never raises on any input (h11's `next_event` says "if this method raises
any exception besides RemoteProtocolError then that's a bug"; we go further and raise nothing):
a poorly-formed frame becomes a `ProtocolViolation(terminate=True)` event and the session goes to
TERMINATED without a reply (RFC 3080 §2.2.1.1); a poorly-formed channel-zero MSG is answered with
an `error` element (RFC 3080 §2.3.1.5) and reported with `terminate=False`. A MSG that outgrows
`max_message_size` on any channel is not a poorly-formed frame: the connection answers it with an
ERR carrying an `error` element (554) and reports `MessageRefused`; the session goes on. Passing
`b""` says the transport reached end-of-file. Once the session is CLOSED or TERMINATED further
bytes are ignored.

Commands raise `LocalProtocolError` when the protocol forbids them, before changing anything.
Their bytes, and SEQ frames, accumulate until `data_to_send()` collects them (h2's model), as a
list of frames joined once. Frames for different channels go out round-robin (RFC 3081 §3.1.4)
as windows allow.

`_flush()` runs after every command and every `receive_data()` that may have queued something or
opened a window, once our greeting is out and until the session is terminated. So whenever a
command may send (a SENDING state), every channel's queue is empty or held back by the peer's
window: nothing but the new message can go out. `send_msg()` and the replies rely on that: they
let the channel write a message that fits whole straight to the output (`out=`), and flush only
if the channel still has something queued.

The common frame takes a fast path through the layers: `FrameDecoder.next_whole()` hands over a
whole message in one frame as a tuple, and if the session is in a state where RECV_DATA changes
nothing (`RECEIVING`) and the frame is for an open profile channel, `Channel.receive_whole()`
accounts for it; the event is built from the payload directly. Each step that meets anything
unusual declines without changing state, and the frame then goes the general way (`_on_frame`),
which checks every rule in order and reports what is wrong. So the fast path decides nothing
the general one would decide differently; it only skips work the state makes redundant.

Transport security and SASL are tuning profiles the APEX layer drives through `start_channel()` /
`accept_start()` with piggybacked content; after TLS takes over the transport it calls
`reset_after_tuning()`, which closes every channel and expects fresh greetings (RFC 3080 §3).

Why one module of this length: it is the one facade over the layers, as h11's
`_connection.py` is; it owns only the channel-zero conversations and the routing of frames to
channels, and every piece it composes lives in its own module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from types import MappingProxyType
from typing import NamedTuple

from common.errors import ReplyCode

from ._channel import Channel, Completed, Refused
from ._config import MAX_NUMBER, BeepConfig, Role
from ._errors import BeepProtocolError, LocalProtocolError, RemoteProtocolError
from ._events import (
    ChannelClosed,
    ChannelStarted,
    ChannelStartRefused,
    ChannelStartRequested,
    CloseRefused,
    CloseRequested,
    Event,
    GreetingReceived,
    GreetingRefused,
    MessageRefused,
    ProtocolViolation,
    SessionClosed,
    message_event,
)
from ._frames import Frame, FrameDecoder, FrameType, SeqFrame, Whole, encode_seq
from ._management import (
    Close,
    Error,
    Greeting,
    ManagementMessage,
    Ok,
    Profile,
    Start,
    parse_management,
    serialize,
)
from ._mime import (
    BEEP_XML,
    DEFAULT_CONTENT_TYPE,
    DEFAULT_TRANSFER_ENCODING,
    decode_entity,
    encode_entity,
    media_type,
)
from ._session import RECEIVING, SENDING, SessionInput, SessionMachine, SessionState

__all__ = ["BeepConnection"]

_TERMINAL = (SessionState.CLOSED, SessionState.TERMINATED)
_BEFORE_PEER_GREETING = (SessionState.AWAITING_GREETINGS, SessionState.GREETING_SENT)
#: Channels whose close we accepted; the peer's SEQ frames for them may still be in flight.
_RECENTLY_CLOSED_MEMORY = 64


class _Kind(Enum):
    GREETING = "greeting"
    START = "start"
    CLOSE = "close"


class _Request(NamedTuple):
    """A channel-zero MSG we sent (or the greeting we await), and what it was about."""

    kind: _Kind
    number: int
    offered: tuple[str, ...] = ()


def _xml(message: ManagementMessage) -> bytes:
    return encode_entity(serialize(message), BEEP_XML)


def _as_profile(profile: str | Profile) -> Profile:
    return Profile(profile) if isinstance(profile, str) else profile


class BeepConnection:
    """One BEEP session, either end, without I/O.

    Args:
        role: `Role.INITIATOR` (opened the transport) or `Role.LISTENER`.
        config: limits and windows; `BeepConfig()` by default.
        profiles: URIs of the profiles we serve: advertised in our greeting, and the only ones a
            peer's `start` may select. Empty: advertise none and let the application judge
            every `ChannelStartRequested`.
    """

    def __init__(
        self,
        role: Role,
        config: BeepConfig | None = None,
        profiles: Iterable[str] = (),
    ) -> None:
        self.role = role
        self.config = config or BeepConfig()
        self.profiles = tuple(profiles)
        self._decoder = FrameDecoder(self.config.max_frame_size)
        self._out: list[bytes] = []
        self._machine = SessionMachine()
        #: The peer's greeting, once received.
        self.peer_greeting: GreetingReceived | None = None
        #: `serverName` of the first start we accepted (RFC 3080 §2.3.1.2).
        self.server_name: str | None = None
        self._reset_channels()

    def _reset_channels(self) -> None:
        zero = Channel(0, "", self.config)
        zero.expect_reply(0)  # the peer's greeting answers a MSG 0 nobody sends
        self._channels: dict[int, Channel] = {0: zero}
        self._requests: dict[int, _Request] = {0: _Request(_Kind.GREETING, 0)}
        self._starting: set[int] = set()
        self._peer_starts: dict[int, tuple[int, Start]] = {}
        self._peer_closes: dict[int, int] = {}
        self._recently_closed: dict[int, None] = {}
        self._next_channel = 1 if self.role is Role.INITIATOR else 2
        self._greeting_sent = False

    # --- observation ----------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._machine.state

    @property
    def is_over(self) -> bool:
        """The session is released or terminated: nothing more is sent or received. Events
        of the read that ended it may still be in the application's hands."""
        return self._machine.state in _TERMINAL

    @property
    def channels(self) -> Mapping[int, str]:
        """Open channels (zero included) and the URI of each one's profile."""
        return MappingProxyType({n: c.profile for n, c in self._channels.items()})

    @property
    def buffered_bytes(self) -> int:
        """Received octets not yet decoded (bounded by one frame plus its header)."""
        return self._decoder.buffered

    @property
    def held_msg_bytes(self) -> int:
        """Octets of the peer's unfinished MSGs kept for reassembly: at most
        `max_message_size` per channel, since a MSG that outgrows it is dropped as it comes."""
        total = 0
        for channel in self._channels.values():
            total += channel.msg_held
        return total

    @property
    def backlog(self) -> int:
        """Octets queued on the channels that the peer's windows do not let out yet."""
        total = 0
        for channel in self._channels.values():
            total += channel.backlog
        return total

    def unfinished_replies(self) -> list[tuple[int, int]]:
        """(channel, msgno) of each of the peer's MSGs whose reply has not completely gone out:
        unanswered, or answered but held back by the peer's window. RFC 3080 §3.1.3.1 has the
        receiver of a TLS `ready` wait for these before it answers."""
        return [(n, m) for n, c in self._channels.items() for m in c.unfinished_replies()]

    # --- bytes ----------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Everything our commands and flow control produced since the last call."""
        out = self._out
        if not out:
            return b""
        data = b"".join(out)  # a single frame is returned as it is, not copied
        out.clear()
        return data

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed received bytes (`b""` for end-of-file); return the events they complete.

        Never raises on any content of `data`; see the module docstring.
        """
        events: list[Event] = []
        if self._machine.state in _TERMINAL:
            return events
        if not data:
            self._machine.process(SessionInput.TRANSPORT_CLOSED)
            events.append(SessionClosed(clean=False))
            return events
        decoder, machine = self._decoder, self._machine
        decoder.feed(data)
        # The frame being handled, or the last one when decoding the next fails: the violation
        # names its channel and msgno.
        frame: Frame | SeqFrame | Whole | None = None
        try:
            while machine.state not in _TERMINAL:
                whole = decoder.next_whole()
                if whole is not None:
                    frame = whole
                    # The fast path (module docstring), inline: nearly every frame takes it.
                    # Channel zero's messages are management, with their own checks.
                    ftype, number, msgno, seqno, payload = whole
                    target = self._channels.get(number) \
                        if number and machine.state in RECEIVING else None
                    if target is not None and target.receive_whole(ftype, msgno, seqno, payload):
                        events.append(message_event(number, ftype, msgno, payload))
                        if self._greeting_sent:  # `_window_update`, for a live channel
                            due = target.recv.update_due()
                            if due is not None:
                                self._out.append(encode_seq(SeqFrame(number, *due)))
                        continue
                    frame = Frame(ftype, number, msgno, False, seqno, payload)
                    self._on_frame(frame, events)
                    continue
                frame = decoder.next_frame()
                if frame is None:
                    break
                if isinstance(frame, SeqFrame):
                    self._on_seq(frame)
                else:
                    self._on_frame(frame, events)
        except BeepProtocolError as exc:
            # Local errors here mean the peer drove us somewhere the tables forbid: still the
            # peer's fault (h11 re-raises them as remote).
            self._machine.process(SessionInput.PROTOCOL_ERROR)
            where: int | None
            what: int | None
            if isinstance(frame, tuple):
                where, what = frame[1], frame[2]
            else:
                where = frame.channel if frame is not None else None
                what = frame.msgno if isinstance(frame, Frame) else None
            events.append(ProtocolViolation(int(exc.code), exc.message, True, where, what))
            return events
        self._flush()
        return events

    # --- receiving ------------------------------------------------------------------------

    def _on_seq(self, seq: SeqFrame) -> None:
        channel = self._channels.get(seq.channel)
        if channel is None:
            if seq.channel in self._recently_closed:
                return
            raise RemoteProtocolError(f"SEQ for channel {seq.channel}, which is not open"
                                      " (RFC 3081 §3.1.3)")
        channel.send.on_seq(seq.ackno, seq.window)

    def _on_frame(self, frame: Frame, events: list[Event]) -> None:
        if self.state in _BEFORE_PEER_GREETING:
            if frame.channel or frame.msgno or frame.type not in (FrameType.RPY, FrameType.ERR):
                raise RemoteProtocolError(f"{frame.type} on channel {frame.channel} before the"
                                          " greeting (RFC 3080 §2.3.1.1)")
        else:
            self._machine.process(SessionInput.RECV_DATA)
        channel = self._channels.get(frame.channel)
        if channel is None:
            raise RemoteProtocolError(f"frame on channel {frame.channel}, which is not open"
                                      " (RFC 3080 §2.2.1.1)")
        completed = channel.receive(frame)
        if completed is not None:
            if isinstance(completed, Refused):
                self._refuse(channel, completed, events)
            elif frame.channel == 0:
                self._on_management(completed, events)
            else:
                events.append(message_event(frame.channel, completed.type, completed.msgno,
                                            completed.payload, completed.ansno))
        self._window_update(frame.channel)

    def _refuse(self, channel: Channel, refused: Refused, events: list[Event]) -> None:
        # The session answers, not the profile: the message never existed for the application.
        # 554, not 550: RFC 3080 §8 gives 550 for "requested action not taken (e.g., no
        # requested profiles are acceptable)" -- the request was fine, nothing could take it --
        # and 554 for "transaction failed (e.g., policy violation)": a size cap is a policy
        # of this peer, and the same message in smaller parts would succeed.
        limit = self.config.max_message_size
        text = (f"message of {refused.size} octets exceeds the limit of {limit} octets this"
                " peer accepts (max_message_size); send it in smaller messages")
        code = int(ReplyCode.TRANSACTION_FAILED)
        self._reply_error(refused.msgno, code, text, channel)
        events.append(MessageRefused(channel.number, refused.msgno, code, text, refused.size,
                                     limit))

    def _window_update(self, number: int) -> None:
        channel = self._channels.get(number)
        if channel is None or not self._greeting_sent or self.state in _TERMINAL:
            return
        due = channel.recv.update_due()
        if due is not None:
            # RFC 3081 §3.1.4: "SEQ frames for a channel must have higher priority than
            # messages for that channel" -- written at once, ahead of queued data.
            self._out.append(encode_seq(SeqFrame(number, *due)))

    def _parse_xml(self, payload: bytes) -> ManagementMessage:
        entity = decode_entity(payload)
        if media_type(entity.content_type) != BEEP_XML:
            raise RemoteProtocolError(f"channel zero carries {BEEP_XML}, not"
                                      f" {entity.content_type!r}", terminate=False)
        return parse_management(entity.body, self.config.max_management_message_size)

    def _on_management(self, done: Completed, events: list[Event]) -> None:
        if done.type is FrameType.MSG:
            try:
                message = self._parse_xml(done.payload)
                if not isinstance(message, Start | Close):
                    raise RemoteProtocolError(
                        f"unexpected element <{type(message).__name__.lower()}> in a MSG",
                        code=ReplyCode.PARAMETER_SYNTAX_ERROR, terminate=False)
            except RemoteProtocolError as exc:
                # RFC 3080 §2.3.1.5: a poorly-formed or unexpected element gets an error reply.
                self._reply_error(done.msgno, int(exc.code), exc.message)
                events.append(ProtocolViolation(int(exc.code), exc.message, False, 0, done.msgno))
                return
            if isinstance(message, Start):
                self._on_start(done.msgno, message, events)
            else:
                self._on_close(done.msgno, message, events)
            return
        # A reply to one of our requests. RFC 3080 §2.2.2.1: a poorly-formed reply on channel
        # zero terminates the session; so does one of the wrong kind.
        request = self._requests.pop(done.msgno)
        if done.type not in (FrameType.RPY, FrameType.ERR):
            raise RemoteProtocolError(f"{done.type} on channel zero, which has no one-to-many"
                                      " exchanges (RFC 3080 §6.1)")
        try:
            reply = self._parse_xml(done.payload)
        except RemoteProtocolError as exc:
            raise RemoteProtocolError(f"poorly-formed reply on channel zero: {exc.message}",
                                      code=exc.code) from None
        if done.type is FrameType.ERR:
            if not isinstance(reply, Error):
                raise RemoteProtocolError("an ERR on channel zero must carry <error>")
            self._on_refusal(request, reply, events)
        else:
            self._on_acceptance(request, reply, events)

    def _on_refusal(self, request: _Request, error: Error, events: list[Event]) -> None:
        if request.kind is _Kind.GREETING:
            self._machine.process(SessionInput.RECV_GREETING_REFUSAL)
            events.append(GreetingRefused(error.code, error.text))
        elif request.kind is _Kind.START:
            self._starting.discard(request.number)
            events.append(ChannelStartRefused(request.number, error.code, error.text))
        elif request.number == 0:
            self._machine.process(SessionInput.RECV_SESSION_CLOSE_REFUSAL)
            events.append(CloseRefused(0, error.code, error.text))
        else:
            closing = self._channels.get(request.number)  # gone if the peer closed it meanwhile
            if closing is not None:
                closing.closing = False
            events.append(CloseRefused(request.number, error.code, error.text))

    def _on_acceptance(self, request: _Request, reply: ManagementMessage,
                       events: list[Event]) -> None:
        if request.kind is _Kind.GREETING:
            if not isinstance(reply, Greeting):
                raise RemoteProtocolError("the first RPY on channel zero must be a <greeting>")
            self._machine.process(SessionInput.RECV_GREETING)
            self.peer_greeting = GreetingReceived(reply.profiles, reply.features, reply.localize)
            events.append(self.peer_greeting)
        elif request.kind is _Kind.START:
            if not isinstance(reply, Profile) or reply.uri not in request.offered:
                raise RemoteProtocolError("a start must be answered with one of the offered"
                                          " profiles (RFC 3080 §2.3.1.2)")
            self._starting.discard(request.number)
            self._open(request.number, reply.uri)
            events.append(ChannelStarted(request.number, reply))
            self._window_update(request.number)
        else:
            if not isinstance(reply, Ok):
                raise RemoteProtocolError("a close must be answered with <ok> or <error>")
            if request.number == 0:
                self._machine.process(SessionInput.RECV_SESSION_OK)
                events.append(SessionClosed(clean=True))
            else:
                self._forget(request.number)
                events.append(ChannelClosed(request.number))

    def _on_start(self, msgno: int, start: Start, events: list[Event]) -> None:
        number, offered = start.number, start.profiles
        if self.profiles:
            offered = tuple(p for p in offered if p.uri in self.profiles)
        # Profiles are judged before parity: RFC 3080 §2.3.1.5's example answers an unsupported
        # profile on an even channel from the initiator with 550, §2.3.1.2's a supported one
        # with 501.
        parity = "odd" if self.role.peer is Role.INITIATOR else "even"
        if not offered:
            self._reply_error(msgno, 550, "all requested profiles are\r\nunsupported")
        elif number % 2 != self.role.peer.channel_parity:
            self._reply_error(msgno, 501, f"number attribute\r\nin <start> element must be"
                                          f" {parity}-valued")
        elif number in self._channels or number in self._peer_starts:
            self._reply_error(msgno, 550, f"channel {number} is already in use")
        elif self._channel_count() >= self.config.max_channels:
            self._reply_error(msgno, 550, f"no more than {self.config.max_channels} channels")
        elif self.state is SessionState.CLOSING:
            self._reply_error(msgno, 550, "the session is being released")
        else:
            self._peer_starts[number] = (msgno, start)
            events.append(ChannelStartRequested(number, offered, start.server_name))

    def _on_close(self, msgno: int, close: Close, events: list[Event]) -> None:
        number = close.number
        if number and number not in self._channels:
            self._reply_error(msgno, 550, f"channel {number} is not open")
        elif number in self._peer_closes:
            self._reply_error(msgno, 550, f"a close of channel {number} is already pending")
        else:
            self._peer_closes[number] = msgno
            events.append(CloseRequested(number, close.code, close.text))

    # --- commands: session ----------------------------------------------------------------

    def send_greeting(
        self,
        profiles: Iterable[str] | None = None,
        *,
        features: Iterable[str] = (),
        localize: Iterable[str] = (),
    ) -> None:
        """Send our greeting (RFC 3080 §2.3.1.1); `profiles` defaults to the constructor's."""
        greeting = Greeting(
            self.profiles if profiles is None else tuple(profiles),
            tuple(features), tuple(localize))
        payload = _xml(greeting)  # validate before the state changes
        self._machine.process(SessionInput.SEND_GREETING)
        self._greeting_sent = True
        self._channels[0].queue_greeting(FrameType.RPY, payload)
        self._flush()
        self._window_update(0)

    def refuse_session(self, code: int = 421, text: str = "") -> None:
        """As an unavailable listener, answer with an `error` instead of a greeting (§2.4)."""
        if self.role is not Role.LISTENER:
            raise LocalProtocolError("only the listener refuses a session (RFC 3080 §2.4)")
        payload = _xml(Error(code, text))
        self._machine.process(SessionInput.SEND_GREETING_REFUSAL)
        self._channels[0].queue_greeting(FrameType.ERR, payload)
        self._flush(force=True)

    def close_session(self, code: int = 200, text: str = "", *,
                      explicit_number: bool = False) -> None:
        """Ask the peer to release the session (RFC 3080 §2.4); expect `SessionClosed` or
        `CloseRefused(0, ...)`. `explicit_number` writes `number='0'`, which the DTD implies
        and some peers (beepcore-java) nevertheless require."""
        if not self._channels[0].all_acknowledged():
            raise LocalProtocolError("wait for a reply to every channel-zero MSG first")
        payload = _xml(Close(0, code, text, explicit_number=explicit_number))
        self._machine.process(SessionInput.SEND_SESSION_CLOSE)
        msgno = self._channels[0].queue_msg(payload)
        self._requests[msgno] = _Request(_Kind.CLOSE, 0)
        self._flush()

    def reset_after_tuning(self) -> bytes:
        """A transport security profile took over the transport (RFC 3080 §3): close every
        channel and await fresh greetings. Returns the undecoded bytes that followed (they
        belong to the new layer, e.g. a TLS handshake)."""
        if self._out:
            raise LocalProtocolError("collect data_to_send() before the tuning reset")
        self._machine.process(SessionInput.TUNING_RESET)
        self._reset_channels()
        self.peer_greeting = None
        return self._decoder.take_buffer()

    # --- commands: channels ---------------------------------------------------------------

    def start_channel(
        self,
        profiles: Iterable[str | Profile],
        *,
        server_name: str | None = None,
        number: int | None = None,
    ) -> int:
        """Propose a channel with one or more profiles, in order of preference (§2.3.1.2);
        return its number. Expect `ChannelStarted` or `ChannelStartRefused`."""
        self._require_open("start a channel")
        offered = tuple(_as_profile(p) for p in profiles)
        if number is None:
            number = self._free_channel_number()
        elif not 1 <= number <= MAX_NUMBER or number % 2 != self.role.channel_parity:
            raise LocalProtocolError(f"a {self.role.value} starts only"
                                     f" {'odd' if self.role.channel_parity else 'even'}"
                                     " channel numbers (RFC 3080 §2.3.1.2)")
        elif number in self._channels or number in self._starting:
            raise LocalProtocolError(f"channel {number} is in use")
        if self._channel_count() >= self.config.max_channels:
            raise LocalProtocolError(f"no more than {self.config.max_channels} channels")
        payload = _xml(Start(number, offered, server_name))
        msgno = self._channels[0].queue_msg(payload)
        self._requests[msgno] = _Request(_Kind.START, number, tuple(p.uri for p in offered))
        self._starting.add(number)
        self._flush()
        return number

    def accept_start(self, channel: int, profile: str | Profile) -> None:
        """Create the channel the peer asked for, with one of its offered profiles (optionally
        carrying initialization content back)."""
        msgno, start = self._pending_start(channel)
        chosen = _as_profile(profile)
        if chosen.uri not in {p.uri for p in start.profiles}:
            raise LocalProtocolError(f"profile {chosen.uri!r} was not offered for {channel}")
        payload = _xml(chosen)
        self._machine.process(SessionInput.SEND_DATA)
        self._channels[0].queue_reply(FrameType.RPY, msgno, payload)
        del self._peer_starts[channel]
        if self.server_name is None and start.server_name is not None:
            self.server_name = start.server_name
        self._open(channel, chosen.uri)
        self._flush()

    def reject_start(self, channel: int, code: int = 550, text: str = "") -> None:
        """Decline the peer's start request with an `error` element."""
        msgno, _ = self._pending_start(channel)
        self._reply_error(msgno, code, text)
        del self._peer_starts[channel]
        self._flush()

    def close_channel(self, channel: int, code: int = 200, text: str = "") -> None:
        """Ask the peer to close `channel` (§2.3.1.3); expect `ChannelClosed` or `CloseRefused`."""
        target = self._user_channel(channel)
        if target.closing:
            raise LocalProtocolError(f"channel {channel} is already being closed")
        if not target.all_acknowledged():
            raise LocalProtocolError("a channel may be closed once every MSG sent on it has"
                                     " been acknowledged (RFC 3080 §2.3.1.3)")
        payload = _xml(Close(channel, code, text))
        self._machine.process(SessionInput.SEND_DATA)
        msgno = self._channels[0].queue_msg(payload)
        target.closing = True
        self._requests[msgno] = _Request(_Kind.CLOSE, channel)
        self._flush()

    def accept_close(self, channel: int) -> None:
        """Agree to the peer's close of `channel` (0: release the session) with `ok`."""
        msgno = self._peer_closes.get(channel)
        if msgno is None:
            raise LocalProtocolError(f"the peer has not asked to close {channel}")
        zero = self._channels[0]
        if channel == 0:
            if zero.first_pending_inbound() != msgno:
                raise LocalProtocolError("answer the earlier channel-zero requests first")
            self._machine.process(SessionInput.SEND_SESSION_OK)
        else:
            if not self._channels[channel].is_quiescent():
                raise LocalProtocolError("finish every exchange on the channel before accepting"
                                         " its close (RFC 3080 §2.3.1.3)")
            self._machine.process(SessionInput.SEND_DATA)
        zero.queue_reply(FrameType.RPY, msgno, _xml(Ok()))
        del self._peer_closes[channel]
        if channel:
            self._forget(channel)
        self._flush(force=True)

    def decline_close(self, channel: int, code: int = 550, text: str = "still working") -> None:
        """Refuse the peer's close of `channel` with an `error` element."""
        msgno = self._peer_closes.get(channel)
        if msgno is None:
            raise LocalProtocolError(f"the peer has not asked to close {channel}")
        self._reply_error(msgno, code, text)
        del self._peer_closes[channel]
        self._flush()

    # --- commands: messages ---------------------------------------------------------------

    def send_msg(self, channel: int, body: bytes, content_type: str = DEFAULT_CONTENT_TYPE,
                 transfer_encoding: str = DEFAULT_TRANSFER_ENCODING) -> int:
        """Send a MSG on a profile channel; return its message number."""
        if self._machine.state is not SessionState.OPEN:  # `_require_open`, once per MSG
            self._require_open("send a MSG")
        target = self._channels.get(channel) if channel else None
        if target is None:
            target = self._user_channel(channel)  # raises, saying why
        payload = encode_entity(body, content_type, transfer_encoding)
        msgno = target.queue_msg(payload, self._out if self._greeting_sent else None)
        if target.queue:  # else it went out whole (see the module docstring)
            self._flush()
        return msgno

    def send_rpy(self, channel: int, msgno: int, body: bytes,
                 content_type: str = DEFAULT_CONTENT_TYPE,
                 transfer_encoding: str = DEFAULT_TRANSFER_ENCODING) -> None:
        """Send the positive reply to the peer's MSG `msgno`."""
        self._reply(channel, FrameType.RPY, msgno,
                    encode_entity(body, content_type, transfer_encoding))

    def send_err(self, channel: int, msgno: int, body: bytes,
                 content_type: str = DEFAULT_CONTENT_TYPE,
                 transfer_encoding: str = DEFAULT_TRANSFER_ENCODING) -> None:
        """Send the negative reply to the peer's MSG `msgno`."""
        self._reply(channel, FrameType.ERR, msgno,
                    encode_entity(body, content_type, transfer_encoding))

    def send_ans(self, channel: int, msgno: int, body: bytes,
                 content_type: str = DEFAULT_CONTENT_TYPE,
                 transfer_encoding: str = DEFAULT_TRANSFER_ENCODING) -> int:
        """Send one answer of a one-to-many reply; return its answer number."""
        ansno = self._reply(channel, FrameType.ANS, msgno,
                            encode_entity(body, content_type, transfer_encoding))
        assert ansno is not None
        return ansno

    def send_nul(self, channel: int, msgno: int) -> None:
        """End the one-to-many reply to the peer's MSG `msgno`."""
        self._reply(channel, FrameType.NUL, msgno, b"")

    # --- helpers --------------------------------------------------------------------------

    def _reply(self, channel: int, ftype: FrameType, msgno: int, payload: bytes) -> int | None:
        target = self._channels.get(channel) if channel else None
        if target is None:
            target = self._user_channel(channel)  # raises, saying why
        if self._machine.state not in SENDING:
            raise LocalProtocolError(f"can't reply when the session is {self.state.value}")
        ansno = target.queue_reply(ftype, msgno, payload,
                                   self._out if self._greeting_sent else None)
        if target.queue:  # else it went out whole or waits for earlier replies
            self._flush()
        return ansno

    def _reply_error(self, msgno: int, code: int, text: str,
                     channel: Channel | None = None) -> None:
        # Queued in MSG order behind earlier replies on the channel (RFC 3080 §2.6.1) and,
        # before our greeting is out, behind the greeting (see _flush).
        target = self._channels[0] if channel is None else channel
        target.queue_reply(FrameType.ERR, msgno, _xml(Error(code, text)))

    def _require_open(self, what: str) -> None:
        if self.state is not SessionState.OPEN:
            raise LocalProtocolError(f"can't {what} when the session is {self.state.value}")

    def _user_channel(self, channel: int) -> Channel:
        if channel == 0:
            raise LocalProtocolError("channel zero is driven by start/close commands only")
        target = self._channels.get(channel)
        if target is None:
            raise LocalProtocolError(f"channel {channel} is not open")
        return target

    def _pending_start(self, channel: int) -> tuple[int, Start]:
        pending = self._peer_starts.get(channel)
        if pending is None:
            raise LocalProtocolError(f"the peer has not asked to start channel {channel}")
        if not self._machine.allows(SessionInput.SEND_DATA):
            raise LocalProtocolError(f"can't answer a start when the session is"
                                     f" {self.state.value}")
        return pending

    def _channel_count(self) -> int:
        return len(self._channels) - 1 + len(self._starting) + len(self._peer_starts)

    def _free_channel_number(self) -> int:
        number = self._next_channel
        while number in self._channels or number in self._starting:
            number += 2
            if number > MAX_NUMBER:
                number = 1 if self.role is Role.INITIATOR else 2
        self._next_channel = number + 2 if number + 2 <= MAX_NUMBER else number % 2 or 2
        return number

    def _open(self, number: int, profile: str) -> None:
        self._channels[number] = Channel(number, profile, self.config)
        self._recently_closed.pop(number, None)

    def _forget(self, number: int) -> None:
        # Both peers may close the same channel at once; the second close finds it gone.
        self._channels.pop(number, None)
        self._recently_closed[number] = None
        if len(self._recently_closed) > _RECENTLY_CLOSED_MEMORY:
            del self._recently_closed[next(iter(self._recently_closed))]

    def _flush(self, *, force: bool = False) -> None:
        """Move frames the windows allow into the output, one per channel per round."""
        # Nothing precedes our greeting (RFC 3080 §2.3.1.1), and a terminated session sends
        # nothing more (§2.2.1.1) -- except the refusal and the final ok that end it.
        if not force and (not self._greeting_sent
                          or self._machine.state is SessionState.TERMINATED):
            return
        # A plain loop, not a comprehension: this runs after every command and every read.
        busy = []
        for channel in self._channels.values():
            if channel.queue:
                busy.append(channel)
        out = self._out
        if len(busy) == 1:
            # The usual case, one busy channel: the round robin is draining it.
            channel = busy[0]
            while channel.queue and (frame := channel.next_frame_bytes()) is not None:
                out.append(frame)
            return
        while busy:
            still = []
            for channel in busy:
                frame = channel.next_frame_bytes()
                if frame is not None:
                    out.append(frame)
                    still.append(channel)
            busy = still
