"""The records apexps keeps in Kafka, as immutable values, and their Avro dict forms."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from itertools import chain
from typing import Any

from broker.kafka_io import Position

__all__ = [
    "PACKED_CONTENT",
    "PACKED_EXPIRATION",
    "PACKED_MESSAGE_ID",
    "PACKED_PUBLISH_TYPE",
    "PACKED_REVISION_ID",
    "PACKED_TOPIC",
    "AccessEffect",
    "AccessEntry",
    "AccessKind",
    "JournalEntry",
    "PackedEntry",
    "Publication",
    "PublishType",
    "RecordKind",
    "Subscription",
    "SubscriptionState",
    "Topic",
    "now_ms",
    "pack_entry",
    "to_ms",
    "unpack_entry",
]


class RecordKind(StrEnum):
    #: an accepted message
    DATA = "DATA"
    #: explains source seqs [source_seq, gap_to] that carry no data (never a silent hole)
    GAP = "GAP"


class PublishType(StrEnum):
    """XEP-0040 publish types."""

    UPDATE = "update"
    CORRECTION = "correction"
    IMAGE = "image"
    DROP = "drop"
    SNAPSHOT = "snapshot"
    #: treated as image
    ADD = "add"


class SubscriptionState(StrEnum):
    ACTIVE = "active"
    PENDING = "pending"
    TERMINATED = "terminated"


class AccessEffect(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class AccessKind(StrEnum):
    """What an access entry's tokens are (access_entry v2; v1 records are all ACCESS)."""

    #: RFC 3341 access tokens (`pubsub:subscribe`, `core:data` …): who may use the service
    ACCESS = "access"
    #: XEP-0040 §5.1 permission tokens: which tokened messages a subscriber receives
    #: (broker/entitlements.py); the effect reads "grant" or "deny"
    PERMTOKEN = "permtoken"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def to_ms(value: datetime | int | None) -> int | None:
    """fastavro returns timestamp-millis as aware datetimes; apexps keeps epoch milliseconds."""
    if value is None or isinstance(value, int):
        return value
    # Exact: `int(value.timestamp() * 1000)` goes through a float and is a millisecond short
    # for some values, and the entry forwarded on acknowledgement must equal the decoded one.
    return (value - _EPOCH) // _MS


@dataclass(frozen=True, slots=True)
class Publication:
    """What a publisher hands the journal; the journal adds the source seq and the time."""

    topic: str
    source: str
    content: bytes
    publish_type: PublishType = PublishType.UPDATE
    content_type: str = "application/xml"
    message_id: str | None = None
    revision_id: str | None = None
    publication_date: int | None = None
    expiration_date: str | None = None
    permission_token: str | None = None
    publisher_seq: int | None = None
    fields: Mapping[str, Sequence[str]] = field(default_factory=dict)
    options: Mapping[str, str] = field(default_factory=dict)

    def to_avro(self, seq: int, appended_at: int) -> dict[str, Any]:
        return {
            "kind": RecordKind.DATA.value,
            "topic": self.topic,
            "source": self.source,
            "source_seq": seq,
            "publisher_seq": self.publisher_seq,
            "gap_to": None,
            "gap_reason": None,
            "publish_type": str(self.publish_type),  # the codec rejects unknown types
            "message_id": self.message_id,
            "revision_id": self.revision_id,
            "publication_date": self.publication_date,
            "expiration_date": self.expiration_date,
            "permission_token": self.permission_token,
            "content_type": self.content_type,
            "content": self.content,
            "fields": {k: list(v) for k, v in self.fields.items()},
            "options": dict(self.options),
            "appended_at": appended_at,
        }


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One record read back from the journal, with where it is stored."""

    position: Position
    kind: RecordKind
    topic: str
    source: str
    source_seq: int
    gap_to: int | None
    gap_reason: str | None
    publish_type: PublishType
    publisher_seq: int | None
    message_id: str | None
    revision_id: str | None
    publication_date: int | None
    expiration_date: str | None
    permission_token: str | None
    content_type: str
    content: bytes
    fields: dict[str, list[str]]
    options: dict[str, str]
    appended_at: int

    @property
    def last_seq(self) -> int:
        """The highest source seq this record accounts for."""
        return self.gap_to if self.kind is RecordKind.GAP and self.gap_to else self.source_seq

    @classmethod
    def from_avro(cls, position: Position, rec: Mapping[str, Any]) -> JournalEntry:
        # Enum lookups by dict: the follower and gap fills build these by the ten thousand.
        kind, ptype = rec["kind"], rec["publish_type"]
        return _new_entry(
            position,
            _RECORD_KINDS.get(kind) or RecordKind(kind),
            rec["topic"],
            rec["source"],
            rec["source_seq"],
            rec["gap_to"],
            rec["gap_reason"],
            _PUBLISH_TYPES.get(ptype) or PublishType(ptype),
            rec["publisher_seq"],
            rec["message_id"],
            rec["revision_id"],
            to_ms(rec["publication_date"]),
            rec["expiration_date"],
            rec["permission_token"],
            rec["content_type"],
            rec["content"],
            rec["fields"],
            rec["options"],
            to_ms(rec["appended_at"]) or 0,
        )


    @classmethod
    def of_publication(cls, pub: Publication, source_seq: int, appended_at: int,
                       position: Position) -> JournalEntry:
        """The DATA entry the journal follower will decode from `pub`'s record once Kafka
        acknowledged it at `position`: forwarding on acknowledgement hands subscribers this
        one, from memory (tests/broker/test_entry_of_publication.py holds the two equal).

        Built field by field, not through `to_avro` and `from_avro`: this runs once per
        publication on the acknowledgement road, and the dict round trip was 7% of a robust
        broker's event loop flat out (py-spy, W1). The copies of `fields` and `options` are
        what the round trip made too: the entry must not share the publication's mappings."""
        ptype = pub.publish_type
        return _new_entry(
            position, RecordKind.DATA, pub.topic, pub.source, source_seq, None, None,
            _PUBLISH_TYPES.get(ptype) or PublishType(ptype), pub.publisher_seq,
            pub.message_id, pub.revision_id, pub.publication_date, pub.expiration_date,
            pub.permission_token, pub.content_type, pub.content,
            {k: list(v) for k, v in pub.fields.items()}, dict(pub.options), appended_at)


def _slot_builder(cls: type[Any]) -> Any:
    """A positional constructor of the frozen, slotted dataclass `cls`, in field order, that
    sets each slot through its descriptor. The generated `__init__` of a frozen dataclass goes
    through `object.__setattr__`, looked up per field: for the 19 fields of a `JournalEntry`
    it took three times as long (7.3 against 2.4 µs, measured here), once per publication on
    the acknowledgement road and once per record the follower or a gap fill decodes. Nothing
    is checked or defaulted: every field must be given (the callers below give them all)."""
    setters = tuple(cls.__dict__[name].__set__ for name in cls.__dataclass_fields__)
    new = object.__new__

    def build(*values: Any) -> Any:
        obj = new(cls)
        for put, value in zip(setters, values):  # noqa: B905 - the callers give every field
            put(obj, value)
        return obj

    return build


_new_entry: Callable[..., JournalEntry] = _slot_builder(JournalEntry)
_RECORD_KINDS = {k.value: k for k in RecordKind}
_PUBLISH_TYPES = {t.value: t for t in PublishType}


#: A `JournalEntry` as a tuple of plain values (`pack_entry`), for entries kept for long.
PackedEntry = tuple[Any, ...]
#: Where `pack_entry` puts what its keepers read without unpacking.
PACKED_TOPIC, PACKED_PUBLISH_TYPE, PACKED_MESSAGE_ID, PACKED_REVISION_ID = 3, 8, 10, 11
PACKED_EXPIRATION, PACKED_CONTENT = 13, 16


def pack_entry(e: JournalEntry) -> PackedEntry:
    """`e` as a tuple of ints, strs, bytes, None and flat tuples of them: nothing CPython's
    cyclic collector walks once it has met it (it untracks such tuples, a level a pass), where
    the entry itself, its Position, its fields map and each list in it are up to five objects
    it walks at every collection for as long as the entry lives. What a store keeps for long
    (the item store's versions: broker/robust/_item_rules.py says what it cost) it keeps
    packed. Not the journal's recent past (broker/recent.py): packing it cost W1 5 % of its
    rate, packed on the follower thread per message, for collections no shorter where it
    counts (docs/bench-peers.md)."""
    # The order is the PACKED_* constants' (tests/broker/test_packed_entry.py holds them).
    return (e.position.partition, e.position.offset, e.kind.value, e.topic, e.source,
            e.source_seq, e.gap_to, e.gap_reason, e.publish_type.value, e.publisher_seq,
            e.message_id, e.revision_id, e.publication_date, e.expiration_date,
            e.permission_token, e.content_type, e.content,
            # Flat (name, count, values..., name, ...): the collector untracks a tuple only
            # once the tuples inside it are, at worst one level a pass, so two levels, not four.
            _flat_fields(e.fields) if e.fields else (),
            tuple(chain.from_iterable(e.options.items())) if e.options else (), e.appended_at)


def _flat_fields(fields: Mapping[str, list[str]]) -> tuple[str | int, ...]:
    flat: list[str | int] = []
    for name, values in fields.items():
        flat.append(name)
        flat.append(len(values))
        flat.extend(values)
    return tuple(flat)


def _fields_of(flat: tuple[Any, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(flat):
        n = flat[i + 1]
        out[flat[i]] = list(flat[i + 2:i + 2 + n])
        i += 2 + n
    return out


def unpack_entry(p: PackedEntry) -> JournalEntry:
    """The entry `pack_entry` packed, equal to it (its own fields map and options)."""
    return _new_entry(Position(p[0], p[1]), _RECORD_KINDS[p[2]], *p[3:8],
                      _PUBLISH_TYPES[p[8]], *p[9:17],
                      _fields_of(p[17]), dict(zip(p[18][::2], p[18][1::2], strict=True)), p[19])


def gap_record(source: str, topic: str, lo: int, hi: int, reason: str) -> dict[str, Any]:
    return Publication(topic=topic, source=source, content=b"").to_avro(lo, now_ms()) | {
        "kind": RecordKind.GAP.value,
        "gap_to": hi,
        "gap_reason": reason,
    }


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    created_at: int
    owner: str | None = None
    description: str | None = None
    revision: int = 1
    message_schema: str | None = None
    selector_schema: str | None = None

    @property
    def key(self) -> str:
        return self.name

    def to_avro(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}

    @classmethod
    def from_avro(cls, rec: Mapping[str, Any]) -> Topic:
        return cls(**{**rec, "created_at": to_ms(rec["created_at"])})


@dataclass(frozen=True, slots=True)
class Subscription:
    subscriber: str
    subscription_id: str
    topic: str
    duration_s: int
    state: SubscriptionState
    created_at: int
    selector_class: str | None = None
    selector: str | None = None
    expires_at: int | None = None
    reason: str | None = None
    link_id: str | None = None
    originator: str | None = None
    trans_id: int | None = None

    @property
    def key(self) -> str:
        # NUL cannot occur in an endpoint or an id, so the key is unambiguous.
        return f"{self.subscriber}\x00{self.subscription_id}"

    def to_avro(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in self.__slots__}
        d["state"] = SubscriptionState(self.state).value
        return d

    @classmethod
    def from_avro(cls, rec: Mapping[str, Any]) -> Subscription:
        return cls(**{**rec, "state": SubscriptionState(rec["state"]),
                      "created_at": to_ms(rec["created_at"]),
                      "expires_at": to_ms(rec["expires_at"])})


@dataclass(frozen=True, slots=True)
class AccessEntry:
    entry_id: str
    originator: str
    tokens: tuple[str, ...]
    effect: AccessEffect
    created_at: int
    topic: str | None = None
    kind: AccessKind = AccessKind.ACCESS

    @property
    def key(self) -> str:
        return self.entry_id

    def to_avro(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in self.__slots__}
        d["tokens"] = list(self.tokens)
        d["effect"] = AccessEffect(self.effect).value
        d["kind"] = AccessKind(self.kind).value
        return d

    @classmethod
    def from_avro(cls, rec: Mapping[str, Any]) -> AccessEntry:
        return cls(**{**rec, "tokens": tuple(rec["tokens"]), "effect": AccessEffect(rec["effect"]),
                      "created_at": to_ms(rec["created_at"]),
                      "kind": AccessKind(rec.get("kind", AccessKind.ACCESS))})
