"""Robust delivery's documents and stamp (docs/robust-binding.md): the binding's examples, round
trips of generated values checked against docs/apexps-robust.dtd, and hostile input."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from adapters.apex.codec import Data, Option, decode, encode
from adapters.apex.endpoint import Endpoint
from adapters.apex.robust_codec import (
    MAX_BATCH_ITEMS,
    MAX_LINK_SEQ,
    Capabilities,
    CapabilityQuery,
    GapRequest,
    Heartbeat,
    LinkReply,
    LinkReset,
    PubStatus,
    PubStatusQuery,
    RepairRequest,
    RobustDocument,
    SourcePosition,
    Withheld,
    decode_robust,
    encode_robust,
)
from adapters.apex.robust_stamp import (
    PUBLISH_OPTION,
    STAMP_OPTION,
    PublishMeta,
    Stamp,
    StampKind,
    data_stamp_xml,
    decode_stamp,
    encode_stamp,
    find_publish_meta,
    find_stamp,
    publish_option,
    stamp_option,
)
from broker.records import PublishType
from common.errors import (
    ApexpsError,
    BadGapRange,
    InvalidParameter,
    LinkContextGone,
    ParameterSyntaxError,
    RebuildRefused,
    SyntaxError_,
)

DTD = etree.DTD(str(Path(__file__).resolve().parents[2] / "docs" / "apexps-robust.dtd"))


def _valid(xml: bytes | str) -> None:
    doc = etree.fromstring(xml.encode() if isinstance(xml, str) else xml)
    assert DTD.validate(doc), DTD.error_log.filter_from_errors()


def _opt(content: str) -> Option:
    return Option(STAMP_OPTION, content=content)


# --- the binding's examples -----------------------------------------------------------------


def test_the_data_stamp_example() -> None:
    """§2's stamp decodes to every field it shows, and is valid by the DTD."""
    xml = ("<seq link='desk-1' epoch='2' linkseq='57372' kind='data' source='fred@example.com'"
           " sourceseq='7547392' type='update' topic='equity.quote' token='6747'"
           " messageid='IBM' time='1712345678901' />")
    _valid(xml)
    assert decode_stamp(_opt(xml)) == Stamp(
        "desk-1", 57372, StampKind.DATA, 2, "fred@example.com", 7547392, PublishType.UPDATE,
        "equity.quote", "6747", "IBM", 1712345678901)


def test_heartbeat_and_reset_examples() -> None:
    """§2.1 and §2.2: heartbeat and reset stamps and their contents."""
    hb = decode_stamp(_opt("<seq link='desk-1' epoch='2' linkseq='57374' kind='heartbeat'"
                           " time='1712345683000' />"))
    assert hb == Stamp("desk-1", 57374, StampKind.HEARTBEAT, 2, time=1712345683000)
    reset = decode_stamp(_opt("<seq link='desk-1' epoch='3' linkseq='0' kind='reset'"
                              " repair='8' time='1712345690000' />"))
    assert reset == Stamp("desk-1", 0, StampKind.RESET, 3, time=1712345690000, repair=8)
    assert decode_robust(b"<heartbeat interval='5000' />") == Heartbeat(5000)
    assert decode_robust(b"<linkreset reason='source repair' />") == LinkReset("source repair")


def test_withheld_stamp_and_content() -> None:
    """§2.4: a withheld stamp takes a link seq and says nothing of the message; its content is
    an empty <withheld />."""
    xml = "<seq link='desk-1' epoch='2' linkseq='57375' kind='withheld' refill='true' />"
    _valid(xml)
    stamp = decode_stamp(_opt(xml))
    assert stamp == Stamp("desk-1", 57375, StampKind.WITHHELD, 2, refill=True)
    assert encode_stamp(stamp) == xml
    _valid(b"<withheld />")
    assert decode_robust(b"<withheld />") == Withheld()
    assert encode_robust(Withheld()) == b"<withheld />"


def test_request_examples() -> None:
    """§5.1, §5.2, §6: gap, open gap, repair, capability query; each valid by the DTD."""
    docs = {
        b"<gap link='desk-1' epoch='2' linkfrom='56737' linkto='56739' transID='7' />":
            GapRequest("desk-1", 56737, 7, 56739, 2),
        b"<gap link='desk-1' linkfrom='56740' transID='9' />": GapRequest("desk-1", 56740, 9),
        b"<repair link='desk-1' epoch='3' since='1712345678000' transID='8'>"
        b"<source name='fred@example.com' after='7547392' />"
        b"<source name='barney@example.com' after='211234' /></repair>":
            RepairRequest("desk-1", 8, (SourcePosition("fred@example.com", 7547392),
                                        SourcePosition("barney@example.com", 211234)),
                          1712345678000, 3),
        b"<capabilityquery transID='3' />": CapabilityQuery(3),
    }
    for xml, doc in docs.items():
        _valid(xml)
        assert decode_robust(xml) == doc
        assert encode_robust(doc) == xml


def test_answer_examples() -> None:
    """§4.1 and §6: a 569 linkreply and a full capabilities answer."""
    xml = (b"<linkreply code='569' transID='7' link='desk-1' epoch='3' linkseq='12'>link"
           b" context gone: desk-1 was reset at epoch 3; repair by source</linkreply>")
    _valid(xml)
    reply = decode_robust(xml)
    assert isinstance(reply, LinkReply) and reply.code == 569 and reply.link_seq == 12
    assert isinstance(reply.exception(), LinkContextGone)
    caps = (b"<capabilities transID='3' seqbits='32' heartbeat='5000' linkretention='86400000'"
            b" maxgap='10000' maxrepair='1000000' journalretention='2592000000'>"
            b"<selectorclass name='jms' /><selectorclass name='rfc2254' />"
            + b"".join(b"<publishtype name='%s' />" % t.value.encode() for t in PublishType)
            + b"<permissions scheme='tokens' /></capabilities>")
    _valid(caps)
    assert decode_robust(caps) == Capabilities(32, 5000, 86_400_000, 10_000, 1_000_000,
                                               2_592_000_000, ("jms", "rfc2254"),
                                               tuple(PublishType), "tokens", 3)


def test_pubstatus_examples() -> None:
    """§8: the pubstatus query and its answer, each valid by the DTD, both ways."""
    docs = {
        b"<pubstatus transID='4' />": PubStatusQuery(4),
        b"<pubstatus transID='4' source='fred@example.com' pubseq='17' sourceseq='7547392' />":
            PubStatus("fred@example.com", 17, 7547392, 4),
        b"<pubstatus source='fred@example.com' pubseq='0' sourceseq='0' />":
            PubStatus("fred@example.com", 0, 0),
    }
    for xml, doc in docs.items():
        _valid(xml)
        assert decode_robust(xml) == doc
        assert encode_robust(doc) == xml


def test_stamp_travels_beside_inre_in_an_apex_data() -> None:
    """The stamp is an option of the recipient: through the APEX codec and back, intact."""
    stamp = Stamp("desk-1", 65535, StampKind.DATA, 0, "fred@example.com", 9, PublishType.IMAGE,
                  "equity.quote", "6747", time=5)
    inre = Option("InRe", content="<subscription-id>100</subscription-id>")
    data = Data(Endpoint.parse("apex=pubsub/equity.quote@example.com"),
                (Endpoint.parse("jade@example.com"),), b"<quote sym='IBM' />",
                "application/beep+xml", recipient_options=((stamp_option(stamp), inre),),
                content_ref="#Content")
    back = decode(*encode(data))
    assert isinstance(back, Data)
    assert find_stamp(back.options_of(0)) == stamp
    assert find_stamp((inre,)) is None


def test_reply_from_an_exception_carries_its_code() -> None:
    """A domain error becomes a linkreply with its code and message, and back again."""
    reply = LinkReply.from_exception(RebuildRefused("a gap of 20000"), "desk-1", 7, max_gap=10)
    back = decode_robust(encode_robust(reply))
    assert back == reply and isinstance(reply.exception(), RebuildRefused)
    assert LinkReply(250, "desk-1", 7).exception() is None


# --- round trips ----------------------------------------------------------------------------

_links = st.sampled_from(["desk-1", "fred/appl=wb@example.com", "a <&>'\" b", "x" * 1024])
_sources = st.sampled_from(["fred@example.com", "apex=pubsub/a.b@redistr.com", "w/x@[10.0.0.1]"])
_topics = st.from_regex(r"[a-z][a-z0-9]{0,8}(\.[a-z0-9]{1,5}){0,2}", fullmatch=True)
_longs = st.integers(0, 2**63 - 1)
_link_seqs = st.integers(1, MAX_LINK_SEQ)
_ids = st.integers(1, 2_147_483_647)
_names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF,
                               blacklist_characters="\x7f"),
                 min_size=1, max_size=30).filter(lambda t: t.strip() == t)


@st.composite
def _stamps(draw: st.DrawFn) -> Stamp:
    kind = draw(st.sampled_from(StampKind))
    link, epoch = draw(_links), draw(_longs)
    time = draw(st.none() | _longs)
    if kind is StampKind.RESET:
        return Stamp(link, 0, kind, epoch, time=time, repair=draw(st.none() | _ids))
    if kind in (StampKind.HEARTBEAT, StampKind.WITHHELD):
        return Stamp(link, draw(_link_seqs), kind, epoch, time=time, refill=draw(st.booleans()))
    return Stamp(link, draw(_link_seqs), kind, epoch, draw(_sources),
                 draw(st.integers(1, 2**63 - 1)), draw(st.sampled_from(PublishType)),
                 draw(_topics), draw(st.none() | _names), draw(st.none() | _names), time,
                 draw(st.booleans()))


_docs: st.SearchStrategy[RobustDocument] = st.one_of(
    st.builds(Heartbeat, st.integers(1, 2**63 - 1)),
    st.builds(LinkReset, st.none() | _names),
    st.just(Withheld()),
    st.builds(GapRequest, _links, st.integers(0, MAX_LINK_SEQ), _ids,
              st.none() | st.integers(0, MAX_LINK_SEQ), st.none() | _longs,
              st.none() | st.integers(1, MAX_BATCH_ITEMS)),
    st.builds(RepairRequest, _links, _ids,
              st.lists(st.builds(SourcePosition, _sources, _longs), max_size=3,
                       unique_by=lambda p: p.source).map(tuple),
              st.none() | _longs, st.none() | _longs,
              st.none() | st.integers(1, MAX_BATCH_ITEMS)),
    st.builds(CapabilityQuery, _ids),
    st.builds(PubStatusQuery, _ids),
    st.builds(PubStatus, _sources, _longs, _longs, st.none() | _ids),
    st.builds(Capabilities, st.sampled_from([16, 32, 64]), st.integers(1, 2**63 - 1),
              st.integers(1, 2**63 - 1), st.integers(1, 2**63 - 1), st.integers(1, 2**63 - 1),
              st.integers(-1, 2**63 - 1),
              st.lists(st.sampled_from(["jms", "rfc2254", "x.y-1"]), unique=True).map(tuple),
              st.lists(st.sampled_from(PublishType), unique=True).map(tuple),
              st.sampled_from(["tokens", "none"]), st.none() | _ids),
    st.builds(LinkReply, st.integers(100, 999), _links, st.none() | _ids, st.none() | _longs,
              st.none() | st.integers(0, MAX_LINK_SEQ), st.none() | st.integers(0, MAX_LINK_SEQ),
              st.none() | st.integers(1, 2**63 - 1), _names | st.just("")),
)


@given(_stamps())
def test_stamp_round_trip(stamp: Stamp) -> None:
    """Every stamp encodes to DTD-valid XML that decodes to the same stamp."""
    xml = encode_stamp(stamp)
    _valid(xml)
    assert decode_stamp(stamp_option(stamp)) == stamp


@given(_docs)
def test_document_round_trip(doc: RobustDocument) -> None:
    """Every document encodes to DTD-valid XML that decodes to the same value."""
    xml = encode_robust(doc)
    _valid(xml)
    assert decode_robust(xml) == doc


# --- hostile and invalid input --------------------------------------------------------------


@pytest.mark.parametrize(("xml", "error"), [
    ("<seq link='L' linkseq='1' />", ParameterSyntaxError),                     # data, no source
    ("<seq link='L' linkseq='0' kind='data' source='a@b.c' sourceseq='1' type='update'"
     " topic='t' />", ParameterSyntaxError),                                   # data at seq 0
    ("<seq link='L' linkseq='5' kind='reset' />", ParameterSyntaxError),       # reset not at 0
    ("<seq link='L' linkseq='0' kind='heartbeat' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='3' kind='heartbeat' source='a@b.c' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='3' kind='heartbeat' repair='4' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='0' kind='reset' refill='true' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='3' kind='beat' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='0' kind='withheld' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='3' kind='withheld' source='a@b.c' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='3' kind='withheld' token='6747' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='3' kind='withheld' topic='t' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='3' kind='withheld' repair='1' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='3' kind='heartbeat' refill='yes' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='3' kind='heartbeat' colour='red' />", ParameterSyntaxError),
    ("<seq linkseq='3' kind='heartbeat' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='x' kind='heartbeat' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='-3' kind='heartbeat' />", BadGapRange),
    ("<seq link='L' linkseq='18446744073709551616' kind='heartbeat' />", BadGapRange),
    ("<seq link='L' linkseq='3' epoch='-1' kind='heartbeat' />", ParameterSyntaxError),
    ("<seq link='L' linkseq='3' epoch='9223372036854775808' kind='heartbeat' />",
     ParameterSyntaxError),
    ("<seq link='' linkseq='3' kind='heartbeat' />", InvalidParameter),
    ("<seq link='L' linkseq='1' source='nobody' sourceseq='1' type='update' topic='t' />",
     InvalidParameter),
    ("<seq link='L' linkseq='1' source='a@b.c' sourceseq='1' type='update' topic='a/b' />",
     InvalidParameter),
    ("<seq link='L' linkseq='1' source='a@b.c' sourceseq='0' type='update' topic='t' />",
     ParameterSyntaxError),
    ("<seq link='L' linkseq='1' source='a@b.c' sourceseq='1' type='set' topic='t' />",
     ParameterSyntaxError),
    ("<seq link='L' linkseq='1' source='a@b.c' sourceseq='1' type='update' topic='t'"
     " token='" + "x" * 300 + "' />", InvalidParameter),
    ("<seq link='L' linkseq='3' kind='heartbeat'><x /></seq>", SyntaxError_),  # too deep
    ("<gap link='L' linkfrom='1' />", ParameterSyntaxError),                    # not a stamp
    ("<seq link='L' linkseq='3' kind='heartbeat'", SyntaxError_),
    ("<!DOCTYPE seq [<!ENTITY a 'b'>]><seq link='&a;' linkseq='3' kind='heartbeat' />",
     SyntaxError_),
])
def test_hostile_stamps_get_the_right_code(xml: str, error: type[ApexpsError]) -> None:
    """Each malformed stamp is refused with the code the binding gives it."""
    with pytest.raises(error):
        decode_stamp(_opt(xml))


def test_foreign_or_doubled_stamp_options() -> None:
    """Only the internal apexps.seq option is a stamp, and a recipient carries one."""
    stamp = _opt("<seq link='L' linkseq='3' kind='heartbeat' />")
    with pytest.raises(ParameterSyntaxError):
        decode_stamp(Option(STAMP_OPTION, external=True, content=stamp.content))
    assert find_stamp([Option("urn:x:" + STAMP_OPTION, external=True)]) is None
    with pytest.raises(ParameterSyntaxError):
        find_stamp([stamp, stamp])


@pytest.mark.parametrize(("doc", "error"), [
    (b"<gap link='L' linkfrom='-1' linkto='3' transID='1' />", BadGapRange),
    (b"<gap link='L' linkfrom='1' linkto='-3' transID='1' />", BadGapRange),
    (b"<gap link='L' linkfrom='1' linkto='" + b"9" * 500 + b"' transID='1' />", BadGapRange),
    (b"<gap link='L' linkfrom='1e3' transID='1' />", ParameterSyntaxError),
    (b"<gap link='L' linkfrom=' 1' transID='1' />", ParameterSyntaxError),
    (b"<gap link='L' linkfrom='1' />", ParameterSyntaxError),
    (b"<gap link='L' linkfrom='1' transID='0' />", ParameterSyntaxError),
    (b"<gap link='L' linkfrom='1' transID='1' extra='x' />", ParameterSyntaxError),
    (b"<gap link='L' linkfrom='1' transID='1'>x</gap>", ParameterSyntaxError),
    (b"<gap link=' L' linkfrom='1' transID='1' />", InvalidParameter),
    (b"<gap link='L' linkfrom='1' transID='1' batch='0' />", ParameterSyntaxError),
    (b"<gap link='L' linkfrom='1' transID='1' batch='4097' />", ParameterSyntaxError),
    (b"<gap link='L' linkfrom='1' transID='1' batch='many' />", ParameterSyntaxError),
    (b"<repair link='L' transID='1' batch='-5' />", ParameterSyntaxError),
    (b"<repair link='L' transID='1'><source name='a@b.c' after='1' />"
     b"<source name='a@b.c' after='2' /></repair>", InvalidParameter),        # twice
    (b"<repair link='L' transID='1'><source name='nobody' after='1' /></repair>",
     InvalidParameter),
    (b"<repair link='L' transID='1'><source name='a@b.c' /></repair>", ParameterSyntaxError),
    (b"<repair link='L' transID='1'><gap /></repair>", ParameterSyntaxError),
    (b"<repair link='L' transID='1'>text</repair>", ParameterSyntaxError),
    (b"<repair link='L' transID='1'>" + b"<source name='a@b.c' after='1' />" * 4097
     + b"</repair>", InvalidParameter),
    (b"<capabilityquery />", ParameterSyntaxError),
    (b"<pubstatus />", ParameterSyntaxError),                                   # no transID
    (b"<pubstatus transID='1' pubseq='3' />", ParameterSyntaxError),            # half an answer
    (b"<pubstatus source='a@b.c' pubseq='-1' sourceseq='0' />", ParameterSyntaxError),
    (b"<pubstatus source='a@b.c' pubseq='1' sourceseq='" + b"9" * 30 + b"' />",
     ParameterSyntaxError),
    (b"<pubstatus source='nobody' pubseq='1' sourceseq='1' />", InvalidParameter),
    (b"<pubstatus transID='1' colour='red' />", ParameterSyntaxError),
    (b"<pubstatus transID='1'>x</pubstatus>", ParameterSyntaxError),
    (b"<capabilities seqbits='24' heartbeat='1' linkretention='1' maxgap='1' maxrepair='1'"
     b" journalretention='1' />", ParameterSyntaxError),
    (b"<capabilities seqbits='16' heartbeat='1' linkretention='1' maxgap='1' maxrepair='1'"
     b" journalretention='1'><permissions scheme='tokens' /><publishtype name='image' />"
     b"</capabilities>", ParameterSyntaxError),                                 # out of order
    (b"<capabilities seqbits='16' heartbeat='1' linkretention='1' maxgap='1' maxrepair='1'"
     b" journalretention='-2' />", ParameterSyntaxError),
    (b"<linkreply code='25' link='L' />", ParameterSyntaxError),
    (b"<linkreply code='250' />", ParameterSyntaxError),
    (b"<linkreply code='250' link='L'><b>no</b></linkreply>", ParameterSyntaxError),
    (b"<heartbeat interval='0' />", ParameterSyntaxError),
    (b"<withheld token='6747' />", ParameterSyntaxError),
    (b"<withheld>a</withheld>", ParameterSyntaxError),
    (b"<subscribe />", ParameterSyntaxError),
    (b"<gap", SyntaxError_),
    (b"<!DOCTYPE gap [<!ENTITY a 'b'>]><gap link='&a;' linkfrom='1' transID='1' />",
     SyntaxError_),
    (b"<repair link='L' transID='1'><source><x /></source></repair>", SyntaxError_),  # depth
    (b"<linkreply code='250' link='L'>" + b"x" * (1024 * 1024) + b"</linkreply>", SyntaxError_),
])
def test_hostile_documents_get_the_right_code(doc: bytes, error: type[ApexpsError]) -> None:
    """Each malformed document is refused with the code the binding gives it."""
    with pytest.raises(error):
        decode_robust(doc)


@given(st.binary(max_size=300))
def test_any_bytes_decode_or_raise_an_apexps_error(blob: bytes) -> None:
    """Whatever arrives, decoding yields a document or an ApexpsError, nothing else."""
    with contextlib.suppress(ApexpsError):
        decode_robust(blob)
    with contextlib.suppress(ApexpsError):
        decode_stamp(_opt(blob.decode("utf-8", "replace")))


@given(_docs, st.data())
def test_mutated_documents_decode_or_raise_an_apexps_error(doc: RobustDocument,
                                                          data: st.DataObject) -> None:
    """A valid document with bytes changed, cut or inserted still meets only coded errors."""
    xml = bytearray(encode_robust(doc))
    at = data.draw(st.integers(0, len(xml)))
    action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    junk = data.draw(st.sampled_from([b"-", b"'", b"<", b"0", b"99999999999999999999999", b" "]))
    if action == "flip" and at < len(xml):
        xml[at] = junk[0]
    elif action == "cut":
        del xml[at:]
    else:
        xml[at:at] = junk
    with contextlib.suppress(ApexpsError):
        decode_robust(bytes(xml))


def test_constructors_refuse_what_could_not_be_encoded() -> None:
    """The dataclasses check their invariants, so nothing invalid is ever written."""
    with pytest.raises(ParameterSyntaxError):
        Stamp("L", 0)                                   # data without source, at 0
    with pytest.raises(InvalidParameter):
        Stamp("L", 1, StampKind.DATA, 0, "a@b.c", 1, PublishType.UPDATE, "t", token="a\nb")
    with pytest.raises(BadGapRange):
        GapRequest("L", -1, 1)
    with pytest.raises(InvalidParameter):
        LinkReset("line\nbreak")
    with pytest.raises(ParameterSyntaxError):
        Capabilities(16, 1, 1, 1, 1, -1, ("a", "a"))


@given(_stamps())
def test_the_fast_data_stamp_writer_matches_the_checked_one(stamp: Stamp) -> None:
    """data_stamp_xml (the fan-out's path) writes exactly what encode_stamp writes."""
    if stamp.kind is not StampKind.DATA:
        return
    assert stamp.source is not None and stamp.source_seq is not None and stamp.topic
    assert data_stamp_xml(stamp.link, stamp.link_seq, epoch=stamp.epoch, source=stamp.source,
                          source_seq=stamp.source_seq, publish_type=str(stamp.publish_type),
                          topic=stamp.topic, token=stamp.token, message_id=stamp.message_id,
                          time=stamp.time, refill=stamp.refill) == encode_stamp(stamp)


# --- the publish option (§2.3) --------------------------------------------------------------


def test_the_publish_option_example() -> None:
    """§2.3's option decodes to every field it shows, and is valid by the DTD."""
    xml = "<publish type='image' messageid='IBM' token='6747' pubseq='1042' />"
    _valid(xml)
    assert find_publish_meta([Option(PUBLISH_OPTION, content=xml)]) == PublishMeta(
        PublishType.IMAGE, "IBM", "6747", 1042)
    assert find_publish_meta([Option("dataTiming", content="<dataTiming />")]) is None


_published_types = st.sampled_from([t for t in PublishType if t is not PublishType.SNAPSHOT])


@given(st.builds(PublishMeta, _published_types, st.none() | _names, st.none() | _names,
                 st.none() | st.integers(1, 2**63 - 1)))
def test_publish_option_round_trip(meta: PublishMeta) -> None:
    option = publish_option(meta)
    _valid(option.content)
    assert find_publish_meta([option]) == meta


@pytest.mark.parametrize(("xml", "error"), [
    ("<publish type='snapshot' />", InvalidParameter),       # a subscriber's request
    ("<publish type='set' />", ParameterSyntaxError),
    ("<publish pubseq='0' />", ParameterSyntaxError),
    ("<publish pubseq='-1' />", ParameterSyntaxError),
    ("<publish pubseq='9223372036854775808' />", ParameterSyntaxError),
    ("<publish colour='red' />", ParameterSyntaxError),
    ("<publish token='" + "x" * 300 + "' />", InvalidParameter),
    ("<publish messageid='a&#1;b' />", SyntaxError_),           # not well-formed XML 1.0
    ("<seq link='L' linkseq='3' kind='heartbeat' />", ParameterSyntaxError),
    ("<publish><x /></publish>", SyntaxError_),
    ("<!DOCTYPE publish [<!ENTITY a 'b'>]><publish token='&a;' />", SyntaxError_),
    ("<publish", SyntaxError_),
])
def test_hostile_publish_options_get_the_right_code(xml: str, error: type[ApexpsError]) -> None:
    with pytest.raises(error):
        find_publish_meta([Option(PUBLISH_OPTION, content=xml)])


def test_two_publish_options_are_501() -> None:
    one = publish_option(PublishMeta())
    with pytest.raises(ParameterSyntaxError):
        find_publish_meta([one, one])
