"""Hypothesis strategies for data entities in and near the canonical layout (`_canonical`),
shared by the tests that hold a fast decoder to the general one (test_codec_fast.py) and the C
twin of `match_data` to the Python one (test_canonical_speedups.py)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import strategies as st

from adapters.apex import _multipart
from adapters.apex.codec import BEEP_XML, Data, encode
from adapters.apex.endpoint import Endpoint
from tests.mutations import EDITS, edit_octets

__all__ = ["datas", "deterministic_ids", "endpoints", "mutated_entities",
           "near_canonical_entities", "plain_endpoints"]

#: Characters an endpoint may hold that XML or MIME treat specially, and a few far from ASCII
#: (U+0085 is a C1 control: valid in an endpoint and in XML, declined by the fast path).
_ODD = list(" !\"#$%&'()*+,-.:;<=>?[\\]^_`{|}~\u00e9\u00df\u4e2d\U0001f600\u00a0\u0085\u2028")
_token = st.text(
    st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/@\ufffe\uffff")
    | st.sampled_from(_ODD), min_size=1, max_size=10)
_label = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9-]{0,6}[A-Za-z0-9])?", fullmatch=True)
_domain = (st.lists(_label, min_size=1, max_size=3).map(".".join)
           | st.from_regex(r"\[[\x21-\x3f\x41-\x5a\x5e-\x7e]{1,12}\]", fullmatch=True))
# Two endpoints that do not print back as they were, which is not the codec's business: "apex:"
# is the URL form, which parse() unescapes, and an "@" in an address literal splits wrongly.
endpoints = st.builds(Endpoint, _token.filter(lambda a: not a.startswith("apex:")), _domain,
                      st.none() | _token)
#: Endpoints the fast path must accept: printable ASCII that needs no escaping.
_plain_token = st.from_regex(r"[a-zA-Z0-9 !#$%()*+,.:;=?\[\]^_`{|}~-]{1,10}", fullmatch=True)
plain_endpoints = st.builds(
    Endpoint, _plain_token.filter(lambda a: not a.startswith("apex:")),
    st.lists(_label, min_size=1, max_size=3).map(".".join), st.none() | _plain_token)

_content_types = (st.sampled_from(["application/octet-stream", "image/gif", "text/plain;"
                                   " charset=utf-8", BEEP_XML, "x/y; a=\"b c\""])
                  | st.from_regex(r"[!-~]([ -~]{0,30}[!-~])?", fullmatch=True))
_tricky = st.sampled_from([b"--", b"\r\n", b"\r\n--", b"--\r\n", b"\r\n\r\n", b"\r\n--b",
                           b"\r\n--u", b"Content-ID: <x@y>\r\n", b"</data>", b"'", b"\x00",
                           b"\xff"])
_contents = st.binary(max_size=200) | st.lists(_tricky | st.binary(max_size=8),
                                               max_size=12).map(b"".join)


def datas(parties: st.SearchStrategy[Endpoint]) -> st.SearchStrategy[Data]:
    """Data operations between `parties`, of odd contents and content types."""
    return st.builds(Data, parties, st.lists(parties, min_size=1, max_size=5).map(tuple),
                     _contents, _content_types)


@contextmanager
def deterministic_ids(start: int = 0) -> Iterator[None]:
    """Content-IDs and boundaries from a counter: two encoders' octets can be compared, and
    hypothesis sees the same octets each time it replays a case."""
    unique = _multipart._unique
    saved = unique.prefix, unique.counter
    unique.prefix, unique.counter = "u", itertools.count(start)
    try:
        yield
    finally:
        unique.prefix, unique.counter = saved


# --- edits ----------------------------------------------------------------------------------

_INSERTS = [b"\r\n", b"\r", b"\n", b" ", b"\t", b"\x0c", b"--", b"'", b"\"", b"&", b"&amp;",
            b"<", b">", b"/", b"@", b"%41", b"%", b"\x00", b"\x7f", b"\xc2\x85", b"\xef\xbf\xbe",
            b"\xff", b"\xc3\xa9", b"<!DOCTYPE x>", b"<!--c-->", b"<?pi?>", b"<![CDATA[x]]>",
            b"<option internal='x' />", b"<recipient identity='z@q.r' />",
            b"<originator identity='z@q.r' />", b"Content-ID: <x@y>\r\n",
            b"Content-Transfer-Encoding: base64\r\n", b"Content-Type: text/plain\r\n", b"cid:",
            b"\r\n\r\n", b"--\r\n", b"content='cid:x'", b"identity='a@b.c'", b"=", b"data"]


#: One octet for another the layout treats alike, or nearly.
_SWAPS = [(b"'", b'"'), (b'"', b"'"), (b" ", b"\t"), (b" ", b"\n"), (b" ", b"\x0c"),
          (b"\r\n", b"\n"), (b"\r\n", b" "), (b" />", b"/>"), (b" />", b"></x>")]


@st.composite
def mutated_entities(draw: st.DrawFn) -> tuple[str, bytes]:
    """An encoded data, then a few edits of its octets or its Content-Type."""
    data = draw(datas(plain_endpoints) | datas(endpoints))
    with deterministic_ids(draw(st.integers(0, 40))):
        content_type, body = encode(data)
    boundary = content_type.split('"')[1].encode()
    inserts = [*_INSERTS, b"\r\n--" + boundary, b"--" + boundary, b"\r\n--" + boundary + b"--",
               b"\r\n--" + boundary + b"--\r\n", boundary]
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        kind = draw(st.sampled_from([*EDITS, "type"]))
        if kind != "type":
            # half the edits land at a seam of the layout, where a guard has to tell
            seams = [i for i, octet in enumerate(body) if octet in b"<>'\"= \r\n@/-:"]
            body = edit_octets(draw, body, kind, seams=seams, inserts=inserts, swaps=_SWAPS)
        else:
            cut = draw(st.integers(0, len(content_type)))
            edit = draw(st.sampled_from(["", " ", ";", '"', "<", ">", "\\", "A", "%", "; x=y",
                                         "; start=\"<a@b>\"", "; boundary=\"b\""]))
            cut_end = cut + draw(st.integers(0, 3))
            content_type = content_type[:cut] + edit + content_type[cut_end:]
            if draw(st.booleans()):
                content_type = content_type.upper() if cut % 2 else content_type.lower()
    return content_type, body


_BLANKS = [b" ", b"\t", b"\r\n", b"\n", b"\r", b"\x0c", b"\x0b", b"\xc2\xa0", b"\xc2\x85"]


@st.composite
def near_canonical_entities(draw: st.DrawFn) -> tuple[str, bytes]:
    """An encoded data of plain endpoints with edits inside its control document or content
    only: blanks where XML allows some (or not), quote styles, odd octets in a value, the
    delimiter or its look-alikes in the content. Many of these the fast path accepts."""
    data = draw(datas(plain_endpoints))
    with deterministic_ids(draw(st.integers(0, 40))):
        content_type, body = encode(data)
    delimiter = b"\r\n--" + content_type.split('"')[1].encode()
    doc_start, doc_end = body.index(b"<data"), body.index(b"</data>") + len(b"</data>")
    content_end = len(body) - len(delimiter + b"--\r\n")
    content_start = content_end - len(data.content)
    head, doc, mid = body[:doc_start], body[doc_start:doc_end], body[doc_end:content_start]
    content, tail = body[content_start:content_end], body[content_end:]
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            seams = [i for i, octet in enumerate(doc) if octet in b"<>'\"= /\r\n@"]
            # ... or the start of an identity value, where an octet must pass the endpoint too
            starts = [m.end() for m in re.finditer(rb"identity=['\"]", doc)]
            at = draw(st.sampled_from(seams) | st.sampled_from(starts or seams))
            piece = draw(st.sampled_from([*_BLANKS, b"'", b'"', b"&", b"<", b">", b"%41", b"\x00",
                                          b"\xef\xbf\xbe", b"\xff", b"\xc3\xa9"]))
            replace = draw(st.booleans()) and doc[at:at + 1] in (b"'", b'"')
            if replace:  # the other quote style, which must then match
                piece = b'"' if doc[at:at + 1] == b"'" else b"'"
            doc = doc[:at] + piece + doc[at + replace:]
        else:
            at = draw(st.integers(0, len(content)))
            piece = draw(st.sampled_from([delimiter, delimiter + b"--", delimiter[:-1],
                                          delimiter[2:], b"\r\n", b"--", b"\r"]))
            content = content[:at] + piece + content[at:]
    return content_type, head + doc + mid + content + tail
