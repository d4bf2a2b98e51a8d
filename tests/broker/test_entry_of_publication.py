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
    assert JournalEntry.of_publication(pub, seq, at, position) == \
        JournalEntry.from_avro(position, decoded)
