"""Link records written straight from a `LinkRecord`: the sequenced fan-out's hot path.

The generic path builds a dict (`LinkRecord.to_avro`) and walks it with the compiled schema
writer, about 25 µs a record; every delivery on a link writes one. This writer knows the field
order of `link_record` v2 and writes the Avro body from the record's attributes, with the link
name cached per link, either alone (`encode`: one `link_record`) or several in one `link_batch`
v1, whose array items are exactly those bodies (`encode_many`). Like `broker/journal_writer.py`
it takes only values whose type is plainly right; anything else, or newer schemas than these,
goes down the generic path, which writes or refuses it exactly as before.
tests/broker/test_link_writer.py checks with hypothesis that the bytes equal the generic path's.

Where the optional C twin is built (`broker/_speedups.c`, see `broker.speedups`), it writes the
bodies of a whole pack at once, about ten times faster; it declines (None) whatever is not
plainly right, and `_body` below, which stays the definition, takes it from there. The same
tests hold the two to the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker import speedups
from broker.avro_bytes import NULL, ONE_BYTE, PRESENT, Slow, avro_long, avro_string
from broker.codec import MARKER, Codec
from broker.kafka_io import Position
from broker.robust.link_records import LinkRecord

__all__ = ["BATCH_SCHEMA", "SCHEMA", "LinkRecordWriter"]

SCHEMA = "link_record"
BATCH_SCHEMA = "link_batch"
#: The fingerprint of link_record.v2, the layout `_body` hard-codes.
V2_FINGERPRINT = bytes.fromhex("998f9d370474f622")
#: The fingerprint of link_batch.v1: an array of link_record v2 bodies.
BATCH_V1_FINGERPRINT = bytes.fromhex("d64518f5aca86778")
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
#: LinkKind (a StrEnum, so its members find these keys) -> its enum index
_KINDS = {"DATA": ONE_BYTE[0], "HEARTBEAT": ONE_BYTE[2], "RESET": ONE_BYTE[4]}
#: Links whose head bytes are kept; past it the cache starts over (hostile link names).
_HEADS_LIMIT = 100_000


#: `link_bodies(records, kinds, LinkRecord, Position)`: the bodies of `records` one after
#: another, as `_body` writes them, or None to decline (see the module docstring).
_c = speedups.load("broker._speedups")
_link_bodies: Callable[[list[Any], dict[str, bytes], type, type], bytes | None] | None = \
    _c.link_bodies if _c is not None else None


def _int(n: Any) -> bytes:
    if type(n) is not int or not _INT_MIN <= n <= _INT_MAX:
        raise Slow
    return avro_long(n)


class LinkRecordWriter:
    """`encode(record)`: the link_record bytes `codec` would write; `encode_many(records)`:
    the link_batch bytes."""

    def __init__(self, codec: Codec, *, compiled: bool = True) -> None:
        """`compiled`: use the C twin where it is built (False: the Python writer alone, which
        the tests compare it with)."""
        self._codec = codec
        self._bodies = _link_bodies if compiled else None
        self._types = (LinkRecord, Position)
        sv = codec.schema(SCHEMA)
        batch = codec.schema(BATCH_SCHEMA)
        self.fast = sv.fingerprint == V2_FINGERPRINT
        self.fast_many = self.fast and batch.fingerprint == BATCH_V1_FINGERPRINT
        self._header = MARKER + sv.fingerprint
        self._batch_header = MARKER + batch.fingerprint
        self._heads: dict[tuple[str, int, int, int], tuple[bytes, bytes]] = {}
        #: the last record whose tail was written, and that tail
        self._last: LinkRecord | None = None
        self._tail = b""

    def encode(self, record: LinkRecord) -> bytes:
        if self.fast:
            if self._bodies is not None:
                body = self._bodies([record], _KINDS, *self._types)
                if body is not None:
                    return self._header + body
            try:
                return self._header + self._body(record)
            except (Slow, TypeError, KeyError):  # KeyError: not a LinkKind
                pass
        return self._codec.encode(SCHEMA, record.to_avro())

    def encode_many(self, records: list[LinkRecord]) -> bytes:
        """One link_batch of `records` (at least one), in their order."""
        if self.fast_many:
            if self._bodies is not None:
                bodies = self._bodies(records if type(records) is list else list(records),
                                      _KINDS, *self._types)
                if bodies is not None:
                    return b"".join((self._batch_header, avro_long(len(records)), bodies, b"\x00"))
            try:
                body = self._body
                # An Avro array: one block of len(records) items, then the empty block.
                return b"".join((self._batch_header, avro_long(len(records)),
                                 *[body(r) for r in records], b"\x00"))
            except (Slow, TypeError, KeyError):
                pass
        return self._codec.encode(BATCH_SCHEMA, {"records": [r.to_avro() for r in records]})

    def _body(self, r: LinkRecord) -> bytes:
        # A link's epoch, epoch start and bits change only on a reset: its head is cached as
        # bytes. What follows the kind (the message, the owner, the writer and time, the
        # snapshot flag) is the same for every record of a fan-out turn's message, which
        # shares the very objects: it is cached for as long as the next record shares them.
        key = (r.link, r.epoch, r.epoch_start, r.bits)
        head = self._heads.get(key)
        if head is None:
            head = (avro_string(r.link),
                    avro_long(r.epoch) + avro_long(r.epoch_start) + _int(r.bits))
            if len(self._heads) >= _HEADS_LIMIT:
                self._heads.clear()
            self._heads[key] = head
        last = self._last
        if last is None or r.position is not last.position or r.source is not last.source \
                or r.source_seq is not last.source_seq or r.owner is not last.owner \
                or r.writer is not last.writer or r.recorded_at is not last.recorded_at \
                or r.snapshot is not last.snapshot:
            self._last = None  # a record that goes down the slow path leaves no cache
            self._tail = self._tail_of(r)
            self._last = r
        return b"".join((head[0], avro_long(r.ordinal), head[1], _KINDS[r.kind], self._tail))

    @staticmethod
    def _tail_of(r: LinkRecord) -> bytes:
        snapshot = r.snapshot
        if type(snapshot) is not bool:
            raise Slow
        pos = r.position
        v: Any
        return b"".join((
            NULL if pos is None else PRESENT + _int(pos.partition),
            NULL if pos is None else PRESENT + avro_long(pos.offset),
            NULL if (v := r.source) is None else PRESENT + avro_string(v),
            NULL if (v := r.source_seq) is None else PRESENT + avro_long(v),
            NULL if (v := r.owner) is None else PRESENT + avro_string(v),
            avro_long(r.writer), avro_long(r.recorded_at), b"\x01" if snapshot else b"\x00",
        ))
