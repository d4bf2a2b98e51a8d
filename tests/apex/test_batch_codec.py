"""The `<batch>` document (docs/robust-binding.md §5.4): what the packer writes decodes to the
very stamps and contents it was given, fits the DTD, and stays within its bounds; the fast stamp
reader agrees with the full one on any input; hostile batches get the right code."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from adapters.apex.batch_codec import (
    BATCH_BYTES,
    MAX_BATCH_XML,
    BatchPacker,
    batch_data_item,
    batch_item,
    decode_batch,
)
from adapters.apex.robust_codec import MAX_BATCH_ITEMS, Heartbeat, Withheld, encode_robust
from adapters.apex.robust_stamp import Stamp, StampKind, data_stamp_xml, encode_stamp
from broker.records import PublishType
from common.errors import ApexpsError, InvalidParameter, ParameterSyntaxError, SyntaxError_

DTD = etree.DTD(str(Path(__file__).resolve().parents[2] / "docs" / "apexps-robust.dtd"))
LINK = "desk <&>'\" 1"


def _data(link_seq: int, source_seq: int, content: bytes = b"x", **kw: object) -> str:
    stamp = data_stamp_xml(LINK, link_seq, epoch=2, source="pub@example.com",
                           source_seq=source_seq, publish_type="update", topic="q.a",
                           time=1_700_000_000_000, refill=True, **kw)  # type: ignore[arg-type]
    return batch_data_item(stamp, content, "text/plain")


def _pack(items: list[str], limit: int = MAX_BATCH_ITEMS) -> list[bytes]:
    packer = BatchPacker(LINK, limit)
    docs = [d for d in (packer.add(i) for i in items) if d is not None]
    last = packer.flush()
    return docs + ([last] if last is not None else [])


# --- round trips ----------------------------------------------------------------------------

_contents = st.binary(max_size=300)
_types = st.sampled_from(["text/plain", "application/octet-stream", "application/beep+xml",
                          "text/plain;charset=utf-8", "x/y+z"])


@st.composite
def _items(draw: st.DrawFn) -> tuple[Stamp, bytes, str, Heartbeat | Withheld | None]:
    link_seq = draw(st.integers(1, 2**64 - 1))
    kind = draw(st.sampled_from([StampKind.DATA, StampKind.DATA, StampKind.HEARTBEAT,
                                 StampKind.WITHHELD]))
    if kind is StampKind.HEARTBEAT:
        return (Stamp(LINK, link_seq, kind, 3, time=draw(st.none() | st.integers(0, 2**63 - 1)),
                      refill=True), b"", "", Heartbeat(draw(st.integers(1, 10**6))))
    if kind is StampKind.WITHHELD:
        return Stamp(LINK, link_seq, kind, 3, refill=True), b"", "", Withheld()
    stamp = Stamp(LINK, link_seq, kind, 3, draw(st.sampled_from(["a@b.c", "pub@example.com"])),
                  draw(st.integers(1, 2**63 - 1)), draw(st.sampled_from(PublishType)),
                  draw(st.sampled_from(["q.a", "q.b"])),
                  draw(st.none() | st.sampled_from(["6747", "t<&>"])),
                  draw(st.none() | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e),
                                           min_size=1, max_size=20)),
                  draw(st.none() | st.integers(0, 2**63 - 1)), draw(st.booleans()),
                  snapshot=draw(st.booleans()))
    return stamp, draw(_contents), draw(_types), None


@given(st.lists(_items(), min_size=1, max_size=40), st.integers(1, 12))
def test_what_is_packed_decodes_to_the_same_items_in_order(
        items: list[tuple[Stamp, bytes, str, Heartbeat | Withheld | None]], limit: int) -> None:
    encoded = [batch_item(encode_stamp(s), encode_robust(d)) if d is not None
               else batch_data_item(encode_stamp(s), c, t) for s, c, t, d in items]
    docs = _pack(encoded, limit)
    assert all(len(decode_batch(doc).items) <= limit for doc in docs)
    got = [item for doc in docs for item in decode_batch(doc).items]
    assert [(i.stamp, i.content, i.document) for i in got] == [(s, c, d) for s, c, _, d in items]
    assert [i.content_type for i in got if i.document is None] == \
        [t for _, _, t, d in items if d is None]
    for doc in docs:
        assert DTD.validate(etree.fromstring(doc)), DTD.error_log.filter_from_errors()


def test_a_batch_closes_at_its_byte_bound() -> None:
    big = b"y" * (20 * 1024)
    docs = _pack([_data(n, n, big) for n in range(1, 41)])
    assert len(docs) > 1
    assert all(len(doc) <= BATCH_BYTES for doc in docs)
    got = [i.stamp.link_seq for doc in docs for i in decode_batch(doc).items]
    assert got == list(range(1, 41))


# --- hostile batches --------------------------------------------------------------------------

_SEQ = "<seq link='L' linkseq='1' kind='data' source='a@b.c' sourceseq='1' type='update'" \
    " topic='q.a' />"
_HB = "<seq link='L' linkseq='2' kind='heartbeat' refill='true' />"


@pytest.mark.parametrize(("doc", "error"), [
    (b"<batch link='L'></batch>", ParameterSyntaxError),                          # no items
    (b"<batches link='L' />", ParameterSyntaxError),
    (b"<batch><item/></batch>", ParameterSyntaxError),                            # no link
    (f"<batch link='L'><item>{_SEQ}</item></batch>".encode(), ParameterSyntaxError),
    (f"<batch link='L'><item>{_SEQ}<content type='t/p'>!!</content></item></batch>".encode(),
     ParameterSyntaxError),                                                     # not base64
    (f"<batch link='L'><item>{_SEQ}<content>eA==</content></item></batch>".encode(),
     ParameterSyntaxError),                                                     # no type
    (f"<batch link='L'><item>{_SEQ}<content type='a b'>eA==</content></item></batch>".encode(),
     ParameterSyntaxError),                                                     # bad type
    (f"<batch link='L'><item>{_SEQ}<heartbeat interval='5' /></item></batch>".encode(),
     ParameterSyntaxError),                                                     # data, no content
    (f"<batch link='L'><item>{_HB}<withheld /></item></batch>".encode(), ParameterSyntaxError),
    (f"<batch link='M'><item>{_HB}<heartbeat interval='5' /></item></batch>".encode(),
     ParameterSyntaxError),                                                     # other link
    (b"<batch link='L'><item><seq link='L' linkseq='0' kind='reset' /><heartbeat interval='5'"
     b" /></item></batch>", ParameterSyntaxError),                              # a reset
    (f"<batch link='L'><item>{_HB}<heartbeat interval='5' /><withheld /></item></batch>"
     .encode(), ParameterSyntaxError),                                          # three children
    (f"<batch link='L'>x<item>{_HB}<heartbeat interval='5' /></item></batch>".encode(),
     ParameterSyntaxError),                                                     # stray text
    (f"<batch link='L'><item n='1'>{_HB}<heartbeat interval='5' /></item></batch>".encode(),
     ParameterSyntaxError),
    (f"<batch link='L'><item>{_SEQ}<content type='t/p'><b/></content></item></batch>"
     .encode(), ParameterSyntaxError),                                          # nested
    (b"<batch link=' L'><item/></batch>", InvalidParameter),
    (b"<!DOCTYPE batch [<!ENTITY e 'x'>]><batch link='L'>&e;</batch>", SyntaxError_),
    (b"<batch link='L'>", SyntaxError_),
    (b"<batch link='L'>" + b"<item/>" * (MAX_BATCH_XML // 7) + b"</batch>", SyntaxError_),
    (b"<batch link='L'>" + f"<item>{_HB}<heartbeat interval='5' /></item>".encode()
     * (MAX_BATCH_ITEMS + 1) + b"</batch>", ParameterSyntaxError),              # too many
])
def test_hostile_batches_get_the_right_code(doc: bytes, error: type[ApexpsError]) -> None:
    with pytest.raises(error):
        decode_batch(doc)


@given(st.binary(max_size=400))
def test_any_bytes_decode_or_raise_a_coded_error(data: bytes) -> None:
    with contextlib.suppress(ApexpsError):  # anything else escaping fails the test
        decode_batch(b"<batch link='L'><item>" + data + b"</item></batch>")


def test_the_binding_example_decodes() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "robust-binding.md").read_text()
    example = text.split("```xml\n<batch ", 1)[1].split("```", 1)[0]
    batch = decode_batch(f"<batch {example}".encode())
    assert batch.link == "desk-1"
    assert [(i.stamp.link_seq, i.stamp.kind) for i in batch.items] == [
        (56737, StampKind.DATA), (56738, StampKind.HEARTBEAT), (56739, StampKind.WITHHELD)]
    assert (batch.items[0].content, batch.items[0].content_type) == (b"IBM 183.22", "text/plain")
    assert batch.items[1].document == Heartbeat(5000)


# --- the fan-out's per-message parts (adapters/pubsub/sequenced.py) -------------------------

_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1,
                 max_size=12)


@given(link=_names, link_seq=st.integers(1, 2**32), epoch=st.integers(0, 5),
       source=_names, source_seq=st.integers(1, 2**40), topic=_names,
       ptype=st.sampled_from(list(PublishType)), token=st.none() | _names,
       message_id=st.none() | _names, time=st.none() | st.integers(0, 2**45),
       refill=st.booleans(), snapshot=st.booleans(), content=st.binary(max_size=64),
       content_type=_names, links=st.integers(1, 3))
def test_the_fanouts_item_equals_the_one_built_whole(
        link: str, link_seq: int, epoch: int, source: str, source_seq: int, topic: str,
        ptype: PublishType, token: str | None, message_id: str | None, time: int | None,
        refill: bool, snapshot: bool, content: bytes, content_type: str, links: int) -> None:
    # The fan-out makes a message's stamp part and content part once and reuses them for
    # every link it goes to: each link's item must be what the whole-item functions write.
    from adapters.pubsub._deliveries import _batch_data_item
    from broker.kafka_io import Position
    from broker.records import JournalEntry, RecordKind
    from broker.robust.link_records import LinkKind, LinkRecord

    entry = JournalEntry(Position(0, 7), RecordKind.DATA, topic, source, source_seq, None, None,
                         ptype, None, message_id, None, None, None, token, content_type,
                         content, {}, {}, time or 0)
    known: dict[int, tuple[JournalEntry, str, str]] = {}
    for n in range(links):
        rec = LinkRecord(f"{link}{n}", n, epoch, 0, 32, link_seq + n, LinkKind.DATA,
                         entry.position, source, source_seq, None, 1, 0, snapshot)
        whole = batch_data_item(
            data_stamp_xml(rec.link, rec.link_seq, epoch=epoch, source=source,
                           source_seq=source_seq, publish_type=str(ptype), topic=topic,
                           token=token, message_id=message_id, time=entry.appended_at,
                           refill=refill, snapshot=snapshot), content, content_type)
        assert _batch_data_item(rec, entry, refill, known) == whole


def test_a_stale_slot_under_a_reused_id_is_not_taken() -> None:
    # The parts are found by id(entry); once an entry is gone its id may name a new one.
    from adapters.pubsub import _deliveries
    from broker.kafka_io import Position
    from broker.records import JournalEntry, RecordKind
    from broker.robust.link_records import LinkKind, LinkRecord

    def entry(content: bytes) -> JournalEntry:
        return JournalEntry(Position(0, 7), RecordKind.DATA, "t", "s", 1, None, None,
                            PublishType.UPDATE, None, None, None, None, None, None,
                            "text/plain", content, {}, {}, 5)

    old, new = entry(b"old"), entry(b"new")
    rec = LinkRecord("L", 1, 0, 0, 32, 1, LinkKind.DATA, new.position, "s", 1, None, 1, 0)
    known: dict[int, tuple[JournalEntry, str, str]] = {}
    stale = _deliveries._batch_data_item(rec, old, False, known)
    known[id(new)] = known.pop(id(old))  # as if `new` had been given `old`'s id
    assert _deliveries._batch_data_item(rec, new, False, known) != stale
    assert "bmV3" in _deliveries._batch_data_item(rec, new, False, known)  # base64 of b"new"
