"""The item store's durability against the real Kafka (broker/robust/items.py): a store
recovered from the compacted topic plus the journal tail after its markers is the store that
was running — whether the crash came right after a checkpoint, between two, or before any —
and keys that no longer matter are tombstoned once a marker covers their replacement."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import pytest

from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, ensure_topics, read_partition, watermarks
from broker.kafka_producer import KafkaProducer
from broker.records import JournalEntry, Publication, PublishType, RecordKind
from broker.robust import items as items_module
from broker.robust.items import ItemStore
from common.errors import JournalUnavailable

pytestmark = pytest.mark.kafka

IMG, U, C, D, A = (PublishType.IMAGE, PublishType.UPDATE, PublishType.CORRECTION,
                   PublishType.DROP, PublishType.ADD)
FRED, BARNEY = "fred@example.com", "barney@example.com"


@pytest.fixture(autouse=True)
def _explicit_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints only when a test asks, so each test decides what a crash leaves behind."""
    monkeypatch.setattr(items_module, "CHECKPOINT_INTERVAL_S", 3600.0)
    monkeypatch.setattr(items_module, "CHECKPOINT_EVERY", 10**9)


@pytest.fixture(name="reopen")
def _reopen(core: BrokerCore) -> Iterator[object]:
    """Recover another store from the same Kafka, as a restarted broker would."""
    producers: list[KafkaProducer] = []

    def reopen(created: Callable[[str], int | None] | None = None) -> ItemStore:
        producer = KafkaProducer(core.config)
        producers.append(producer)
        store = ItemStore(core.config, producer, core.codec)
        store.recover(created)
        return store

    yield reopen
    for p in producers:
        p.close()


class _Journal:
    """Publishes through the core's journal and hands back what a follower would read."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        self.read = dict.fromkeys(range(core.config.journal_partitions), 0)

    def publish(self, *messages: tuple[str, str, PublishType, str]) -> list[JournalEntry]:
        """(source, message-id, type, content) each, on topic q.items; durable on return."""
        done = threading.Event()
        pubs = [Publication(topic="q.items", source=s, content=c.encode(), publish_type=t,
                            message_id=m) for s, m, t, c in messages]
        self.core.journal.append_many(pubs, lambda _: done.set())
        assert done.wait(60)
        out: list[JournalEntry] = []
        for entry in self.core.journal.read_from(self.read):
            self.read[entry.position.partition] = entry.position.offset + 1
            if entry.kind is RecordKind.DATA:
                out.append(entry)
        return out


def _view(store: ItemStore) -> dict[tuple[str, str], list[JournalEntry]]:
    return {k: [v.entry for v in s.versions] for k, s in store.states().items()}


def test_recovery_is_the_running_store_across_checkpoints_and_crashes(
        core: BrokerCore, reopen: object) -> None:
    """Checkpointed state, then more applied without a checkpoint, then a 'crash': the
    recovered store equals the live one (images, deltas, drops, content, journal positions,
    snapshot order), replaying only the uncovered tail, and the follower resumes at the end."""
    journal = _Journal(core)
    live = core.items
    live.recover()
    live.apply(journal.publish(
        (FRED, "IBM", IMG, "ibm0"), (FRED, "IBM", U, "ibm1"), (BARNEY, "MSFT", A, "ms0"),
        (FRED, "IBM", C, "ibm2"), (BARNEY, "ORCL", U, "or0"), (BARNEY, "ORCL", D, ""),
        (FRED, "HPQ", IMG, "hp0")))
    live.checkpoint()
    live.apply(journal.publish(
        (FRED, "IBM", U, "ibm3"), (BARNEY, "MSFT", IMG, "ms1"), (FRED, "HPQ", D, ""),
        (BARNEY, "ORCL", IMG, "or1"), (BARNEY, "MSFT", U, "ms2")))
    first = reopen()  # type: ignore[operator]
    assert _view(first) == _view(live)
    assert sorted(e.content for e in first.snapshot("q.items")) == [
        b"ibm0", b"ibm1", b"ibm2", b"ibm3", b"ms1", b"ms2", b"or1"]
    # Each source on its own partition: the order within an item and a source is the same.
    assert first.snapshot("q.items") == live.snapshot("q.items")
    ends = {p: watermarks(core.config, core.journal.topic, p)[1]
            for p in range(core.config.journal_partitions)}
    assert first.resume_positions() == ends
    # The recovered store goes on: new orders never collide with written ones.
    first.apply(journal.publish((FRED, "IBM", U, "ibm4"), (FRED, "HPQ", U, "hp1")))
    first.checkpoint()
    second = reopen()  # type: ignore[operator]
    assert _view(second) == _view(first)
    assert [e.content for e in second.snapshot("q.items", "IBM")] == [
        b"ibm0", b"ibm1", b"ibm2", b"ibm3", b"ibm4"]
    assert second.snapshot("q.items", "HPQ")[0].content == b"hp1"


def test_a_store_never_checkpointed_is_rebuilt_from_the_journal(core: BrokerCore,
                                                                reopen: object) -> None:
    """No marker at all: recovery replays the whole journal — but not what belongs to a
    deleted topic, or to the topic before it was created again."""
    journal = _Journal(core)
    entries = journal.publish((FRED, "IBM", IMG, "a"), (FRED, "IBM", U, "b"),
                              (BARNEY, "MSFT", U, "c"))
    store = reopen()  # type: ignore[operator]
    assert store.snapshot("q.items") == entries
    assert [e.content for e in store.snapshot("q.items", "IBM")] == [b"a", b"b"]
    store.checkpoint()
    for created in (lambda _: None, lambda _: entries[-1].appended_at + 1):
        assert reopen(created).states() == {}  # type: ignore[operator]
    assert reopen(lambda _: 0).snapshot("q.items") == entries  # type: ignore[operator]


def test_replaced_and_dropped_keys_are_tombstoned_once_covered(core: BrokerCore,
                                                               reopen: object) -> None:
    """An image makes its item's earlier versions garbage, a drop its header: both are
    tombstoned by the checkpoint after the one that wrote the change, never before."""
    journal = _Journal(core)
    store = core.items
    store.recover()
    store.apply(journal.publish((FRED, "IBM", IMG, "a"), (FRED, "IBM", U, "b"),
                                (FRED, "HPQ", IMG, "h")))
    store.checkpoint()
    store.apply(journal.publish((FRED, "IBM", IMG, "c"), (FRED, "HPQ", D, "")))
    store.checkpoint()

    def latest() -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for rec in read_partition(core.config, store.topic, 0):
            assert rec.key is not None
            out[rec.key.decode()] = rec.value
        return out

    before = latest()
    assert before["q.items\x00HPQ"] is not None  # the dropped header, until a marker covers it
    old = [k for k in before if k.startswith("q.items\x00IBM\x00")]
    assert len(old) == 3 and all(before[k] is not None for k in old)
    assert _view(reopen()) == _view(store)  # type: ignore[operator]
    store.apply(journal.publish((BARNEY, "MSFT", IMG, "m")))
    store.checkpoint()
    after = latest()
    assert after["q.items\x00HPQ"] is None
    gone = [k for k in old if after[k] is None]
    assert len(gone) == 2  # IBM's first image and its delta; the new image stays
    assert _view(reopen()) == _view(store)  # type: ignore[operator]


def _markers(core: BrokerCore) -> dict[bytes, bytes | None]:
    return {r.key: r.value for r in read_partition(core.config, core.items.topic, 0)
            if r.key is not None and r.key.startswith(b"\x00")}


def test_a_failed_checkpoint_writes_no_marker_and_loses_nothing(
        kafka_config: KafkaConfig) -> None:
    """The items topic refuses a version (too large for it): the checkpoint fails, no marker
    moves, its items stay dirty and fail again; a recovery still rebuilds everything from the
    journal; once the item is replaced by a small image, checkpoints succeed again."""
    core = BrokerCore(kafka_config)
    topics = core.kafka_topics()
    parts, conf = topics[kafka_config.topic("items")]
    topics[kafka_config.topic("items")] = (parts, conf | {"max.message.bytes": "4000"})
    ensure_topics(kafka_config, topics)
    core.open()
    producers: list[KafkaProducer] = []

    def reopen() -> ItemStore:
        producers.append(KafkaProducer(core.config))
        store = ItemStore(core.config, producers[-1], core.codec)
        store.recover()
        return store

    try:
        journal = _Journal(core)
        store = core.items
        store.recover()
        store.checkpoint()  # the positions of the empty journal
        before = _markers(core)
        assert len(before) == core.config.journal_partitions
        big = os.urandom(6000).hex()  # random: it does not compress under the limit
        store.apply(journal.publish((FRED, "IBM", IMG, "small"), (BARNEY, "HPQ", IMG, big)))
        for _ in range(2):
            with pytest.raises(JournalUnavailable):
                store.checkpoint()
        assert _markers(core) == before
        assert _view(reopen()) == _view(store)
        store.apply(journal.publish((BARNEY, "HPQ", IMG, "small again")))
        store.checkpoint()
        assert _markers(core) != before
        assert _view(reopen()) == _view(store)
    finally:
        for p in producers:
            p.close()
        core.close()
