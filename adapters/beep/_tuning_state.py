"""The two tuning state machines of a session (RFC 3080 §3 and §4), as tables.

Theory of operation
-------------------
Rule 1 (as in `_session`): whether transport security or authentication may move is decided
here, by `TLS_TRANSITIONS` and `AUTH_TRANSITIONS`; a pair missing from a table raises
`LocalProtocolError` and changes nothing. Rule 2: this file knows no roles, channels or XML.

Transport security: a `ready` goes out or comes in (REQUESTED); it is answered with an `error`
(back to PLAIN) or `proceed` (PROCEEDING: the shell must write what is queued and hand the
transport to TLS). `begin_tls()` closes every channel (NEGOTIATING); the handshake's outcome
makes the session SECURED or, failing, PLAIN again -- RFC 3080 §3: "upon completion of the
negotiation process, regardless of its outcome, a new greeting is issued by both BEEP peers"
(a shell whose transport died with the handshake terminates instead, as §3 also allows).

Authentication: one exchange at a time (IN_PROGRESS); success is final (§4: "no additional
attempts at authentication are allowed"); failure or abort returns to NONE.

The rules that tie the two together live with the facade (`Tuning._judge`), because they read
both machines: TLS may not begin once SASL succeeded (§4.1) -- nor, here, while an exchange is
in progress -- and an exchange may not start while TLS is being set up.
"""

from __future__ import annotations

from enum import Enum
from typing import Generic, TypeVar

from ._errors import LocalProtocolError

__all__ = [
    "AUTH_TRANSITIONS",
    "TLS_TRANSITIONS",
    "AuthInput",
    "AuthState",
    "Machine",
    "TlsInput",
    "TlsState",
]


class TlsState(Enum):
    """Where transport security is."""

    #: No transport security (the start of every session).
    PLAIN = "plain"
    #: A `ready` is out (or in) and not answered yet.
    REQUESTED = "requested"
    #: `proceed` was sent (or received): the transport must be handed to TLS now.
    PROCEEDING = "proceeding"
    #: Every channel is closed and the TLS handshake is under way.
    NEGOTIATING = "negotiating"
    #: TLS protects the transport; new greetings follow.
    SECURED = "secured"


class TlsInput(Enum):
    READY = "ready"
    REFUSED = "refused"
    PROCEED = "proceed"
    RESET = "reset"
    ESTABLISHED = "established"
    FAILED = "failed"


class AuthState(Enum):
    """Where user authentication is."""

    #: Nobody is authenticated (anonymous access, RFC 3080 §4).
    NONE = "none"
    #: A SASL exchange is under way on some channel.
    IN_PROGRESS = "in progress"
    #: The authenticated identity is fixed for the rest of the session.
    AUTHENTICATED = "authenticated"


class AuthInput(Enum):
    START = "start"
    SUCCEED = "succeed"
    FAIL = "fail"


_T, _TI = TlsState, TlsInput
#: `(state, input) -> next state`. Anything absent is illegal.
TLS_TRANSITIONS: dict[tuple[TlsState, TlsInput], TlsState] = {
    (_T.PLAIN, _TI.READY): _T.REQUESTED,
    (_T.REQUESTED, _TI.REFUSED): _T.PLAIN,
    (_T.REQUESTED, _TI.PROCEED): _T.PROCEEDING,
    (_T.PROCEEDING, _TI.RESET): _T.NEGOTIATING,
    (_T.NEGOTIATING, _TI.ESTABLISHED): _T.SECURED,
    (_T.NEGOTIATING, _TI.FAILED): _T.PLAIN,
}

_A, _AI = AuthState, AuthInput
#: `(state, input) -> next state`. Anything absent is illegal.
AUTH_TRANSITIONS: dict[tuple[AuthState, AuthInput], AuthState] = {
    (_A.NONE, _AI.START): _A.IN_PROGRESS,
    (_A.IN_PROGRESS, _AI.SUCCEED): _A.AUTHENTICATED,
    (_A.IN_PROGRESS, _AI.FAIL): _A.NONE,
}

S = TypeVar("S", bound=Enum)
I = TypeVar("I", bound=Enum)  # noqa: E741 - the table's own vocabulary: state and input


class Machine(Generic[S, I]):
    """A current state, moved only through `table`."""

    def __init__(self, table: dict[tuple[S, I], S], initial: S) -> None:
        self._table = table
        self.state = initial

    def allows(self, input_: I) -> bool:
        return (self.state, input_) in self._table

    def process(self, input_: I) -> S:
        """Apply `input_` and return the new state.

        Raises:
            LocalProtocolError: the table has no such transition; the state is unchanged.
        """
        try:
            self.state = self._table[(self.state, input_)]
        except KeyError:
            raise LocalProtocolError(
                f"can't {input_.value} when {type(self.state).__name__} is {self.state.value}"
            ) from None
        return self.state
