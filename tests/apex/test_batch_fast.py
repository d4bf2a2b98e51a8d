"""The `<batch>` fast path (`_batch_fast.match_batch`, the C twin) against the general decoder.

The fast path may decline anything; what it accepts, the general path must accept with an
equal result (compared by `repr` too, so `True` never passes for `1`), and it never raises.
The tests that say a batch takes the fast path fail where the twin is not built
(tests/test_speedups.py says how to build it): there the fast path declines everything.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from adapters.apex.batch_codec import (
    MAX_BATCH_XML,
    Batch,
    BatchItem,
    BatchPacker,
    _decode_general,
    batch_data_item,
    batch_items,
    decode_batch,
)
from adapters.apex.batch_fast import match_batch
from adapters.apex.robust_codec import MAX_BATCH_ITEMS
from adapters.apex.robust_stamp import data_stamp_xml
from common.errors import ApexpsError
from tests.apex.batch_data import HAND_MADE_ITEM as _ITEM
from tests.apex.batch_data import LINK, batches, mutated_batches, near_layout_batches
from tests.apex.batch_data import hand_made as _doc


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
@given(batches(withheld=False, heartbeats=False))
def test_what_the_broker_writes_takes_the_fast_path(doc: bytes) -> None:
    """Data items of plain names are read by the fast path, to the general path's result."""
    assert _agree(doc) is not None
    link, items = _decode_general(doc)
    assert decode_batch(doc) == Batch(link, tuple(BatchItem(*i) for i in items))


@settings(max_examples=100)
@given(batches(withheld=False))
def test_batches_with_heartbeats_take_the_general_path(doc: bytes) -> None:
    """A heartbeat item (idle links: rare) is left to the general path, which reads the whole
    batch; `decode_batch` gives its result either way."""
    fast = _agree(doc)
    if b"kind='heartbeat'" in doc:
        assert fast is None
    link, items = _decode_general(doc)
    assert decode_batch(doc) == Batch(link, tuple(BatchItem(*i) for i in items))


@settings(max_examples=300)
@given(batches(odd=True))
def test_any_names_decline_or_decode_alike(doc: bytes) -> None:
    """Names that need escaping, carry blanks or are not ASCII, or that the checks refuse;
    media types that need escaping; withheld items: the fast path declines or agrees."""
    _agree(doc)


def test_a_live_item_takes_the_fast_path() -> None:
    """What a subscriber gets at a trickle: one item, as the fan-out writes it."""
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

@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_batches())
def test_mutations_are_declined_or_decoded_alike(doc: bytes) -> None:
    """Byte flips, insertions, deletions, truncations, case changes and copies of a packed
    batch: the fast path declines or agrees; what the general path refuses, it declined."""
    _agree(doc)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(near_layout_batches())
def test_values_at_their_bounds_are_declined_or_decoded_alike(doc: bytes) -> None:
    """Numbers at and past their bounds, names the checks refuse or normalise, escapes and
    blanks in values: the fast path declines or agrees."""
    _agree(doc)


# --- guards, one by one ---------------------------------------------------------------------

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
