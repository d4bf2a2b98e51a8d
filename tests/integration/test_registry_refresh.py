"""Registry refresh against the real Kafka: what other processes write shows up, through one
long-lived consumer (`kafka_io.PartitionReader`), not a new Kafka client per refresh."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer

import broker.kafka_io as kafka_io
from adapters.local.kafka import LocalKafka
from broker.access import access_registry
from broker.codec import default_codec
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, PartitionReader, ensure_topics, read_partition, watermarks
from broker.kafka_producer import KafkaProducer
from broker.records import AccessEffect, AccessEntry, now_ms
from broker.registry import Registry
from common.errors import JournalUnavailable

pytestmark = pytest.mark.kafka


class _CountingConsumer(Consumer):
    made = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).made += 1
        super().__init__(*args, **kwargs)


@pytest.fixture(name="consumers")
def _consumers(monkeypatch: pytest.MonkeyPatch) -> type[_CountingConsumer]:
    """Counts every librdkafka consumer kafka_io makes from here on."""
    monkeypatch.setattr(_CountingConsumer, "made", 0)
    monkeypatch.setattr(kafka_io, "Consumer", _CountingConsumer)
    return _CountingConsumer


@pytest.fixture(name="writer")
def _writer(core: BrokerCore) -> Iterator[Registry[AccessEntry]]:
    """The core's access registry as another process (the `apexps access` CLI) opens it."""
    producer = KafkaProducer(core.config)
    registry = access_registry(core.config, producer)
    registry.load()
    yield registry
    registry.close()
    producer.close()


def entry(eid: str, effect: AccessEffect = AccessEffect.ALLOW) -> AccessEntry:
    return AccessEntry(entry_id=eid, originator="*@example.com", tokens=("core:data",),
                       effect=effect, created_at=now_ms())


def test_refresh_sees_another_writers_put_and_delete(core: BrokerCore,
                                                     writer: Registry[AccessEntry]) -> None:
    """A put or delete by another registry on the topic shows after the next refresh, which
    applies exactly those records; a refresh with nothing new changes nothing."""
    mine = core.access
    assert mine.refresh() == 0
    writer.put(entry("cli:a"))
    assert "cli:a" not in mine
    assert mine.refresh() == 1
    assert mine.get("cli:a") == writer.get("cli:a")
    writer.put(entry("cli:b"))
    writer.delete("cli:a")
    assert mine.refresh() == 2
    assert mine.refresh() == 0
    assert [e.entry_id for e in mine] == ["cli:b"]


def test_idle_refreshes_make_no_new_client(core: BrokerCore, writer: Registry[AccessEntry],
                                           consumers: type[_CountingConsumer]) -> None:
    """The first refresh makes one consumer; later refreshes, idle or reading another
    writer's records, reuse it."""
    core.access.refresh()
    assert consumers.made == 1
    for _ in range(5):
        assert core.access.refresh() == 0
    writer.put(entry("cli:a"))
    assert core.access.refresh() == 1
    assert consumers.made == 1


def test_refreshes_from_two_threads_apply_each_record_once(
        core: BrokerCore, writer: Registry[AccessEntry]) -> None:
    """Two threads refreshing while another writer puts: every record is applied exactly
    once between them, and the views end up equal."""
    keys = [f"cli:{i}" for i in range(40)]
    changed = [0, 0]
    start = threading.Barrier(3)
    wrote = threading.Event()

    def refresher(slot: int) -> None:
        start.wait()
        while not wrote.is_set():
            changed[slot] += core.access.refresh()

    threads = [threading.Thread(target=refresher, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    start.wait()
    for key in keys:
        writer.put(entry(key))
    wrote.set()
    for t in threads:
        t.join()
    assert sum(changed) + core.access.refresh() == len(keys)
    assert sorted(e.entry_id for e in core.access) == sorted(keys)


def test_close_is_idempotent_and_refresh_after_it_raises(
        core: BrokerCore, writer: Registry[AccessEntry],
        consumers: type[_CountingConsumer]) -> None:
    """close() twice is fine; a refresh or load afterwards raises RuntimeError and makes no
    Kafka client, while the view stays readable."""
    writer.put(entry("cli:a"))
    assert core.access.refresh() == 1
    core.access.close()
    core.access.close()
    made = consumers.made
    with pytest.raises(RuntimeError, match=r"access is closed"):
        core.access.refresh()
    with pytest.raises(RuntimeError, match=r"access is closed"):
        core.access.load()
    assert consumers.made == made
    assert "cli:a" in core.access


def test_partition_reader_reads_what_read_partition_reads(kafka_config: KafkaConfig) -> None:
    """Ranges read through one PartitionReader, again and again, equal read_partition's."""
    topic = kafka_config.topic("reader")
    ensure_topics(kafka_config, {topic: (1, {})})
    producer = KafkaProducer(kafka_config)
    try:
        for i in range(6):
            producer.produce_sync(topic, f"k{i}".encode(), f"v{i}".encode())
    finally:
        producer.close()
    reader = PartitionReader(kafka_config, topic)
    try:
        assert reader.watermarks(0) == watermarks(kafka_config, topic, 0) == (0, 6)
        assert reader.read(0) == list(read_partition(kafka_config, topic, 0))
        assert reader.read(0, 2, 5) == list(read_partition(kafka_config, topic, 0, 2, 5))
        assert [r.position.offset for r in reader.read(0, 4)] == [4, 5]
        assert reader.read(0, 6) == []
    finally:
        reader.close()
        reader.close()
    with pytest.raises(RuntimeError, match="closed"):
        reader.watermarks(0)


def test_refresh_rides_out_a_kafka_restart(private_kafka: LocalKafka,
                                           consumers: type[_CountingConsumer]) -> None:
    """Kafka restarting between refreshes costs no new consumer; a refresh while Kafka is
    down raises JournalUnavailable, and once Kafka is back the next refresh applies what was
    written (on a new consumer)."""
    config = KafkaConfig(bootstrap=private_kafka.start().bootstrap, namespace="refresh")
    ensure_topics(config, {config.topic("access"): (1, {"cleanup.policy": "compact"})})
    producer = KafkaProducer(config)
    mine = Registry(config, producer, default_codec(), role="access", schema="access_entry",
                    from_avro=AccessEntry.from_avro, kafka_wait_s=3.0)
    theirs = access_registry(config, producer)
    try:
        assert mine.refresh() == 0
        theirs.put(entry("cli:a"))
        assert mine.refresh() == 1
        made = consumers.made

        private_kafka.stop()
        private_kafka.start(warm_up=False)  # its warm-up consumer is not the registry's
        theirs.put(entry("cli:b"))
        assert mine.refresh() == 1
        assert consumers.made == made

        private_kafka.stop()
        with pytest.raises(JournalUnavailable):
            mine.refresh()
        private_kafka.start(warm_up=False)
        theirs.put(entry("cli:c"))
        assert mine.refresh() == 1
        assert consumers.made == made + 1
        assert sorted(e.entry_id for e in mine) == ["cli:a", "cli:b", "cli:c"]
    finally:
        mine.close()
        producer.close()
