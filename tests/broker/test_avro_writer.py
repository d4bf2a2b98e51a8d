"""The compiled Avro writer writes exactly what fastavro writes, and refuses what it refuses."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker._avro_writer import Invalid, compile_writer
from broker.codec import AVRO_DIR

SCHEMAS = {p.name: json.loads(p.read_text()) for p in sorted(AVRO_DIR.glob("*.avsc"))}

text = st.text(max_size=20)
longs = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


def _value(schema: Any) -> st.SearchStrategy[Any]:
    """A hypothesis strategy for any valid value of `schema`."""
    if isinstance(schema, list):
        return st.one_of(*[_value(b) for b in schema])
    if isinstance(schema, str):
        schema = {"type": schema}
    t = schema["type"]
    if isinstance(t, (dict, list)):
        return _value(t)
    simple = {"null": st.none(), "string": text, "bytes": st.binary(max_size=40),
              "long": longs, "int": st.integers(-(1 << 31), (1 << 31) - 1),
              "boolean": st.booleans()}
    if t in simple:
        return simple[t]
    if t == "enum":
        return st.sampled_from(schema["symbols"])
    if t == "array":
        return st.lists(_value(schema["items"]), max_size=4)
    if t == "map":
        return st.dictionaries(text, _value(schema["values"]), max_size=4)
    assert t == "record", t
    return st.fixed_dictionaries({f["name"]: _value(f["type"]) for f in schema["fields"]})


def _fastavro(schema: Any, record: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema, _force=True), record)
    return buf.getvalue()


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_bytes_equal_fastavro(name: str, data: st.DataObject) -> None:
    """For every shipped schema and any valid record, the bytes equal fastavro's."""
    schema = SCHEMAS[name]
    record = data.draw(_value(schema))
    assert compile_writer(schema)(record) == _fastavro(schema, record)


def test_defaults_fill_missing_fields() -> None:
    """A field left out that has a default is written with its default, as fastavro does."""
    schema = SCHEMAS["journal_record.v2.avsc"]
    full = {f["name"]: f.get("default") for f in schema["fields"]}
    full.update(kind="DATA", topic="t", source="s", source_seq=1, publish_type="update",
                content=b"", appended_at=5)
    partial = {k: full[k] for k in ("kind", "topic", "source", "source_seq", "publish_type",
                                    "content", "appended_at")}
    assert compile_writer(schema)(partial) == _fastavro(schema, full)


@pytest.mark.parametrize("bad", [
    {"source_seq": "1"}, {"source_seq": True}, {"source_seq": 1 << 64}, {"kind": "NOPE"},
    {"extra": 1}, {"fields": {"a": [1]}}, {"content": "str"}, {"topic": None},
])
def test_refuses_invalid_records(bad: dict[str, Any]) -> None:
    """Wrong types, out-of-range numbers, unknown symbols and extra fields raise Invalid."""
    schema = SCHEMAS["journal_record.v2.avsc"]
    rec = {"kind": "DATA", "topic": "t", "source": "s", "source_seq": 1,
           "publish_type": "update", "content": b"", "appended_at": 5} | bad
    with pytest.raises(Invalid):
        compile_writer(schema)(rec)
