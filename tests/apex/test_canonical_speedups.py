"""The C twin of `match_data` (`match_layout` in adapters/apex/_speedups.c) against the
layout's oracle (tests/apex/canonical_oracle.py, the layout as regular expressions).

`match_data` runs the compiled `match_layout` and reads the parties in Python; what the C leaves
undecided (True) it declines, for the general path. On any input `match_data` must return the
oracle's result -- None, or equal `DataLayout`s of the same types -- or None where the C left
the decision open, and neither may raise. These tests fail where the twin is not built.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters import speedups
from adapters.apex._canonical import DataLayout, match_data
from adapters.apex.codec import DEFAULT_MAX_XML_SIZE, Data, encode
from adapters.apex.endpoint import Endpoint
from tests.apex.canonical_data import (
    datas,
    endpoints,
    mutated_entities,
    near_canonical_entities,
    plain_endpoints,
)
from tests.apex.canonical_oracle import match_data_python

_NAME = "adapters.apex._speedups"
_C = speedups.load(_NAME)


@pytest.fixture(autouse=True, scope="module")
def _twin_is_built() -> Iterator[None]:
    assert _C is not None, (
        f"{_NAME} is not built, or APEXPS_PURE_PYTHON is set: build it with `bash ops/bootstrap`"
        " (or `.venv/bin/pip install -e '.[dev]'`), which needs a C compiler")
    yield


def _agree(content_type: str, body: bytes,
           max_xml_size: int = DEFAULT_MAX_XML_SIZE) -> DataLayout | None:
    """The oracle's result, having checked that `match_data`'s is the same (by `repr` too, so a
    bytearray never passes for bytes), or None where the C left the decision to the general
    path, and that whatever the C decided itself agrees."""
    assert _C is not None
    decided = _C.match_layout(content_type, body, max_xml_size)
    python = match_data_python(content_type, body, max_xml_size)
    both = match_data(content_type, body, max_xml_size)
    expected = None if decided is True else python
    assert both == expected and repr(both) == repr(expected)
    if decided is None:
        assert python is None
    elif decided is not True:
        assert python is None or decided == (
            python.content_ref, decided[1], python.content_type, python.content)
    return python


def _decision(content_type: str, body: bytes, max_xml_size: int = DEFAULT_MAX_XML_SIZE) -> str:
    """What the C made of an entity: "accepted", "declined" or "undecided" (left to the
    general path)."""
    assert _C is not None
    decided = _C.match_layout(content_type, body, max_xml_size)
    return "declined" if decided is None else "undecided" if decided is True else "accepted"


def test_the_twin_is_listed_and_active() -> None:
    """The build lists the twin among the accelerators, and this process uses it."""
    assert _NAME in speedups.ACCELERATORS
    assert speedups.active()[_NAME]


def test_pure_python_switch_turns_the_twin_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """APEXPS_PURE_PYTHON=1 makes `load` report the twin as absent."""
    monkeypatch.setenv("APEXPS_PURE_PYTHON", "1")
    assert speedups.load(_NAME) is None


# --- differential properties ----------------------------------------------------------------

_max_xml_sizes = (st.just(DEFAULT_MAX_XML_SIZE) | st.integers(-3, 700)
                  | st.sampled_from([0, 2**63 - 1, 2**63, 2**70, -(2**70)]))


@settings(max_examples=400)
@given(datas(endpoints) | datas(plain_endpoints), _max_xml_sizes)
def test_encoded_data_is_matched_alike(data: Data, max_xml_size: int) -> None:
    """Data as encode() writes it, of any endpoints, content and content type, under any
    document size limit: the C and the oracle agree."""
    _agree(*encode(data), max_xml_size)


@settings(max_examples=200)
@given(datas(plain_endpoints))
def test_canonical_data_is_decided_in_c(data: Data) -> None:
    """A data of plain (ASCII) endpoints is accepted by the C itself, not left undecided."""
    content_type, body = encode(data)
    assert _decision(content_type, body) == "accepted"
    layout = _agree(content_type, body)
    assert layout is not None and layout.content == data.content


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_entities(), _max_xml_sizes)
def test_mutated_data_is_matched_alike(entity: tuple[str, bytes], max_xml_size: int) -> None:
    """Octet flips, insertions, deletions, truncations, case changes and Content-Type edits of
    an encoded data (tests/mutations.py): the two versions agree."""
    _agree(*entity, max_xml_size)


@settings(max_examples=700)
@given(near_canonical_entities())
def test_near_canonical_data_is_matched_alike(entity: tuple[str, bytes]) -> None:
    """Edits at the edge of the layout -- blanks, quote styles, odd octets in the document,
    delimiter look-alikes in the content -- many of them accepted: the two versions agree."""
    _agree(*entity)


_ID_256 = "i" * 250 + "@x.org"
_ID_257 = "i" * 251 + "@x.org"
_MEDIA_256 = "x/" + "y" * 254

# Values for the layout's fields at and past their bounds, of their class or just outside it.
_boundaries = (st.from_regex(r"[0-9A-Za-z()+_,./:=?-]{1,70}", fullmatch=True)
               | st.sampled_from(["B", "b" * 70, "b" * 71, "b'", "b b"])
               | st.from_regex(r"[0-9A-Za-z()+_,./:=?' \"-]{1,72}", fullmatch=True))
_ids = (st.from_regex(r"[0-9A-Za-z!#$*+\-./:=?@^_`{|}~]{1,20}", fullmatch=True)
        | st.sampled_from(["s@x", "c@x", _ID_256, _ID_257, "c%40x", "a>b"])
        | st.from_regex(r"[!-~]{1,12}", fullmatch=True))
_medias = (st.sampled_from(["image/gif", _MEDIA_256, _MEDIA_256 + "z", " x", "x ", "a"])
           | st.from_regex(r"[ -~]{1,12}", fullmatch=True))
_ODD_TEXT = st.text(st.sampled_from(list("B<>\"' \t\r\n=@:;-/\\x\x00\x85\xe9\ufffe"))
                    | st.characters(), max_size=4)
_ODD_OCTETS = st.binary(max_size=4) | st.sampled_from(
    [b"\r\n", b"--", b"'", b'"', b" ", b"\t", b"\x0c", b"\xc3\xa9", b"\xc2\x85", b"\xef\xbf\xbe",
     b"\xff", b"x" * 256])
_EDITS = ["drop", "double", "odd", "odd before", "odd after", "odd within"]
_Piece = TypeVar("_Piece", str, bytes)


def _edit(draw: st.DrawFn, pieces: list[_Piece], odd: st.SearchStrategy[_Piece]) -> None:
    at = draw(st.integers(0, len(pieces) - 1))
    kind = draw(st.sampled_from(_EDITS))
    if kind == "drop":
        pieces[at] = pieces[at][:0]
    elif kind == "double":
        pieces[at] *= 2
    elif kind == "odd":
        pieces[at] = draw(odd)
    elif kind == "odd before":
        pieces[at] = draw(odd) + pieces[at]
    elif kind == "odd after":
        pieces[at] += draw(odd)
    else:  # in place of one octet or character
        piece = pieces[at]
        i = draw(st.integers(0, max(0, len(piece) - 1)))
        pieces[at] = piece[:i] + draw(odd) + piece[i + 1:]


@st.composite
def _spliced(draw: st.DrawFn) -> tuple[str, bytes]:
    """An entity of the canonical layout cut at every seam a guard looks at, with its fields'
    values drawn at and past their bounds, then a few pieces dropped, doubled, replaced, or
    given arbitrary text or octets (a delimiter, say) before, after or within."""
    boundary, start_id, cid, media = (draw(_boundaries), draw(_ids), draw(_ids | st.just("s@x")),
                                      draw(_medias))
    quote = draw(st.sampled_from(["'", '"']))
    close = draw(st.just(quote) | st.sampled_from(["'", '"', ""]))
    ct = ['multipart/related; boundary="', boundary, '"; start="<', start_id,
          '>"; type="application/beep+xml"']
    body = [b"--", boundary, "\r\nContent-Type: application/beep+xml\r\nContent-ID: <", start_id,
            ">\r\n\r\n", "<data", " ", "content", "=", quote, "cid:", cid, close, ">",
            "\r\n    <originator identity='fred@example.com' />",
            "\r\n    <recipient identity='barney@example.com' />\r\n</data>",
            "\r\n--", boundary, "\r\nContent-Type: ", media,
            "\r\nContent-Transfer-Encoding: binary\r\nContent-ID: <", cid, ">\r\n\r\n",
            draw(st.sampled_from([b"", b"GIF89a"]) | st.binary(max_size=20)),
            "\r\n--", boundary, "--\r\n"]
    octets = [p if isinstance(p, bytes) else p.encode() for p in body]
    delimiter = b"\r\n--" + boundary.encode()
    odd_octets = _ODD_OCTETS | st.sampled_from([delimiter, delimiter + b"--", delimiter[2:],
                                                delimiter[:-1], delimiter + b"--\r\n"])
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 4)) == 0:
            _edit(draw, ct, _ODD_TEXT)
        else:
            _edit(draw, octets, odd_octets)
    return "".join(ct), b"".join(octets)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(_spliced(), _max_xml_sizes)
def test_spliced_entities_are_matched_alike(entity: tuple[str, bytes],
                                            max_xml_size: int) -> None:
    """Entities of the canonical layout with fields at and past their bounds and pieces
    dropped, doubled or replaced at every seam: the two versions agree."""
    _agree(*entity, max_xml_size)


@settings(max_examples=300)
@given(st.text(max_size=200) | st.from_regex(
           r'multipart/related; boundary="[^"]{0,80}"; start="<[^>]{0,300}>";.{0,40}',
           fullmatch=True),
       st.binary(max_size=400), _max_xml_sizes)
def test_arbitrary_input_is_matched_alike(content_type: str, body: bytes,
                                          max_xml_size: int) -> None:
    """Arbitrary strings and octets: the two versions agree (and neither raises)."""
    _agree(content_type, body, max_xml_size)


# --- guards, one by one ---------------------------------------------------------------------

_PARTIES = (b"\r\n    <originator identity='fred@example.com' />\r\n"
            b"    <recipient identity='barney@example.com' />\r\n</data>")


def _entity(*, boundary: str = "B", start_id: str = "s@x", cid: str = "c@x",
            start_ref: str | None = None, opening: bytes | None = None,
            parties: bytes = _PARTIES, media: str = "image/gif",
            content: bytes = b"GIF89a", tail: bytes | None = None) -> tuple[str, bytes]:
    """The canonical entity, with one piece changed; `start_ref` is the Content-Type's
    `start` where it differs from the start part's Content-ID."""
    content_type = (f'multipart/related; boundary="{boundary}"; start="<{start_ref or start_id}>";'
                    ' type="application/beep+xml"')
    if opening is None:
        opening = f"<data content='cid:{cid}'>".encode()
    body = b"".join([
        f"--{boundary}\r\nContent-Type: application/beep+xml\r\nContent-ID: <{start_id}>\r\n"
        "\r\n".encode(), opening, parties,
        f"\r\n--{boundary}\r\nContent-Type: {media}\r\nContent-Transfer-Encoding: binary\r\n"
        f"Content-ID: <{cid}>\r\n\r\n".encode(), content,
        f"\r\n--{boundary}--\r\n".encode() if tail is None else tail])
    return content_type, body


@pytest.mark.parametrize(
    ("entity", "expected"),
    [
        (_entity(), "accepted"),
        (_entity(opening=b'<data content="cid:c@x">'), "accepted"),
        (_entity(opening=b"<data\r\n\tcontent \t=\n 'cid:c@x' \r\n>"), "accepted"),
        # the backreferenced quote
        (_entity(opening=b"<data content='cid:c@x\">"), "declined"),
        (_entity(opening=b"<data content=\"cid:c@x'>"), "declined"),
        (_entity(opening=b"<data content=cid:c@x>"), "declined"),
        # white space: XML's four only, and some after <data
        (_entity(opening=b"<datacontent='cid:c@x'>"), "declined"),
        (_entity(opening=b"<data\x0ccontent='cid:c@x'>"), "declined"),
        (_entity(opening=b"<data content='cid:c@x'\x0b>"), "declined"),
        (_entity(opening=b"<data content='cid:c@x' />"), "declined"),
        # the boundary: 1 to 70 bchars
        (_entity(boundary="b" * 70), "accepted"),
        (_entity(boundary="b" * 71), "declined"),
        (_entity(boundary="()+_,./:=?-09AZaz"), "accepted"),
        (_entity(boundary="b'b"), "declined"),
        (_entity(boundary="b b"), "declined"),
        (_entity(boundary=""), "declined"),
        # Content-IDs: 1 to 256 of their class, paired up
        (_entity(start_id=_ID_256), "accepted"),
        (_entity(start_id=_ID_257), "declined"),
        (_entity(cid=_ID_256), "accepted"),
        (_entity(cid=_ID_257), "declined"),
        (_entity(cid="!#$*+-./:=?@^_`{|}~"), "accepted"),
        (_entity(cid="c%40x"), "declined"),
        (_entity(start_id="s@x", start_ref="t@x"), "declined"),
        (_entity(opening=b"<data content='cid:d@x'>"), "declined"),
        # the content part's media type: 1 to 256 printable octets, no blank at either end
        (_entity(media=_MEDIA_256), "accepted"),
        (_entity(media=_MEDIA_256 + "z"), "declined"),
        (_entity(media="a"), "accepted"),
        (_entity(media="text/plain; charset=utf-8"), "accepted"),
        (_entity(media=" image/gif"), "declined"),
        (_entity(media="image/gif "), "declined"),
        (_entity(media=""), "declined"),
        (_entity(media="image/gif\x7f"), "declined"),
        # the delimiter inside the content, or straddling the headers' blank line
        (_entity(content=b"GIF\r\n--B89a"), "declined"),
        (_entity(content=b"GIF\r\n--B--\r\n"), "declined"),
        (_entity(content=b"--B\r\n"), "declined"),
        (_entity(content=b"GIF\r\n--"), "accepted"),
        (_entity(content=b"GIF\r\n-B"), "accepted"),
        (_entity(content=b""), "accepted"),
        # ... or in the document, or at its very start
        (_entity(parties=_PARTIES.replace(b"</data>", b"\r\n--B</data>")), "declined"),
        (_entity(opening=b"--B<data content='cid:c@x'>"), "declined"),
        # the close delimiter
        (_entity(tail=b"\r\n--B--"), "declined"),
        (_entity(tail=b"\r\n--B--\r\n\r\n"), "declined"),
        (_entity(tail=b"\r\n--B-\r\n"), "declined"),
        (_entity(tail=b"\r\n--B--\r\r"), "declined"),
        (_entity(tail=b"\r\n--B--\n\n"), "declined"),
        (_entity(tail=b"\r\n--C--\r\n"), "declined"),
        (_entity(tail=b""), "declined"),
        # a document that is not ASCII is left undecided, for the general path
        (_entity(parties=_PARTIES.replace(b"fred", b"fr\xc3\xa9d")), "undecided"),
        (_entity(parties=_PARTIES.replace(b"fred", b"fr\xc2\x85d")), "undecided"),
        (_entity(parties=_PARTIES.replace(b"fred", b"fr\xef\xbf\xbed")), "undecided"),
        (_entity(parties=_PARTIES.replace(b"fred", b"fr\xffd")), "undecided"),
        (_entity(parties=_PARTIES.replace(b"fred", b"fr\xedd")), "undecided"),
        # ... unless a guard on the octets has declined already
        (_entity(parties=_PARTIES.replace(b"fred", b"fr\xc3\xa9d"), media=" x"), "declined"),
    ],
)
def test_guard(entity: tuple[str, bytes], expected: str) -> None:
    """Each guard of the layout, at and past its bounds: the C accepts, declines or leaves the
    decision to the general path as expected, and `match_data` agrees with the oracle."""
    assert _decision(*entity) == expected
    layout = _agree(*entity)
    if expected == "accepted":
        assert layout is not None
    elif expected == "declined":
        assert layout is None


def test_non_ascii_documents_as_the_oracle_reads_them() -> None:
    """Left undecided by the C (so `match_data` declines): the oracle accepts a UTF-8 endpoint
    and declines C1 controls, U+FFFE and octets that are not UTF-8."""
    fine = _entity(parties=_PARTIES.replace(b"fred", b"fr\xc3\xa9d"))
    layout = _agree(*fine)
    assert layout is not None and layout.originator == Endpoint.parse("fr\u00e9d@example.com")
    for octets in (b"\xc2\x85", b"\xef\xbf\xbe", b"\xef\xbf\xbf", b"\xff", b"\xed\xa0\x80"):
        assert _agree(*_entity(parties=_PARTIES.replace(b"fred", b"fr" + octets + b"d"))) is None


def test_document_size_limit() -> None:
    """The document may be exactly `max_xml_size` octets, not one more; a negative limit
    declines; a limit beyond C's integers is left undecided."""
    content_type, body = _entity()
    size = len(b"<data content='cid:c@x'>" + _PARTIES)
    assert _decision(content_type, body, size) == "accepted"
    assert _agree(content_type, body, size) is not None
    assert _decision(content_type, body, size - 1) == "declined"
    assert _agree(content_type, body, size - 1) is None
    for limit in (0, -1):
        assert _decision(content_type, body, limit) == "declined"
        assert _agree(content_type, body, limit) is None
    assert _decision(content_type, body, 2**70) == _decision(content_type, body, -(2**70)) \
        == "undecided"
    assert _agree(content_type, body, 2**70) is not None
    assert _agree(content_type, body, -(2**70)) is None
    assert _agree(content_type, body, 2**63 - 1) is not None


def test_argument_types_other_than_str_bytes_int_are_left_undecided() -> None:
    """Subclasses and look-alikes (a bytearray body, a bool limit) are left undecided: the
    general path reads them (the oracle would give a bytearray content, say)."""

    class Text(str):
        pass

    content_type, body = _entity()
    for args in [(Text(content_type), body, 4096), (content_type, bytearray(body), 4096),
                 (content_type, body, True), (content_type, memoryview(body), 4096)]:
        assert _C is not None and _C.match_layout(*args) is True
    assert _agree(Text(content_type), body) is not None
    layout = _agree(content_type, bytearray(body))  # type: ignore[arg-type]
    assert layout is not None and type(layout.content) is bytearray
    assert _agree(content_type, body, True) is None
    with pytest.raises(TypeError):
        _C.match_layout(content_type, body)


def test_a_large_content_with_many_delimiter_look_alikes() -> None:
    """A megabyte of content made of near-delimiters is scanned to the same answer."""
    content_type, body = _entity(content=b"\r\n--\r\n-B\r\n--" * 100_000)
    assert _decision(content_type, body) == "accepted"
    assert _agree(content_type, body) is not None
    content_type, body = _entity(content=b"\r\n--C" * 200_000 + b"\r\n--B")
    assert _decision(content_type, body) == "declined"
    assert _agree(content_type, body) is None
