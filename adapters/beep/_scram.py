"""SCRAM-SHA-256 (RFC 5802 with RFC 7677's hash): pure functions, the server and client
mechanisms, and the stored credentials (`Users`) both SCRAM and PLAIN check against.

Theory of operation
-------------------
The server never keeps a password: per user it keeps the salt, the iteration count, StoredKey =
H(HMAC(SaltedPassword, "Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key") --
PostgreSQL's `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` text format. A SCRAM
client proves it knows SaltedPassword without sending it, and checks the server's signature in
return; a PLAIN client sends the password (over TLS only), which the server salts and hashes to
compare with StoredKey. So one users file serves both mechanisms.

Channel binding is not offered (no SCRAM-SHA-256-PLUS): a client flag "n" or "y" is fine, "p="
is refused. A user name the directory does not know gets made-up credentials derived from a
per-process secret, so the exchange fails at the proof like a wrong password does (RFC 5802 §9:
don't reveal which users exist). Randomness (nonces, salts) is injectable for tests.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

from common.errors import (
    AccessDenied,
    AuthenticationFailed,
    ConfigError,
    ParameterSyntaxError,
)

from ._sasl import (
    MAX_IDENTITY_OCTETS,
    MAX_PASSWORD_OCTETS,
    Challenge,
    PasswordVerifier,
    Success,
    saslprep,
)

__all__ = [
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "MIN_ITERATIONS",
    "ScramClient",
    "ScramCredentials",
    "ScramServer",
    "ScramUsers",
    "Users",
    "Verifier",
    "new_nonce",
    "password_verifier",
]

#: RFC 7677 §4: "the hash iteration-count ... SHOULD be at least 4096".
MIN_ITERATIONS = 4096
#: What `Users.add` uses: four times the floor. PLAIN makes the server pay this once per login on
#: its event loop (about 15 ms here), which is why it is not OWASP's 600000.
DEFAULT_ITERATIONS = 16384
#: A server may ask for more; a client refuses beyond this, so a hostile server cannot make it
#: spin for minutes.
MAX_ITERATIONS = 1_000_000
#: RFC 5802 §5: "printable ASCII except ','".
_NONCE = re.compile(r"[\x21-\x2b\x2d-\x7e]{8,256}")
_SALT_OCTETS = 16
_NAME = "SCRAM-SHA-256"
_PREFIX = f"{_NAME}$"
#: Made-up credentials for unknown users derive from this; a restart changes them, harmlessly.
_MOCK_SECRET = secrets.token_bytes(32)


def new_nonce() -> str:
    """A fresh random nonce (24 octets of entropy, URL-safe base64: never a comma)."""
    return secrets.token_urlsafe(24)


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, "sha256")


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ParameterSyntaxError(f"{what} is not base64") from None
    # Canonical only: a proof or signature has exactly one spelling, so no octet of the
    # message can change unnoticed (non-zero padding bits are otherwise ignored).
    if _b64(data) != text:
        raise ParameterSyntaxError(f"{what} is not canonical base64")
    return data


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(Normalize(password), salt, i) of RFC 5802 §2.2: PBKDF2-HMAC-SHA-256."""
    return hashlib.pbkdf2_hmac("sha256", saslprep(password).encode("utf-8"), salt, iterations)


@dataclass(frozen=True, slots=True)
class ScramCredentials:
    """What the server keeps for one user (RFC 5802 §3)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def derive(cls, password: str, salt: bytes, iterations: int = DEFAULT_ITERATIONS
               ) -> ScramCredentials:
        if iterations < MIN_ITERATIONS:
            raise ConfigError(f"SCRAM needs at least {MIN_ITERATIONS} iterations (RFC 7677)")
        salted = salted_password(password, salt, iterations)
        return cls(salt, iterations, _h(_hmac(salted, b"Client Key")),
                   _hmac(salted, b"Server Key"))

    def verify_password(self, password: str) -> bool:
        """Does `password` (as PLAIN sends it) produce these credentials?"""
        salted = salted_password(password, self.salt, self.iterations)
        return hmac.compare_digest(_h(_hmac(salted, b"Client Key")), self.stored_key)

    def format(self) -> str:
        return (f"{_PREFIX}{self.iterations}:{_b64(self.salt)}"
                f"${_b64(self.stored_key)}:{_b64(self.server_key)}")

    @classmethod
    def parse(cls, text: str) -> ScramCredentials:
        """Parse `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.

        Raises:
            ConfigError: anything else.
        """
        match = re.fullmatch(r"SCRAM-SHA-256\$([0-9]{1,9}):([^$:]+)\$([^$:]+):([^$:]+)", text)
        if match is None:
            raise ConfigError("expected SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:"
                              "<ServerKey>")
        try:
            salt, stored, server = (base64.b64decode(match.group(i), validate=True)
                                    for i in (2, 3, 4))
        except (binascii.Error, ValueError):
            raise ConfigError("salt and keys must be base64") from None
        iterations = int(match.group(1))
        if iterations < MIN_ITERATIONS or len(stored) != 32 or len(server) != 32 or not salt:
            raise ConfigError(f"at least {MIN_ITERATIONS} iterations, a salt and 32-octet keys"
                              " are needed")
        return cls(salt, iterations, stored, server)


def _mock(user: str) -> ScramCredentials:
    seed = _hmac(_MOCK_SECRET, user.encode("utf-8"))
    return ScramCredentials(seed[:_SALT_OCTETS], MIN_ITERATIONS, _h(seed), _hmac(seed, b"k"))


@runtime_checkable
class ScramUsers(Protocol):
    """A user directory that can serve SCRAM (and, through `password_verifier`, PLAIN)."""

    def scram_credentials(self, user: str) -> ScramCredentials | None: ...


#: What a shell supplies to authenticate peers: a bare `verify(user, password) -> bool` (PLAIN
#: only) or a `ScramUsers` directory (SCRAM-SHA-256 and PLAIN).
Verifier = PasswordVerifier | ScramUsers


def password_verifier(verifier: Verifier) -> PasswordVerifier:
    """The `verify(user, password)` PLAIN needs, from either kind of verifier."""
    if not isinstance(verifier, ScramUsers):
        return verifier
    users = verifier

    def verify(user: str, password: str) -> bool:
        creds = users.scram_credentials(user)
        if creds is None:
            _mock(user).verify_password(password)  # the same work, so timing tells nothing
            return False
        return creds.verify_password(password)

    return verify


# --- message syntax ---------------------------------------------------------------------------


def _saslname_decode(text: str) -> str:
    # RFC 5802 §5.1: "=2C" and "=3D" stand for "," and "="; any other "=" is an error.
    if re.search(r"=(?!2C|3D)", text):
        raise ParameterSyntaxError("'=' in a user name must be =2C or =3D (RFC 5802 §5.1)")
    return text.replace("=2C", ",").replace("=3D", "=")


def _saslname_encode(text: str) -> str:
    return text.replace("=", "=3D").replace(",", "=2C")


def _attributes(message: str, what: str) -> Iterator[tuple[str, str]]:
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isascii() or not part[0].isalpha():
            raise ParameterSyntaxError(f"{what}: {part[:40]!r} is not attr=value")
        yield part[0], part[2:]


def _text(data: bytes, what: str) -> str:
    if len(data) > 2048:
        raise ParameterSyntaxError(f"{what} is too long")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ParameterSyntaxError(f"{what} is not UTF-8") from None


def _identity(text: str, what: str) -> str:
    name = saslprep(_saslname_decode(text))
    if not name or len(name.encode("utf-8")) > MAX_IDENTITY_OCTETS:
        raise ParameterSyntaxError(f"{what} must be 1 to {MAX_IDENTITY_OCTETS} octets")
    return name


class _Step(Enum):
    FIRST = "awaiting client-first"
    FINAL = "awaiting client-final"
    DONE = "done"


class ScramServer:
    """SCRAM-SHA-256, server side, over a `lookup(user) -> ScramCredentials | None`."""

    name = _NAME

    def __init__(self, lookup: Callable[[str], ScramCredentials | None],
                 nonce: Callable[[], str] = new_nonce) -> None:
        self._lookup, self._nonce = lookup, nonce
        self.user: str | None = None
        self._step = _Step.FIRST
        self._authzid = ""
        self._gs2 = self._first_bare = self._server_first = self._combined = ""
        self._creds: ScramCredentials | None = None
        self._known = False

    def step(self, response: bytes | None) -> Challenge | Success:
        if self._step is _Step.FIRST:
            if response is None:
                return Challenge(b"")
            return self._first(_text(response, "client-first-message"))
        if self._step is _Step.FINAL and response is not None:
            self._step = _Step.DONE
            return self._final(_text(response, "client-final-message"))
        raise ParameterSyntaxError(f"the SCRAM exchange is {self._step.value}")

    def _first(self, message: str) -> Challenge:
        flag, sep, rest = message.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep or not sep2:
            raise ParameterSyntaxError("client-first-message lacks its GS2 header")
        if flag.startswith("p="):
            raise AuthenticationFailed("channel binding is not supported (no SCRAM-SHA-256-PLUS)")
        if flag not in ("n", "y"):
            raise ParameterSyntaxError("GS2 channel-binding flag must be n, y or p=")
        if authzid:
            if not authzid.startswith("a="):
                raise ParameterSyntaxError("GS2 authzid must be a=...")
            self._authzid = _identity(authzid[2:], "authzid")
        attrs = list(_attributes(bare, "client-first-message"))
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            if attrs and attrs[0][0] == "m":
                raise ParameterSyntaxError("mandatory extension m= is not supported")
            raise ParameterSyntaxError("client-first-message must be n=user,r=nonce")
        user, client_nonce = _identity(attrs[0][1], "user name"), attrs[1][1]
        if not _NONCE.fullmatch(client_nonce):
            raise ParameterSyntaxError("client nonce must be 8-256 printable characters")
        self.user = user
        creds = self._lookup(user)
        self._known = creds is not None
        self._creds = creds or _mock(user)
        server_nonce = self._nonce()
        if not _NONCE.fullmatch(server_nonce):  # pragma: no cover - our own factory
            raise ValueError("server nonce must be printable ASCII without ','")
        self._gs2 = f"{flag},{authzid},"
        self._first_bare = bare
        self._combined = client_nonce + server_nonce
        self._server_first = (f"r={self._combined},s={_b64(self._creds.salt)},"
                              f"i={self._creds.iterations}")
        self._step = _Step.FINAL
        return Challenge(self._server_first.encode("ascii"))

    def _final(self, message: str) -> Success:
        without_proof, sep, proof_attr = message.rpartition(",")
        if not sep or not proof_attr.startswith("p="):
            raise ParameterSyntaxError("client-final-message must end with p=proof")
        attrs = list(_attributes(without_proof, "client-final-message"))
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise ParameterSyntaxError("client-final-message must be c=...,r=...,p=...")
        if _unb64(attrs[0][1], "channel binding") != self._gs2.encode("utf-8"):
            raise AuthenticationFailed("channel binding data does not match the GS2 header")
        if attrs[1][1] != self._combined:
            raise AuthenticationFailed("nonce does not match")
        proof = _unb64(proof_attr[2:], "proof")
        assert self._creds is not None
        auth = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        if len(proof) != 32:
            raise AuthenticationFailed("authentication failure: invalid proof")
        client_key = _xor(proof, _hmac(self._creds.stored_key, auth))
        if not (hmac.compare_digest(_h(client_key), self._creds.stored_key) and self._known):
            raise AuthenticationFailed("authentication failure: wrong user name or password")
        assert self.user is not None
        if self._authzid and self._authzid != self.user:
            raise AccessDenied(f"{self.user!r} may not act as {self._authzid!r}")
        signature = _hmac(self._creds.server_key, auth)
        return Success(self.user, f"v={_b64(signature)}".encode("ascii"))


class ScramClient:
    """SCRAM-SHA-256, client side."""

    name = _NAME

    def __init__(self, user: str, password: str, authzid: str = "",
                 nonce: Callable[[], str] = new_nonce) -> None:
        if len(password.encode("utf-8")) > MAX_PASSWORD_OCTETS:
            raise ParameterSyntaxError("password too long")
        self.identity = authzid or user
        self._password = password
        self._nonce = nonce()
        zid = f"a={_saslname_encode(saslprep(authzid))}" if authzid else ""
        self._gs2 = f"n,{zid},"
        self._first_bare = f"n={_saslname_encode(saslprep(user))},r={self._nonce}"
        self._signature: bytes | None = None

    def initial(self) -> bytes | None:
        return (self._gs2 + self._first_bare).encode("utf-8")

    def step(self, challenge: bytes) -> bytes:
        if self._signature is not None:
            raise AuthenticationFailed("the server sent a second SCRAM challenge")
        server_first = _text(challenge, "server-first-message")
        attrs = dict(list(_attributes(server_first, "server-first-message"))[:3])
        if "m" in attrs or not {"r", "s", "i"} <= set(attrs):
            raise AuthenticationFailed("server-first-message must be r=...,s=...,i=...")
        combined, salt = attrs["r"], _unb64(attrs["s"], "salt")
        if not combined.startswith(self._nonce) or len(combined) == len(self._nonce):
            raise AuthenticationFailed("the server's nonce does not extend ours")
        if not attrs["i"].isdigit() or not MIN_ITERATIONS <= int(attrs["i"]) <= MAX_ITERATIONS:
            raise AuthenticationFailed(f"iteration count must be {MIN_ITERATIONS}.."
                                       f"{MAX_ITERATIONS}")
        salted = salted_password(self._password, salt, int(attrs["i"]))
        without_proof = f"c={_b64(self._gs2.encode('utf-8'))},r={combined}"
        auth = f"{self._first_bare},{server_first},{without_proof}".encode()
        client_key = _hmac(salted, b"Client Key")
        proof = _xor(client_key, _hmac(_h(client_key), auth))
        self._signature = _hmac(_hmac(salted, b"Server Key"), auth)
        return f"{without_proof},p={_b64(proof)}".encode("ascii")

    def complete(self, data: bytes) -> None:
        """Check the server's signature; raise if the server does not know our password."""
        text = _text(data, "server-final-message")
        if self._signature is None:
            raise AuthenticationFailed("the server claimed success before the SCRAM exchange")
        if text.startswith("e="):
            raise AuthenticationFailed(f"the server says: {text[2:80]}")
        if not text.startswith("v=") or not hmac.compare_digest(
                _unb64(text[2:].split(",")[0], "verifier"), self._signature):
            raise AuthenticationFailed("the server's SCRAM signature is wrong: it does not know"
                                       " the password (an impostor?)")


# --- the users file ---------------------------------------------------------------------------

_USER_NAME = re.compile(r"[^\s:/\x00-\x1f\x7f]+")


class Users:
    """User name -> `ScramCredentials`; the directory `apexps users add` writes.

    One line per user, `name:SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`; blank
    lines and lines starting with "#" are ignored. Names are SASLprep'ed, with no ":", "/" or
    white space.
    """

    def __init__(self, entries: Mapping[str, ScramCredentials] | None = None) -> None:
        self._entries = dict(entries or {})

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, user: object) -> bool:
        return user in self._entries

    def scram_credentials(self, user: str) -> ScramCredentials | None:
        return self._entries.get(user)

    def verify(self, user: str, password: str) -> bool:
        return password_verifier(self)(user, password)

    @staticmethod
    def check_name(name: str) -> str:
        """The prepared form of user name `name`; ConfigError if it cannot be one."""
        try:
            prepared = saslprep(name, stored=True)
        except ParameterSyntaxError as exc:
            raise ConfigError(f"user name {name!r}: {exc}") from None
        if not _USER_NAME.fullmatch(prepared) or len(prepared.encode()) > MAX_IDENTITY_OCTETS:
            raise ConfigError(f"user name {name!r} must be 1 to {MAX_IDENTITY_OCTETS} octets"
                              " without ':', '/' or white space")
        return prepared

    def add(self, name: str, password: str, *, iterations: int = DEFAULT_ITERATIONS,
            salt: bytes | None = None) -> None:
        """Add or replace `name` with credentials derived from `password`."""
        if not password:
            raise ConfigError("the password is empty")
        try:
            prepared_password = saslprep(password, stored=True)
        except ParameterSyntaxError as exc:
            raise ConfigError(f"password: {exc}") from None
        if len(prepared_password.encode()) > MAX_PASSWORD_OCTETS:
            raise ConfigError(f"passwords are limited to {MAX_PASSWORD_OCTETS} octets")
        self._entries[self.check_name(name)] = ScramCredentials.derive(
            prepared_password, salt if salt is not None else secrets.token_bytes(_SALT_OCTETS),
            iterations)

    @classmethod
    def parse(cls, text: str) -> Users:
        """Read a users file's text; ConfigError names the first bad line."""
        entries: dict[str, ScramCredentials] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, creds = line.partition(":")
            try:
                if not sep:
                    raise ConfigError("expected name:SCRAM-SHA-256$...")
                if cls.check_name(name) != name:
                    raise ConfigError(f"user name {name!r} is not in SASLprep form")
                if name in entries:
                    raise ConfigError(f"user {name!r} appears twice")
                entries[name] = ScramCredentials.parse(creds)
            except ConfigError as exc:
                raise ConfigError(f"users file line {number}: {exc}") from None
        return cls(entries)

    def format(self) -> str:
        return "".join(f"{name}:{creds.format()}\n"
                       for name, creds in sorted(self._entries.items()))
