"""The canonical-layout fast paths of `decode` and `encode` against the general ones.

The fast decoder may decline anything; what it accepts, the general decoder must accept with an
equal result. The fast encoder must write the general encoder's octets.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.apex import _multipart
from adapters.apex._codec import (
    BEEP_XML,
    DEFAULT_MAX_CONTENT_SIZE,
    DEFAULT_MAX_RECIPIENTS,
    DEFAULT_MAX_XML_SIZE,
    Data,
    Ok,
    Operation,
    Option,
    _decode_fast,
    _decode_general,
    _encode_fast,
    _encode_general,
    decode,
    encode,
    plain_data,
)
from adapters.apex._endpoint import Endpoint
from broker.errors import ApexpsError, ReplyCode
from tests.mutations import EDITS, edit_octets

FRED, BARNEY = Endpoint.parse("fred@example.com"), Endpoint.parse("barney@example.com")

# --- strategies -----------------------------------------------------------------------------

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
_endpoints = st.builds(Endpoint, _token.filter(lambda a: not a.startswith("apex:")), _domain,
                       st.none() | _token)
#: Endpoints the fast path must accept: printable ASCII that needs no escaping.
_plain_token = st.from_regex(r"[a-zA-Z0-9 !#$%()*+,.:;=?\[\]^_`{|}~-]{1,10}", fullmatch=True)
_plain_endpoints = st.builds(
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


def _data(endpoints: st.SearchStrategy[Endpoint]) -> st.SearchStrategy[Data]:
    return st.builds(Data, endpoints, st.lists(endpoints, min_size=1, max_size=5).map(tuple),
                     _contents, _content_types)


@contextmanager
def _deterministic_ids(start: int = 0) -> Iterator[None]:
    """Content-IDs and boundaries from a counter: two encoders' octets can be compared, and
    hypothesis sees the same octets each time it replays a case."""
    unique = _multipart._unique
    saved = unique.prefix, unique.counter
    unique.prefix, unique.counter = "u", itertools.count(start)
    try:
        yield
    finally:
        unique.prefix, unique.counter = saved


def _same_but_ref(back: Operation, data: Data) -> bool:
    return isinstance(back, Data) and (
        back.originator, back.recipients, back.content, back.content_type) == (
        data.originator, data.recipients, data.content, data.content_type)


# --- round trips ----------------------------------------------------------------------------


@settings(max_examples=400)
@given(_data(_endpoints))
def test_round_trip_fast_equals_general(data: Data) -> None:
    """Whatever the endpoints hold, the general path gets the data back, and the fast path
    either declines or gets exactly the same."""
    content_type, body = encode(data)
    general = _decode_general(content_type, body)
    assert _same_but_ref(general, data)
    fast = _decode_fast(content_type, body)
    assert fast is None or fast == general
    assert decode(content_type, body) == general


@settings(max_examples=300)
@given(_data(_plain_endpoints))
def test_canonical_data_takes_the_fast_path(data: Data) -> None:
    """A data of plain endpoints as encode() writes it is decoded by the fast path, to the
    general path's result: the data itself, content_ref aside."""
    content_type, body = encode(data)
    fast = _decode_fast(content_type, body)
    assert fast is not None
    assert fast == _decode_general(content_type, body)
    assert _same_but_ref(fast, data) and fast.content_ref is not None


def test_rfc_multipart_example_takes_the_fast_path() -> None:
    """RFC 3340 §4.1's example (a blank line after </data>, headers as printed) is canonical."""
    content_type = ('multipart/related; boundary="boundary"; start="<1@example.com>";'
                    ' type="application/beep+xml"')
    body = (b"--boundary\r\nContent-Type: application/beep+xml\r\nContent-ID: <1@example.com>"
            b"\r\n\r\n<data content='cid:2@example.com'>\r\n"
            b"    <originator identity='fred@example.com' />\r\n"
            b"    <recipient identity='barney@example.com' />\r\n</data>\r\n\r\n"
            b"--boundary\r\nContent-Type: image/gif\r\nContent-Transfer-Encoding: binary\r\n"
            b"Content-ID: <2@example.com>\r\n\r\n...\r\n--boundary--\r\n")
    fast = _decode_fast(content_type, body)
    assert fast == _decode_general(content_type, body)
    assert fast == Data(FRED, (BARNEY,), b"...", "image/gif", content_ref="cid:2@example.com")


def test_many_recipients_take_the_fast_path() -> None:
    """Recipients past the first are found too, in order, past the encoder's cache size."""
    recipients = tuple(Endpoint.parse(f"r{i}/s@example.com") for i in range(100))
    content_type, body = encode(Data(FRED, recipients, b"x"))
    fast = _decode_fast(content_type, body)
    assert fast is not None and fast.recipients == recipients
    assert fast == _decode_general(content_type, body)


# --- mutations ------------------------------------------------------------------------------

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
def _mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    """An encoded data, then a few edits of its octets or its Content-Type."""
    data = draw(_data(_plain_endpoints) | _data(_endpoints))
    with _deterministic_ids(draw(st.integers(0, 40))):
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


def _check_agreement(content_type: str, body: bytes) -> Operation | None:
    fast = _decode_fast(content_type, body)  # must not raise, whatever the input
    try:
        general = _decode_general(content_type, body)
    except ApexpsError:
        assert fast is None, "the fast path accepted what the general path refuses"
        return None
    assert fast is None or fast == general
    return fast


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutations_are_declined_or_decoded_alike(mutated: tuple[str, bytes]) -> None:
    """Byte flips, insertions, deletions, truncations, case changes and Content-Type edits of
    an encoded data: the fast path declines, or agrees with the general path; when the
    general path refuses, the fast path has declined."""
    _check_agreement(*mutated)


_BLANKS = [b" ", b"\t", b"\r\n", b"\n", b"\r", b"\x0c", b"\x0b", b"\xc2\xa0", b"\xc2\x85"]


@st.composite
def _near_canonical(draw: st.DrawFn) -> tuple[str, bytes]:
    """An encoded data of plain endpoints with edits inside its control document or content
    only: blanks where XML allows some (or not), quote styles, odd octets in a value, the
    delimiter or its look-alikes in the content. Many of these the fast path accepts."""
    data = draw(_data(_plain_endpoints))
    with _deterministic_ids(draw(st.integers(0, 40))):
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


@settings(max_examples=700)
@given(_near_canonical())
def test_near_canonical_edits_are_declined_or_decoded_alike(mutated: tuple[str, bytes]) -> None:
    """Edits that keep an entity at the edge of the canonical layout: the fast path declines,
    or agrees with the general path; when the general path refuses, the fast path declined."""
    _check_agreement(*mutated)


# --- guards, one by one ---------------------------------------------------------------------

_CT = ('multipart/related; boundary="B"; start="<s@x>"; type="application/beep+xml"')
_DOC = (b"<data content='cid:c@x'>\r\n    <originator identity='fred@example.com' />\r\n"
        b"    <recipient identity='barney@example.com' />\r\n</data>")
_CONTENT_HEAD = (b"Content-Type: image/gif\r\nContent-Transfer-Encoding: binary\r\n"
                 b"Content-ID: <c@x>\r\n\r\n")


def _entity(doc: bytes = _DOC, content: bytes = b"GIF89a", content_head: bytes = _CONTENT_HEAD,
            start_head: bytes = b"Content-Type: application/beep+xml\r\nContent-ID: <s@x>\r\n",
            tail: bytes = b"\r\n--B--\r\n") -> bytes:
    return (b"--B\r\n" + start_head + b"\r\n" + doc + b"\r\n--B\r\n" + content_head + content
            + tail)


def test_hand_made_entity_takes_the_fast_path() -> None:
    """The entity the guard cases below vary is itself accepted (so each case tests its guard)."""
    fast = _check_agreement(_CT, _entity())
    assert fast == Data(FRED, (BARNEY,), b"GIF89a", "image/gif", content_ref="cid:c@x")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        # the content holds the delimiter: the general path splits it there
        (_CT, _entity(content=b"GIF\r\n--B\r\n89a")),
        (_CT, _entity(content=b"GIF\r\n--Bxyz89a")),
        # empty content whose close delimiter starts in the headers' blank line
        (_CT, _entity(content=b"", content_head=_CONTENT_HEAD[:-2], tail=b"\r\n--B--\r\n")),
        (_CT, _entity(content=b"--B--\r\n", tail=b"")),
        # a delimiter closing the document early
        (_CT, _entity(doc=_DOC.replace(b"</data>", b"\r\n--B\r\n</data>"))),
        # Content-IDs that do not pair up, or need unquoting
        (_CT.replace("<s@x>", "<t@x>"), _entity()),
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"<c@x>", b"<d@x>"))),
        (_CT.replace("s@x", "s%40x"), _entity(start_head=b"Content-Type: application/beep+xml"
                                               b"\r\nContent-ID: <s%40x>\r\n")),
        (_CT, _entity(doc=_DOC.replace(b"cid:c@x", b"cid:c%40x"))),
        # transfer encodings, header spellings, folding
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"binary", b"base64"))),
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"binary", b"quoted-printable"))),
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"Content-ID", b"Content-Id"))),
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"image/gif", b"image/gif\r\n x=y"))),
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"image/gif", b" image/gif"))),
        # markup, entities and declarations in the document
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr&apos;ed"))),
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr&#65;ed"))),
        (_CT, _entity(doc=b"<!DOCTYPE data>" + _DOC)),
        (_CT, _entity(doc=_DOC.replace(b"\r\n</data>", b"<!-- c --></data>"))),
        (_CT, _entity(doc=_DOC.replace(b"\r\n</data>", b"x</data>"))),
        (_CT, _entity(doc=_DOC.replace(b"</data>", b"<option internal='x' /></data>"))),
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr\x01ed"))),
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr\xc2\x85ed"))),
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr\xef\xbf\xbeed"))),
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr\xffed"))),
        (_CT, _entity(doc=_DOC.replace(b"\r\n", b"\x0c"))),
        # endpoints that do not parse
        (_CT, _entity(doc=_DOC.replace(b"fred@example.com", b"fred"))),
        (_CT, _entity(doc=_DOC.replace(b"barney@example.com", b"a/b/c@example.com"))),
        # the media type of the start part, the multipart parameters
        (_CT, _entity(start_head=b"Content-Type: text/plain\r\nContent-ID: <s@x>\r\n")),
        (_CT.replace("related", "Related"), _entity()),
        (_CT.replace('"B"', "B"), _entity()),
    ],
)
def test_guard_declines(content_type: str, body: bytes) -> None:
    """Each departure from the canonical layout is declined, whatever the general path
    makes of it."""
    assert _decode_fast(content_type, body) is None
    _check_agreement(content_type, body)


def test_limits_still_apply() -> None:
    """Too many recipients, too much content, too large a document: declined, and refused."""
    many = tuple(Endpoint.parse(f"r{i}@example.com") for i in range(DEFAULT_MAX_RECIPIENTS + 1))
    big_names = tuple(Endpoint.parse(f"{'r' * 300}{i}@example.com") for i in range(1000))
    for data, code in [
        (Data(FRED, many, b"x"), ReplyCode.PARAMETER_SYNTAX_ERROR),
        (Data(FRED, (BARNEY,), b"x" * (DEFAULT_MAX_CONTENT_SIZE + 1)),
         ReplyCode.PARAMETER_SYNTAX_ERROR),
        (Data(FRED, big_names, b"x"), ReplyCode.SYNTAX_ERROR),
    ]:
        content_type, body = encode(data)
        assert _decode_fast(content_type, body) is None
        with pytest.raises(ApexpsError) as info:
            decode(content_type, body)
        assert info.value.code is code
    assert len(encode(Data(FRED, big_names, b"x"))[1]) > DEFAULT_MAX_XML_SIZE


# --- encoding -------------------------------------------------------------------------------


_refs = st.none() | st.builds("cid:{}".format, st.text(
    st.characters(blacklist_categories=("Cs",), max_codepoint=0x17F), max_size=12))


def _outcome(encoder: Callable[[Data], object], data: Data) -> object:
    try:
        return encoder(data)
    except UnicodeEncodeError as exc:  # a Content-ID or content type that is not Latin-1
        return type(exc)


@settings(max_examples=400)
@given(_data(_endpoints), _refs)
def test_fast_encode_writes_the_general_octets(data: Data, ref: str | None) -> None:
    """With the same ids drawn, the fast encoder's Content-Type and octets are the general
    encoder's (or it fails alike), for any endpoints and `cid:` reference."""
    data = Data(data.originator, data.recipients, data.content, data.content_type,
                content_ref=ref)
    with _deterministic_ids():
        general = _outcome(_encode_general, data)
    with _deterministic_ids():
        fast = _outcome(_encode_fast, data)
    assert fast == general


def test_fast_encode_of_many_recipients_and_its_scope() -> None:
    """Past the parties cache the octets are still the general ones; options, `#` and
    external references are left to the general encoder; `<ok />` is written once."""
    data = Data(FRED, tuple(Endpoint.parse(f"r{i}@example.com") for i in range(70)), b"x")
    with _deterministic_ids():
        general = _encode_general(data)
    with _deterministic_ids():
        assert _encode_fast(data) == general
    option = (Option("x"),)
    for declined in [Data(FRED, (BARNEY,), options=option),
                     Data(FRED, (BARNEY,), originator_options=option),
                     Data(FRED, (BARNEY,), recipient_options=(option,)),
                     Data(FRED, (BARNEY,), b"<x/>", content_ref="#c"),
                     Data(FRED, (BARNEY,), content_ref="http://example.com/x")]:
        assert _encode_fast(declined) is None
        with _deterministic_ids():
            general = _encode_general(declined)
        with _deterministic_ids():
            assert encode(declined) == general
    assert encode(Ok()) == _encode_general(Ok()) == (BEEP_XML, b"<ok />")
    assert encode(Ok(3)) == _encode_general(Ok(3))


@given(content=st.binary(max_size=64), content_type=st.sampled_from(["text/plain", "a/b"]),
       ref=st.sampled_from([None, "cid:1@x"]), many=st.booleans())
def test_plain_data_is_the_constructors_data(content: bytes, content_type: str,
                                             ref: str | None, many: bool) -> None:
    """`plain_data` (the fast decoder's and the client's constructor) builds a Data equal to,
    hashing like and as frozen as the dataclass constructor's."""
    recipients = (BARNEY, FRED) if many else (BARNEY,)
    fast = plain_data(FRED, recipients, content, content_type, ref)
    slow = Data(FRED, recipients, content, content_type, content_ref=ref)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    with pytest.raises(AttributeError):
        fast.content = b"changed"  # type: ignore[misc]
