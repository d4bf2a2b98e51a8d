"""Avro single-object codec: fingerprints, evolution, and refusal of bad input."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.codec import HEADER_LEN, MARKER, Codec, crc64_avro, default_codec
from broker.records import Publication
from common.errors import RecordSchemaError, UnknownSchemaFingerprint


def _record(**over: object) -> dict[str, object]:
    return Publication(topic="music.jazz", source="fred@example.com",
                       content=b"<q/>").to_avro(7, 1_700_000_000_000) | over


class TestFingerprint:
    def test_matches_avro_spec_vector(self) -> None:
        """CRC-64-AVRO of the canonical form "null" is the value the Avro spec's tests use."""
        assert crc64_avro(b'"null"') == 0x63DD24E7CC258F8A

    def test_header_carries_little_endian_fingerprint(self) -> None:
        """Encoded bytes start with C3 01 and the writer schema's fingerprint."""
        codec = default_codec()
        data = codec.encode("journal_record", _record())
        assert data[:2] == MARKER
        assert data[2:HEADER_LEN] == codec.schema("journal_record").fingerprint
        assert struct.unpack("<Q", data[2:HEADER_LEN])[0] != 0


class TestRoundTrip:
    def test_journal_record_round_trips(self) -> None:
        """What is encoded decodes to the same values."""
        name, rec = default_codec().decode(default_codec().encode("journal_record", _record()))
        assert name == "journal_record"
        assert rec["source_seq"] == 7 and rec["content"] == b"<q/>" and rec["topic"] == "music.jazz"

    def test_reads_record_written_with_older_schema(self) -> None:
        """A v1 record decodes into the current layout with the new fields defaulted."""
        codec = default_codec()
        old = _record()
        for added in ("permission_token", "publisher_seq", "options"):
            old.pop(added)
        data = codec.encode("journal_record", old, version=1)
        assert data[2:HEADER_LEN] == codec.schema("journal_record", 1).fingerprint
        _, rec = codec.decode(data)
        assert rec["permission_token"] is None and rec["publisher_seq"] is None
        assert rec["options"] == {} and rec["source_seq"] == 7


class TestRefusals:
    @pytest.mark.parametrize("bad", [
        {"source_seq": "seven"},
        {"kind": "NOT_A_KIND"},
        {"publish_type": "bogus"},
        {"unexpected_field": 1},
        {"content": "text, not bytes"},
    ])
    def test_record_not_matching_schema_is_refused(self, bad: dict[str, object]) -> None:
        """A record that does not fit its schema raises RecordSchemaError (501)."""
        with pytest.raises(RecordSchemaError) as info:
            default_codec().encode("journal_record", _record(**bad))
        assert int(info.value.code) == 501

    def test_unknown_fingerprint_is_refused(self) -> None:
        """Bytes naming a schema this version does not ship raise UnknownSchemaFingerprint."""
        data = bytearray(default_codec().encode("journal_record", _record()))
        data[2:HEADER_LEN] = b"\x01" * 8
        with pytest.raises(UnknownSchemaFingerprint):
            default_codec().decode(bytes(data))

    def test_wrong_record_type_is_refused(self) -> None:
        """Decoding with an expected schema refuses a record of another schema."""
        data = default_codec().encode("journal_record", _record())
        with pytest.raises(RecordSchemaError):
            default_codec().decode(data, expect="topic_record")

    def test_missing_schema_directory_is_an_error(self, tmp_path: Path) -> None:
        """A codec with no schemas to load says so rather than failing later."""
        with pytest.raises(RecordSchemaError):
            Codec(tmp_path)

    @given(st.binary(max_size=200))
    def test_any_bytes_decode_or_raise_schema_error(self, data: bytes) -> None:
        """Arbitrary bytes either decode or raise RecordSchemaError; nothing else escapes."""
        with contextlib.suppress(RecordSchemaError):
            default_codec().decode(data)

    @given(st.binary(max_size=120))
    def test_corrupted_body_decodes_or_raises_schema_error(self, tail: bytes) -> None:
        """A valid header followed by garbage never raises anything but RecordSchemaError."""
        header = default_codec().encode("journal_record", _record())[:HEADER_LEN]
        with contextlib.suppress(RecordSchemaError):
            default_codec().decode(header + tail)
