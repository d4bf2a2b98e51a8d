"""The journal's DATA-record writer writes exactly what the generic codec writes, or refuses
exactly what it refuses."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.codec import default_codec
from broker.journal_writer import SCHEMA, DataRecordWriter
from broker.records import Publication, PublishType
from common.errors import RecordSchemaError

text = st.text(max_size=12)
longs = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
optional_text = st.none() | text


@st.composite
def publications(draw: st.DrawFn) -> Publication:
    """Any valid publication, including every optional field and the odd-but-valid types the
    generic path takes (tuples of field values, plain-str publish types)."""
    return Publication(
        topic=draw(text),
        source=draw(text),
        content=draw(st.binary(max_size=300)),
        publish_type=draw(st.sampled_from(PublishType) | st.sampled_from(["update", "drop"])),
        content_type=draw(text),
        message_id=draw(optional_text),
        revision_id=draw(optional_text),
        publication_date=draw(st.none() | longs),
        expiration_date=draw(optional_text),
        permission_token=draw(optional_text),
        publisher_seq=draw(st.none() | longs),
        fields=draw(st.dictionaries(text, st.lists(text, max_size=3)
                                    | st.tuples(text, text), max_size=3)),
        options=draw(st.dictionaries(text, text, max_size=3)),
    )


def _generic(pub: Publication, seq: int, ts: int) -> bytes:
    return default_codec().encode(SCHEMA, pub.to_avro(seq, ts))


@settings(max_examples=300, deadline=None)
@given(pub=publications(), seq=st.integers(1, (1 << 63) - 1), ts=longs)
@example(pub=Publication(topic="t", source="s", content=b""), seq=1, ts=-1)  # a fresh stamp cache
def test_bytes_equal_the_generic_path(pub: Publication, seq: int, ts: int) -> None:
    """For any valid publication, seq and time the bytes equal the generic codec's."""
    assert DataRecordWriter(default_codec()).encode(pub, seq, ts) == _generic(pub, seq, ts)


def test_writes_the_current_schema_itself() -> None:
    """The fast path is on for the shipped journal_record (a new version must teach it)."""
    writer = DataRecordWriter(default_codec())
    assert writer.fast
    pub = Publication(topic="t", source="s", content=b"x")
    assert writer._write(pub, 1, 5) == _generic(pub, 1, 5)


def test_caches_do_not_leak_between_records() -> None:
    """One writer reused across topics, sources, content types and milliseconds stays exact."""
    writer = DataRecordWriter(default_codec())
    pubs = [Publication(topic=f"t{i % 3}", source=f"s{i % 2}", content=bytes([i]),
                        content_type=("text/plain", "application/xml")[i % 2])
            for i in range(12)]
    for i, pub in enumerate(pubs):
        assert writer.encode(pub, i + 1, 1_700_000_000_000 + i // 4) == \
            _generic(pub, i + 1, 1_700_000_000_000 + i // 4)


@pytest.mark.parametrize("over", [
    {"publish_type": "bogus"},
    {"publish_type": ["update"]},
    {"fields": {"a": [1]}},
    {"fields": {1: ["a"]}},
    {"options": {"a": 1}},
    {"content": "not bytes"},
    {"message_id": 5},
    {"publisher_seq": "5"},
    {"publisher_seq": 1 << 64},
    {"publication_date": True},
    {"content_type": None},
])
def test_refuses_what_the_generic_path_refuses(over: dict[str, Any]) -> None:
    """A value of the wrong type or range raises RecordSchemaError, as the codec does."""
    pub = Publication(**({"topic": "t", "source": "s", "content": b"x"} | over))
    with pytest.raises(RecordSchemaError):
        _generic(pub, 1, 5)
    with pytest.raises(RecordSchemaError):
        DataRecordWriter(default_codec()).encode(pub, 1, 5)


def test_takes_what_only_the_generic_path_takes() -> None:
    """A value it leaves to the generic path (a datetime publication date) still encodes."""
    pub = Publication(topic="t", source="s", content=b"x",
                      publication_date=datetime(2024, 1, 2, tzinfo=UTC))  # type: ignore[arg-type]
    assert DataRecordWriter(default_codec()).encode(pub, 1, 5) == _generic(pub, 1, 5)
