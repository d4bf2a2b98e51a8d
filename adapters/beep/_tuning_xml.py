"""The tuning profiles' vocabulary (RFC 3080 §3.1 and §4.1, DTDs in §7.2 and §7.3): XML <->
frozen dataclasses.

Theory of operation
-------------------
The TLS profile exchanges `ready` (MSG, or piggybacked in the `start`) for `proceed` (RPY) or
`error` (ERR, or piggybacked in the `profile` reply). The SASL family exchanges `blob` elements,
whose content is always base64 (§4.1.2), with an optional `status` of abort (client),
complete (server) or continue (either), and `error` for failure. Both arrive from a peer that has
not authenticated yet, so they go through the same hardened parser as channel zero, with a far
smaller size limit: nothing in a tuning exchange needs more than a few hundred octets.

Errors carry RFC 3080 §8 codes as `RemoteProtocolError(terminate=False)`: 500 for XML that does
not parse, 501 for XML that parses but is not valid per the DTD (including a `version` that is not
a version and base64 that is not base64). The caller answers with an `error` element; no state
changes.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from enum import StrEnum

from lxml import etree

from common.errors import ReplyCode
from common.xml_safe import UnsafeXml, parse_hardened

from ._errors import RemoteProtocolError
from ._management import Error, Profile, ProfileEncoding, parse_management, serialize

__all__ = [
    "MAX_TUNING_MESSAGE_SIZE",
    "SASL_PROFILE_PREFIX",
    "TLS_PROFILE",
    "Blob",
    "BlobStatus",
    "Proceed",
    "Ready",
    "TuningMessage",
    "parse_tuning",
    "profile_xml",
    "serialize_tuning",
]

#: RFC 3080 §3.1.1.
TLS_PROFILE = "http://iana.org/beep/TLS"
#: RFC 3080 §4.1.1: "http://iana.org/beep/SASL/mechanism".
SASL_PROFILE_PREFIX = "http://iana.org/beep/SASL/"

#: Largest tuning message (a MSG or reply body on a TLS or SASL channel). A piggybacked element
#: is capped at 4K by RFC 3080 §2.3.1.2; a SCRAM exchange stays under 500 octets. Twice the
#: piggyback limit leaves room for a long password in PLAIN and nothing for a flood.
MAX_TUNING_MESSAGE_SIZE = 8192

_VERSION = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){0,2}")
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_ASCII_SPACE = re.compile(rb"[ \t\r\n]+")


class BlobStatus(StrEnum):
    """The `status` attribute of a `blob` (RFC 3080 §4.1.3)."""

    #: "used by a client to indicate that it is aborting the authentication process".
    ABORT = "abort"
    #: "used by a server to indicate that the exchange is complete and successful".
    COMPLETE = "complete"
    #: "used by either a client or server, otherwise" (the DTD's default).
    CONTINUE = "continue"


@dataclass(frozen=True, slots=True)
class Ready:
    """`ready`: the sender wants TLS, `version` being the earliest it accepts (§3.1.3.1)."""

    version: str = "1"


@dataclass(frozen=True, slots=True)
class Proceed:
    """`proceed`: the receiver of `ready` agrees; both close every channel and negotiate."""


@dataclass(frozen=True, slots=True)
class Blob:
    """`blob`: one SASL challenge or response (decoded from base64) and its status."""

    data: bytes = b""
    status: BlobStatus = BlobStatus.CONTINUE


TuningMessage = Ready | Proceed | Blob | Error


def _invalid(text: str) -> RemoteProtocolError:
    return RemoteProtocolError(text, code=ReplyCode.PARAMETER_SYNTAX_ERROR, terminate=False)


def _only(attrs: dict[str, str], allowed: set[str], tag: str) -> None:
    unknown = set(attrs) - allowed
    if unknown:
        raise _invalid(f"unexpected attribute {sorted(unknown)[0][:40]!r} in <{tag}>")


def _empty(elem: etree._Element, tag: str) -> None:
    if len(elem) or (elem.text or "").strip():
        raise _invalid(f"<{tag}> is EMPTY (RFC 3080 §7)")


def parse_tuning(payload: bytes, max_size: int = MAX_TUNING_MESSAGE_SIZE) -> TuningMessage:
    """Parse one tuning element (without MIME headers).

    Raises:
        RemoteProtocolError: 500 if not well-formed (or too big, or it declares a DTD), 501 if
            not valid per RFC 3080 §7.2/§7.3. Always `terminate=False`.
    """
    try:
        root = parse_hardened(payload, max_bytes=max_size, max_depth=2,
                              what="tuning message")
    except UnsafeXml as exc:
        raise RemoteProtocolError(str(exc), code=ReplyCode.SYNTAX_ERROR,
                                  terminate=False) from None
    tag = root.tag
    attrs = {str(k): str(v) for k, v in root.attrib.items()}
    if tag == "ready":
        _only(attrs, {"version"}, "ready")
        _empty(root, "ready")
        version = attrs.get("version", "1")
        if not _VERSION.fullmatch(version):
            raise _invalid("version attribute\r\npoorly formed in <ready> element")
        return Ready(version)
    if tag == "proceed":
        _only(attrs, set(), "proceed")
        _empty(root, "proceed")
        return Proceed()
    if tag == "blob":
        _only(attrs, {"status", _XML_SPACE}, "blob")
        if len(root):
            raise _invalid("<blob> may contain only base64 text")
        try:
            status = BlobStatus(attrs.get("status", "continue"))
        except ValueError:
            raise _invalid("status attribute of <blob> must be abort, complete or"
                           " continue") from None
        if attrs.get(_XML_SPACE, "preserve") not in ("default", "preserve"):
            raise _invalid("xml:space of <blob> must be default or preserve")
        text = _ASCII_SPACE.sub(b"", (root.text or "").encode("utf-8"))
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise _invalid("<blob> content is not base64 (RFC 3080 §4.1.2)") from None
        return Blob(data, status)
    if tag == "error":
        message = parse_management(payload, max_size)
        assert isinstance(message, Error)
        return message
    raise _invalid(f"unexpected element <{str(tag)[:40]}> in a tuning exchange")


def serialize_tuning(message: TuningMessage) -> bytes:
    """The XML of one tuning element, in the RFC's layout (single quotes, " />")."""
    if isinstance(message, Ready):
        if message.version == "1":
            return b"<ready />"
        if not _VERSION.fullmatch(message.version):
            raise ValueError(f"{message.version!r} is not a TLS version")
        return f"<ready version='{message.version}' />".encode("ascii")
    if isinstance(message, Proceed):
        return b"<proceed />"
    if isinstance(message, Blob):
        status = "" if message.status is BlobStatus.CONTINUE else f" status='{message.status}'"
        if not message.data:
            return f"<blob{status} />".encode("ascii")
        data = base64.b64encode(message.data).decode("ascii")
        return f"<blob{status}>{data}</blob>".encode("ascii")
    return serialize(message).rstrip(b"\r\n")


def profile_xml(profile: Profile) -> bytes:
    """The piggybacked tuning element a `profile` carries (b"" if none), base64 undone."""
    if profile.encoding is ProfileEncoding.BASE64:
        try:
            return base64.b64decode(profile.content, validate=True)
        except (binascii.Error, ValueError):
            raise _invalid("profile content marked base64 is not base64") from None
    return profile.content.encode("utf-8")
