"""SASL mechanisms as small pure objects (RFC 4422): PLAIN (RFC 4616), ANONYMOUS (RFC 4505),
and the pieces every mechanism shares (SASLprep, RFC 4013). SCRAM-SHA-256 lives in `_scram`.

Theory of operation
-------------------
A server mechanism is fed the client's responses one at a time through `step()` (`None` for "the
client sent no initial response", which differs from an empty one) and answers with a
`Challenge` to send back or a `Success` naming the authorization identity. Failure is an
exception from the project's one hierarchy, whose code is what the `error` element carries:
501 for a response that does not parse, 535 for refused credentials, 537 for an authorization
identity the authenticated user may not act as. A client mechanism is the mirror image: an
optional initial response, `step(challenge) -> response`, and `complete(data)` to check the
additional data that comes with success (SCRAM's server signature).

Credentials are not this module's business: PLAIN asks a `PasswordVerifier`
(`verify(user, password) -> bool`) supplied by the shell. Nothing here does I/O, logs, or reads a
clock; the only randomness (SCRAM nonces) is injected.
"""

from __future__ import annotations

import stringprep
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from common.errors import AccessDenied, AuthenticationFailed, ParameterSyntaxError

__all__ = [
    "MAX_IDENTITY_OCTETS",
    "MAX_PASSWORD_OCTETS",
    "AnonymousClient",
    "AnonymousServer",
    "Challenge",
    "ClientMechanism",
    "PasswordVerifier",
    "PlainClient",
    "PlainServer",
    "ServerMechanism",
    "Success",
    "parse_plain",
    "saslprep",
]

#: RFC 4616 §2: servers "MUST be capable of accepting authzid, authcid, and passwd values of up
#: to 255 octets"; identities longer than that are refused rather than looked up.
MAX_IDENTITY_OCTETS = 255
#: Passwords get more room (passphrases), still far below what a tuning message may carry.
MAX_PASSWORD_OCTETS = 1024
#: RFC 4505 §3: the anonymous trace token is at most 255 characters.
_MAX_TRACE_CHARS = 255

PasswordVerifier = Callable[[str, str], bool]


@dataclass(frozen=True, slots=True)
class Challenge:
    """The server's next challenge (possibly empty: "send your response")."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Success:
    """The exchange succeeded for authorization identity `identity`; `data` is the additional
    data sent with success (RFC 4422 §3.6), e.g. SCRAM's server signature."""

    identity: str
    data: bytes = b""


class ServerMechanism(Protocol):
    """The server side of one exchange. `user` is the authentication identity claimed so far
    (for the log line of a failure), None until the client named one."""

    name: str
    user: str | None

    def step(self, response: bytes | None) -> Challenge | Success: ...


class ClientMechanism(Protocol):
    """The client side of one exchange; `identity` is who we authenticate as."""

    name: str
    identity: str

    def initial(self) -> bytes | None: ...

    def step(self, challenge: bytes) -> bytes: ...

    def complete(self, data: bytes) -> None: ...


# --- SASLprep ---------------------------------------------------------------------------------


def _prohibited(c: str) -> bool:
    return (stringprep.in_table_c12(c) or stringprep.in_table_c21_c22(c)
            or stringprep.in_table_c3(c) or stringprep.in_table_c4(c)
            or stringprep.in_table_c5(c) or stringprep.in_table_c6(c)
            or stringprep.in_table_c7(c) or stringprep.in_table_c8(c)
            or stringprep.in_table_c9(c))


def saslprep(text: str, *, stored: bool = False) -> str:
    """RFC 4013 SASLprep of a user name or password.

    `stored=True` prepares a string to be kept (unassigned code points are refused); the default
    prepares a query (a string a client sent), which may contain them (RFC 3454 §7).

    Raises:
        ParameterSyntaxError: a prohibited character or a bidirectional-text violation.
    """
    mapped = "".join(" " if stringprep.in_table_c12(c) else c
                     for c in text if not stringprep.in_table_b1(c))
    result = unicodedata.normalize("NFKC", mapped)
    for c in result:
        if _prohibited(c):
            raise ParameterSyntaxError(f"character U+{ord(c):04X} is prohibited (SASLprep)")
        if stored and stringprep.in_table_a1(c):
            raise ParameterSyntaxError(f"character U+{ord(c):04X} is unassigned (SASLprep)")
    if any(stringprep.in_table_d1(c) for c in result) and (
            any(stringprep.in_table_d2(c) for c in result)
            or not stringprep.in_table_d1(result[0]) or not stringprep.in_table_d1(result[-1])):
        raise ParameterSyntaxError("mixed or badly placed right-to-left text (RFC 3454 §6)")
    return result


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ParameterSyntaxError(f"{what} is not UTF-8") from None


# --- PLAIN ------------------------------------------------------------------------------------


def parse_plain(message: bytes) -> tuple[str, str, str]:
    """Split a PLAIN message `[authzid] NUL authcid NUL passwd` (RFC 4616 §2) into
    (authzid, authcid, passwd), each SASLprep'ed.

    Raises:
        ParameterSyntaxError: not exactly three fields, an empty authcid or passwd, a field
            too long, not UTF-8, or a character SASLprep prohibits.
    """
    parts = message.split(b"\x00")
    if len(parts) != 3:
        raise ParameterSyntaxError("a PLAIN message is authzid NUL authcid NUL passwd")
    authzid, authcid, passwd = parts
    if not authcid or not passwd:
        raise ParameterSyntaxError("PLAIN needs a user name and a password")
    if len(authzid) > MAX_IDENTITY_OCTETS or len(authcid) > MAX_IDENTITY_OCTETS:
        raise ParameterSyntaxError(f"identities are limited to {MAX_IDENTITY_OCTETS} octets")
    if len(passwd) > MAX_PASSWORD_OCTETS:
        raise ParameterSyntaxError(f"passwords are limited to {MAX_PASSWORD_OCTETS} octets")
    zid = saslprep(_utf8(authzid, "authzid")) if authzid else ""
    cid = saslprep(_utf8(authcid, "authcid"))
    password = saslprep(_utf8(passwd, "password"))
    if not cid or not password:
        raise ParameterSyntaxError("PLAIN needs a user name and a password")
    return zid, cid, password


class PlainServer:
    """PLAIN, server side: one response, checked with `verify(user, password)`."""

    name = "PLAIN"

    def __init__(self, verify: PasswordVerifier) -> None:
        self._verify = verify
        self.user: str | None = None
        self._done = False

    def step(self, response: bytes | None) -> Challenge | Success:
        if self._done:
            raise ParameterSyntaxError("the PLAIN exchange is over")
        if response is None:
            return Challenge(b"")  # RFC 4422 §5: an empty challenge asks for the response
        self._done = True
        authzid, authcid, password = parse_plain(response)
        self.user = authcid
        if not self._verify(authcid, password):
            raise AuthenticationFailed("authentication failure: wrong user name or password")
        if authzid and authzid != authcid:
            # No proxy authorization here: a user acts as nobody but itself.
            raise AccessDenied(f"{authcid!r} may not act as {authzid!r}")
        return Success(authcid)


class PlainClient:
    """PLAIN, client side: sends everything in the initial response."""

    name = "PLAIN"

    def __init__(self, user: str, password: str, authzid: str = "") -> None:
        self.identity = authzid or user
        self._message = b"\x00".join(
            (saslprep(authzid).encode() if authzid else b"", saslprep(user).encode(),
             saslprep(password).encode()))

    def initial(self) -> bytes | None:
        return self._message

    def step(self, challenge: bytes) -> bytes:
        if challenge:
            raise AuthenticationFailed("PLAIN expects no challenge")
        return self._message

    def complete(self, data: bytes) -> None:
        if data:
            raise AuthenticationFailed("PLAIN has no additional data with success")


# --- ANONYMOUS --------------------------------------------------------------------------------


class AnonymousServer:
    """ANONYMOUS: anyone succeeds; the optional trace token is kept in `user` for the log."""

    name = "ANONYMOUS"

    def __init__(self) -> None:
        self.user: str | None = None

    def step(self, response: bytes | None) -> Challenge | Success:
        if response is None:
            return Challenge(b"")
        trace = _utf8(response, "trace information")
        if len(trace) > _MAX_TRACE_CHARS or any(c < " " or c == "\x7f" for c in trace):
            raise ParameterSyntaxError("trace information is at most 255 printable characters"
                                       " (RFC 4505 §3)")
        self.user = trace
        return Success("anonymous")


class AnonymousClient:
    """ANONYMOUS, client side, with an optional trace token (an email address, say)."""

    name = "ANONYMOUS"
    identity = "anonymous"

    def __init__(self, trace: str = "") -> None:
        self._trace = trace.encode("utf-8")

    def initial(self) -> bytes | None:
        return self._trace

    def step(self, challenge: bytes) -> bytes:
        return self._trace

    def complete(self, data: bytes) -> None:
        return None
