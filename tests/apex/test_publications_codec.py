"""The `<publications>` document (docs/robust-binding.md §2.6): what the writer writes decodes
to the very publications it was given and fits the DTD; the fast reader agrees with the general
one on any input it takes; hostile and malformed documents get the right code; the durable
note names exactly the publications it was given."""

from __future__ import annotations

import binascii
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from adapters.apex.publications_codec import (
    MAX_PUBLICATIONS,
    Publication,
    _decode_fast,
    _decode_general,
    decode_publications,
    durable_items,
    durable_note,
    encode_publications,
)
from adapters.apex.robust_stamp import PublishMeta
from broker.records import PublishType
from common.errors import (
    ApexpsError,
    InvalidParameter,
    InvalidTopicName,
    ParameterSyntaxError,
    SyntaxError_,
)

DTD = etree.DTD(str(Path(__file__).resolve().parents[2] / "docs" / "apexps-robust.dtd"))

_topics = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,6}(\.[A-Za-z0-9][A-Za-z0-9_-]{0,6}){0,2}",
                        fullmatch=True)
# MIME types with every printable octet, those the writer escapes (& < > ') included
_types = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1,
                 max_size=40)
_metas = st.none() | st.builds(
    PublishMeta,
    st.sampled_from([t for t in PublishType if t is not PublishType.SNAPSHOT]),
    st.none() | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1,
                        max_size=20),
    st.none() | st.sampled_from(["6747", "t<&>'\""]),
    st.none() | st.integers(1, 2**63 - 1),
    st.none() | st.integers(0x8000, 0xFFFF_FFFF),
    st.booleans())
# the ids of a delivery's inre (the service writes them: subscription ids, non-ASCII ones too)
_in_re = st.none() | st.lists(st.from_regex(r"[\w.:=/@+-]{1,12}", fullmatch=True), min_size=1,
                              max_size=4).map(tuple)
_publications = st.builds(Publication, _topics, st.binary(max_size=200), _types, _metas,
                          _in_re)


@given(st.lists(_publications, max_size=30))
def test_what_is_written_decodes_to_the_same_publications_in_order(
        pubs: list[Publication]) -> None:
    doc = encode_publications(pubs)
    assert decode_publications(doc) == pubs
    assert DTD.validate(etree.fromstring(doc)), DTD.error_log


@given(st.lists(_publications, max_size=30))
def test_the_fast_reader_gives_what_the_general_one_gives(pubs: list[Publication]) -> None:
    doc = encode_publications(pubs)
    fast = _decode_fast(doc)
    assert _decode_general(doc) == pubs
    assert fast is None or fast == pubs
    # the writer's plain layout (no <publish>, nothing to escape, ASCII ids) is the fast
    # reader's
    if all(p.meta is None and not set(p.content_type) & set("&<>'")
           and all(i.isascii() for i in p.in_re or ()) for p in pubs):
        assert fast == pubs


@given(st.binary(max_size=400))
def test_the_fast_reader_never_takes_what_the_general_one_refuses(noise: bytes) -> None:
    doc = encode_publications([Publication("q.a", b"hello", "text/plain")])
    for candidate in (noise, doc[:30] + noise + doc[30:], doc.replace(b"aGVsbG8=", noise)):
        fast = _decode_fast(candidate)
        if fast is None:
            continue
        assert _decode_general(candidate) == fast


_BAD: list[tuple[bytes, type[ApexpsError]]] = [
    (b"<publications", SyntaxError_),
    (b"<!DOCTYPE publications [<!ENTITY a 'b'>]><publications>&a;</publications>",
     SyntaxError_),
    (b"<batch />", ParameterSyntaxError),
    (b"<publications x='1' />", ParameterSyntaxError),
    (b"<publications>text</publications>", ParameterSyntaxError),
    (b"<publications><item /></publications>", ParameterSyntaxError),
    (b"<publications><publication><content type='a/b'>eA==</content></publication>"
     b"</publications>", ParameterSyntaxError),  # no topic
    (b"<publications><publication topic='q'>eA==</publication></publications>",
     ParameterSyntaxError),
    (b"<publications><publication topic='q'><content type='a/b'>not base64!</content>"
     b"</publication></publications>", ParameterSyntaxError),
    (b"<publications><publication topic='q'><content type='a b'>eA==</content>"
     b"</publication></publications>", ParameterSyntaxError),
    (b"<publications><publication topic='q'><content>eA==</content></publication>"
     b"</publications>", ParameterSyntaxError),
    (b"<publications><publication topic='q'><content type='a/b'>eA==</content>"
     b"<content type='a/b'>eA==</content></publication></publications>",
     ParameterSyntaxError),
    (b"<publications><publication topic='q'><publish pubseq='0' /><content type='a/b'>eA=="
     b"</content></publication></publications>", ParameterSyntaxError),
    (b"<publications><publication topic='q'><publish type='snapshot' /><content type='a/b'>"
     b"eA==</content></publication></publications>", InvalidParameter),
    (b"<publications><publication topic='no such!'><content type='a/b'>eA==</content>"
     b"</publication></publications>", InvalidTopicName),
    (b"<publications><publication topic='WKT=Nope'><content type='a/b'>eA==</content>"
     b"</publication></publications>", InvalidTopicName),
    (b"<publications><publication topic='q' inre='a  b'><content type='a/b'>eA==</content>"
     b"</publication></publications>", ParameterSyntaxError),  # an empty id
    (b"<publications><publication topic='q' inre='a;b'><content type='a/b'>eA==</content>"
     b"</publication></publications>", ParameterSyntaxError),
    (b"<publications>" + b"<publication topic='q'><content type='a/b'>eA==</content>"
     b"</publication>" * (MAX_PUBLICATIONS + 1) + b"</publications>", ParameterSyntaxError),
]


@pytest.mark.parametrize(("doc", "error"), _BAD, ids=range(len(_BAD)))
def test_a_malformed_or_hostile_document_is_refused_with_its_code(
        doc: bytes, error: type[ApexpsError]) -> None:
    with pytest.raises(error):
        decode_publications(doc)


def test_the_reader_keeps_whitespace_between_elements_out_of_the_content() -> None:
    doc = (b"<publications>\n  <publication topic='q.a'>\n    <content type='text/plain'>"
           + binascii.b2a_base64(b"hi", newline=False)
           + b"</content>\n  </publication>\n</publications>")
    assert decode_publications(doc) == [Publication("q.a", b"hi", "text/plain")]


@given(st.lists(st.integers(0, 300), unique=True).map(sorted), st.text(max_size=30))
def test_the_durable_note_names_exactly_its_publications(durable: list[int], text: str) -> None:
    note = durable_note(durable)
    assert durable_items(f"{text}{note}", 301) == set(durable)
    # a place beyond the document is not believed, nor is a text in another form
    if durable:
        assert durable_items(f"{text}{note}", durable[-1]) == set()
    assert durable_items(text.replace(" (durable: ", ""), 301) == set()


def test_the_binding_example_decodes() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "robust-binding.md").read_text()
    example = text.split("```xml\n<publications>", 1)[1].split("```", 1)[0]
    got = decode_publications(f"<publications>{example}".encode())
    assert [(p.topic, p.content, p.content_type) for p in got] == [
        ("equity.quote", b"<quote sym='IBM' />", "application/xml"),
        ("equity.quote", b"IBM 101.5", "text/plain")]
    assert got[0].meta is None
    assert got[1].meta == PublishMeta(PublishType.IMAGE, "IBM", "6747")
