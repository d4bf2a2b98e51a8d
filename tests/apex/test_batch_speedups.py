"""The C twin of `match_batch` (`scan_batch` in adapters/apex/_speedups.c) against the layout's
oracle (tests/apex/batch_oracle.py, the layout as regular expressions).

`match_batch` runs the compiled `scan_batch` and finishes in Python (the stamps' values through
`_known`); what the C leaves undecided (True) it declines, for the general path. On any input
`match_batch` must return the oracle's result -- None, or the same link and items of the same
types -- or None where the C left the decision open, and neither may raise. These tests fail
where the twin is not built.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters import speedups
from adapters.apex import batch_fast as _batch_fast
from adapters.apex.batch_codec import MAX_BATCH_XML
from adapters.apex.batch_fast import ItemFields, match_batch
from adapters.apex.robust_codec import MAX_BATCH_ITEMS, MAX_LONG
from tests.apex.batch_data import (
    HAND_MADE_ITEM,
    batches,
    hand_made,
    mutated_batches,
    near_layout_batches,
)
from tests.apex.batch_oracle import match_batch_python

_NAME = "adapters.apex._speedups"
_C = speedups.load(_NAME)

_Result = tuple[str, list[ItemFields]] | None


@pytest.fixture(autouse=True, scope="module")
def _twin_is_built() -> Iterator[None]:
    assert _C is not None and _batch_fast._scan_batch is not None, (
        f"{_NAME} is not built (or is out of date), or APEXPS_PURE_PYTHON is set: build it with"
        " `bash ops/bootstrap` (or `.venv/bin/pip install -e '.[dev]'`), which needs a C"
        " compiler")
    yield


def _decision(doc: object, max_bytes: object = MAX_BATCH_XML) -> str:
    """What the C made of a batch: "accepted", "declined" or "undecided" (left to the
    general path)."""
    assert _C is not None
    decided = _C.scan_batch(doc, max_bytes)
    return "declined" if decided is None else "undecided" if decided is True else "accepted"


def _agree(doc: bytes, max_bytes: int = MAX_BATCH_XML) -> _Result:
    """The oracle's result, having checked that `match_batch`'s is the same (by `repr` too, so
    `True` never passes for `1`), from a cold and from a warm `_known`, or None where the C
    left the decision to the general path; and that whatever the C decided itself agrees."""
    assert _C is not None
    decided = _C.scan_batch(doc, max_bytes)
    _batch_fast._known.clear()
    both = match_batch(doc, max_bytes)  # must not raise, whatever the input
    _batch_fast._known.clear()
    python = match_batch_python(doc, max_bytes)
    expected = None if decided is True else python
    assert both == expected and repr(both) == repr(expected)
    warm = match_batch(doc, max_bytes)  # the stamps' values now come from `_known`
    assert warm == expected and repr(warm) == repr(expected)
    if decided is None:
        assert python is None
    elif decided is not True and python is not None:
        link, items = decided
        assert link == python[0]
        assert [(seq, number, at, message_id, content, media)
                for _, seq, number, at, message_id, content, media in items] == [
            (stamp.link_seq, stamp.source_seq, stamp.time, stamp.message_id, content, media)
            for stamp, content, media, _ in python[1]]
    return python


def test_the_twin_is_listed_and_active() -> None:
    """The build lists the twin among the accelerators, and this process uses it."""
    assert _NAME in speedups.ACCELERATORS
    assert speedups.active()[_NAME]


# --- differential properties ----------------------------------------------------------------

_max_bytes = (st.just(MAX_BATCH_XML) | st.integers(-3, 3000)
              | st.sampled_from([0, 2**63 - 1, 2**63, 2**70, -(2**70)]))


@settings(max_examples=400)
@given(batches(withheld=False, heartbeats=False))
def test_what_the_broker_writes_is_decided_in_c(doc: bytes) -> None:
    """Data items of plain names, as `BatchPacker` writes them: accepted by the C itself (not
    left undecided), to the oracle's result."""
    assert _decision(doc) == "accepted"
    assert _agree(doc) is not None


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(batches(odd=True) | batches(), _max_bytes)
def test_packed_batches_are_matched_alike(doc: bytes, max_bytes: int) -> None:
    """Batches as `BatchPacker` writes them, of any links, sources, topics, tokens, message
    ids, numbers, contents and media types, with heartbeat and withheld items, under any size
    limit: the C and the oracle agree."""
    _agree(doc, max_bytes)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_batches())
def test_mutated_batches_are_matched_alike(doc: bytes) -> None:
    """Octet flips, insertions, deletions, truncations, case changes and copies of a packed
    batch (tests/mutations.py): the two versions agree."""
    _agree(doc)


@settings(max_examples=700, suppress_health_check=[HealthCheck.too_slow])
@given(near_layout_batches())
def test_values_at_their_bounds_are_matched_alike(doc: bytes) -> None:
    """Attribute values replaced by numbers at and past their bounds, names the checks refuse
    or normalise, escapes, blanks and non-ASCII octets: the two versions agree."""
    _agree(doc)


@settings(max_examples=300)
@given(st.binary(max_size=300)
       | st.builds(lambda middle: b"<batch link='L'>" + middle + b"</batch>",
                   st.binary(max_size=300)), _max_bytes)
def test_arbitrary_bytes_are_matched_alike(doc: bytes, max_bytes: int) -> None:
    """Arbitrary octets, bare or between a batch's head and end: the two versions agree (and
    neither raises)."""
    _agree(doc, max_bytes)


_BASE64ISH = "AB/9+=<\n"


@settings(max_examples=500)
@given(st.text(st.sampled_from(_BASE64ISH), max_size=16)
       | st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode()))
def test_contents_are_decoded_alike(content: str) -> None:
    """A content of base64 or near it: the C decodes it to the same octets or leaves it to
    the general path, or declines what strict base64 refuses."""
    _agree(hand_made(HAND_MADE_ITEM.replace("eA==", content)))


def test_short_contents_are_decoded_alike() -> None:
    """Every content of up to five characters of the alphabet's edges, "=", "<" and a newline
    (the bits a short last group leaves over set, or not)."""
    for n in range(6):
        for chars in itertools.product(_BASE64ISH[:-1], repeat=n):
            content = "".join(chars)
            doc = hand_made(HAND_MADE_ITEM.replace("eA==", content))
            try:
                binascii.a2b_base64(content, strict_mode=True)
                refused = False
            except binascii.Error:
                refused = True
            if refused:
                assert _decision(doc) in ("declined", "undecided")
            assert _agree(doc) is None or not refused


# --- guards, one by one ---------------------------------------------------------------------

_DIGITS_20 = "0" * 19 + "5"
_DIGITS_21 = "0" * 20 + "5"
_HEARTBEAT = "<item><seq link='L' linkseq='4' kind='heartbeat' /><heartbeat interval='5' /></item>"


def _item(old: str, new: str) -> bytes:
    """The hand-made batch with `old` in its item replaced by `new`."""
    assert old in HAND_MADE_ITEM
    return hand_made(HAND_MADE_ITEM.replace(old, new))


def _message_id(value: str) -> bytes:
    """The hand-made batch with a message id in its item."""
    return _item(" time='12'", f" messageid='{value}' time='12'")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (hand_made(), "accepted"),
        (_item("time='12'", "token='t' messageid='m' time='12' snapshot='true' refill='true'"),
         "accepted"),
        (_item("<seq link='L'", "<seq link='L' epoch='3'"), "accepted"),
        (_item("eA==", ""), "accepted"),
        (_item("eA==", "eHk="), "accepted"),
        (_item("eA==", "eHl6"), "accepted"),
        # numbers: 20 digits, not 21; link seq 1..2**64-1, source seq 1..2**63-1, time to 2**63-1
        (_item("linkseq='5'", f"linkseq='{_DIGITS_20}'"), "accepted"),
        (_item("linkseq='5'", f"linkseq='{_DIGITS_21}'"), "declined"),
        (_item("linkseq='5'", "linkseq='0'"), "declined"),
        (_item("linkseq='5'", f"linkseq='{2**64 - 1}'"), "accepted"),
        (_item("linkseq='5'", f"linkseq='{2**64}'"), "declined"),
        (_item("linkseq='5'", "linkseq='99999999999999999999'"), "declined"),
        (_item("sourceseq='9'", f"sourceseq='{_DIGITS_20}'"), "accepted"),
        (_item("sourceseq='9'", f"sourceseq='{_DIGITS_21}'"), "declined"),
        (_item("sourceseq='9'", "sourceseq='0'"), "declined"),
        (_item("sourceseq='9'", f"sourceseq='{MAX_LONG}'"), "accepted"),
        (_item("sourceseq='9'", f"sourceseq='{MAX_LONG + 1}'"), "declined"),
        (_item("time='12'", "time='0'"), "accepted"),
        (_item("time='12'", f"time='{MAX_LONG}'"), "accepted"),
        (_item("time='12'", f"time='{MAX_LONG + 1}'"), "declined"),
        (_item("time='12'", f"time='{_DIGITS_21}'"), "declined"),
        (_item("time='12'", "time='-1'"), "declined"),
        (_item("time='12'", "time=''"), "declined"),
        (_item("<seq link='L'", f"<seq link='L' epoch='{_DIGITS_20}'"), "accepted"),
        (_item("<seq link='L'", f"<seq link='L' epoch='{_DIGITS_21}'"), "declined"),
        # the publish type: [a-z]{1,16} (whether it is one is Python's: see below)
        (_item("type='update'", "type='abcdefghijklmnopq'"), "declined"),
        (_item("type='update'", "type='Update'"), "declined"),
        (_item("type='update'", "type='snapshot'"), "accepted"),
        # a blank more or less, a quote of the other kind, attributes out of their order
        (_item("<item>", "<item >"), "declined"),
        (_item(" />", "  />"), "declined"),
        (_item(" />", "/>"), "declined"),
        (_item("kind='data'", "kind = 'data'"), "declined"),
        (_item("type='text/plain'", 'type="text/plain"'), "declined"),
        (hand_made(HAND_MADE_ITEM + " " + HAND_MADE_ITEM.replace("'5'", "'6'")), "declined"),
        (hand_made(tail="</batch>\n"), "declined"),
        (hand_made(head="<batch link='L'> "), "declined"),
        (hand_made(head="<batch  link='L'>"), "declined"),
        (_item(" time='12'", " time='12' messageid='x'"), "declined"),
        (_item("time='12'", "time='12' refill='true' snapshot='true'"), "declined"),
        # inre: after snapshot, before refill; its ids are Python's to judge (below)
        (_item("time='12'", "time='12' inre='1'"), "accepted"),
        (_item("time='12'", "time='12' snapshot='true' inre='s-1 s.2' refill='true'"),
         "accepted"),
        (_item("time='12'", "time='12' refill='true' inre='1'"), "declined"),
        (_item("time='12'", "time='12' inre='1' snapshot='true'"), "declined"),
        (_item("time='12'", "time='12' inre=''"), "declined"),
        (_item("time='12'", "time='12' inre='1' inre='2'"), "declined"),
        (_item("time='12'", "time='12' inre='a&amp;b'"), "declined"),
        (_item("time='12'", "time='12' snapshot='false'"), "declined"),
        (_item("topic='q.a'", "topic='q.a' topic='q.b'"), "declined"),
        # an `&` (an entity) in a value, or the other excluded octets
        (_item("topic='q.a'", "topic='q&amp;a'"), "declined"),
        (_message_id("a&#65;"), "declined"),
        (_item("topic='q.a'", "topic='q>a'"), "declined"),
        (_item("topic='q.a'", "topic='q\ta'"), "declined"),
        (_item("topic='q.a'", "topic='q\x7fa'"), "declined"),
        (_message_id(""), "declined"),
        # not ASCII
        (_message_id("\u00e9"), "declined"),
        (_item("eA==", "eA==\u00e9"), "declined"),
        # ... anywhere, so not even a heartbeat item before it is left undecided
        (hand_made(_HEARTBEAT + HAND_MADE_ITEM.replace("q.a", "q.\u00e9")), "declined"),
        # the items' link
        (_item("<seq link='L'", "<seq link='M'"), "declined"),
        (_item("<seq link='L'", "<seq link='LL'"), "declined"),
        (_item("<seq link='L'", "<seq link='l'"), "declined"),
        (hand_made(head="<batch link='LL'>"), "declined"),
        # message ids: at most 1024 octets
        (_message_id("m" * 1024), "accepted"),
        (_message_id("m" * 1025), "declined"),
        # media types: 1 to 255 of their class
        (_item("text/plain", "x" * 255), "accepted"),
        (_item("text/plain", "x" * 256), "declined"),
        (_item("text/plain", "a b"), "declined"),
        (_item("text/plain", ""), "declined"),
        (_item("text/plain", 'text/plain;x="y"'), "accepted"),
        # the number of items: 1..MAX_BATCH_ITEMS
        (hand_made(HAND_MADE_ITEM * MAX_BATCH_ITEMS), "accepted"),
        (hand_made(HAND_MADE_ITEM * (MAX_BATCH_ITEMS + 1)), "declined"),
        (hand_made(""), "declined"),
        # the content: strict base64, in canonical form or left undecided
        (_item("eA==", "eA==\n"), "declined"),
        (_item("eA==", "e A=="), "declined"),
        (_item("eA==", "eA-="), "declined"),
        (_item("eA==", "eA="), "undecided"),
        (_item("eA==", "eA"), "undecided"),
        (_item("eA==", "eA==="), "undecided"),
        (_item("eA==", "eA==eA=="), "undecided"),
        (_item("eA==", "=eA="), "undecided"),
        (_item("eA==", "e"), "undecided"),
        # ... a `<` in it
        (_item("eA==", "e<b/>A=="), "declined"),
        (_item("eA==", "eA==<x/>"), "declined"),
        (_item("</content></item>", "</content><x/></item>"), "declined"),
        (_item("</content></item>", "</content></item></item>"), "declined"),
        (_item("</content></item>", "</content>"), "declined"),
        # heartbeat items are left undecided, whatever comes before or after; other kinds decline
        (hand_made(_HEARTBEAT), "undecided"),
        (hand_made(HAND_MADE_ITEM + _HEARTBEAT), "undecided"),
        (hand_made(_HEARTBEAT + HAND_MADE_ITEM), "undecided"),
        (hand_made(_HEARTBEAT.replace("interval='5'", "interval='0'")), "undecided"),
        (hand_made(HAND_MADE_ITEM.replace("'5'", "'0'") + _HEARTBEAT), "declined"),
        (hand_made(_HEARTBEAT.replace("heartbeat'", "heartbeats'")), "declined"),
        (hand_made(_HEARTBEAT.replace("<seq link='L'", "<seq link='L' epoch='x'")), "declined"),
        (_item("kind='data'", "kind='withheld'"), "declined"),
        # the head and the end
        (hand_made(head="<batch link=''>"), "declined"),
        (hand_made(head="<batch link=\"L\">"), "declined"),
        (hand_made(head="<?xml version='1.0'?><batch link='L'>"), "declined"),
        (hand_made(tail="</batch"), "declined"),
        (hand_made(tail="</Batch>"), "declined"),
        (b"<batch link='L'></batch>", "declined"),
        (b"<batch link='L'>", "declined"),
        (b"", "declined"),
    ],
)
def test_guard(doc: bytes, expected: str) -> None:
    """Each guard of the layout, at and past its bounds: the C accepts, declines or leaves the
    decision to Python as expected, and the two versions agree."""
    assert _decision(doc) == expected
    result = _agree(doc)
    assert (result is not None) == (expected == "accepted") or expected == "undecided"


def test_python_checks_what_the_c_accepts() -> None:
    """Values only the general path's functions judge -- an epoch past its range, a publish
    type or topic that is none (a blank in a value is the value's), a source that is no
    endpoint -- pass the C and are declined in Python; a source's domain is normalised there."""
    for doc in [_item("<seq link='L'", f"<seq link='L' epoch='{MAX_LONG + 1}'"),
                _item("type='update'", "type='nonsense'"),
                _item("type='update'", "type='abcdefghijklmnop'"),
                _item("topic='q.a'", "topic='9bad'"),
                _item("topic='q.a'", "topic=' q.a'"),
                _item("source='a@b.c'", "source='nobody'"),
                _item("time='12'", "time='12' inre='a,b'"),
                _item("time='12'", "time='12' inre='a  b'"),
                _item("time='12'", "time='12' inre=' a'")]:
        assert _decision(doc) == "accepted"
        assert _agree(doc) is None
    doc = _item("source='a@b.c'", "source='a@B.C'")
    result = _agree(doc)
    assert result is not None and result[1][0][0].source == "a@b.c"


def test_items_of_one_key_share_it() -> None:
    """Items whose stamps differ only in their numbers share one key (one tuple for Python to
    hash); an item that differs in any of the key's fields gets its own."""
    assert _C is not None
    varied = [HAND_MADE_ITEM.replace("time='12'", "token='t' time='12'").replace("'5'", "'6'"),
              HAND_MADE_ITEM.replace("type='update'", "type='drop'"),
              HAND_MADE_ITEM.replace("<seq link='L'", "<seq link='L' epoch='2'"),
              HAND_MADE_ITEM.replace(" />", " refill='true' />"),
              HAND_MADE_ITEM.replace(" />", " inre='2' />")]
    same = HAND_MADE_ITEM.replace("sourceseq='9'", "sourceseq='10'").replace(
        "time='12'", "messageid='m' time='13'")
    for other in varied:
        doc = hand_made(HAND_MADE_ITEM + same + other + HAND_MADE_ITEM)
        scanned = _C.scan_batch(doc, MAX_BATCH_XML)
        assert scanned is not None and scanned is not True
        keys = [item[0] for item in scanned[1]]
        assert keys[0] is keys[1] and keys[2] != keys[1] and keys[3] == keys[0]
        result = _agree(doc)
        assert result is not None and result[1][2][0] != result[1][0][0]


def test_size_limit() -> None:
    """The batch may be exactly `max_bytes` octets, not one more; a negative limit declines; a
    limit beyond C's integers is left to Python."""
    doc = hand_made()
    assert _decision(doc, len(doc)) == "accepted"
    assert _agree(doc, len(doc)) is not None
    for limit in (len(doc) - 1, 0, -1):
        assert _decision(doc, limit) == "declined"
        assert _agree(doc, limit) is None
    assert _decision(doc, 2**70) == _decision(doc, -(2**70)) == "undecided"
    assert _agree(doc, 2**70) is not None
    assert _agree(doc, -(2**70)) is None
    assert _agree(doc, 2**63 - 1) is not None


def test_argument_types_other_than_bytes_and_int_are_left_undecided() -> None:
    """Subclasses and look-alikes (a bytearray, a bool limit) are left undecided (to the general
    path)."""

    class Octets(bytes):
        pass

    doc = hand_made()
    for args in [(bytearray(doc), 4096), (Octets(doc), 4096), (memoryview(doc), 4096),
                 (doc, True), (doc, 4096.0), ("text", 4096)]:
        assert _decision(*args) == "undecided"
    assert _agree(Octets(doc)) is not None
    assert match_batch(bytearray(doc), 4096) is None  # type: ignore[arg-type]
    assert _agree(doc, True) is None
    assert _C is not None
    with pytest.raises(TypeError):
        _C.scan_batch(doc)


def test_a_large_batch_of_near_ends() -> None:
    """A batch of many items whose contents are long runs of near-ends is read to the same
    answer."""
    content = base64.b64encode(b"</content></item" * 2000).decode()
    doc = hand_made(HAND_MADE_ITEM.replace("eA==", content) * 8)
    assert _decision(doc) == "accepted"
    assert _agree(doc) is not None
    doc = hand_made(HAND_MADE_ITEM.replace("eA==", "</content></ite" * 4000))
    assert _decision(doc) == "declined"
    assert _agree(doc) is None
