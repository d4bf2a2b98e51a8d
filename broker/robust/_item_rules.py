"""The pure rules of data items and cached messages: what one journaled message does to its
item (`reduce`) and what of an item is still valid at a time (`unexpired`).

The theory is broker/robust/items.py's ("Items", "Revisions and the cache"); the store applies
these rules, keeps the result durable and serves it. They are here, without Kafka, so that the
reducer can be checked against a plain model (tests/robust/test_items.py,
tests/robust/test_cache_rules.py) and the store stays a size one reads in a sitting.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.expiry import ONCE, expired, parse_revision, supersedes
from broker.records import (
    PACKED_CONTENT,
    PACKED_EXPIRATION,
    PACKED_MESSAGE_ID,
    PACKED_PUBLISH_TYPE,
    PACKED_REVISION_ID,
    PACKED_TOPIC,
    JournalEntry,
    PackedEntry,
    PublishType,
    pack_entry,
    unpack_entry,
)
from common.errors import InvalidParameter

__all__ = ["DELTAS", "REPLACES", "ItemKey", "ItemState", "ItemVersion", "reduce", "unexpired"]

#: (topic, message-id)
ItemKey = tuple[str, str]
#: publish types that replace an item, and those that add a delta to it (XEP-0040 §3.1)
REPLACES = frozenset({PublishType.IMAGE, PublishType.ADD})
DELTAS = frozenset({PublishType.UPDATE, PublishType.CORRECTION})


class ItemVersion:
    """One image or delta: the journal entry and the order it was applied in.

    Kept packed (`broker.records.pack_entry`), because the store keeps every version of every
    item for as long as the item lives: as a `JournalEntry` each version was up to six objects
    the cyclic collector walks (this, the entry, its Position, its fields map and the lists in
    it), and 100,000 items of six versions made a full collection take 805 ms, a stall of every
    delivery and Notify in flight; packed, 150 ms (10,000 items: 85 against 9 ms;
    /tmp scripts, 2026-11-26). A version is this one object and a tuple the collector lets go
    of. `entry` unpacks a new, equal entry at each call (2.7 µs): the store's readers (a
    snapshot, a checkpoint, a Notify's state) are far rarer than its versions, and the rules
    read what they need (below) without unpacking."""

    __slots__ = ("_packed", "order")

    def __init__(self, order: int, entry: JournalEntry) -> None:
        self.order = order
        self._packed: PackedEntry = pack_entry(entry)

    @property
    def entry(self) -> JournalEntry:
        return unpack_entry(self._packed)

    # What the rules read of every version, from the packed tuple: no entry is unpacked to
    # apply a version or to check an item's expiry.
    @property
    def topic(self) -> str:
        value: str = self._packed[PACKED_TOPIC]
        return value

    @property
    def publish_type(self) -> PublishType:
        return PublishType(self._packed[PACKED_PUBLISH_TYPE])

    @property
    def message_id(self) -> str | None:
        value: str | None = self._packed[PACKED_MESSAGE_ID]
        return value

    @property
    def revision_id(self) -> str | None:
        value: str | None = self._packed[PACKED_REVISION_ID]
        return value

    @property
    def expiration_date(self) -> str | None:
        value: str | None = self._packed[PACKED_EXPIRATION]
        return value

    @property
    def size(self) -> int:
        """Its content's octets."""
        return len(self._packed[PACKED_CONTENT])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ItemVersion) \
            and (self.order, self._packed) == (other.order, other._packed)

    def __hash__(self) -> int:
        return hash((self.order, self._packed))

    def __repr__(self) -> str:
        return f"ItemVersion({self.order}, {self.entry!r})"


@dataclass(frozen=True, slots=True)
class ItemState:
    """An item's current image (None until it has one) and the deltas since, in apply order;
    `size` counts their content octets. Immutable: a checkpoint captures it by reference."""

    topic: str
    message_id: str
    image: ItemVersion | None = None
    deltas: tuple[ItemVersion, ...] = ()
    size: int = 0

    @property
    def key(self) -> ItemKey:
        return (self.topic, self.message_id)

    @property
    def versions(self) -> tuple[ItemVersion, ...]:
        return self.deltas if self.image is None else (self.image, *self.deltas)


def _revision(version: ItemVersion | None) -> int | None:
    """The version's revision; None if it has none (or one the ingest should have refused)."""
    revision_id = None if version is None else version.revision_id
    if revision_id is None:
        return None
    try:
        return parse_revision(revision_id)
    except InvalidParameter:
        return None


def reduce(state: ItemState | None, version: ItemVersion) -> ItemState | None:
    """The item after `version` (XEP-0040 §3.1): image/add replace it, update/correction add a
    delta, drop deletes it (None). `snapshot` is never published; it changes nothing.
    Content-based messages (draft §5.2.1, see "Revisions" above): one that expires at once
    (`0`) changes nothing; one with a revision replaces the item (as an image; a drop deletes
    it) if its revision is higher than the item's, and changes nothing otherwise."""
    ptype = version.publish_type
    if version.expiration_date == ONCE:
        return state
    revision = _revision(version)
    if revision is not None:
        base = None if state is None else state.image
        if not supersedes(revision, _revision(base)) or ptype is PublishType.SNAPSHOT:
            return state
        if ptype is PublishType.DROP:
            return None
        return _image(version)
    if ptype in REPLACES:
        return _image(version)
    if ptype is PublishType.DROP:
        return None
    if ptype not in DELTAS:
        return state
    if state is None:
        message_id = version.message_id
        assert message_id is not None
        return ItemState(version.topic, message_id, None, (version,), version.size)
    return ItemState(state.topic, state.message_id, state.image, (*state.deltas, version),
                     state.size + version.size)


def _image(version: ItemVersion) -> ItemState:
    message_id = version.message_id
    assert message_id is not None
    return ItemState(version.topic, message_id, version, (), version.size)


def unexpired(state: ItemState, now: int) -> tuple[ItemVersion, ...]:
    """What of an item is still valid at `now`: nothing once its image has expired (its
    deltas were relative to it), else the image and each delta that has not expired."""
    image = state.image
    if image is not None and expired(image.expiration_date, now):
        return ()
    return tuple(v for v in state.versions if not expired(v.expiration_date, now))
