"""The MIME entity of a BEEP message: entity-headers, an empty line, then the body.

RFC 3080 §2.2: "each message may begin with entity-headers ... If none, or only some, of the
entity-headers are present: the default Content-Type is application/octet-stream; and, the
default Content-Transfer-Encoding is binary." A message with no headers therefore starts with a
bare CRLF (the "empty-header CRLF form"), and we send that form whenever both values are the
defaults. Channel zero always carries `application/beep+xml` (RFC 3080 §6.4).

Decoding is bounded (`MAX_HEADER_BLOCK_SIZE`) and strict about structure (header lines are
`name: value`, folded continuation lines are joined) but not about which headers appear: unknown
headers are kept for the profile to judge. Content-Transfer-Encoding is reported, not applied.

Both directions run once per message, so each has a shortcut that gives the same result as the
general code: decoding reads the usual header block -- one `Content-Type:` line -- in C where
that is built (`content_type_only` in `_speedups.c`; elsewhere the general loop reads it, and
tests/beep/test_fast_paths.py holds the two to one answer on arbitrary header blocks); encoding
keeps the header blocks of the parameterless content types it has
seen (a bounded table: a few, like `application/beep+xml`, are used again and again) and writes
the one `Content-Type` line of any other without the general loop.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from adapters import speedups
from common.errors import ReplyCode

from ._errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "BEEP_XML",
    "DEFAULT_CONTENT_TYPE",
    "DEFAULT_TRANSFER_ENCODING",
    "MAX_HEADER_BLOCK_SIZE",
    "EntityFields",
    "MimeEntity",
    "decode_entity",
    "decode_fields",
    "encode_entity",
    "media_type",
]

#: RFC 3080 §2.2: the Content-Type of a message that names none.
DEFAULT_CONTENT_TYPE = "application/octet-stream"
#: RFC 3080 §2.2: the Content-Transfer-Encoding of a message that names none.
DEFAULT_TRANSFER_ENCODING = "binary"
#: RFC 3080 §6.4: the media type of every channel-zero message.
BEEP_XML = "application/beep+xml"
#: Entity headers are a few dozen octets in practice; this stops a peer from making us scan a
#: multi-megabyte body for a blank line that is not there.
MAX_HEADER_BLOCK_SIZE = 8 * 1024

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_SAFE_VALUE = re.compile(r"[\x20-\x7e\t]*")
# The same octets, for `bytes.translate` to delete: what is left over is not a safe value.
_SAFE_OCTETS = bytes(range(0x20, 0x7F)) + b"\t"
_DEFAULT_CONTENT_TYPE_OCTETS = DEFAULT_CONTENT_TYPE.encode("ascii")
#: `content_type_only(payload, limit)`: a header block that is one `Content-Type:` line, in C
#: (None if not built). The value can't hold a CR, so the first CRLF CRLF is the one after it,
#: and the value is what `_SAFE_VALUE` accepts; anything else it declines (None).
_c = speedups.load("adapters.beep._speedups")
_content_type_only: Callable[[bytes, int], EntityFields | None] | None = \
    _c.content_type_only if _c is not None else None
#: Content types (with transfer encodings) whose encoded header block `encode_entity` keeps.
#: Only types without parameters are kept -- parameters are where per-message values live (a
#: multipart boundary) -- and no more than this many.
_HEADER_CACHE_SIZE = 64
_header_cache: dict[tuple[str, str], bytes] = {}


@dataclass(frozen=True, slots=True)
class MimeEntity:
    """A decoded message: its two significant headers, every header as received, and the body."""

    content_type: str
    transfer_encoding: str
    body: bytes
    #: `(name, value)` pairs in order of appearance, names as sent.
    headers: tuple[tuple[str, str], ...] = ()


def media_type(content_type: str) -> str:
    """`type/subtype` in lower case, without parameters: what to compare content types by."""
    return content_type.split(";", 1)[0].strip().lower()


def encode_entity(
    body: bytes,
    content_type: str = DEFAULT_CONTENT_TYPE,
    transfer_encoding: str = DEFAULT_TRANSFER_ENCODING,
) -> bytes:
    """The payload of a message: headers for the non-default values, CRLF, body."""
    head = _header_cache.get((content_type, transfer_encoding))
    if head is not None:
        return head + body
    if (transfer_encoding == DEFAULT_TRANSFER_ENCODING and type(content_type) is str
            and content_type.isascii()):
        # What `_header_block` makes of a non-default content type, without its loop and its
        # regular expression (`translate` leaves what `_SAFE_VALUE` would not match): the one
        # header it writes. Anything else goes there.
        raw = content_type.encode("ascii")
        if raw and not raw.translate(None, _SAFE_OCTETS) and (
                len(raw) != len(_DEFAULT_CONTENT_TYPE_OCTETS)  # a lower() copy spared
                or raw.lower() != _DEFAULT_CONTENT_TYPE_OCTETS):
            if ";" in content_type:  # not kept (see _HEADER_CACHE_SIZE): one join, one copy
                return b"".join((b"Content-Type: ", raw, b"\r\n\r\n", body))
            head = b"Content-Type: " + raw + b"\r\n\r\n"
    if head is None:
        head = _header_block(content_type, transfer_encoding)  # raises for a bad value
    if ";" not in content_type and len(_header_cache) < _HEADER_CACHE_SIZE:
        _header_cache[(content_type, transfer_encoding)] = head
    return head + body


def _header_block(content_type: str, transfer_encoding: str) -> bytes:
    headers = []
    for name, value, default in (
        ("Content-Type", content_type, DEFAULT_CONTENT_TYPE),
        ("Content-Transfer-Encoding", transfer_encoding, DEFAULT_TRANSFER_ENCODING),
    ):
        if not value or not _SAFE_VALUE.fullmatch(value):
            raise LocalProtocolError(f"{name} {value!r} is empty or not printable ASCII")
        if value.lower() != default:
            headers.append(f"{name}: {value}\r\n")
    return "".join(headers).encode("ascii") + b"\r\n"


def _malformed(text: str) -> RemoteProtocolError:
    # Whether this ends the session depends on the channel and on MSG versus reply
    # (RFC 3080 §2.2.2.1); the caller decides, so the error itself does not.
    return RemoteProtocolError(f"poorly-formed MIME entity: {text}", code=ReplyCode.SYNTAX_ERROR,
                               terminate=False)


#: `MimeEntity`'s fields in order, as `decode_fields()` returns them.
EntityFields = tuple[str, str, bytes, tuple[tuple[str, str], ...]]


def decode_entity(payload: bytes) -> MimeEntity:
    """Split a message into headers and body.

    Raises:
        RemoteProtocolError: no blank line ends the headers within `MAX_HEADER_BLOCK_SIZE`, or a
            header line is malformed (`terminate=False`: the caller decides).
    """
    return MimeEntity(*decode_fields(payload))


def decode_fields(payload: bytes) -> EntityFields:
    """`decode_entity()` as a plain tuple, for the once-per-message path: building a frozen
    `MimeEntity` would cost as much as the parse. Raises as `decode_entity()`."""
    if payload.startswith(b"\r\n"):
        return DEFAULT_CONTENT_TYPE, DEFAULT_TRANSFER_ENCODING, payload[2:], ()
    if _content_type_only is not None and type(payload) is bytes:
        fields: EntityFields | None = _content_type_only(payload, MAX_HEADER_BLOCK_SIZE)
        if fields is not None:
            return fields
    return _decode_general(payload)


def _decode_general(payload: bytes) -> EntityFields:
    """`decode_fields()` by the general loop alone: the definition its compiled one-header
    case is held to. Raises as `decode_entity()`."""
    if payload.startswith(b"\r\n"):
        return DEFAULT_CONTENT_TYPE, DEFAULT_TRANSFER_ENCODING, payload[2:], ()
    end = payload.find(b"\r\n\r\n", 0, MAX_HEADER_BLOCK_SIZE)
    if end < 0:
        raise _malformed("no empty line ends the entity headers")
    try:
        block = payload[:end].decode("ascii")
    except UnicodeDecodeError:
        raise _malformed("non-ASCII octets in the entity headers") from None
    headers: list[tuple[str, str]] = []
    for line in block.split("\r\n"):
        if line[:1] in (" ", "\t") and headers:
            # RFC 5322 §2.2.3 folding: a continuation of the previous header's value.
            name, value = headers[-1]
            headers[-1] = (name, f"{value} {line.strip()}")
            continue
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name) or not _SAFE_VALUE.fullmatch(value):
            raise _malformed(f"bad header line {line[:80]!r}")
        headers.append((name, value.strip()))
    content_type, transfer_encoding = DEFAULT_CONTENT_TYPE, DEFAULT_TRANSFER_ENCODING
    for name, value in headers:
        lowered = name.lower()
        if lowered == "content-type":
            content_type = value
        elif lowered == "content-transfer-encoding":
            transfer_encoding = value.lower()
    return content_type, transfer_encoding, payload[end + 4 :], tuple(headers)
