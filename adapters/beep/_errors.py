"""BEEP protocol errors, as leaves of the project's one hierarchy (`common.errors.ApexpsError`).

Theory of operation
-------------------
As in h11, there are two kinds of protocol error and they must never be confused:

* `LocalProtocolError`: *we* were asked to do something the protocol forbids (send a reply to a
  message nobody sent, start a channel before the greeting, ...). Commands raise it; the session
  is left exactly as it was, so the caller may carry on.
* `RemoteProtocolError`: the *peer* broke the protocol. The connection never lets it escape from
  `receive_data()`; it becomes a `ProtocolViolation` event instead.

Both carry `code`, the RFC 3080 §8 reply code that describes the failure (what goes in an
`<error code=...>` element where the RFC calls for one), and `terminate`: whether the session must
be torn down. RFC 3080 §2.2.1.1 says of every poorly-formed frame "the session is terminated
without generating a response", so that is the default for remote errors; a poorly-formed or
unexpected element in a channel-zero "MSG" is answered with an "error" element instead
(§2.3.1.5) and does not end the session.

`ApexpsError.code` is a class variable (it feeds `for_code()`'s registry). A protocol error's code
depends on which rule was broken, so these classes shadow it per instance; the class default
(500, general syntax error) is registered nowhere new because `SyntaxError_` already owns 500.
"""

from __future__ import annotations

from common.errors import ApexpsError, ReplyCode

__all__ = ["BeepProtocolError", "LocalProtocolError", "RemoteProtocolError"]


class BeepProtocolError(ApexpsError):
    """A broken rule of RFC 3080/3081. Abstract: raise Local- or RemoteProtocolError."""

    code = ReplyCode.SYNTAX_ERROR
    description = "BEEP protocol error"
    #: Default for `terminate` when the constructor is not told.
    default_terminate = True

    def __init__(
        self,
        message: str | None = None,
        *,
        code: ReplyCode | None = None,
        terminate: bool | None = None,
    ) -> None:
        if type(self) is BeepProtocolError:
            raise TypeError("BeepProtocolError is abstract; raise Local- or RemoteProtocolError")
        super().__init__(message)
        if code is not None:
            # Per-instance shadowing of the ClassVar; see the module docstring.
            self.code = code  # type: ignore[misc]
        #: Must the session be torn down (RFC 3080 §2.2.1.1) rather than answered?
        self.terminate: bool = self.default_terminate if terminate is None else terminate

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}({self.message!r}, code={int(self.code)}, terminate={self.terminate})"


class LocalProtocolError(BeepProtocolError):
    """We tried to do something the protocol forbids; nothing was sent and no state changed."""

    description = "local BEEP protocol error"
    default_terminate = False


class RemoteProtocolError(BeepProtocolError):
    """The peer broke the protocol; by default the session must end (RFC 3080 §2.2.1.1)."""

    description = "remote BEEP protocol error"
    default_terminate = True
