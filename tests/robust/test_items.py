"""Data item state (broker/robust/items.py) without Kafka: the reducer and the store's live side
against a plain model (hypothesis), snapshot order, and the limits that require an image."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.kafka_io import KafkaConfig, Position
from broker.records import JournalEntry, PublishType, RecordKind
from broker.robust.items import ItemLimits, ItemState, ItemStore, ItemVersion, reduce
from common.errors import InvalidParameter

PUBLISHED = [t for t in PublishType if t is not PublishType.SNAPSHOT]
TOPICS = ("q.a", "q.b")
SOURCES = ("a@example.com", "b@example.com")


class _NoKafka:
    """What the store asks of its producer when it is only constructed: a place for its
    checkpoint hook (never enabled here: these stores are never recovered, so never write)."""

    def add_after_poll(self, hook: Callable[[], None]) -> None:
        pass


def _store(limits: ItemLimits | None = None) -> ItemStore:
    return ItemStore(KafkaConfig(namespace="unit"), _NoKafka(), limits=limits)  # type: ignore[arg-type]


def _entry(i: int, topic: str, mid: str | None, ptype: PublishType, content: bytes,
           source: str = SOURCES[0], seq: int | None = None) -> JournalEntry:
    part = SOURCES.index(source)
    return JournalEntry(
        position=Position(part, i), kind=RecordKind.DATA, topic=topic, source=source,
        source_seq=i + 1 if seq is None else seq, gap_to=None, gap_reason=None,
        publish_type=ptype, publisher_seq=None, message_id=mid, revision_id=None,
        publication_date=None, expiration_date=None, permission_token=None,
        content_type="application/xml", content=content, fields={}, options={},
        appended_at=1_700_000_000_000 + i)


#: One published message: (topic, message-id or None, publish type, source)
_messages = st.lists(st.tuples(st.sampled_from(TOPICS), st.sampled_from(["IBM", "MSFT", None]),
                               st.sampled_from(PUBLISHED), st.sampled_from(SOURCES)),
                     max_size=60)


def _entries(messages: list[tuple[str, str | None, PublishType, str]]) -> list[JournalEntry]:
    seqs = dict.fromkeys(SOURCES, 0)
    out = []
    for i, (topic, mid, ptype, source) in enumerate(messages):
        seqs[source] += 1
        out.append(_entry(i, topic, mid, ptype, f"m{i}".encode(), source, seqs[source]))
    return out


def _model(entries: list[JournalEntry]) -> dict[tuple[str, str], list[int]]:
    """Per item, the indexes (in the sequence) of its image and the deltas since: the plain
    reading of XEP-0040 §3.1."""
    state: dict[tuple[str, str], list[int]] = {}
    for i, e in enumerate(entries):
        if e.message_id is None:
            continue
        key = (e.topic, e.message_id)
        if e.publish_type in (PublishType.IMAGE, PublishType.ADD):
            state[key] = [i]
        elif e.publish_type is PublishType.DROP:
            state.pop(key, None)
        else:
            state.setdefault(key, []).append(i)
    return state


def _index(entries: list[JournalEntry]) -> dict[tuple[str, int], int]:
    return {(e.source, e.source_seq): i for i, e in enumerate(entries)}


@given(_messages)
def test_the_reducer_is_the_model(messages: list[tuple[str, str | None, PublishType, str]]
                                  ) -> None:
    """Any sequence of publish types, folded with `reduce` per item, is the model's state:
    image/add replace, update/correction add a delta, drop deletes."""
    entries = _entries(messages)
    got: dict[tuple[str, str], ItemState | None] = {}
    for i, e in enumerate(entries):
        if e.message_id is not None:
            key = (e.topic, e.message_id)
            got[key] = reduce(got.get(key), ItemVersion(i, e))
    index = _index(entries)
    assert {k: [index[(v.entry.source, v.entry.source_seq)] for v in s.versions]
            for k, s in got.items() if s is not None} == _model(entries)


@given(_messages, st.integers(1, 10))
def test_the_store_applies_batches_as_the_model(
        messages: list[tuple[str, str | None, PublishType, str]], batch: int) -> None:
    """The store, fed in batches as the follower feeds it, holds the model's state; each
    topic's snapshot lists its items' versions in apply order (so each item's image before its
    deltas and each source's seqs rising), and only what has a message-id is an item."""
    entries = _entries(messages)
    store = _store()
    for at in range(0, len(entries), batch):
        store.apply(entries[at:at + batch])
    model = _model(entries)
    index = _index(entries)
    states = store.states()
    assert {k: [index[(v.entry.source, v.entry.source_seq)] for v in s.versions]
            for k, s in states.items()} == model
    for topic in TOPICS:
        snap = [index[(e.source, e.source_seq)] for e in store.snapshot(topic)]
        assert snap == sorted(i for (t, _), idx in model.items() if t == topic for i in idx)
        for source in SOURCES:
            seqs = [e.source_seq for e in store.snapshot(topic) if e.source == source]
            assert seqs == sorted(seqs)
        for mid in ("IBM", "MSFT"):
            one = [index[(e.source, e.source_seq)] for e in store.snapshot(topic, mid)]
            assert one == model.get((topic, mid), [])
    assert all(s.size == sum(len(v.entry.content) for v in s.versions) for s in states.values())


def test_a_delta_without_an_image_is_kept_and_a_drop_forgets_everything() -> None:
    """An update to an unknown item starts it with that delta; a drop deletes the item, and the
    next image starts afresh; messages without a message-id are the stream, not an item."""
    store = _store()
    u = PublishType.UPDATE
    store.apply([_entry(0, "q.a", "IBM", u, b"d0"), _entry(1, "q.a", None, PublishType.IMAGE,
                                                             b"plain")])
    state = store.get("q.a", "IBM")
    assert state is not None and state.image is None and len(state.deltas) == 1
    store.apply([_entry(2, "q.a", "IBM", PublishType.DROP, b""),
                 _entry(3, "q.a", "IBM", PublishType.ADD, b"new")])
    assert [e.content for e in store.snapshot("q.a")] == [b"new"]
    store.apply([_entry(4, "q.a", "IBM", PublishType.DROP, b"")])
    assert store.snapshot("q.a") == [] and store.states() == {}


def test_updates_past_the_limits_require_an_image() -> None:
    """An update or correction to an item at max_deltas, or one that would take it past
    max_bytes, is refused (553); so is an image larger than max_bytes; an image, add or drop
    of the same item is accepted and starts it over."""
    store = _store(ItemLimits(max_deltas=2, max_bytes=10))
    store.apply([_entry(0, "q.a", "IBM", PublishType.IMAGE, b"1234"),
                 _entry(1, "q.a", "IBM", PublishType.UPDATE, b"5"),
                 _entry(2, "q.a", "IBM", PublishType.CORRECTION, b"6")])
    for ptype in (PublishType.UPDATE, PublishType.CORRECTION):
        with pytest.raises(InvalidParameter, match="publish an image"):
            store.check_publish("q.a", "IBM", ptype, 1)
    for ptype in (PublishType.IMAGE, PublishType.ADD, PublishType.DROP):
        store.check_publish("q.a", "IBM", ptype, 10)
    with pytest.raises(InvalidParameter):
        store.check_publish("q.a", "MSFT", PublishType.IMAGE, 11)
    store.apply([_entry(3, "q.a", "MSFT", PublishType.IMAGE, b"12345678")])
    store.check_publish("q.a", "MSFT", PublishType.UPDATE, 2)
    with pytest.raises(InvalidParameter):
        store.check_publish("q.a", "MSFT", PublishType.UPDATE, 3)
    store.check_publish("q.a", "NEW", PublishType.UPDATE, 10)  # no item yet: nothing to exceed


def test_a_deleted_topic_forgets_its_items() -> None:
    """forget_topic drops every item of the topic and no other."""
    store = _store()
    store.apply([_entry(0, "q.a", "IBM", PublishType.IMAGE, b"a"),
                 _entry(1, "q.b", "IBM", PublishType.IMAGE, b"b"),
                 _entry(2, "q.a", "MSFT", PublishType.UPDATE, b"c")])
    assert store.forget_topic("q.a") == 2
    assert store.snapshot("q.a") == [] and [e.content for e in store.snapshot("q.b")] == [b"b"]

