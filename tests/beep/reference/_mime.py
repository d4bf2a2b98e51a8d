"""The MIME entity of a BEEP message: entity-headers, an empty line, then the body.

RFC 3080 §2.2: "each message may begin with entity-headers ... If none, or only some, of the
entity-headers are present: the default Content-Type is application/octet-stream; and, the
default Content-Transfer-Encoding is binary." A message with no headers therefore starts with a
bare CRLF (the "empty-header CRLF form"), and we send that form whenever both values are the
defaults. Channel zero always carries `application/beep+xml` (RFC 3080 §6.4).

Decoding is bounded (`MAX_HEADER_BLOCK_SIZE`) and strict about structure (header lines are
`name: value`, folded continuation lines are joined) but not about which headers appear: unknown
headers are kept for the profile to judge. Content-Transfer-Encoding is reported, not applied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from adapters.beep._errors import LocalProtocolError, RemoteProtocolError
from broker.errors import ReplyCode

__all__ = [
    "BEEP_XML",
    "DEFAULT_CONTENT_TYPE",
    "DEFAULT_TRANSFER_ENCODING",
    "MAX_HEADER_BLOCK_SIZE",
    "MimeEntity",
    "decode_entity",
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
    headers = []
    for name, value, default in (
        ("Content-Type", content_type, DEFAULT_CONTENT_TYPE),
        ("Content-Transfer-Encoding", transfer_encoding, DEFAULT_TRANSFER_ENCODING),
    ):
        if not value or not _SAFE_VALUE.fullmatch(value):
            raise LocalProtocolError(f"{name} {value!r} is empty or not printable ASCII")
        if value.lower() != default:
            headers.append(f"{name}: {value}\r\n")
    return "".join(headers).encode("ascii") + b"\r\n" + body


def _malformed(text: str) -> RemoteProtocolError:
    # Whether this ends the session depends on the channel and on MSG versus reply
    # (RFC 3080 §2.2.2.1); the caller decides, so the error itself does not.
    return RemoteProtocolError(f"poorly-formed MIME entity: {text}", code=ReplyCode.SYNTAX_ERROR,
                               terminate=False)


def decode_entity(payload: bytes) -> MimeEntity:
    """Split a message into headers and body.

    Raises:
        RemoteProtocolError: no blank line ends the headers within `MAX_HEADER_BLOCK_SIZE`, or a
            header line is malformed (`terminate=False`: the caller decides).
    """
    if payload.startswith(b"\r\n"):
        return MimeEntity(DEFAULT_CONTENT_TYPE, DEFAULT_TRANSFER_ENCODING, payload[2:])
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
    return MimeEntity(content_type, transfer_encoding, payload[end + 4 :], tuple(headers))
