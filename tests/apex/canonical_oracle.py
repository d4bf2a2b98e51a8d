"""The canonical data layout of `adapters/apex/_canonical.py`, spelled as regular expressions and
`bytes.find`s: the oracle its compiled twin (`match_layout` in adapters/apex/_speedups.c) is
held to.

This was the product's pure-Python fast path until the general path (`_multipart` and lxml)
and the C twin were made the only two readers; it stays here because it states the layout more
plainly than the C's octet-by-octet scan, so a property test comparing the two on arbitrary
input finds a guard the C lost. `match_data_python` returns what `match_data` would if the C
decided everything itself; it also reads control documents that are not ASCII (strict UTF-8,
without C1 controls, U+FFFE or U+FFFF), which the C leaves to the general path. It shares
`_canonical`'s reading of the parties (`_cached_parties`).
"""

from __future__ import annotations

import re

from adapters.apex._canonical import (
    _MAX_CACHED_REST,
    _MAX_ID,
    _MAX_MEDIA,
    _WS,
    DataLayout,
    _cached_parties,
    _parties,
)

__all__ = ["match_data_python"]

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

_DATA_OPEN = re.compile(
    rf"<data{_WS}+content{_WS}*={_WS}*(['\"])cid:({_ID}{{1,{_MAX_ID}}})\1{_WS}*>")
# Not XML characters (U+FFFE, U+FFFF; strict UTF-8 excludes the surrogates), and C1 controls:
# the first lxml refuses, the others are declined so that no value holds a control character.
_UNSAFE_TEXT = re.compile(r"[\x80-\x9f\ufffe\uffff]")


def match_data_python(content_type: str, body: bytes, max_xml_size: int) -> DataLayout | None:
    """The pieces of `body` if it is a data in the canonical layout whose control document is
    at most `max_xml_size` octets (strict UTF-8 too, not only ASCII); None to decline."""
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
