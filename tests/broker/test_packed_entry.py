"""A journal entry kept for long is kept packed (broker/records.py `pack_entry`): it unpacks to
an equal entry, the PACKED_* indices name what they say, and, the point of it, the packed form
is nothing CPython's cyclic collector walks once it has met it (broker/robust/_item_rules.py
says what the walking cost)."""

from __future__ import annotations

import gc

from hypothesis import given
from hypothesis import strategies as st

from broker.kafka_io import Position
from broker.records import (
    PACKED_CONTENT,
    PACKED_EXPIRATION,
    PACKED_MESSAGE_ID,
    PACKED_PUBLISH_TYPE,
    PACKED_REVISION_ID,
    PACKED_TOPIC,
    JournalEntry,
    PublishType,
    RecordKind,
    pack_entry,
    unpack_entry,
)
from broker.robust._item_rules import ItemVersion

_text = st.text(max_size=12)
_maybe_text = st.none() | _text
_maybe_int = st.none() | st.integers(0, 2**62)

entries = st.builds(
    JournalEntry,
    position=st.builds(Position, st.integers(0, 99), st.integers(0, 2**62)),
    kind=st.sampled_from(RecordKind), topic=_text, source=_text,
    source_seq=st.integers(0, 2**62), gap_to=_maybe_int, gap_reason=_maybe_text,
    publish_type=st.sampled_from(PublishType), publisher_seq=_maybe_int,
    message_id=_maybe_text, revision_id=_maybe_text, publication_date=_maybe_int,
    expiration_date=_maybe_text, permission_token=_maybe_text, content_type=_text,
    content=st.binary(max_size=64),
    fields=st.dictionaries(_text, st.lists(_text, max_size=3), max_size=3),
    options=st.dictionaries(_text, _text, max_size=3), appended_at=st.integers(0, 2**62))


@given(entries)
def test_an_entry_unpacks_equal_and_its_indices_name_its_fields(entry: JournalEntry) -> None:
    packed = pack_entry(entry)
    back = unpack_entry(packed)
    assert back == entry
    # its own maps: a reader that changes what it got does not change what is kept
    assert back.fields is not entry.fields and back.options is not entry.options
    assert (packed[PACKED_TOPIC], packed[PACKED_PUBLISH_TYPE], packed[PACKED_MESSAGE_ID],
            packed[PACKED_REVISION_ID], packed[PACKED_EXPIRATION], packed[PACKED_CONTENT]) == (
        entry.topic, entry.publish_type.value, entry.message_id, entry.revision_id,
        entry.expiration_date, entry.content)


def test_a_packed_entry_is_nothing_the_collector_walks() -> None:
    # the deepest a packed entry nests: fields (a name and its values) and options
    entry = unpack_entry(pack_entry(JournalEntry(
        position=Position(0, 1), kind=RecordKind.DATA, topic="q", source="s@e.com",
        source_seq=1, gap_to=None, gap_reason=None, publish_type=PublishType.UPDATE,
        publisher_seq=1, message_id="m", revision_id=None, publication_date=None,
        expiration_date=None, permission_token=None, content_type="text/xml",
        content=b"<q><symbol>S1</symbol></q>", fields={"symbol": ["S1"], "q": ["S1"]},
        options={"dataHopping": "5"}, appended_at=1)))
    packed, version = pack_entry(entry), ItemVersion(7, entry)
    # The collector untracks a tuple that holds only untracked values when it meets it, one
    # level a pass at worst (it meets them in no set order): two levels, two passes.
    gc.collect()
    gc.collect()
    assert not gc.is_tracked(packed)
    assert not gc.is_tracked(version._packed)
    assert gc.is_tracked(entry)  # what it replaces is walked at every collection


@given(entries)
def test_an_item_version_reads_its_entry_back(entry: JournalEntry) -> None:
    version = ItemVersion(3, entry)
    assert version.entry == entry and version.order == 3
    assert (version.topic, version.publish_type, version.message_id, version.revision_id,
            version.expiration_date, version.size) == (
        entry.topic, entry.publish_type, entry.message_id, entry.revision_id,
        entry.expiration_date, len(entry.content))
    assert version == ItemVersion(3, entry) and version != ItemVersion(4, entry)
