"""Forwarding on acknowledgement hands subscribers an entry built from the publication in memory
(`JournalEntry.of_publication`); it must equal, field for field, the one the journal follower
decodes from the record the journal wrote (broker/pubsub/follower.py)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.codec import default_codec
from broker.journal import SCHEMA
from broker.journal_writer import DataRecordWriter
from broker.kafka_io import Position
from broker.records import JournalEntry, Publication
from tests.broker.test_journal_writer import publications

# The journal's times: a millisecond clock (any time of the next millennia, and before 1970).
stamps = st.integers(-(1 << 41), 1 << 45)


@settings(max_examples=300, deadline=None)
@given(pub=publications(), seq=st.integers(1, (1 << 63) - 1), at=stamps,
       date=st.none() | stamps)
@example(pub=Publication(topic="t", source="s", content=b""), seq=1, at=1_700_000_000_123,
         date=1_700_000_000_999)
@example(pub=Publication(topic="t", source="s", content=b""), seq=1, at=35_079_160_273_991,
         date=-1)  # a float-rounded conversion reads 35_079_160_273_990
def test_the_acknowledged_entry_is_the_one_the_follower_decodes(
        pub: Publication, seq: int, at: int, date: int | None) -> None:
    codec = default_codec()
    pub = Publication(**{**{f: getattr(pub, f) for f in pub.__dataclass_fields__},
                         "publication_date": date})
    value = DataRecordWriter(codec).encode(pub, seq, at)
    position = Position(3, 41)
    _, decoded = codec.decode(value, expect=SCHEMA)
    entry = JournalEntry.of_publication(pub, seq, at, position)
    assert entry == JournalEntry.from_avro(position, decoded)
    # Both are built by the same slot builder (records.py): each field checked on its own too,
    # against the dataclass's own constructor, so a builder that mixed fields up is caught.
    assert entry == JournalEntry(**{name: getattr(entry, name)
                                    for name in JournalEntry.__dataclass_fields__})
    assert (entry.position, entry.source_seq, entry.appended_at) == (position, seq, at)
    for name in ("topic", "source", "content", "content_type", "message_id", "revision_id",
                 "publication_date", "expiration_date", "permission_token", "publisher_seq"):
        assert getattr(entry, name) == getattr(pub, name), name
    assert entry.fields == {k: list(v) for k, v in pub.fields.items()}
    assert entry.options == dict(pub.options) and entry.publish_type == pub.publish_type
