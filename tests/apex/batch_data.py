"""Hypothesis strategies for `<batch>` documents in and near the layout the broker writes,
shared by the tests that hold the batch fast path to the general decoder (test_batch_fast.py)
and the C twin of `match_batch` to the Python one (test_batch_speedups.py)."""

from __future__ import annotations

import re

from hypothesis import strategies as st

from adapters.apex.batch_codec import BatchPacker, batch_data_item, batch_item
from adapters.apex.robust_codec import MAX_BATCH_ITEMS, Heartbeat, Withheld, encode_robust
from adapters.apex.robust_stamp import Stamp, StampKind, data_stamp_xml, encode_stamp
from broker.records import PublishType
from common.errors import ApexpsError
from tests.apex.canonical_data import endpoints, plain_endpoints
from tests.mutations import EDITS, edit_octets

__all__ = ["HAND_MADE_ITEM", "LINK", "batches", "hand_made", "mutated_batches",
           "near_layout_batches"]

LINK = "s1@bench.example"

#: Names the broker writes as they are (no escaping, ASCII): the fast path must take them.
_plain = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 .@/=_-]{0,14}[A-Za-z0-9]", fullmatch=True)
_sources = st.sampled_from(["pub@bench.example", "a@b.c", "fred/appl=x@example.com"])
_topics = st.sampled_from(["bench.quotes", "q.a", "WKT=Topics"])
#: ... and names that are not plain: escapes, blanks at the ends, non-ASCII, controls; the
#: checks refuse some; any text, and endpoints of any characters.
_odd = (st.sampled_from(["a&b", "a<b", "a>b", "a'b", 'a"b', " a", "a ", "é", "a\tb", "a\x85b",
                         "x" * 1025, "nobody", "9bad", "WKT=Nope", "a@b.c", "q.b"])
        | st.text(max_size=12))
_odd_sources = _odd | plain_endpoints.map(str) | endpoints.map(str)
_odd_topics = _odd | st.from_regex(
    r"[A-Za-z][A-Za-z0-9_-]{0,8}(\.[A-Za-z0-9][A-Za-z0-9_-]{0,8}){0,3}", fullmatch=True)
_numbers = st.integers(1, 2**63 - 1) | st.sampled_from([1, 2**32, 2**63 - 1])

_MEDIA = st.sampled_from(["application/octet-stream", 'text/plain;x="y"', "x/y+z"])
#: Media types the fast path leaves to the general one: escaped, or too long; and any.
_ODD_MEDIA = st.sampled_from(["a'b", "a&b/c", "x" * 256, "a b"]) | st.from_regex(
    r"[!-~]{1,20}", fullmatch=True)
_contents = st.binary(max_size=100) | st.sampled_from([b"", b"x" * 512]) | st.binary(
    min_size=500, max_size=600)


#: A selecting subscription's ids on its items (inre), and ones the stamp refuses: a blank
#: of more (an empty id), a character outside the ids' class.
_in_re = st.lists(st.from_regex(r"[A-Za-z0-9_.:=/@+-]{1,12}", fullmatch=True), min_size=1,
                  max_size=3).map(tuple)
_odd_in_re = st.sampled_from([("",), ("a", ""), ("a,b",), ("\u00e9",), ("x" * 257,)])


def _stamp_kw(draw: st.DrawFn, odd: bool) -> dict[str, object]:
    names = (_plain | _odd) if odd else _plain
    return {"epoch": draw(st.sampled_from([0, 0, 1, 2**63 - 1])),
            "source": draw((_sources | names | _odd_sources) if odd else _sources),
            "source_seq": draw(_numbers),
            "publish_type": str(draw(st.sampled_from(PublishType))),
            "topic": draw((_topics | names | _odd_topics) if odd else _topics),
            "token": draw(st.none() | st.sampled_from(["6747", "fx.1"]) | names),
            "message_id": draw(st.none() | names),
            "time": draw(st.none() | st.integers(0, 2**63 - 1)),
            "refill": draw(st.booleans()), "snapshot": draw(st.booleans()),
            "in_re": draw(st.just(()) | _in_re | (_odd_in_re if odd else st.nothing()))}


#: What varies between the stamps of one publisher's messages.
_PER_MESSAGE = frozenset({"source_seq", "time", "message_id"})


def _varied_kw(draw: st.DrawFn, odd: bool, first: dict[str, object]) -> dict[str, object]:
    """A data stamp's fields: `first`'s but for those `_PER_MESSAGE` (and maybe one other),
    or all drawn afresh."""
    fresh = _stamp_kw(draw, odd)
    how = draw(st.sampled_from(["same", "same", "one differs", "fresh"]))
    if how == "fresh":
        return fresh
    own = _PER_MESSAGE | ({draw(st.sampled_from(sorted(fresh)))} if how == "one differs"
                          else set())
    return {name: fresh[name] if name in own else value for name, value in first.items()}


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
def batches(draw: st.DrawFn, odd: bool = False, withheld: bool = True,
            heartbeats: bool = True) -> bytes:
    """A batch as `BatchPacker` writes it: data items (and now and then a heartbeat or a
    withheld item) of one link, stamps as the fan-out writes them; `odd`: names and media
    types the fast path declines come in too. A data item's stamp mostly repeats the first
    one's fields but for the numbers and message-id (as from one publisher), or all but one
    of them, or is drawn afresh."""
    link = draw(st.sampled_from([LINK]) | ((_plain | _odd) if odd else _plain))
    first = _stamp_kw(draw, odd)
    packer = BatchPacker(link, MAX_BATCH_ITEMS)
    kinds = (["data"] * 6 + (["heartbeat"] if heartbeats else [])
             + (["withheld"] if withheld else []))
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
            stamp_xml = data_stamp_xml(link, link_seq, **_varied_kw(draw, odd, first))  # type: ignore[arg-type]
            media = draw((_MEDIA | _ODD_MEDIA) if odd else _MEDIA)
            packer.add(batch_data_item(stamp_xml, draw(_contents), media))
        if draw(st.integers(0, 3)) == 0:
            break
    doc = packer.flush()
    assert doc is not None
    return doc


# --- mutations ------------------------------------------------------------------------------

_INSERTS = [b" ", b"\t", b"\n", b"\r\n", b"'", b'"', b"&", b"&amp;", b"&#65;", b"<", b">",
            b"/", b"=", b"0", b"9", b"-", b"+", b"\x00", b"\x7f", b"\xc3\xa9", b"\xff",
            b"<!DOCTYPE x>", b"<!--c-->", b"<?pi?>", b"<![CDATA[x]]>", b"<item>", b"</item>",
            b"</content></item>", b"<content type='x/y'>", b" refill='true'",
            b" snapshot='true'", b" epoch='1'", b" time='1'", b" token='t'", b" inre='1'",
            b" messageid='m'", b" link='L'", b" kind='data'", b"<heartbeat interval='5' />",
            b"<withheld />", b"eA==", b"==", b"</batch>", b"<batch link='L'>"]
_SEAM = re.compile(rb"[<>'\"= /]")
_SWAPS = [(b"'", b'"'), (b" ", b"  "), (b" ", b"\n"), (b" />", b"/>"), (b" />", b"></seq>"),
          (b"data", b"heartbeat"), (b"='", b" = '")]


@st.composite
def mutated_batches(draw: st.DrawFn) -> bytes:
    """A packed batch, then a few edits of its octets (tests/mutations.py)."""
    doc = draw(batches(odd=draw(st.booleans())))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        doc = edit_octets(draw, doc, draw(st.sampled_from(EDITS)),
                          seams=[m.start() for m in _SEAM.finditer(doc)], inserts=_INSERTS,
                          swaps=_SWAPS)
    return doc


_ATTRIBUTE = re.compile(rb"(\w+)='([^']*)'")
_VALUES = [b"0", b"1", b"2", b"12", b"007", b"-1", b"+1", b"1e3", b" 1", b"",
           b"18446744073709551615", b"18446744073709551616", b"9223372036854775807",
           b"9223372036854775808", b"9" * 20, b"9" * 21, b"0" * 19 + b"1", b"0" * 20 + b"1",
           b"0" * 25 + b"1", b"true", b"false", b"data", b"heartbeat", b"withheld", b"reset",
           b"update", b"image", b"snapshot", b"abcdefghijklmnop", b"abcdefghijklmnopq", b"L",
           b"M", b"a@b.c", b"a@B.C", b"nobody", b"q.a", b"q.b", b"p@q.r", b"fx", b"9bad",
           b"a&amp;b", b"a&#65;", b"&lt;", b"a\tb", b"a b", b" a", b"\xc3\xa9", b"x" * 1024,
           b"x" * 1025, b"text/plain", b"a/b c", b"x" * 255, b"x" * 256]


@st.composite
def near_layout_batches(draw: st.DrawFn) -> bytes:
    """A packed batch with some attribute values replaced: the layout stays, so the fast path
    often reads it, and each value meets its bounds and checks in both paths."""
    doc = draw(batches())
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 4]))):
        found = list(_ATTRIBUTE.finditer(doc))
        m = draw(st.sampled_from(found))
        value = draw(st.sampled_from(_VALUES) | st.binary(max_size=3))
        doc = doc[:m.start(2)] + value + doc[m.end(2):]
    return doc


# --- a hand-made batch, for one guard at a time ---------------------------------------------

_SEQ = ("<seq link='L' linkseq='5' kind='data' source='a@b.c' sourceseq='9' type='update'"
        " topic='q.a' time='12' />")
#: A data item of link L, whose content is b"x".
HAND_MADE_ITEM = f"<item>{_SEQ}<content type='text/plain'>eA==</content></item>"


def hand_made(item: str = HAND_MADE_ITEM, head: str = "<batch link='L'>",
              tail: str = "</batch>") -> bytes:
    """A batch of `item` (the hand-made one unless given), with the head and tail given."""
    return f"{head}{item}{tail}".encode()
