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
from broker.records import JournalEntry, PublishType
from common.errors import InvalidParameter

__all__ = ["DELTAS", "REPLACES", "ItemKey", "ItemState", "ItemVersion", "reduce", "unexpired"]

#: (topic, message-id)
ItemKey = tuple[str, str]
#: publish types that replace an item, and those that add a delta to it (XEP-0040 §3.1)
REPLACES = frozenset({PublishType.IMAGE, PublishType.ADD})
DELTAS = frozenset({PublishType.UPDATE, PublishType.CORRECTION})


@dataclass(frozen=True, slots=True)
class ItemVersion:
    """One image or delta: the journal entry and the order it was applied in."""

    order: int
    entry: JournalEntry


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


def _revision(entry: JournalEntry | None) -> int | None:
    """The entry's revision; None if it has none (or one the ingest should have refused)."""
    if entry is None or entry.revision_id is None:
        return None
    try:
        return parse_revision(entry.revision_id)
    except InvalidParameter:
        return None


def reduce(state: ItemState | None, version: ItemVersion) -> ItemState | None:
    """The item after `version` (XEP-0040 §3.1): image/add replace it, update/correction add a
    delta, drop deletes it (None). `snapshot` is never published; it changes nothing.
    Content-based messages (draft §5.2.1, see "Revisions" above): one that expires at once
    (`0`) changes nothing; one with a revision replaces the item (as an image; a drop deletes
    it) if its revision is higher than the item's, and changes nothing otherwise."""
    entry = version.entry
    ptype = entry.publish_type
    if entry.expiration_date == ONCE:
        return state
    revision = _revision(entry)
    if revision is not None:
        base = None if state is None or state.image is None else state.image.entry
        if not supersedes(revision, _revision(base)) or ptype is PublishType.SNAPSHOT:
            return state
        if ptype is PublishType.DROP:
            return None
        assert entry.message_id is not None
        return ItemState(entry.topic, entry.message_id, version, (), len(entry.content))
    if ptype in REPLACES:
        assert entry.message_id is not None
        return ItemState(entry.topic, entry.message_id, version, (), len(entry.content))
    if ptype is PublishType.DROP:
        return None
    if ptype not in DELTAS:
        return state
    if state is None:
        assert entry.message_id is not None
        return ItemState(entry.topic, entry.message_id, None, (version,), len(entry.content))
    return ItemState(state.topic, state.message_id, state.image, (*state.deltas, version),
                     state.size + len(entry.content))


def unexpired(state: ItemState, now: int) -> tuple[ItemVersion, ...]:
    """What of an item is still valid at `now`: nothing once its image has expired (its
    deltas were relative to it), else the image and each delta that has not expired."""
    image = state.image
    if image is not None and expired(image.entry.expiration_date, now):
        return ()
    return tuple(v for v in state.versions if not expired(v.entry.expiration_date, now))
