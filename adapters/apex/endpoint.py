"""APEX endpoint names (RFC 3340 §2.2) and how two of them compare (§2.2.1).

    entity     = local "@" Domain
    local      = address [ "/" subaddress ]
    token      = 1*(%x20-2E / %x30-3F / %x41-7E / UTF-8)   ; no "/", "@" or controls

The domain is an RFC 2821 `Domain`: a dotted FQDN of letter-digit-hyphen labels, or an address
literal in brackets ("[10.0.0.1]"). The local part is compared exactly (§2.2.1: "fred" and
"Fred" are different endpoints); the domain, being a DNS name, case-insensitively, so `Endpoint`
keeps the domain lower-cased and dataclass equality is the RFC's comparison. The `apex:` URL
form is decoded first ("apex:f%72ed@example.com" is "fred@example.com").
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import unquote

from common.errors import InvalidParameter

__all__ = ["MAX_ENDPOINT_LENGTH", "Endpoint"]

#: Endpoint names travel in XML attributes and log lines; SMTP caps a path at 256 octets
#: (RFC 2821 §4.5.3.1) and nothing in APEX needs more, so neither do we.
MAX_ENDPOINT_LENGTH = 1024

_TOKEN = re.compile(r"[^\x00-\x1f\x7f/@]+")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_FQDN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_LITERAL = re.compile(r"\[[\x21-\x5a\x5e-\x7e]+\]")  # RFC 2821 dcontent, without "[\]"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """`address[/subaddress]@domain`; build with `parse()` unless the parts are known good."""

    address: str
    domain: str
    subaddress: str | None = None

    def __post_init__(self) -> None:
        for part in (self.address, self.subaddress):
            if part is not None and not _TOKEN.fullmatch(part):
                raise InvalidParameter(f"endpoint local part {part!r} is not an RFC 3340 token")
        if not (_FQDN.fullmatch(self.domain) or _LITERAL.fullmatch(self.domain)):
            raise InvalidParameter(f"{self.domain!r} is not a domain or address literal")
        object.__setattr__(self, "domain", self.domain.lower())

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """Parse `text`; raise `InvalidParameter` (553) if it is not an endpoint."""
        if cls is Endpoint:
            return _parse_cached(text)
        return cls._parse(text)

    @classmethod
    def _parse(cls, text: str) -> Endpoint:
        if len(text) > MAX_ENDPOINT_LENGTH:
            raise InvalidParameter(f"endpoint longer than {MAX_ENDPOINT_LENGTH} characters")
        if text.startswith("apex:"):
            try:
                text = unquote(text[5:], errors="strict")
            except UnicodeDecodeError:
                raise InvalidParameter("apex: URL escapes are not UTF-8") from None
        local, at, domain = text.rpartition("@")
        if not at:
            raise InvalidParameter(f"endpoint {text!r} has no '@domain'")
        address, slash, subaddress = local.partition("/")
        return cls(address, domain, subaddress if slash else None)

    @property
    def local(self) -> str:
        """The local part, subaddress included."""
        if self.subaddress is None:
            return self.address
        return f"{self.address}/{self.subaddress}"

    @property
    def base(self) -> Endpoint:
        """The endpoint this is a subaddress of ("fred/appl=wb@x" -> "fred@x"); else itself."""
        return Endpoint(self.address, self.domain) if self.subaddress is not None else self

    @property
    def is_well_known(self) -> bool:
        """Reserved for IANA-registered APEX services (the "apex=" convention)."""
        return self.address.startswith("apex=")

    def __str__(self) -> str:
        return f"{self.local}@{self.domain}"


#: The same few endpoints name the parties of every data (each parse costs a few microseconds
#: of regex work); bounded, so names a peer makes up only push older ones out.
_parse_cached = functools.lru_cache(maxsize=4096)(Endpoint._parse)
