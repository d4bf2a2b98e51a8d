"""A data operation in its canonical layout, read and written without the MIME parser or lxml.

Theory of operation
-------------------
Nearly every data a relay sees was written by `encode()` -- ours, or a peer's copying RFC 3340
§4.1's example: a two-part `multipart/related` entity, the control document first with one
`originator` and one or more `recipient`s and no option, the content second. Decoding that
through `_multipart` and lxml cost about 50 µs, a quarter of what a relay spent on a data.
`match_data` recognises exactly that layout with a few compiled regexes and `bytes.find`s and
returns its pieces; `_codec` turns them into a `Data`. Anything else, however legitimate, is
declined (None) and goes the general way, which stays the one definition of what is accepted.

The contract: `match_data` accepts only input the general path accepts with an equal result.
Each guard below exists for one clause of that:

* The entity's Content-Type is matched whole, with quoted `boundary` and `start` values of
  characters that need no unquoting, so `content_type_params` would find the same three
  parameters (it would read more layouts; we do not).
* The general path splits `CRLF + body` on every `CRLF--boundary`, whatever follows it, and
  treats a part beginning with `--` as the close delimiter. So the first delimiter after the
  start part's headers must be the one closing the control document, and the next one must be
  the close delimiter that ends the body: a content holding `CRLF--boundary` is declined. The
  `find`s start early enough to see a delimiter straddling a header block's last CRLF.
* Header blocks are literal (names in our spelling, one space after the colon, `binary`), their
  values hold no CR or LF (no folding, no blank line ends them early) and no leading or
  trailing blank (the general path strips), and are short enough for `MAX_PART_HEADER_SIZE`.
* Content-IDs and the `start` value are of a class without `%` (`unquote` of `cid:` is then the
  identity), `<`, `>` (nothing to strip), quotes, `&` or blanks; the start part's Content-ID
  must equal `start`, the content part's must equal the `cid:` of the `content` attribute.
* The control document: `<data content='cid:…'>`, an `<originator identity='…' />`, one or
  more `<recipient identity='…' />`, `</data>`, with XML white space (never `\\f` or `\\v`,
  which XML forbids) where XML allows it. Attribute values exclude `&`, `<`, `>`, both quotes
  and every control character, so no entity, declaration, comment or markup can hide in them
  and lxml's attribute-value normalisation has nothing to change: the text is the value. The
  document must be strict UTF-8 (lxml refuses the rest) without U+FFFE or U+FFFF (not XML
  characters); C1 controls, which XML allows, are declined too.

The endpoints are parsed here (`Endpoint.parse`; one that does not parse is declined), cached
with the text they came from. The caller passes the control document's size limit (checked
before any regex runs over it); the other limits are `_codec`'s to check.

Where the optional C twin is built (`_speedups.c`, see `adapters.speedups`), it does every check
above but the parties' and hands back the pieces; `match_data_python` stays the definition and
decides whatever the C leaves open (a control document that is not ASCII), and
tests/apex/test_canonical_speedups.py holds the two to the same answers on arbitrary input.

Writing (`write_data`) produces the layout `_multipart.encode_related` does, octet for octet.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Literal, NamedTuple

from adapters import speedups
from broker.errors import InvalidParameter

from ._endpoint import Endpoint

__all__ = ["FAST_CONTENT_TYPE_PREFIX", "DataLayout", "match_data", "match_data_python",
           "write_data"]

#: What the Content-Type of every entity `match_data` could accept starts with.
FAST_CONTENT_TYPE_PREFIX = 'multipart/related; boundary="'
#: Longest Content-ID (and `start`) accepted; keeps either header block far below
#: `_multipart.MAX_PART_HEADER_SIZE` (4096).
_MAX_ID = 256
#: Longest content type of the content part accepted, for the same reason.
_MAX_MEDIA = 256

# RFC 2046 bcharsnospace without "'"; RFC 2822 dot-atom text plus "@" without "%", "&", "'".
_BCHARS = r"[0-9A-Za-z()+_,./:=?-]"
_ID = r"[0-9A-Za-z!#$*+\-./:=?@^_`{|}~]"
_CONTENT_TYPE = re.compile(
    rf'multipart/related; boundary="({_BCHARS}{{1,70}})"; start="<({_ID}{{1,{_MAX_ID}}})>";'
    r' type="application/beep\+xml"')
# The content part's headers up to its Content-ID, which must equal the document's `cid:`.
_CONTENT_PART = re.compile(
    rb"\r\nContent-Type: ([!-~](?:[ -~]{0,%d}[!-~])?)\r\n" % (_MAX_MEDIA - 2)
    + rb"Content-Transfer-Encoding: binary\r\nContent-ID: <")

# The control document, matched once it is text (strict UTF-8; see _UNSAFE_TEXT).
_WS = r"[ \t\r\n]"
# An attribute value: no control character, no quote, no "&", "<" or ">".
_VALUE = r"[^\x00-\x1f\x7f\"&'<>]+"


def _party(tag: str, value: str) -> str:
    return rf"{_WS}*<{tag}{_WS}+identity{_WS}*={_WS}*{value}{_WS}*/>"


_DATA_OPEN = re.compile(
    rf"<data{_WS}+content{_WS}*={_WS}*(['\"])cid:({_ID}{{1,{_MAX_ID}}})\1{_WS}*>")
# The rest of the document after <data ...>: the parties and the end tag.
_PARTIES = re.compile(
    # the originator and the first recipient have groups of their own (one recipient is usual),
    _party("originator", rf"(['\"])({_VALUE})\1")
    + _party("recipient", rf"(['\"])({_VALUE})\3")
    # further recipients share one (_RECIPIENT then finds each)
    + "((?:" + _party("recipient", f"(?:'{_VALUE}'|\"{_VALUE}\")") + ")*)"
    + rf"{_WS}*</data{_WS}*>{_WS}*")
_RECIPIENT = re.compile(rf"<recipient{_WS}+identity{_WS}*={_WS}*['\"]({_VALUE})")
# Not XML characters (U+FFFE, U+FFFF; strict UTF-8 excludes the surrogates), and C1 controls:
# the first lxml refuses, the others are declined so that no value holds a control character.
_UNSAFE_TEXT = re.compile(r"[\x80-\x9f\ufffe\uffff]")
#: Longest rest of a document whose parties are cached (`_cached_parties`): a few dozen
#: recipients; bounds the cache's memory whatever peers send.
_MAX_CACHED_REST = 2048

_Parties = tuple[Endpoint, tuple[Endpoint, ...]]
#: `match_layout(content_type, body, max_xml_size)`: `match_data`'s checks of all but the
#: parties in C (None if not built). It returns `(content_ref, rest, media_type, content)`,
#: None to decline, or True where `match_data_python` must decide (a non-ASCII document).
_c = speedups.load("adapters.apex._speedups")
_match_layout: Callable[[str, bytes, int],
                        tuple[str, str, str, bytes] | Literal[True] | None] | None = \
    _c.match_layout if _c is not None else None


class DataLayout(NamedTuple):
    """The pieces of a canonical data, as the general path would have read them."""

    #: The `content` attribute ("cid:" and the content part's Content-ID).
    content_ref: str
    originator: Endpoint
    recipients: tuple[Endpoint, ...]
    content_type: str
    content: bytes


def _parties(rest: str) -> _Parties | None:
    """The originator and recipients the rest of a document after `<data ...>` names, if it is
    canonical and they parse."""
    document = _PARTIES.fullmatch(rest)
    if document is None:
        return None
    recipients = [document[4]]
    if document[5]:
        recipients += _RECIPIENT.findall(document[5])
    try:
        return Endpoint.parse(document[2]), tuple(map(Endpoint.parse, recipients))
    except InvalidParameter:
        return None  # the general path says which endpoint


#: The same few parties send most data, and all but the `cid:` of their documents repeats:
#: reading and parsing them was a third of decoding a data. Refusals are cached too.
_cached_parties = functools.lru_cache(maxsize=1024)(_parties)


def match_data(content_type: str, body: bytes, max_xml_size: int) -> DataLayout | None:
    """The pieces of `body` if it is a data in the canonical layout whose control document is
    at most `max_xml_size` octets; None to decline."""
    if _match_layout is None:
        return match_data_python(content_type, body, max_xml_size)
    got = _match_layout(content_type, body, max_xml_size)
    if got is None:
        return None
    if got is True:
        return match_data_python(content_type, body, max_xml_size)
    content_ref, rest, media_type, content = got
    parties = _cached_parties(rest) if len(rest) <= _MAX_CACHED_REST else _parties(rest)
    if parties is None:
        return None
    return DataLayout(content_ref, parties[0], parties[1], media_type, content)


def match_data_python(content_type: str, body: bytes, max_xml_size: int) -> DataLayout | None:
    """`match_data()` in Python: what the compiled twin must equal, and the fallback."""
    head = _CONTENT_TYPE.fullmatch(content_type)
    if head is None:
        return None
    boundary, start_id = head.groups()
    start = (f"--{boundary}\r\nContent-Type: application/beep+xml\r\nContent-ID: <{start_id}>"
             "\r\n\r\n").encode()
    if not body.startswith(start):
        return None
    delimiter = b"\r\n--" + boundary.encode()
    # `body` opens with "--boundary" (the general path's first delimiter, once CRLF is put in
    # front); the next one must close the control document.
    xml_start = len(start)
    xml_end = body.find(delimiter, xml_start - 2)
    if not xml_start <= xml_end <= xml_start + max_xml_size:
        return None
    try:
        xml = body[xml_start:xml_end].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not xml.isascii() and _UNSAFE_TEXT.search(xml):
        return None
    opening = _DATA_OPEN.match(xml)
    if opening is None:
        return None
    cid = opening[2]
    part = _CONTENT_PART.match(body, xml_end + len(delimiter))
    if part is None or not body.startswith(f"{cid}>\r\n\r\n".encode(), part.end()):
        return None
    content_start = part.end() + len(cid) + 5
    closing = delimiter + b"--\r\n"
    content_end = len(body) - len(closing)
    # content_end < content_start: the close delimiter would begin in the headers' last CRLF
    if (content_end < content_start or not body.endswith(closing)
            or body.find(delimiter, content_start - 2) != content_end):
        return None
    rest = xml[opening.end():]
    parties = _cached_parties(rest) if len(rest) <= _MAX_CACHED_REST else _parties(rest)
    if parties is None:
        return None
    return DataLayout("cid:" + cid, parties[0], parties[1], part[1].decode(),
                      body[content_start:content_end])


def write_data(parties: bytes, content_type: str, content: bytes, *, xml_ref: str,
               content_id: str, start_id: str, boundary: str) -> tuple[str, bytes]:
    """`(Content-Type, body)` exactly as `encode_related` writes a data without options: the
    document `<data content='cid:{xml_ref}'>` around the `parties` lines, then the content.

    `boundary` and `start_id` are ours, ASCII, so the first line may be encoded as UTF-8 whole
    (the document is UTF-8, headers Latin-1).
    """
    body = b"".join((
        f"--{boundary}\r\nContent-Type: application/beep+xml\r\nContent-ID: <{start_id}>\r\n"
        f"\r\n<data content='cid:{xml_ref}'>\r\n".encode(),
        parties,
        f"</data>\r\n--{boundary}\r\nContent-Type: {content_type}\r\n"
        f"Content-Transfer-Encoding: binary\r\nContent-ID: <{content_id}>\r\n\r\n"
        .encode("latin-1"),
        content,
        f"\r\n--{boundary}--\r\n".encode("latin-1"),
    ))
    return (f'multipart/related; boundary="{boundary}"; start="<{start_id}>";'
            ' type="application/beep+xml"'), body
