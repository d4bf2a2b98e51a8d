"""`multipart/related` (RFC 2387) as APEX uses it (RFC 3340 §4.1): the XML control document as
the start part, the data's content as a part named by `Content-ID` and referenced by a `cid:` URL.

Only what APEX needs: parameters of the top Content-Type, parts split on the boundary, each part's
headers; no nesting, no transfer decoding beyond the identity encodings (§4.1: "a
'transformative' Content-Transfer-Encoding ... should not be used"). Bounded: at most
`DEFAULT_MAX_PARTS` parts, `MAX_PART_HEADER_SIZE` octets of headers each.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass

from common.errors import OptionNotImplemented, ParameterSyntaxError, SyntaxError_

__all__ = [
    "DEFAULT_MAX_PARTS",
    "MULTIPART_RELATED",
    "Part",
    "content_type_params",
    "decode_related",
    "encode_related",
    "new_boundary",
    "new_content_id",
    "new_data_ids",
]

MULTIPART_RELATED = "multipart/related"
#: APEX sends the control document plus one content part; a few spare for peers that attach
#: more. Each part costs a header parse, so a hostile peer does not get thousands.
DEFAULT_MAX_PARTS = 8
#: A part's headers are a few lines (Content-Type, Content-ID, Content-Transfer-Encoding).
MAX_PART_HEADER_SIZE = 4096

# The quoted-string is "unrolled" ([^"\\]* runs between escapes): one step per run, not per
# character, which made this the costliest line of decoding a data.
_PARAM = re.compile(r';\s*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)\s*=\s*("[^"\\]*(?:\\.[^"\\]*)*"|[^;\s]*)')
_IDENTITY = {"binary", "8bit", "7bit"}
_QUOTED_PAIR = re.compile(r"\\(.)")
_HEADER_LINE = re.compile(rb"\r\n(?![ \t])")
_FOLD = re.compile(rb"\r\n[ \t]+")


@dataclass(frozen=True, slots=True)
class Part:
    """One body part: its content type, Content-ID (without angle brackets), and octets."""

    content_type: str
    content_id: str | None
    body: bytes


class _Unique:
    """128 random bits per process, then a counter: as unique as a fresh UUID4 each time
    (RFC 2045 §7, RFC 2046 §5.1.1) for a fraction of its cost, which a data paid three times."""

    def __init__(self) -> None:
        self._reseed()
        os.register_at_fork(after_in_child=self._reseed)  # a child must not repeat the parent

    def _reseed(self) -> None:
        self.prefix, self.counter = os.urandom(16).hex(), itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter):x}"


_unique = _Unique()


def new_content_id() -> str:
    """A globally unique Content-ID (RFC 2045 §7 wants one), without angle brackets."""
    return f"{_unique()}@apexps.invalid"


def new_data_ids() -> tuple[str, str, str]:
    """What encoding a data draws, in its order and in one call: the content's Content-ID, the
    start part's Content-ID, the boundary."""
    prefix, counter = _unique.prefix, _unique.counter  # three `_unique()` calls, inlined
    return (f"{prefix}{next(counter):x}@apexps.invalid",
            f"{prefix}{next(counter):x}@apexps.invalid",
            f"{prefix}{next(counter):x}")


def new_boundary() -> str:
    """A multipart boundary that no content is likely to hold (RFC 2046 §5.1.1)."""
    return _unique()


def content_type_params(content_type: str) -> tuple[str, dict[str, str]]:
    """`(type/subtype in lower case, {parameter: unquoted value})`."""
    media, semicolon, rest = content_type.partition(";")
    params: dict[str, str] = {}
    if not semicolon:
        return media.strip().lower(), params
    for name, raw in _PARAM.findall(";" + rest):
        value = raw
        if value.startswith('"'):
            value = value[1:-1]
            if "\\" in value:
                value = _QUOTED_PAIR.sub(r"\1", value)
        params[name.lower()] = value
    return media.strip().lower(), params


def _parse_part(raw: bytes) -> Part:
    if raw.startswith(b"\r\n"):  # no headers at all
        head, body = b"", raw[2:]
    else:
        head, sep, body = raw.partition(b"\r\n\r\n")
        if not sep:
            raise SyntaxError_("a multipart body part lacks the blank line after its headers")
    if len(head) > MAX_PART_HEADER_SIZE:
        raise SyntaxError_(f"body part headers exceed {MAX_PART_HEADER_SIZE} octets")
    headers: dict[str, str] = {}
    folded = b"\r\n " in head or b"\r\n\t" in head
    lines = (_HEADER_LINE.split(head) if folded else head.split(b"\r\n")) if head else []
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon:
            raise SyntaxError_("a body part header line lacks ':'")
        if folded:
            value = _FOLD.sub(b" ", value)
        headers[name.strip().decode("latin-1").lower()] = value.strip().decode("latin-1")
    encoding = headers.get("content-transfer-encoding", "binary").lower()
    if encoding not in _IDENTITY:
        raise OptionNotImplemented(f"Content-Transfer-Encoding {encoding[:40]!r} (RFC 3340 §4.1:"
                                   " BEEP is 8bit-wide, send binary)")
    cid = headers.get("content-id")
    if cid is not None:
        cid = cid.strip().removeprefix("<").removesuffix(">")
    return Part(headers.get("content-type", "text/plain"), cid, body)


def decode_related(content_type: str, body: bytes,
                   max_parts: int = DEFAULT_MAX_PARTS) -> tuple[Part, list[Part]]:
    """Split a multipart/related body into its start part and the others."""
    _, params = content_type_params(content_type)
    boundary = params.get("boundary", "")
    if not 1 <= len(boundary) <= 70:
        raise ParameterSyntaxError("multipart/related without a valid boundary parameter")
    delimiter = b"\r\n--" + boundary.encode("latin-1", "replace")
    chunks = (b"\r\n" + body).split(delimiter)
    if len(chunks) < 3:
        raise SyntaxError_("multipart body without a part and a closing delimiter")
    parts: list[Part] = []
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):
            break  # close delimiter; the epilogue is ignored
        if len(parts) == max_parts:
            raise ParameterSyntaxError(f"more than {max_parts} body parts")
        _, nl, rest = chunk.partition(b"\r\n")  # transport padding, then CRLF
        if not nl:
            raise SyntaxError_("a multipart delimiter line does not end with CRLF")
        parts.append(_parse_part(rest))
    else:
        raise SyntaxError_("multipart body without its closing delimiter")
    if not parts:
        raise ParameterSyntaxError("multipart/related without parts")
    start = params.get("start")
    if start is None:
        return parts[0], parts[1:]
    start = start.strip().removeprefix("<").removesuffix(">")
    for index, part in enumerate(parts):
        if part.content_id == start:
            return part, parts[:index] + parts[index + 1:]
    raise ParameterSyntaxError(f"no body part has the start Content-ID <{start[:60]}>")


def encode_related(start: Part, others: list[Part]) -> tuple[str, bytes]:
    """`(Content-Type header value, body)` of a multipart/related entity (§4.1's layout)."""
    boundary = new_boundary()
    out = bytearray()
    for part in (start, *others):
        out += f"--{boundary}\r\nContent-Type: {part.content_type}\r\n".encode("latin-1")
        if part is not start:
            out += b"Content-Transfer-Encoding: binary\r\n"
        if part.content_id is not None:
            out += f"Content-ID: <{part.content_id}>\r\n".encode("latin-1")
        out += b"\r\n" + part.body + b"\r\n"
    out += f"--{boundary}--\r\n".encode("latin-1")
    content_type = (f'{MULTIPART_RELATED}; boundary="{boundary}"; start="<{start.content_id}>";'
                    f' type="{start.content_type}"')
    return content_type, bytes(out)
