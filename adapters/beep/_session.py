"""The session state machine (RFC 3080 §2.3.1.1, §2.4; RFC 3081 §2.2), as a table.

Theory of operation
-------------------
Rule 1 (h11's): everything that decides whether the *session* may do something lives here, in
`TRANSITIONS`; a pair missing from the table raises `LocalProtocolError` and changes nothing.
Rule 2: this file knows nothing of roles, channels or bytes. The connection feeds it inputs.

Each peer sends a greeting first, independently (RFC 3080 §2.3.1.1: "this is an artifact of the
presentation; in fact, both BEEP peers send their replies independently"), so two greeting states
keep the two directions apart. Data may flow once our greeting is out and the peer's is in;
frames from the peer are welcome once its greeting has arrived (it may pipeline a start after its
greeting before it sees ours). A tuning reset (a transport security profile took over the
transport, RFC 3080 §3) takes the session back to AWAITING_GREETINGS from any live state.
CLOSED (released) and TERMINATED (aborted, or a refused greeting) are terminal.
"""

from __future__ import annotations

from enum import Enum

from ._errors import LocalProtocolError

__all__ = ["RECEIVING", "SENDING", "TRANSITIONS", "SessionInput", "SessionMachine", "SessionState"]


class SessionState(Enum):
    """Where the session is."""

    #: Neither greeting has been sent or received.
    AWAITING_GREETINGS = "awaiting greetings"
    #: Ours is sent; the peer's has not arrived.
    GREETING_SENT = "greeting sent"
    #: The peer's has arrived; ours is not sent.
    GREETING_RECEIVED = "greeting received"
    #: Both greetings exchanged: channels may be started and used.
    OPEN = "open"
    #: We asked to release the session and await `ok` or `error`.
    CLOSING = "closing"
    #: Released by a close/ok exchange (terminal).
    CLOSED = "closed"
    #: Aborted: protocol violation, refused greeting or lost transport (terminal).
    TERMINATED = "terminated"

    # Identity hashing (members are singletons compared by identity) runs in C; Enum's own
    # __hash__ is a Python call on every TRANSITIONS lookup.
    __hash__ = object.__hash__


class SessionInput(Enum):
    """What can happen to the session."""

    SEND_GREETING = "send greeting"
    SEND_GREETING_REFUSAL = "send greeting refusal"
    RECV_GREETING = "receive greeting"
    RECV_GREETING_REFUSAL = "receive greeting refusal"
    #: We send anything else (start, close of a channel, MSG, replies).
    SEND_DATA = "send data"
    #: A frame other than the greeting arrives.
    RECV_DATA = "receive data"
    SEND_SESSION_CLOSE = "send session close"
    RECV_SESSION_OK = "receive session ok"
    RECV_SESSION_CLOSE_REFUSAL = "receive session close refusal"
    #: We accept the peer's request to release the session.
    SEND_SESSION_OK = "send session ok"
    PROTOCOL_ERROR = "protocol error"
    TRANSPORT_CLOSED = "transport closed"
    TUNING_RESET = "tuning reset"

    __hash__ = object.__hash__  # as SessionState's


_S, _I = SessionState, SessionInput
_LIVE = (_S.AWAITING_GREETINGS, _S.GREETING_SENT, _S.GREETING_RECEIVED, _S.OPEN, _S.CLOSING)

#: `(state, input) -> next state`. Anything absent is illegal.
TRANSITIONS: dict[tuple[SessionState, SessionInput], SessionState] = {
    (_S.AWAITING_GREETINGS, _I.SEND_GREETING): _S.GREETING_SENT,
    (_S.AWAITING_GREETINGS, _I.RECV_GREETING): _S.GREETING_RECEIVED,
    (_S.GREETING_SENT, _I.RECV_GREETING): _S.OPEN,
    (_S.GREETING_RECEIVED, _I.SEND_GREETING): _S.OPEN,
    # RFC 3080 §2.4: an unavailable listener answers with an error; both sides terminate.
    (_S.AWAITING_GREETINGS, _I.SEND_GREETING_REFUSAL): _S.TERMINATED,
    (_S.GREETING_RECEIVED, _I.SEND_GREETING_REFUSAL): _S.TERMINATED,
    (_S.AWAITING_GREETINGS, _I.RECV_GREETING_REFUSAL): _S.TERMINATED,
    (_S.GREETING_SENT, _I.RECV_GREETING_REFUSAL): _S.TERMINATED,
    (_S.GREETING_RECEIVED, _I.RECV_DATA): _S.GREETING_RECEIVED,
    (_S.OPEN, _I.SEND_DATA): _S.OPEN,
    (_S.OPEN, _I.RECV_DATA): _S.OPEN,
    (_S.OPEN, _I.SEND_SESSION_CLOSE): _S.CLOSING,
    (_S.OPEN, _I.SEND_SESSION_OK): _S.CLOSED,
    # While our release is pending we still answer the peer and read its traffic
    # (RFC 3080 §2.3.1.3: "the BEEP peer must be prepared to process any MSG messages").
    (_S.CLOSING, _I.SEND_DATA): _S.CLOSING,
    (_S.CLOSING, _I.RECV_DATA): _S.CLOSING,
    (_S.CLOSING, _I.RECV_SESSION_OK): _S.CLOSED,
    (_S.CLOSING, _I.RECV_SESSION_CLOSE_REFUSAL): _S.OPEN,
    (_S.CLOSING, _I.SEND_SESSION_OK): _S.CLOSED,
    # A peer may close the transport after the ok; that is the clean end.
    (_S.CLOSED, _I.TRANSPORT_CLOSED): _S.CLOSED,
    (_S.TERMINATED, _I.TRANSPORT_CLOSED): _S.TERMINATED,
}
for _state in _LIVE:
    TRANSITIONS[(_state, _I.PROTOCOL_ERROR)] = _S.TERMINATED
    TRANSITIONS[(_state, _I.TRANSPORT_CLOSED)] = _S.TERMINATED
    # RFC 3080 §3: after transport security negotiation "a new greeting is issued by both".
    TRANSITIONS[(_state, _I.TUNING_RESET)] = _S.AWAITING_GREETINGS

#: The states in which a data frame from the peer is welcome and changes nothing: RECV_DATA
#: leads back to the same state. Read off the table, so that the connection's per-frame fast
#: path can skip `process(RECV_DATA)` without deciding anything the table does not say.
RECEIVING = frozenset(s for s in SessionState if TRANSITIONS.get((s, _I.RECV_DATA)) is s)
#: The states that allow SEND_DATA (`allows()`), read off the table as well: what the
#: connection checks once per reply it sends.
SENDING = frozenset(s for s in SessionState if (s, _I.SEND_DATA) in TRANSITIONS)


class SessionMachine:
    """The current `SessionState`, moved only through `TRANSITIONS`."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = SessionState.AWAITING_GREETINGS

    def allows(self, input_: SessionInput) -> bool:
        return (self.state, input_) in TRANSITIONS

    def process(self, input_: SessionInput) -> SessionState:
        """Apply `input_` and return the new state.

        Raises:
            LocalProtocolError: the table has no such transition; the state is unchanged.
        """
        try:
            self.state = TRANSITIONS[(self.state, input_)]
        except KeyError:
            raise LocalProtocolError(
                f"can't {input_.value} when the session is {self.state.value}"
            ) from None
        return self.state
