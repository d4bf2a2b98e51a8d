"""Snapshots on the wire (docs/robust-binding.md §9): the `snapshot` request, the stamp's
`snapshot` marker and subscribe's `snapshot` attribute — the binding's examples, round trips
checked against docs/apexps-robust.dtd, and hostile input."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from adapters.apex.codec import Option
from adapters.apex.endpoint import Endpoint
from adapters.apex.pubsub_codec import Subscribe, decode_pubsub, encode_pubsub
from adapters.apex.robust_codec import (
    ROBUST_ELEMENTS,
    SnapshotRequest,
    decode_robust,
    encode_robust,
)
from adapters.apex.robust_stamp import (
    STAMP_OPTION,
    Stamp,
    StampKind,
    data_stamp_xml,
    decode_stamp,
    encode_stamp,
    stamp_option,
)
from broker.records import PublishType
from common.errors import ApexpsError, InvalidParameter, ParameterSyntaxError, SyntaxError_

DTD = etree.DTD(str(Path(__file__).resolve().parents[2] / "docs" / "apexps-robust.dtd"))


def _valid(xml: bytes | str) -> None:
    doc = etree.fromstring(xml.encode() if isinstance(xml, str) else xml)
    assert DTD.validate(doc), DTD.error_log.filter_from_errors()


def test_the_binding_examples() -> None:
    """§9's request and stamp decode to what they show and are valid by the DTD."""
    req = b"<snapshot topic='equity.quote' messageid='IBM' transID='9' />"
    _valid(req)
    assert decode_robust(req) == SnapshotRequest("equity.quote", 9, "IBM")
    assert "snapshot" in ROBUST_ELEMENTS
    whole = b"<snapshot topic='equity.quote' link='desk-1' transID='10' />"
    assert decode_robust(whole) == SnapshotRequest("equity.quote", 10, None, "desk-1")
    stamp = ("<seq link='desk-1' linkseq='1' kind='data' source='fred@example.com'"
             " sourceseq='7547390' type='image' topic='equity.quote' messageid='IBM'"
             " time='1712345600000' snapshot='true' />")
    _valid(stamp)
    got = decode_stamp(stamp_option(Stamp("desk-1", 1, StampKind.DATA, 0, "fred@example.com",
                                          7547390, PublishType.IMAGE, "equity.quote",
                                          message_id="IBM", time=1712345600000,
                                          snapshot=True)))
    assert got.snapshot and encode_stamp(got) == stamp


_topics = st.from_regex(r"[a-z][a-z0-9]{0,8}(\.[a-z0-9]{1,5}){0,2}", fullmatch=True)
_names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF,
                               blacklist_characters="\x7f"),
                 min_size=1, max_size=30).filter(lambda t: t.strip() == t)
_ids = st.integers(1, 2_147_483_647)


@given(st.builds(SnapshotRequest, _topics, _ids, st.none() | _names,
                 st.none() | st.sampled_from(["desk-1", "a <&>'\" b", "x" * 1024])))
def test_request_round_trip(req: SnapshotRequest) -> None:
    """Every snapshot request encodes to DTD-valid XML that decodes to the same value."""
    xml = encode_robust(req)
    _valid(xml)
    assert decode_robust(xml) == req


@given(st.builds(Stamp, st.just("desk-1"), st.integers(1, 2**64 - 1), st.just(StampKind.DATA),
                 st.integers(0, 2**63 - 1), st.just("fred@example.com"),
                 st.integers(1, 2**63 - 1), st.sampled_from(PublishType), _topics,
                 st.none() | _names, st.none() | _names, st.none() | st.integers(0, 2**63 - 1),
                 st.booleans(), st.none(), st.booleans()))
def test_snapshot_stamps_round_trip_and_the_fast_writer_agrees(stamp: Stamp) -> None:
    """A data stamp with or without `snapshot` (and `refill`) round-trips, is DTD-valid, and
    the fan-out's writer produces the same bytes."""
    xml = encode_stamp(stamp)
    _valid(xml)
    assert decode_stamp(stamp_option(stamp)) == stamp
    assert stamp.source is not None and stamp.source_seq is not None and stamp.topic
    assert data_stamp_xml(stamp.link, stamp.link_seq, epoch=stamp.epoch, source=stamp.source,
                          source_seq=stamp.source_seq, publish_type=str(stamp.publish_type),
                          topic=stamp.topic, token=stamp.token, message_id=stamp.message_id,
                          time=stamp.time, refill=stamp.refill,
                          snapshot=stamp.snapshot) == xml


@pytest.mark.parametrize(("xml", "error"), [
    (b"<snapshot transID='9' />", ParameterSyntaxError),                       # no topic
    (b"<snapshot topic='q' />", ParameterSyntaxError),                         # no transID
    (b"<snapshot topic='q' transID='0' />", ParameterSyntaxError),
    (b"<snapshot topic='q' transID='9' colour='red' />", ParameterSyntaxError),
    (b"<snapshot topic='q' transID='9'><x /></snapshot>", ParameterSyntaxError),  # EMPTY
    (b"<snapshot topic='q' transID='9'>text</snapshot>", ParameterSyntaxError),
    (b"<snapshot topic='a/b' transID='9' />", InvalidParameter),               # not a topic
    (b"<snapshot topic='q' transID='9' messageid='a&#9;b' />", InvalidParameter),
    (b"<snapshot topic='q' transID='9' link='' />", InvalidParameter),
    (b"<snapshot topic='q' transID='9'", SyntaxError_),
    (b"<!DOCTYPE snapshot [<!ENTITY a 'q'>]><snapshot topic='&a;' transID='9' />",
     SyntaxError_),
])
def test_hostile_requests_get_the_right_code(xml: bytes, error: type[ApexpsError]) -> None:
    """Each malformed snapshot request is refused with the code the binding gives it."""
    with pytest.raises(error):
        decode_robust(xml)


@pytest.mark.parametrize("xml", [
    "<seq link='L' linkseq='3' kind='heartbeat' snapshot='true' />",
    "<seq link='L' linkseq='1' source='a@b.c' sourceseq='1' type='update' topic='t'"
    " snapshot='yes' />",
])
def test_snapshot_marks_only_data(xml: str) -> None:
    """`snapshot` is true or false, and only a data stamp carries it: 501."""
    with pytest.raises(ParameterSyntaxError):
        decode_stamp(Option(STAMP_OPTION, content=xml))


def test_subscribe_asks_for_a_snapshot() -> None:
    """subscribe's `snapshot` attribute round-trips; anything but true/false is 501."""
    doc = (b"<subscribe subscriber='jade@example.com' topic='equity.quote' duration='86400'"
           b" transID='5' link='desk-1' snapshot='true' />")
    op = decode_pubsub(doc)
    assert op == Subscribe(Endpoint.parse("jade@example.com"), "equity.quote", 5, 86400,
                           "desk-1", True)
    assert encode_pubsub(op) == doc
    plain = Subscribe(Endpoint.parse("jade@example.com"), "q", 6, 60)
    assert b"snapshot" not in encode_pubsub(plain)
    assert decode_pubsub(encode_pubsub(plain)) == plain
    with pytest.raises(ParameterSyntaxError):
        decode_pubsub(b"<subscribe subscriber='jade@example.com' topic='q' duration='9'"
                      b" transID='5' snapshot='1' />")
