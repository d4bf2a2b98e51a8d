"""Avro single-object encoding for every record apexps stores in Kafka.

Theory of operation
-------------------
Each stored value is `C3 01` + the 8-byte little-endian CRC-64-AVRO fingerprint of the writer
schema's parsing canonical form + the Avro binary body (Avro 1.11 spec, "Single-object
encoding"). The fingerprint says which schema wrote the bytes, so schemas can evolve: the codec
knows every version shipped under `avro/` (`NAME.vN.avsc`), decodes with the writer's version and
resolves to the newest one (the reader schema), filling new fields from their defaults.

Encoding is strict: a record missing a field without default, with an extra field, or with a
value of the wrong type raises `RecordSchemaError` and produces no bytes. Decoding bytes that do
not start with the marker, or that name a fingerprint no shipped schema has, raises
`UnknownSchemaFingerprint` / `RecordSchemaError`; nothing is guessed.

Both directions have a compiled fast path beside fastavro: writers per schema
(broker/_avro_writer.py) and readers per (writer version, newest version) pair
(broker/_avro_reader.py), each giving exactly fastavro's bytes or values and refusing what it
refuses. What they do not compile, fastavro does.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import fastavro
from fastavro.schema import to_parsing_canonical_form

from broker._avro_reader import CannotCompile, Corrupt, Decoder, UseFastavro, compile_reader
from broker._avro_writer import Fallback, Invalid, Unsupported, compile_writer
from common.errors import RecordSchemaError, UnknownSchemaFingerprint

__all__ = ["AVRO_DIR", "Codec", "SchemaVersion", "crc64_avro", "default_codec"]

#: The schemas ship at the repository top (`avro/`); APEXPS_AVRO_DIR points elsewhere.
AVRO_DIR = Path(os.environ.get("APEXPS_AVRO_DIR", Path(__file__).resolve().parents[1] / "avro"))

MARKER = b"\xc3\x01"
HEADER_LEN = 10

_EMPTY = 0xC15D213AA4D7A795  # the Avro spec's CRC-64-AVRO initial value


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _crc_table()


def crc64_avro(data: bytes) -> int:
    """The Rabin fingerprint of the Avro spec ("Schema Fingerprints")."""
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


@dataclass(frozen=True)
class SchemaVersion:
    name: str
    version: int
    parsed: Any
    fingerprint: bytes  # 8 bytes, little-endian, as it stands in the header
    #: the compiled writer (broker/_avro_writer.py), None where only fastavro can write it
    fast: Callable[[Mapping[str, Any]], bytes] | None = None
    #: the compiled reader of this version's records into the newest layout
    #: (broker/_avro_reader.py), None where only fastavro can read them
    read: Decoder | None = None
    #: the schema as its .avsc file gives it (JSON), for readers in other runtimes: Spark's
    #: `from_avro` (broker/spark/avro_decode.py)
    raw: Any = None


_FILE_RE = re.compile(r"^(?P<name>[a-z_]+)\.v(?P<version>\d+)\.avsc$")
_DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, EOFError, OverflowError,
                  UnicodeDecodeError, struct.error, StopIteration)
_FAST_ERRORS = (Invalid, UnicodeEncodeError, OverflowError, struct.error)
_ENCODE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError)


class Codec:
    """Encode and decode records by schema name (`journal_record`, `topic_record`, …).

    `fast_read=False` decodes everything with fastavro, as the compiled readers are checked
    against (and as the benchmark compares them with).
    """

    def __init__(self, schema_dir: Path = AVRO_DIR, *, fast_read: bool = True) -> None:
        self._by_fp: dict[bytes, SchemaVersion] = {}
        self._latest: dict[str, SchemaVersion] = {}
        raws: dict[bytes, Any] = {}
        for path in sorted(schema_dir.glob("*.avsc")):
            m = _FILE_RE.match(path.name)
            if m is None:
                continue
            raw = json.loads(path.read_text())
            parsed = fastavro.parse_schema(raw, _force=True)
            canonical = to_parsing_canonical_form(raw)
            fp = struct.pack("<Q", crc64_avro(canonical.encode()))
            try:
                fast: Callable[[Mapping[str, Any]], bytes] | None = compile_writer(raw)
            except Unsupported:
                fast = None
            sv = SchemaVersion(m["name"], int(m["version"]), parsed, fp, fast, raw=raw)
            self._by_fp[fp] = sv
            raws[fp] = raw
            cur = self._latest.get(sv.name)
            if cur is None or sv.version > cur.version:
                self._latest[sv.name] = sv
        if not self._latest:
            raise RecordSchemaError(f"no Avro schemas found in {schema_dir}")
        if fast_read:
            self._compile_readers(raws)
        #: by marker + fingerprint: one lookup checks both
        self._by_header = {MARKER + fp: sv for fp, sv in self._by_fp.items()}

    def _compile_readers(self, raws: Mapping[bytes, Any]) -> None:
        for fp, sv in list(self._by_fp.items()):
            newest = self._latest[sv.name].fingerprint
            try:
                read = compile_reader(raws[fp], None if newest == fp else raws[newest])
            except CannotCompile:
                continue  # fastavro reads this version
            self._by_fp[fp] = dataclasses.replace(sv, read=read)
        self._latest = {name: self._by_fp[sv.fingerprint] for name, sv in self._latest.items()}

    def schema(self, name: str, version: int | None = None) -> SchemaVersion:
        if version is None:
            try:
                return self._latest[name]
            except KeyError:
                raise RecordSchemaError(f"no schema named {name!r}") from None
        for sv in self._by_fp.values():
            if sv.name == name and sv.version == version:
                return sv
        raise RecordSchemaError(f"no schema {name!r} version {version}")

    def versions(self, name: str) -> list[SchemaVersion]:
        """Every shipped version of `name`, oldest first (the last is the reader schema)."""
        found = sorted((sv for sv in self._by_fp.values() if sv.name == name),
                       key=lambda sv: sv.version)
        if not found:
            raise RecordSchemaError(f"no schema named {name!r}")
        return found

    def encode(self, name: str, record: Mapping[str, Any], *, version: int | None = None) -> bytes:
        """Single-object encode `record` with the newest (or the given) version of `name`."""
        sv = self.schema(name, version)
        if sv.fast is not None:
            try:
                return MARKER + sv.fingerprint + sv.fast(record)
            except Fallback:
                pass
            except _FAST_ERRORS as exc:
                raise RecordSchemaError(f"{name} record does not match its schema: {exc}") from exc
        buf = io.BytesIO()
        buf.write(MARKER)
        buf.write(sv.fingerprint)
        try:
            fastavro.schemaless_writer(buf, sv.parsed, record, strict_allow_default=True)
        except _ENCODE_ERRORS as exc:
            raise RecordSchemaError(f"{name} record does not match its schema: {exc}") from exc
        return buf.getvalue()

    def decode(self, data: bytes | bytearray | memoryview,
               expect: str | None = None) -> tuple[str, dict[str, Any]]:
        """Decode single-object bytes into (schema name, record in the newest layout)."""
        if type(data) is not bytes:
            data = bytes(data)  # a bytes field then reads as bytes, as from fastavro's BytesIO
        writer = self._by_header.get(data[:HEADER_LEN])
        if writer is None:
            _refuse_header(data)
        if expect is not None and writer.name != expect:
            raise RecordSchemaError(f"expected a {expect} record, found {writer.name}")
        if writer.read is not None:
            try:
                return writer.name, writer.read(data, HEADER_LEN)
            except Corrupt as exc:
                raise RecordSchemaError(f"corrupt {writer.name} record: {exc}") from exc
            except UseFastavro:
                pass  # bytes whose answer only fastavro knows: it reads them below
        reader = self._latest[writer.name]
        buf = io.BytesIO(data)
        buf.seek(HEADER_LEN)
        try:
            rec = fastavro.schemaless_reader(
                buf, writer.parsed, None if reader is writer else reader.parsed
            )
        except _DECODE_ERRORS as exc:
            raise RecordSchemaError(f"corrupt {writer.name} record: {exc}") from exc
        if buf.tell() != len(data):
            raise RecordSchemaError(f"corrupt {writer.name} record: trailing bytes")
        return writer.name, rec  # type: ignore[return-value]


def _refuse_header(data: bytes) -> NoReturn:
    if len(data) < HEADER_LEN or data[:2] != MARKER:
        raise RecordSchemaError("not an Avro single-object encoded record (bad marker)")
    raise UnknownSchemaFingerprint(
        f"record written with unknown schema fingerprint {data[2:HEADER_LEN].hex()}; "
        "is this apexps older than the one that wrote it?"
    )


_default: Codec | None = None


def default_codec() -> Codec:
    """The process-wide codec over the shipped schemas (parsed once)."""
    global _default  # noqa: PLW0603 - one parse of the schema directory per process
    if _default is None:
        _default = Codec()
    return _default
