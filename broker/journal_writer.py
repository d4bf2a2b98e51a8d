"""Journal DATA records written straight from a `Publication`: the append hot path.

Theory of operation
-------------------
The generic path builds a dict (`Publication.to_avro`, ~2 µs) and walks it with the compiled
schema writer (`broker/_avro_writer.py`, one closure call per field, ~16 µs a record). This
writer knows the field order of `journal_record` v2 and writes the single-object bytes from the
publication's attributes directly:

- the header (marker, fingerprint), `kind=DATA`, `topic` and `source` are one cached byte string
  per (topic, source) pair;
- `gap_to`/`gap_reason` are always null on a DATA record; an absent optional field costs one
  `is None` test;
- `appended_at` is encoded once per millisecond.

It takes only values whose type is plainly right (exact `str`, `int`, `bytes`, a known publish
type). Anything else — a wrong type, a datetime publication date, an int out of the long range,
a newer schema than the one this was written for — goes down the generic path, which writes or
refuses it exactly as before. So this module never decides validity; it only skips work when the
answer is obvious. tests/broker/test_journal_writer.py checks with hypothesis that the bytes
equal the generic path's for any publication.
"""

from __future__ import annotations

from typing import Any

from broker.avro_bytes import (
    LONG_MAX,
    NULL,
    ONE_BYTE,
    PRESENT,
    Slow,
    avro_long,
    avro_string,
    varint,
)
from broker.codec import MARKER, Codec
from broker.records import Publication

__all__ = ["DataRecordWriter"]

SCHEMA = "journal_record"
#: The fingerprint of journal_record.v2, the layout `_write` hard-codes. A newer version makes
#: `DataRecordWriter.fast` False (and every record takes the generic path) until it is taught.
V2_FINGERPRINT = bytes.fromhex("270752eabf28aa5c")

#: Beyond this many distinct (topic, source) pairs the head cache is cleared: hostile traffic
#: with ever-new sources must not grow memory without bound.
_HEADS_LIMIT = 100_000

#: publisher_seq null, gap_to null, gap_reason null
_THREE_NULLS = b"\x00\x00\x00"
_EMPTY_MAP = b"\x00"
_PUBLISH_TYPES = {s: ONE_BYTE[2 * i] for i, s in enumerate(
    ("update", "correction", "image", "drop", "snapshot", "add"))}


def _fields(fields: Any) -> bytes:
    # Mirrors Publication.to_avro: {k: list(v)}; any non-str key or item goes the slow way.
    if type(fields) is not dict:
        raise Slow
    if not fields:
        return _EMPTY_MAP
    out = [varint(len(fields) << 1)]
    add = out.append
    for key, values in fields.items():
        add(avro_string(key))
        items = list(values)
        if items:
            add(varint(len(items) << 1))
            for v in items:
                add(avro_string(v))
        add(NULL)
    add(NULL)
    return b"".join(out)


def _options(options: Any) -> bytes:
    if type(options) is not dict:
        raise Slow
    if not options:
        return _EMPTY_MAP
    out = [varint(len(options) << 1)]
    for key, value in options.items():
        out.append(avro_string(key))
        out.append(avro_string(value))
    out.append(NULL)
    return b"".join(out)


class DataRecordWriter:
    """`encode(pub, seq, appended_at)`: the journal_record bytes `codec` would write."""

    def __init__(self, codec: Codec) -> None:
        self._codec = codec
        sv = codec.schema(SCHEMA)
        #: whether the newest journal_record is the layout this writer knows
        self.fast = sv.fingerprint == V2_FINGERPRINT
        self._header = MARKER + sv.fingerprint + NULL  # kind=DATA is enum index 0
        self._heads: dict[tuple[str, str], bytes] = {}
        self._content_types: dict[str, bytes] = {}
        self._stamp: tuple[int | None, bytes] = (None, b"")  # appended_at, its encoding

    def encode(self, pub: Publication, seq: int, appended_at: int) -> bytes:
        if self.fast and 0 < seq <= LONG_MAX:  # the journal's seqs always are
            try:
                return self._write(pub, seq, appended_at)
            except (Slow, TypeError):  # TypeError: e.g. an unhashable publish type
                pass
        return self._codec.encode(SCHEMA, pub.to_avro(seq, appended_at))

    def _write(self, pub: Publication, seq: int, appended_at: int) -> bytes:
        topic, source = pub.topic, pub.source
        head = self._heads.get((topic, source))
        if head is None:
            head = self._header + avro_string(topic) + avro_string(source)
            if len(self._heads) >= _HEADS_LIMIT:
                self._heads.clear()
            self._heads[topic, source] = head
        ms, stamp = self._stamp
        if ms != appended_at:
            stamp = avro_long(appended_at)
            self._stamp = (appended_at, stamp)
        content = pub.content
        if type(content) is not bytes:
            raise Slow
        ptype = _PUBLISH_TYPES.get(pub.publish_type)
        if ptype is None:
            raise Slow
        ctype = self._content_types.get(pub.content_type)
        if ctype is None:
            ctype = avro_string(pub.content_type)
            if len(self._content_types) < 64:
                self._content_types[pub.content_type] = ctype
        # Absent optional fields are the common case: test them inline, call only for values.
        v: Any = pub.publisher_seq
        middle = _THREE_NULLS if v is None else PRESENT + avro_long(v) + b"\x00\x00"
        fields, options = pub.fields, pub.options
        return b"".join((
            head, varint(seq << 1), middle, ptype,
            NULL if (v := pub.message_id) is None else PRESENT + avro_string(v),
            NULL if (v := pub.revision_id) is None else PRESENT + avro_string(v),
            NULL if (v := pub.publication_date) is None else PRESENT + avro_long(v),
            NULL if (v := pub.expiration_date) is None else PRESENT + avro_string(v),
            NULL if (v := pub.permission_token) is None else PRESENT + avro_string(v),
            ctype, varint(len(content) << 1), content,
            _EMPTY_MAP if not fields and type(fields) is dict else _fields(fields),
            _EMPTY_MAP if not options and type(options) is dict else _options(options),
            stamp,
        ))
