"""The `<batch>` fast path (`_batch_fast.match_batch`) against the general decoder.

The fast path may decline anything; what it accepts, the general path must accept with an
equal result (compared by `repr` too, so `True` never passes for `1`), and it never raises.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.apex._batch_codec import (
    MAX_BATCH_XML,
    Batch,
    BatchItem,
    BatchPacker,
    _decode_general,
    batch_data_item,
    batch_item,
    batch_items,
    decode_batch,
)
from adapters.apex._batch_fast import match_batch
from adapters.apex._robust_codec import (
    MAX_BATCH_ITEMS,
    Heartbeat,
    Stamp,
    StampKind,
    Withheld,
    data_stamp_xml,
    encode_robust,
    encode_stamp,
)
from broker.errors import ApexpsError
from broker.records import PublishType
from tests.mutations import EDITS, edit_octets

LINK = "s1@bench.example"

# --- strategies -----------------------------------------------------------------------------

#: Names the broker writes as they are (no escaping, ASCII): the fast path must take them.
_plain = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 .@/=_-]{0,14}[A-Za-z0-9]", fullmatch=True)
_sources = st.sampled_from(["pub@bench.example", "a@b.c", "fred/appl=x@example.com"])
_topics = st.sampled_from(["bench.quotes", "q.a", "WKT=Topics"])
#: ... and names that are not plain: escapes, blanks at the ends, non-ASCII, controls.
_odd = st.sampled_from(["a&b", "a<b", "a>b", "a'b", 'a"b', " a", "a ", "é", "a\tb", "a\x85b",
                        "x" * 1025, "nobody", "9bad", "WKT=Nope", "a@b.c", "q.b"])
_numbers = st.integers(1, 2**63 - 1) | st.sampled_from([1, 2**32, 2**63 - 1])


_MEDIA = st.sampled_from(["application/octet-stream", 'text/plain;x="y"', "x/y+z"])
#: Media types the fast path leaves to the general one: escaped, or too long.
_ODD_MEDIA = st.sampled_from(["a'b", "a&b/c", "x" * 256, "a b"])


def _stamp_kw(draw: st.DrawFn, odd: bool) -> dict[str, object]:
    names = (_plain | _odd) if odd else _plain
    return {"epoch": draw(st.sampled_from([0, 0, 1, 2**63 - 1])),
            "source": draw((_sources | names) if odd else _sources),
            "source_seq": draw(_numbers),
            "publish_type": str(draw(st.sampled_from(PublishType))),
            "topic": draw((_topics | names) if odd else _topics),
            "token": draw(st.none() | st.sampled_from(["6747", "fx.1"]) | names),
            "message_id": draw(st.none() | names),
            "time": draw(st.none() | st.integers(0, 2**63 - 1)),
            "refill": draw(st.booleans()), "snapshot": draw(st.booleans())}


def _other_stamp(link: str, link_seq: int, kind: StampKind, epoch: int, time: int | None,
                 refill: bool) -> str:
    """A heartbeat or withheld stamp as `encode_stamp` writes it, also of a link id no
    `Stamp` takes (written as the encoder would)."""
    try:
        return encode_stamp(Stamp(link, link_seq, kind, epoch, time=time, refill=refill))
    except ApexpsError:
        link = link.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") \
            .replace("'", "&apos;")
        return f"<seq link='{link}' linkseq='{link_seq}' kind='{kind}' />"


@st.composite
def _batches(draw: st.DrawFn, odd: bool = False, withheld: bool = True) -> bytes:
    """A batch as `BatchPacker` writes it: data items (and now and then a heartbeat or a
    withheld item) of one link, stamps as the fan-out writes them; `odd`: names and media
    types the fast path declines come in too."""
    link = draw(st.sampled_from([LINK]) | ((_plain | _odd) if odd else _plain))
    packer = BatchPacker(link, MAX_BATCH_ITEMS)
    kinds = ["data"] * 6 + ["heartbeat"] + (["withheld"] if withheld else [])
    for link_seq in range(draw(st.integers(1, 2**40)), 2**64):
        kind = draw(st.sampled_from(kinds))
        if kind == "heartbeat":
            stamp_xml = _other_stamp(link, link_seq, StampKind.HEARTBEAT, draw(
                st.integers(0, 3)), draw(st.none() | st.integers(0, 2**63 - 1)), draw(
                st.booleans()))
            packer.add(batch_item(stamp_xml,
                                  encode_robust(Heartbeat(draw(st.integers(1, 10**6))))))
        elif kind == "withheld":
            stamp_xml = _other_stamp(link, link_seq, StampKind.WITHHELD, 0, None, True)
            packer.add(batch_item(stamp_xml, encode_robust(Withheld())))
        else:
            stamp_xml = data_stamp_xml(link, link_seq, **_stamp_kw(draw, odd))  # type: ignore[arg-type]
            content = draw(st.binary(max_size=100) | st.sampled_from([b"", b"x" * 512]))
            media = draw((_MEDIA | _ODD_MEDIA) if odd else _MEDIA)
            packer.add(batch_data_item(stamp_xml, content, media))
        if draw(st.integers(0, 3)) == 0:
            break
    doc = packer.flush()
    assert doc is not None
    return doc


def _agree(doc: bytes) -> tuple[str, list[object]] | None:
    """Whatever `doc` is: the fast path declines or equals the general path, and declines
    whatever the general path refuses."""
    fast = match_batch(doc, MAX_BATCH_XML)  # must not raise, whatever the input
    try:
        general = _decode_general(doc)
    except ApexpsError:
        assert fast is None, "the fast path accepted what the general path refuses"
        return None
    if fast is not None:
        assert fast[0] == general[0]
        assert list(fast[1]) == list(general[1])
        assert repr(fast[1]) == repr(list(general[1]))
    return fast  # type: ignore[return-value]


# --- round trips ----------------------------------------------------------------------------


@settings(max_examples=300)
@given(_batches(withheld=False))
def test_what_the_broker_writes_takes_the_fast_path(doc: bytes) -> None:
    """Data and heartbeat items of plain names are read by the fast path, to the general
    path's result."""
    assert _agree(doc) is not None
    link, items = _decode_general(doc)
    assert decode_batch(doc) == Batch(link, tuple(BatchItem(*i) for i in items))


@settings(max_examples=300)
@given(_batches(odd=True))
def test_any_names_decline_or_decode_alike(doc: bytes) -> None:
    """Names that need escaping, carry blanks or are not ASCII, or that the checks refuse;
    media types that need escaping; withheld items: the fast path declines or agrees."""
    _agree(doc)


def test_a_live_item_takes_the_fast_path() -> None:
    """What a subscriber gets at a trickle: one item, as `_sequenced` writes it."""
    stamp = data_stamp_xml(LINK, 7, epoch=0, source="pub@bench.example", source_seq=7,
                           publish_type="update", topic="bench.quotes", time=1_700_000_000_000)
    packer = BatchPacker(LINK, 1024)
    packer.add(batch_data_item(stamp, b"x" * 512, "application/octet-stream"))
    doc = packer.flush()
    assert doc is not None
    fast = _agree(doc)
    assert fast is not None
    assert batch_items(doc) == fast


# --- mutations ------------------------------------------------------------------------------

_INSERTS = [b" ", b"\t", b"\n", b"\r\n", b"'", b'"', b"&", b"&amp;", b"&#65;", b"<", b">",
            b"/", b"=", b"0", b"9", b"-", b"+", b"\x00", b"\x7f", b"\xc3\xa9", b"\xff",
            b"<!DOCTYPE x>", b"<!--c-->", b"<?pi?>", b"<![CDATA[x]]>", b"<item>", b"</item>",
            b"</content></item>", b"<content type='x/y'>", b" refill='true'",
            b" snapshot='true'", b" epoch='1'", b" time='1'", b" token='t'",
            b" messageid='m'", b" link='L'", b" kind='data'", b"<heartbeat interval='5' />",
            b"<withheld />", b"eA==", b"==", b"</batch>", b"<batch link='L'>"]


_SEAM = re.compile(rb"[<>'\"= /]")
_SWAPS = [(b"'", b'"'), (b" ", b"  "), (b" ", b"\n"), (b" />", b"/>"), (b" />", b"></seq>"),
          (b"data", b"heartbeat"), (b"='", b" = '")]


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    """A packed batch, then a few edits of its octets."""
    doc = draw(_batches(odd=draw(st.booleans())))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        doc = edit_octets(draw, doc, draw(st.sampled_from(EDITS)),
                          seams=[m.start() for m in _SEAM.finditer(doc)], inserts=_INSERTS,
                          swaps=_SWAPS)
    return doc


@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutations_are_declined_or_decoded_alike(doc: bytes) -> None:
    """Byte flips, insertions, deletions, truncations, case changes and copies of a packed
    batch: the fast path declines or agrees; what the general path refuses, it declined."""
    _agree(doc)


_ATTRIBUTE = re.compile(rb"(\w+)='([^']*)'")
_VALUES = [b"0", b"1", b"2", b"12", b"007", b"-1", b"+1", b"1e3", b" 1", b"",
           b"18446744073709551615", b"18446744073709551616", b"9223372036854775807",
           b"9223372036854775808", b"9" * 21, b"0" * 25 + b"1", b"true", b"false", b"data",
           b"heartbeat", b"withheld", b"reset", b"update", b"image", b"snapshot", b"L", b"M",
           b"a@b.c", b"a@B.C", b"nobody", b"q.a", b"q.b", b"p@q.r", b"fx", b"9bad", b"a&amp;b",
           b"a&#65;", b"&lt;", b"a\tb", b"a b", b" a", b"\xc3\xa9", b"x" * 1025, b"text/plain",
           b"a/b c"]


@st.composite
def _near_layout(draw: st.DrawFn) -> bytes:
    """A packed batch with some attribute values replaced: the layout stays, so the fast path
    often reads it, and each value meets its bounds and checks in both paths."""
    doc = draw(_batches())
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 4]))):
        found = list(_ATTRIBUTE.finditer(doc))
        m = draw(st.sampled_from(found))
        value = draw(st.sampled_from(_VALUES) | st.binary(max_size=3))
        doc = doc[:m.start(2)] + value + doc[m.end(2):]
    return doc


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(_near_layout())
def test_values_at_their_bounds_are_declined_or_decoded_alike(doc: bytes) -> None:
    """Numbers at and past their bounds, names the checks refuse or normalise, escapes and
    blanks in values: the fast path declines or agrees."""
    _agree(doc)


# --- guards, one by one ---------------------------------------------------------------------

_SEQ = ("<seq link='L' linkseq='5' kind='data' source='a@b.c' sourceseq='9' type='update'"
        " topic='q.a' time='12' />")
_ITEM = f"<item>{_SEQ}<content type='text/plain'>eA==</content></item>"


def _doc(item: str = _ITEM, head: str = "<batch link='L'>", tail: str = "</batch>") -> bytes:
    return f"{head}{item}{tail}".encode()


def test_the_hand_made_batch_takes_the_fast_path() -> None:
    """The batch the guard cases below vary is itself accepted (so each case tests its
    guard)."""
    fast = _agree(_doc())
    assert fast is not None and fast[1][0][1:] == (b"x", "text/plain", None)


@pytest.mark.parametrize("doc", [
    _doc(tail="</batch>\n"),                                           # blank after the root
    _doc(head="<?xml version='1.0'?><batch link='L'>"),
    _doc(head="<batch link=\"L\">"),
    _doc(head="<batch  link='L'>"),
    _doc(item=_ITEM.replace("<item>", "<item >")),
    _doc(item=_ITEM.replace("link='L'", "link='M'")),                  # another link
    _doc(item=_ITEM.replace("linkseq='5'", "linkseq='0'")),            # data at seq 0
    _doc(item=_ITEM.replace("linkseq='5'", "linkseq='18446744073709551616'")),
    _doc(item=_ITEM.replace("sourceseq='9'", "sourceseq='0'")),
    _doc(item=_ITEM.replace("sourceseq='9'", "sourceseq='9223372036854775808'")),
    _doc(item=_ITEM.replace("time='12'", "time='9223372036854775808'")),
    _doc(item=_ITEM.replace("type='update'", "type='nonsense'")),
    _doc(item=_ITEM.replace("topic='q.a'", "topic='9bad'")),
    _doc(item=_ITEM.replace("source='a@b.c'", "source='nobody'")),
    _doc(item=_ITEM.replace("topic='q.a'", "topic='q&#46;a'")),
    _doc(item=_ITEM.replace("topic='q.a'", "topic='q.a' topic='q.b'")),
    _doc(item=_ITEM.replace(" time='12'", " time='12' messageid='x'")),  # out of order
    _doc(item=_ITEM.replace(" />", " messageid='' />")),
    _doc(item=_ITEM.replace("eA==", "eA=")),                           # not strict base64
    _doc(item=_ITEM.replace("eA==", "eA==\n")),
    _doc(item=_ITEM.replace("eA==", "e<b/>A==")),
    _doc(item=_ITEM.replace("text/plain", "a b")),
    _doc(item=_ITEM.replace("text/plain", "x" * 256)),
    _doc(item=_ITEM.replace("</content>", "</content><x/>")),
    _doc(item=_ITEM * (MAX_BATCH_ITEMS + 1)),
    _doc(item=""),
    _doc(item="<item><seq link='L' linkseq='0' kind='heartbeat' /><heartbeat interval='5' />"
               "</item>"),
    _doc(item="<item><seq link='L' linkseq='3' kind='heartbeat' /><heartbeat interval='0' />"
               "</item>"),
    _doc(item="<item><seq link='L' linkseq='3' kind='heartbeat' /><withheld /></item>"),
    _doc(head="<batch link=' L'>", item=_ITEM.replace("link='L'", "link=' L'")),
])
def test_guard_declines(doc: bytes) -> None:
    """Each departure from the broker's layout is declined, whatever the general path makes
    of it."""
    assert match_batch(doc, MAX_BATCH_XML) is None
    _agree(doc)


def test_values_the_general_path_normalises_are_read_alike() -> None:
    """A source's domain is lower-cased (`Endpoint.parse`), and a stamp may say `snapshot` as
    its type: the fast path reads both as the general path does."""
    for doc in [_doc(item=_ITEM.replace("source='a@b.c'", "source='a@B.C'")),
                _doc(item=_ITEM.replace("type='update'", "type='snapshot'"))]:
        fast = _agree(doc)
        assert fast is not None


def test_the_size_limit_is_the_callers() -> None:
    """A batch over the limit passed in is declined (the general path refuses it: 500)."""
    doc = _doc()
    assert match_batch(doc, len(doc)) is not None
    assert match_batch(doc, len(doc) - 1) is None


def test_any_bytes_are_declined_or_decoded_alike() -> None:
    """A few hostile shapes: never an exception out of the fast path."""
    for doc in [b"", b"<batch", b"<batch link='L'></batch>", b"\xff" * 10, _doc()[:-1],
                b"<batch link='L'>" + b"<item>" * 100 + b"</batch>"]:
        _agree(doc)
