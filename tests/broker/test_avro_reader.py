"""The compiled Avro reader decodes exactly what fastavro decodes, and refuses what it refuses."""

from __future__ import annotations

import io
import json
import tracemalloc
from datetime import datetime
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker._avro_reader import CannotCompile, Corrupt, UseFastavro, compile_reader
from broker.codec import AVRO_DIR, HEADER_LEN, Codec
from common.errors import RecordSchemaError

SHIPPED = sorted((p.name.split(".")[0], int(p.name.split(".")[1][1:]))
                 for p in AVRO_DIR.glob("*.avsc"))
FAST = Codec()
SLOW = Codec(fast_read=False)

#: Constructs no shipped schema uses but the reader compiles: a nested record, a union of three,
#: a union with null second, an int, a map of arrays of records.
PROBE: dict[str, Any] = {
    "type": "record", "name": "Probe", "fields": [
        {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [
            {"name": "a", "type": "int"}, {"name": "b", "type": ["string", "null"]}]}},
        {"name": "three", "type": ["null", "long", "string"]},
        {"name": "flag", "type": "boolean"},
        {"name": "nested", "type": {"type": "map", "values": {"type": "array", "items": {
            "type": "record", "name": "Leaf", "fields": [{"name": "x", "type": "bytes"}]}}}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}

text = st.text(max_size=20)
longs = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
#: within datetime's range mostly, beyond it sometimes (both paths must refuse those alike)
millis = st.integers(-62_135_596_800_000, 253_402_300_799_999) | longs


def _value(schema: Any) -> st.SearchStrategy[Any]:
    """Any valid value of `schema`, as the codec takes it for writing."""
    if isinstance(schema, list):
        return st.one_of(*[_value(b) for b in schema])
    if isinstance(schema, str):
        schema = {"type": schema}
    t = schema["type"]
    if isinstance(t, (dict, list)):
        return _value(t)
    if schema.get("logicalType") == "timestamp-millis":
        return millis
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


#: a varint's end (00, 7F), start (80, 81, FF), small values of both signs, and the one bytes
#: a boolean holds (00, 01) and does not (02)
INTERESTING = [bytes((b,)) for b in (0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x7F, 0x80, 0x81, 0xFF)]


def _sample(schema: Any, *, full: bool) -> Any:
    """A fixed valid value: every optional present, multi-byte numbers, non-ASCII text and
    containers of two (`full`), or every optional absent and containers empty."""
    if isinstance(schema, list):
        return _sample(schema[-1] if full else schema[0], full=full)
    if isinstance(schema, str):
        schema = {"type": schema}
    t = schema["type"]
    if isinstance(t, (dict, list)):
        return _sample(t, full=full)
    if t == "record":
        return {f["name"]: _sample(f["type"], full=full) for f in schema["fields"]}
    if t == "array":
        return [_sample(schema["items"], full=full)] * 2 if full else []
    if t == "map":
        return {"k": _sample(schema["values"], full=full), "é": _sample(schema["values"],
                                                                        full=full)} if full else {}
    if t == "enum":
        return schema["symbols"][-1 if full else 0]
    if schema.get("logicalType") == "timestamp-millis":
        return 1_700_000_000_123
    return {"null": None, "boolean": full, "int": 300 if full else 1, "long": -300 if full else 1,
            "string": "zé" if full else "", "bytes": b"\x00\xff" if full else b""}[t]


def _raw(name: str, version: int) -> Any:
    return json.loads((AVRO_DIR / f"{name}.v{version}.avsc").read_text())


@st.composite
def encoded(draw: st.DrawFn) -> bytes:
    """Single-object bytes of a valid record of any shipped schema version."""
    name, version = draw(st.sampled_from(SHIPPED))
    return FAST.encode(name, draw(_value(_raw(name, version))), version=version)


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down and dicts in the same key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, datetime):
        return bool(a == b and a.tzinfo == b.tzinfo)
    return bool(a == b)


def _outcome(codec: Codec, data: bytes) -> Any:
    try:
        return codec.decode(data)
    except RecordSchemaError:
        return RecordSchemaError


def _agree(data: bytes) -> None:
    fast, slow = _outcome(FAST, data), _outcome(SLOW, data)
    assert fast is slow or _same(fast, slow), (data.hex(), fast, slow)


class TestShippedSchemas:
    @pytest.mark.parametrize(("name", "version"), SHIPPED)
    def test_every_version_reads_compiled(self, name: str, version: int) -> None:
        """Every shipped version, old ones into the newest layout too, has a compiled reader."""
        assert FAST.schema(name, version).read is not None

    @settings(max_examples=600, deadline=None)
    @given(data=encoded())
    def test_valid_records_decode_as_fastavro_does(self, data: bytes) -> None:
        """Any valid record of any shipped version decodes to fastavro's value, types and key
        order included, or both refuse it (a timestamp beyond datetime's range)."""
        _agree(data)

    @settings(max_examples=300, deadline=None)
    @given(data=encoded())
    def test_the_compiled_reader_itself_decodes_them(self, data: bytes) -> None:
        """Valid records never need fastavro: the compiled reader answers them itself."""
        writer = FAST.schema(*_name_version(data))
        assert writer.read is not None
        try:
            got: Any = writer.read(data, HEADER_LEN)
        except Corrupt:  # a timestamp beyond datetime's range
            got = RecordSchemaError
        slow = _outcome(SLOW, data)
        assert got is slow or _same(got, slow[1])

    @settings(max_examples=1500, deadline=None)
    @given(data=encoded(), cuts=st.lists(st.tuples(st.integers(0, 1 << 16), st.binary(max_size=4),
                                                   st.integers(0, 3)), min_size=1, max_size=3))
    @example(data=FAST.encode("topic_record", {"name": "t", "created_at": 1}), cuts=[(0, b"", 1)])
    def test_corrupted_records_fail_or_decode_as_fastavro(
            self, data: bytes, cuts: list[tuple[int, bytes, int]]) -> None:
        """Valid bytes cut short, overwritten, spliced or extended anywhere after the header:
        both paths raise RecordSchemaError, or both return the same value."""
        body = bytearray(data[HEADER_LEN:])
        for where, new, drop in cuts:
            at = where % (len(body) + 1)
            body[at:at + drop] = new
        _agree(data[:HEADER_LEN] + bytes(body))
        _agree(data[:HEADER_LEN] + bytes(body[: len(body) // 2]))

    @pytest.mark.parametrize(("name", "version"), SHIPPED)
    @pytest.mark.parametrize("full", [True, False], ids=["full", "bare"])
    def test_every_byte_changed_or_cut_decodes_as_fastavro(
            self, name: str, version: int, full: bool) -> None:
        """Exhaustively for one record with every optional value present (and one with none):
        each body byte set to each of the values that change a varint's meaning, each byte
        inserted before it, and each cut, fail in both paths or decode alike in both."""
        data = FAST.encode(name, _sample(_raw(name, version), full=full), version=version)
        for at in range(HEADER_LEN, len(data) + 1):
            _agree(data[:at])
            for byte in INTERESTING:
                _agree(data[:at] + byte + data[at + 1:])
                _agree(data[:at] + byte + data[at:])

    def test_old_layout_gets_defaults_after_its_own_fields(self) -> None:
        """A v1 journal record reads as fastavro reads it: v1's fields in v1's order, then the
        fields v2 added, with their defaults."""
        v1 = _raw("journal_record", 1)
        rec: dict[str, Any] = {f["name"]: f.get("default") for f in v1["fields"]}
        rec.update(kind="DATA", topic="t", source="s", source_seq=1, content=b"c",
                   appended_at=5, publish_type="image")
        data = FAST.encode("journal_record", rec, version=1)
        _, got = FAST.decode(data)
        assert _same(got, SLOW.decode(data)[1])
        assert list(got)[-3:] == ["publisher_seq", "permission_token", "options"]

    def test_defaults_are_fresh_per_record(self) -> None:
        """A caller changing one record's defaulted map does not change the next record's."""
        data = FAST.encode("source_checkpoint", {"source": "s", "seq": 1, "partition": 0,
                                                 "offset": 0, "updated_at": 0}, version=1)
        FAST.decode(data)[1]["publisher_failed"].append(7)
        assert FAST.decode(data)[1]["publisher_failed"] == []


def _name_version(data: bytes) -> tuple[str, int]:
    for name, version in SHIPPED:
        if FAST.schema(name, version).fingerprint == data[2:HEADER_LEN]:
            return name, version
    raise AssertionError("unknown fingerprint")


def _probe(tmp_path: Path, fields: list[dict[str, Any]]) -> tuple[Codec, Codec, bytes]:
    """A fast and a fastavro-only codec over a one-schema directory, and its header."""
    path = tmp_path / "probe.v1.avsc"
    path.write_text(json.dumps({"type": "record", "name": "Probe", "fields": fields}))
    fast = Codec(tmp_path)
    assert fast.schema("probe").read is not None
    return fast, Codec(tmp_path, fast_read=False), b"\xc3\x01" + fast.schema("probe").fingerprint


def _refused(tmp_path: Path, fields: list[dict[str, Any]], body: bytes) -> str:
    """The fast path's message for `body`; fastavro refuses it too."""
    fast, slow, header = _probe(tmp_path, fields)
    with pytest.raises(RecordSchemaError):
        slow.decode(header + body)
    with pytest.raises(RecordSchemaError) as info:
        fast.decode(header + body)
    assert str(info.value).startswith("corrupt probe record: ")
    return str(info.value)


STRING = [{"name": "s", "type": "string"}]


class TestRefusals:
    def test_truncated(self, tmp_path: Path) -> None:
        """Data ending inside a field is truncated."""
        assert "truncated" in _refused(tmp_path, [*STRING, {"name": "n", "type": "long"}],
                                       b"\x02a\x80")

    def test_trailing_bytes(self, tmp_path: Path) -> None:
        """Bytes after the last field are refused, with their count."""
        assert "2 trailing bytes" in _refused(tmp_path, STRING, b"\x02a\x00\x00")

    def test_union_branch_out_of_range(self, tmp_path: Path) -> None:
        """A union index beyond the branches (or below minus their number) is refused."""
        fields = [{"name": "u", "type": ["null", "string"]}]
        assert "u: union branch 2 out of range" in _refused(tmp_path, fields, b"\x04")
        assert "union branch -3 out of range" in _refused(tmp_path, fields, b"\x05")

    def test_enum_index_out_of_range(self, tmp_path: Path) -> None:
        """An enum index beyond the symbols is refused."""
        fields = [{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}]
        assert "e: enum index 2 out of range" in _refused(tmp_path, fields, b"\x04")

    def test_negative_length(self, tmp_path: Path) -> None:
        """A string or bytes length below zero is refused."""
        assert "s: negative length -1" in _refused(tmp_path, STRING, b"\x01")

    def test_invalid_utf8(self, tmp_path: Path) -> None:
        """A string that is not UTF-8 is refused."""
        assert "not UTF-8" in _refused(tmp_path, STRING, b"\x02\xff")

    def test_timestamp_beyond_datetime(self, tmp_path: Path) -> None:
        """A timestamp-millis that no datetime can hold is refused."""
        fields = [{"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}]
        assert "out of range" in _refused(tmp_path, fields, b"\xfe\xff\xff\xff\xff\xff\xff\x7f")

    @pytest.mark.parametrize(("fields", "body", "message"), [
        (STRING, b"\x80" * 8 + b"\x10", "s: length 576460752303423488 exceeds the 0 bytes left"),
        ([{"name": "a", "type": {"type": "array", "items": "long"}}], b"\x80" * 8 + b"\x10\x00",
         "a: 576460752303423488 items cannot fit in the 1 bytes left"),
        ([{"name": "m", "type": {"type": "map", "values": "long"}}], b"\x82\x80\x80\x80\x10\x00",
         "m: 2147483649 items cannot fit in the 1 bytes left"),
    ])
    def test_absurd_lengths_allocate_nothing(self, tmp_path: Path, fields: list[dict[str, Any]],
                                             body: bytes, message: str) -> None:
        """A length or count beyond the bytes left is refused before anything is allocated."""
        fast, slow, header = _probe(tmp_path, fields)
        with pytest.raises(RecordSchemaError):
            slow.decode(header + body)
        tracemalloc.start()
        try:
            with pytest.raises(RecordSchemaError) as info:
                fast.decode(header + body)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert message in str(info.value)
        assert peak < 64 * 1024


class TestFastavroQuirks:
    """Where fastavro accepts what the Avro spec would not, the reader agrees with it."""

    def _both(self, tmp_path: Path, fields: list[dict[str, Any]], body: bytes) -> Any:
        fast, slow, header = _probe(tmp_path, fields)
        got = fast.decode(header + body)
        assert _same(got, slow.decode(header + body))
        return got[1]

    def test_negative_indexes_count_from_the_end(self, tmp_path: Path) -> None:
        """fastavro indexes unions and enums Python-style: -1 is the last branch or symbol."""
        fields: list[dict[str, Any]] = [
            {"name": "u", "type": ["null", "string"]},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}]
        assert self._both(tmp_path, fields, b"\x01\x02x\x01") == {"u": "x", "e": "B"}

    def test_any_non_zero_byte_is_true(self, tmp_path: Path) -> None:
        """A boolean byte other than 0 and 1 reads as True."""
        assert self._both(tmp_path, [{"name": "b", "type": "boolean"}], b"\x07") == {"b": True}

    def test_int_has_no_32_bit_check(self, tmp_path: Path) -> None:
        """An int reads as a long, as fastavro reads it."""
        got = self._both(tmp_path, [{"name": "i", "type": "int"}], b"\x80\x80\x80\x80\x80\x01")
        assert got == {"i": 1 << 34}

    def test_ten_byte_varint_wraps_at_64_bits(self, tmp_path: Path) -> None:
        """A 10th varint byte's high bits fall off, as in fastavro's unsigned arithmetic."""
        body = b"\xff" * 9 + b"\x7f"
        assert self._both(tmp_path, [{"name": "n", "type": "long"}], body) == {"n": -(1 << 63)}

    @pytest.mark.parametrize(("fields", "body"), [
        ([{"name": "n", "type": "long"}], b"\x80" * 10 + b"\x01"),  # 11 bytes: C shifts by 70
        ([{"name": "a", "type": {"type": "array", "items": "long"}}],  # count -2**63
         b"\xff" * 9 + b"\x01" + b"\x00\x00"),
    ])
    def test_undefined_corners_are_fastavros_to_answer(
            self, tmp_path: Path, fields: list[dict[str, Any]], body: bytes) -> None:
        """Where fastavro's answer rests on C undefined behaviour, fastavro gives it."""
        fast, _, header = _probe(tmp_path, fields)
        read = fast.schema("probe").read
        assert read is not None
        with pytest.raises(UseFastavro):
            read(header + body, HEADER_LEN)
        self._both(tmp_path, fields, body)

    def test_buffers_other_than_bytes_read_bytes(self) -> None:
        """A memoryview or bytearray decodes as bytes would, bytes fields as bytes."""
        data = FAST.encode("item_version", {"topic": "t", "message_id": "m", "order": 1,
                                            "journal_partition": 0, "journal_offset": 2,
                                            "record": b"r"})
        for buf in (memoryview(data), bytearray(data)):
            assert _same(FAST.decode(buf), SLOW.decode(data))


PROBE_READ = compile_reader(PROBE)
PROBE_PARSED = fastavro.parse_schema(PROBE, _force=True)


class TestCompile:
    @settings(max_examples=300, deadline=None)
    @given(data=st.data())
    def test_probe_schema_decodes_as_fastavro_does(self, data: st.DataObject) -> None:
        """Nested records, wider unions and containers of records decode as fastavro does."""
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, PROBE_PARSED, data.draw(_value(PROBE)))
        body = buf.getvalue()
        try:
            expected: Any = fastavro.schemaless_reader(io.BytesIO(body), PROBE_PARSED)
        except OverflowError:
            expected = Corrupt
        try:
            got: Any = PROBE_READ(body, 0)
        except Corrupt:
            got = Corrupt
        assert got is expected or _same(got, expected)

    @pytest.mark.parametrize("fields", [
        [{"name": "f", "type": {"type": "fixed", "name": "F", "size": 4}}],
        [{"name": "f", "type": "double"}],
        [{"name": "u", "type": {"type": "string", "logicalType": "uuid"}}],
        [{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
         {"name": "e2", "type": "E"}],
        [{"name": "a", "type": {"type": "array", "items": "null"}}],
    ])
    def test_unsupported_constructs_stay_with_fastavro(
            self, tmp_path: Path, fields: list[dict[str, Any]]) -> None:
        """A schema using what the reader does not compile is read by fastavro instead."""
        schema = {"type": "record", "name": "Probe", "fields": fields}
        with pytest.raises(CannotCompile):
            compile_reader(schema)
        (tmp_path / "probe.v1.avsc").write_text(json.dumps(schema))
        assert Codec(tmp_path).schema("probe").read is None

    @pytest.mark.parametrize("v2_fields", [
        [],  # drops a field
        [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}],  # no default
        [{"name": "a", "type": "string"}],  # changes a type
        [{"name": "z", "type": "long", "aliases": ["a"]}],  # renames
    ])
    def test_resolution_beyond_added_defaults_stays_with_fastavro(
            self, v2_fields: list[dict[str, Any]]) -> None:
        """Only "the reader adds fields with defaults" compiles; other evolution falls back."""
        v1 = {"type": "record", "name": "Probe", "fields": [{"name": "a", "type": "long"}]}
        v2 = {"type": "record", "name": "Probe", "fields": v2_fields}
        with pytest.raises(CannotCompile):
            compile_reader(v1, v2)
