"""The link log's record writer writes exactly what the generic codec writes, or refuses exactly
what it refuses, for any link record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.codec import default_codec
from broker.kafka_io import Position
from broker.robust import _link_writer
from broker.robust._link_writer import BATCH_SCHEMA, SCHEMA, LinkRecordWriter
from broker.robust.link_records import LinkKind, LinkRecord
from common.errors import RecordSchemaError

longs = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
ints = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)
text = st.text(max_size=12)


@st.composite
def records(draw: st.DrawFn, *, wild: bool = False) -> LinkRecord:
    """Any link record; `wild`: with values out of their Avro ranges too."""
    big = st.integers(min_value=-(1 << 70), max_value=1 << 70) if wild else longs
    position = draw(st.none() | st.builds(Position, big if wild else ints, big))
    return LinkRecord(
        link=draw(text), ordinal=draw(big), epoch=draw(big), epoch_start=draw(big),
        bits=draw(big if wild else ints), link_seq=draw(longs),
        kind=draw(st.sampled_from(LinkKind)), position=position,
        source=draw(st.none() | text), source_seq=draw(st.none() | big),
        owner=draw(st.none() | text), writer=draw(big), recorded_at=draw(big),
        snapshot=draw(st.booleans()))


def _generic(record: LinkRecord) -> bytes | type[Exception]:
    try:
        return default_codec().encode(SCHEMA, record.to_avro())
    except RecordSchemaError:
        return RecordSchemaError


def _fast(writer: LinkRecordWriter, record: LinkRecord) -> bytes | type[Exception]:
    try:
        return writer.encode(record)
    except RecordSchemaError:
        return RecordSchemaError


@given(records())
def test_the_bytes_are_the_generic_codecs(record: LinkRecord) -> None:
    writer = LinkRecordWriter(default_codec())
    assert writer.fast
    assert writer.encode(record) == default_codec().encode(SCHEMA, record.to_avro())
    assert writer.encode(record) == writer.encode(record)  # the cached head changes nothing


@given(records(wild=True))
def test_out_of_range_values_fare_as_on_the_generic_path(record: LinkRecord) -> None:
    assert _fast(LinkRecordWriter(default_codec()), record) == _generic(record)


def test_the_bytes_decode_to_the_record() -> None:
    record = LinkRecord("desk-1", 9, 2, 4, 16, 5, LinkKind.DATA, Position(1, 77), "a@b.c", 3,
                        None, 12, 1_700_000_000_000, True)
    _, value = default_codec().decode(LinkRecordWriter(default_codec()).encode(record),
                                      expect=SCHEMA)
    assert LinkRecord.from_avro(value) == record


@pytest.mark.parametrize("snapshot", [1, None])
def test_a_wrong_type_takes_the_generic_path(snapshot: object) -> None:
    record = LinkRecord("desk-1", 9, 2, 4, 16, 5, LinkKind.DATA, None, None, None, None, 12, 0,
                        snapshot)  # type: ignore[arg-type]
    assert _fast(LinkRecordWriter(default_codec()), record) == _generic(record)


@given(st.lists(records(), min_size=1, max_size=8), st.data())
def test_one_writer_over_many_records_keeps_its_caches_right(
        batch: list[LinkRecord], data: st.DataObject) -> None:
    # records sharing links, epochs and stamps with each other, as one append's do
    writer = LinkRecordWriter(default_codec())
    for record in [*batch, data.draw(st.sampled_from(batch))]:
        assert writer.encode(record) == default_codec().encode(SCHEMA, record.to_avro())


def _generic_many(records: list[LinkRecord]) -> bytes | type[Exception]:
    try:
        return default_codec().encode(BATCH_SCHEMA, {"records": [r.to_avro() for r in records]})
    except RecordSchemaError:
        return RecordSchemaError


def _fast_many(writer: LinkRecordWriter, records: list[LinkRecord]) -> bytes | type[Exception]:
    try:
        return writer.encode_many(records)
    except RecordSchemaError:
        return RecordSchemaError


@given(st.lists(records(), min_size=1, max_size=8))
def test_a_pack_is_the_generic_codecs_link_batch(batch: list[LinkRecord]) -> None:
    writer = LinkRecordWriter(default_codec())
    assert writer.fast_many
    assert writer.encode_many(batch) == _generic_many(batch)


def test_a_pack_decodes_to_its_records_in_order() -> None:
    batch = [LinkRecord("desk-1", 9, 2, 4, 16, 5, LinkKind.DATA, Position(1, 77), "a@b.c", 3,
                        None, 12, 1_700_000_000_000, True),
             LinkRecord("desk-2", 0, 0, 0, 32, 0, LinkKind.RESET, None, None, None, "o@b.c", 12,
                        1_700_000_000_000),
             LinkRecord("desk-1", 10, 2, 4, 16, 6, LinkKind.HEARTBEAT, None, None, None, None,
                        12, 1_700_000_000_000)]
    name, value = default_codec().decode(LinkRecordWriter(default_codec()).encode_many(batch))
    assert name == BATCH_SCHEMA
    assert [LinkRecord.from_avro(r) for r in value["records"]] == batch


@given(st.lists(records(wild=True), min_size=1, max_size=4))
def test_a_pack_with_out_of_range_values_fares_as_on_the_generic_path(
        batch: list[LinkRecord]) -> None:
    # one bad record sends the whole pack down the generic path, which refuses it
    assert _fast_many(LinkRecordWriter(default_codec()), batch) == _generic_many(batch)


# --- the C twin (broker/_speedups.c) against the Python writer --------------------------------


def _outcome(write: Callable[[], bytes]) -> bytes | str:
    try:
        return write()
    except Exception as exc:  # whatever the Python writer raises, the twin must raise too
        return type(exc).__name__


def _both(records_: list[Any], many: bool) -> tuple[bytes | str, bytes | str]:
    c = LinkRecordWriter(default_codec())
    py = LinkRecordWriter(default_codec(), compiled=False)
    if many:
        return _outcome(lambda: c.encode_many(records_)), _outcome(lambda: py.encode_many(records_))
    return _outcome(lambda: c.encode(records_[0])), _outcome(lambda: py.encode(records_[0]))


def test_the_twin_is_built() -> None:
    assert _link_writer._link_bodies is not None, (
        "broker._speedups is not built: apt-get install gcc python3-dev, then bash ops/bootstrap")


#: values of every type a field might be handed: right ones, near misses and wrong types
odd_values = (st.integers(min_value=-(1 << 70), max_value=1 << 70) | st.booleans() | st.none()
              | st.text(max_size=6) | st.floats(allow_nan=False) | st.just("DATA")
              | st.sampled_from(LinkKind) | st.builds(Position, ints, longs)
              | st.tuples(ints, longs) | st.just("\ud800") | st.binary(max_size=4))


@st.composite
def odd_records(draw: st.DrawFn) -> Any:
    """A link record with any field replaced by an odd value, or something else altogether."""
    record = draw(records(wild=True))
    fields = list(record)
    for i in draw(st.sets(st.integers(0, len(fields) - 1), max_size=3)):
        fields[i] = draw(odd_values)
    if draw(st.integers(0, 9)) == 0:
        return tuple(fields)  # a plain tuple: the Python writer reads fields by name
    return LinkRecord(*fields)


@given(st.lists(records(wild=True) | odd_records(), min_size=1, max_size=5), st.booleans())
def test_the_twin_writes_or_declines_as_the_python_writer(batch: list[Any], many: bool) -> None:
    compiled, python = _both(batch, many)
    assert compiled == python


@given(st.lists(records(), min_size=1, max_size=6))
def test_the_twin_takes_plain_records(batch: list[LinkRecord]) -> None:
    bodies = _link_writer._link_bodies
    assert bodies is not None
    # it answers for them itself, rather than declining to the Python writer
    assert bodies(batch, _link_writer._KINDS, LinkRecord, Position) is not None
    assert _both(batch, True)[0] == _generic_many(batch)


@pytest.mark.parametrize("field, value", [
    ("ordinal", 1 << 63), ("ordinal", -(1 << 63) - 1), ("bits", 1 << 31), ("bits", True),
    ("epoch", 2.0), ("link", b"desk"), ("link", "\ud800"), ("kind", "NOPE"), ("kind", ["x"]),
    ("position", (1, 2)), ("position", Position(1 << 31, 0)), ("source", 7),
    ("snapshot", 0), ("writer", None),
])
def test_each_guard_declines_to_the_python_writer(field: str, value: object) -> None:
    base = LinkRecord("desk-1", 9, 2, 4, 16, 5, LinkKind.DATA, Position(1, 77), "a@b.c", 3,
                      None, 12, 1_700_000_000_000, True)
    odd = base._replace(**{field: value})
    bodies = _link_writer._link_bodies
    assert bodies is not None
    assert bodies([base], _link_writer._KINDS, LinkRecord, Position) is not None
    assert bodies([base, odd], _link_writer._KINDS, LinkRecord, Position) is None
    assert _both([odd], False)[0] == _both([odd], False)[1]
